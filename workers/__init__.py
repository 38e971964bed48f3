"""The streamnb daemon: workers that learn and predict from Redis streams.

Workers scale out as processes, so each uses one BLAS thread: with OpenBLAS's default of a
thread per core, LDA/QDA workers on a 2-core host ran 5-8x slower and erratically
(docs/performance.md). Set the variables yourself to override; they must be set before numpy
is first imported, which is why this happens here, at the top of the daemon package.
"""

import os as _os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

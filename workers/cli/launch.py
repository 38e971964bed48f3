"""The ``streamnb`` console script and ``python -m streamnb_workers``: set up the process,
then run the command line (:mod:`streamnb_workers.cli.main`).

Workers scale out as processes, so each uses one BLAS thread: with OpenBLAS's default of a
thread per core, LDA/QDA workers on a 2-core host ran 5-8x slower and erratically. BLAS
reads these variables once, when numpy is first imported, so they are set here, before
anything imports numpy; a value already in the environment is kept. Child processes
(``--processes N``) inherit them.

>>> blas_env({"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"], blas_env({})["OPENBLAS_NUM_THREADS"]
('4', '1')
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

#: What BLAS libraries read for their thread count (OpenBLAS, OpenMP builds, MKL).
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with one BLAS thread wherever it does not say otherwise (for a process
    about to start a worker, this one or a child)."""
    return {**dict.fromkeys(BLAS_THREAD_VARIABLES, "1"), **env}


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.update(blas_env(os.environ))
    # deferred: numpy (and the command line) load only after the BLAS threads are set
    from streamnb_workers.cli.main import main as cli_main

    return cli_main(None if argv is None else list(argv))


if __name__ == "__main__":
    raise SystemExit(main())

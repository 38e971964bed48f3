"""Build hook for the optional C speed-ups (metadata is in pyproject.toml).

``streamnb.features._speedups`` runs the tokenizer's per-character steps and the token
hash cache (see its source); ``streamnb._kernels`` runs the count models' loops over a
batch (prequential scores, class sums). Both are optional: where no C compiler is
found, the build goes on without them and the same code runs in Python (``python -c
"import streamnb.features.text as t; print(t.SPEEDUPS)"``); ``tests/test_speedups.py``
checks that CI built them.
"""

import sys

from setuptools import Extension, setup

#: streamnb._kernels must give numpy's floats bit for bit (the class sums): no
#: fused multiply-add where a build for a newer CPU would allow one.
NO_FMA = [] if sys.platform == "win32" else ["-ffp-contract=off"]

setup(
    ext_modules=[
        Extension("streamnb.features._speedups", ["streamnb/features/_speedups.c"],
                  depends=["streamnb/_buffers.h"], optional=True),
        Extension("streamnb._kernels", ["streamnb/_kernels.c"], depends=["streamnb/_buffers.h"],
                  libraries=["m"], extra_compile_args=NO_FMA, optional=True),
    ]
)

"""Build hook for the optional C modules (metadata is in pyproject.toml).

``streamnb.features._speedups`` holds the tokenizer's per-character steps, the token hash
table and the sort of each message's buckets; ``streamnb._kernels`` the count models'
loops over a batch's nonzeros (prequential scores, class sums, merges). Each C function
stands for Python code that defines what it computes and that tests compare it with; each
is kept because it earns its place end to end (docs/performance.md, "What the C modules
earn"). Both modules are optional: where no C compiler is found the build goes on without
them and the Python code runs alone (``python -c "import streamnb.features.steps as s;
print(s.DEFAULT_STEPS)"``); ``STREAMNB_PURE_PYTHON=1`` turns them off
(``streamnb/_cmodules.py``, the one loader); CI sets ``STREAMNB_REQUIRE_SPEEDUPS=1`` so
that ``tests/streamnb/features/test_speedups.py`` fails where they were not built.
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

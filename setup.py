"""Build hook for the optional C speed-ups (metadata is in pyproject.toml).

``streamnb.features._speedups`` runs the tokenizer's per-character steps and the token
hash cache (see its source); ``streamnb._kernels`` runs the per-nonzero loop of the
multinomial prequential prediction; ``workers._resp`` packs a worker's commit command in the Redis
protocol. Both are optional: where no C compiler is found, the build goes on without them
and the same code runs in Python (``python -c "import streamnb.features.text as t;
print(t.SPEEDUPS)"``). All three are checked by ``tests/test_speedups.py``.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamnb.features._speedups",
            ["streamnb/features/_speedups.c"],
            optional=True,
        ),
        Extension("streamnb._kernels", ["streamnb/_kernels.c"], libraries=["m"],
                  optional=True),
        Extension("workers._resp", ["workers/_resp.c"], optional=True),
    ]
)

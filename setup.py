"""Build hook for the optional C speed-up (metadata is in pyproject.toml).

``streamnb.features._speedups`` runs the tokenizer's per-character steps and the token
hash cache (see its source). It is optional: where no C compiler is found, the build goes on without it and the same rules
run in Python (``python -c "import streamnb.features.text as t; print(t.SPEEDUPS)"``).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "streamnb.features._speedups",
            ["streamnb/features/_speedups.c"],
            optional=True,
        )
    ]
)

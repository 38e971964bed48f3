"""Benchmarks of streamnb next to River and scikit-learn (see docs/performance.md).

Each module is a script (``python -m benchmarks.<name> --help``) that prints its figures,
the machine it ran on and the command that reproduces them; ``python -m benchmarks``
runs the short versions of the model-only, end-to-end and daemon-accuracy benchmarks.
"""

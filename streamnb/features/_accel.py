"""The optional C module :mod:`streamnb.features._speedups`, loaded in one place.

It is built by ``setup.py`` where a C compiler is found (docs/architecture.md, decision 16)
and turned off by the environment variable ``STREAMNB_PURE_PYTHON=1``; without it every
caller runs the same rules in Python.

>>> speedups() is None or hasattr(speedups(), "word_tokens")
True
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["speedups"]


def speedups() -> ModuleType | None:
    """The C module, or None (not built, or turned off by ``STREAMNB_PURE_PYTHON``)."""
    if os.environ.get("STREAMNB_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from streamnb.features import _speedups
    except ImportError:
        return None
    return _speedups

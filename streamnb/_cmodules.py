"""The optional C modules, loaded in one place.

``streamnb.features._speedups`` (the tokenizer's steps, the token hash cache, sorts),
``streamnb._kernels`` (the count models' per-nonzero loops) and ``streamnb_workers._resp`` (the
commit command's packing) are built by ``setup.py`` where a C compiler is found
(docs/architecture.md, decision 16) and turned off together by the environment variable
``STREAMNB_PURE_PYTHON=1``; without them every caller runs the same code in Python (its
reference). This module imports nothing of the package, so any module may use it.

>>> module = optional_c_module("streamnb._kernels")
>>> module is None or hasattr(module, "class_sums")
True
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["optional_c_module"]


def optional_c_module(name: str) -> ModuleType | None:
    """The optional C module ``name``, or None: not built, or every one turned off by
    ``STREAMNB_PURE_PYTHON``."""
    if os.environ.get("STREAMNB_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None

"""The optional C module :mod:`streamnb.features._speedups`, loaded in one place.

It is built by ``setup.py`` where a C compiler is found (docs/architecture.md, decision 16)
and turned off by the environment variable ``STREAMNB_PURE_PYTHON=1``; without it every
caller runs the same rules in Python.

>>> speedups() is None or hasattr(speedups(), "word_tokens")
True
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = ["optional_c_module", "python_tokenizer", "speedups"]

#: The tokenizer's C steps: (module, attribute) holding the C function, None to run the
#: Python code (the reference) instead. Token hashing has its own switch (hashing).
TOKENIZER_STEPS = (
    ("streamnb.features.text", "_word_tokens"),
    ("streamnb.features.text", "_url_scan"),
    ("streamnb.features.markup", "_html_strip"),
    ("streamnb.features.markup", "_tag_tokens"),
    ("streamnb.features.mail", "_c_received_tokens"),
    ("streamnb.features.mail", "_text_counts"),
    ("streamnb.features.mime", "_header_fields"),
)


def optional_c_module(name: str) -> ModuleType | None:
    """The optional C module ``name`` (``streamnb.features._speedups``, ``workers._resp``),
    or None: not built, or every one turned off by ``STREAMNB_PURE_PYTHON``."""
    if os.environ.get("STREAMNB_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def speedups() -> ModuleType | None:
    """The tokenizer's C module, or None (see :func:`optional_c_module`)."""
    return optional_c_module("streamnb.features._speedups")


@contextmanager
def python_tokenizer() -> Iterator[None]:
    """Run the tokenizer's Python code in the block, every C step of :data:`TOKENIZER_STEPS`
    switched off (tests compare both; ``benchmarks/accuracy.py`` times both).

    >>> from streamnb.features import tokenize_text
    >>> with python_tokenizer():
    ...     tokenize_text("see www.example.com")
    ['proto:http', 'url:www.example.com', 'url:example.com', 'see']
    """
    saved = []
    for module_name, attribute in TOKENIZER_STEPS:
        module = importlib.import_module(module_name)
        saved.append((module, attribute, getattr(module, attribute)))
        setattr(module, attribute, None)
    try:
        yield
    finally:
        for module, attribute, value in saved:
            setattr(module, attribute, value)

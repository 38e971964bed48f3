"""The optional C module :mod:`streamnb.features._speedups`, loaded in one place.

It is built by ``setup.py`` where a C compiler is found and turned off by the environment
variable ``STREAMNB_PURE_PYTHON=1`` (:mod:`streamnb._cmodules`); without it every caller
runs the same rules in Python.

>>> speedups() is None or hasattr(speedups(), "word_tokens")
True
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from streamnb._cmodules import optional_c_module

__all__ = ["python_tokenizer", "speedups"]

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
    ("streamnb.features.mime", "_header_index"),
    ("streamnb.features.mime", "_c_header_block_end"),
    ("streamnb.features.mime", "_c_plain_headers"),
    ("streamnb.features.mail", "_c_header_tokens"),
    ("streamnb.features.mail", "_c_value_words"),
    ("streamnb.features.mail", "_c_addresses"),
)


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

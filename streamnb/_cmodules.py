"""The optional C modules, loaded in one place, with one switch.

``streamnb.features._speedups`` (the tokenizer's per-character steps, the token hash
table, the sort of each message's buckets) and ``streamnb._kernels`` (the count models'
loops over a batch's nonzeros, the packing of outputs, the drift detectors' per-value
loops) are built by ``setup.py`` where a C compiler is found
(docs/architecture.md, decision 14). Every C function stands for Python code, its
reference, which runs wherever the function is missing and which tests compare it with.

The environment variable ``STREAMNB_PURE_PYTHON`` is the one switch, read as the modules
that use a C function are imported: ``1`` turns every C module off; a comma-separated list of names
turns off only those, to measure what each piece earns (docs/performance.md, "What the C
modules earn"). A name is a module (``streamnb._kernels``), a C function
(``multinomial_jll``, ``unique_buckets``) or one of the pieces of :data:`PIECES`
(``tokenizer``, ``hash_table``).

This module imports nothing of the package, so any module may use it.

>>> module = optional_c_module("streamnb._kernels")
>>> module is None or hasattr(module, "multinomial_jll")
True
>>> sorted(_switched_off("multinomial_jll, tokenizer"))[:3]
['addresses', 'header_block_end', 'header_fields']
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["PIECES", "optional_c_module"]

#: Names of the pieces made of several C functions of ``streamnb.features._speedups``,
#: each measured as a whole: the tokenizer's steps (streamnb.features.steps) and the token
#: hash table (streamnb.features.hashing; ``word_hashes`` writes to it from the word rules).
PIECES = {
    "tokenizer": ("word_tokens", "word_hashes", "value_words", "url_scan", "html_strip", "tag_tokens",
                  "html_unescape", "message_id_value", "received_tokens", "text_counts", "addresses",
                  "header_tokens", "header_fields", "header_block_end", "plain_headers", "header_index"),
    "hash_table": ("hash_cache_init", "hash_cache_clear", "hash_cache_len", "hash_one", "hash_lists",
                   "word_hashes"),
}


def _switched_off(value: str) -> frozenset[str]:
    """The module and function names a value of ``STREAMNB_PURE_PYTHON`` turns off (``*``:
    all; none for ``""`` or ``0``), pieces spelt out."""
    if value.strip() in ("", "0"):
        return frozenset()
    if value.strip().lower() in ("1", "true", "yes", "on"):
        return frozenset({"*"})
    names: set[str] = set()
    for name in filter(None, (part.strip() for part in value.split(","))):
        names.update(PIECES.get(name, (name,)))
    return frozenset(names)


def optional_c_module(name: str) -> ModuleType | None:
    """The optional C module ``name``, or None: not built, or turned off by
    ``STREAMNB_PURE_PYTHON``. Where the variable lists some of its functions, a copy of
    the module without them (callers look functions up with ``getattr(module, f, None)``)."""
    off = _switched_off(os.environ.get("STREAMNB_PURE_PYTHON", ""))
    if "*" in off or name in off:
        return None
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None
    kept = {key: value for key, value in vars(module).items() if key not in off}
    if len(kept) == len(vars(module)):
        return module
    view = ModuleType(module.__name__, module.__doc__)
    vars(view).update(kept)
    return view

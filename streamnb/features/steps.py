"""The tokenizer's per-character steps: C functions where they are built, or none.

Each rule of the tokenizer (the word rules, the URL rule, the HTML passes and tags, the
Received tokens, the letter counts, the header block, its fields and index, the header
stage, address lists) is written once, in Python. A step here is the same rule in C
(:mod:`streamnb.features._speedups`), a fast path the Python code takes when the step is
there: it returns the same result on the input whose semantics are plain in C (Latin-1
text, ASCII header blocks) and declines the rest (None or False), for which the Python
code runs in that call.

A tokenizer takes its steps once, when it is made (``WordRules(steps=...)``,
``MailTokenizer(steps=...)``, ``strip_html(..., steps=...)``): :data:`DEFAULT_STEPS` is
:data:`C_STEPS` where the module is built (and not turned off, :mod:`streamnb._cmodules`),
else :data:`REFERENCE_STEPS`, the Python code alone, which tests compare the C steps with
and benchmarks time.

>>> REFERENCE_STEPS.word_tokens is None
True
>>> DEFAULT_STEPS is (C_STEPS or REFERENCE_STEPS)
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from types import ModuleType
from typing import Any

from streamnb._cmodules import optional_c_module

__all__ = ["C_STEPS", "DEFAULT_STEPS", "REFERENCE_STEPS", "TokenizerSteps"]

Step = Callable[..., Any] | None


@dataclass(frozen=True, slots=True, repr=False)
class TokenizerSteps:
    """The C function of each step, or None where the Python code runs alone. What each
    takes and gives is in its docstring (``help(streamnb.features._speedups)``) and at the
    Python code that calls it."""

    name: str
    #: the word rules (text.WordRules.words), and with the token hash table the stable
    #: hashes of the word tokens (WordRules.hash_words)
    word_tokens: Step = None
    word_hashes: Step = None
    #: the words of a header value (mail_headers.HeaderTokenizer.value_tokens)
    value_words: Step = None
    #: the URL rule (text.WordRules.urls)
    url_scan: Step = None
    #: markup.strip_html whole, or its tag tokens
    html_strip: Step = None
    tag_tokens: Step = None
    #: html.unescape (markup.unescape)
    html_unescape: Step = None
    #: mail_headers._received_tokens, MailAnalysis.add_text_stats' counts, mail_headers._address_matches,
    #: HeaderTokenizer.add
    received_tokens: Step = None
    text_counts: Step = None
    addresses: Step = None
    header_tokens: Step = None
    #: mime._plain_headers' split, mime._header_block_end, mime._plain_headers,
    #: mime._names_and_index
    header_fields: Step = None
    header_block_end: Step = None
    plain_headers: Step = None
    header_index: Step = None

    def __repr__(self) -> str:
        return f"<TokenizerSteps {self.name}>"

    @classmethod
    def of_module(cls, module: ModuleType | None) -> TokenizerSteps | None:
        """The steps ``module`` holds (None: it holds none)."""
        found = {f.name: getattr(module, f.name, None) for f in fields(cls) if f.name != "name"}
        return cls("C", **found) if any(found.values()) else None


#: The Python code alone.
REFERENCE_STEPS = TokenizerSteps("reference")
#: The C steps, or None: not built, or turned off (``STREAMNB_PURE_PYTHON``).
C_STEPS = TokenizerSteps.of_module(optional_c_module("streamnb.features._speedups"))
#: What a tokenizer takes unless told otherwise.
DEFAULT_STEPS = C_STEPS or REFERENCE_STEPS

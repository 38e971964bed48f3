"""Featurization: raw mail, text, tokens, named features and vectors -> model input.

The daemon and offline users share one code path: a :class:`Featurizer` built from the
model's stored config turns each decoded message into a :class:`Row` and stacks rows
into a CSR matrix (hashed tokens) or a dense array (``x`` vectors).

>>> from streamnb.features import EmailFeaturizer, tokenize_email
>>> X = EmailFeaturizer(bits=16).transform([b"Subject: cheap meds\\n\\nbuy now"])
>>> X.shape
(1, 65536)
>>> "subject:cheap" in tokenize_email(b"Subject: cheap meds\\n\\nbuy now")
True
"""

from importlib import import_module
from typing import Any

#: Each public name -> the module that defines it. They load on first use: the wire
#: codec needs only ``payload`` and a mail filter started per mail skips the featurizer's
#: scipy.sparse.
_MODULE_OF = {
    **dict.fromkeys(("COUNT_MODES", "EmailFeaturizer", "Featurizer", "TextFeaturizer"),
                    "featurizer"),
    **dict.fromkeys(("Row", "rows_to_bytes"), "rows"),
    **dict.fromkeys(("TokenHasher", "token_hash64", "token_hashes"), "hashing"),
    **dict.fromkeys(("DEFAULT_HEADERS", "MailTokenizer", "tokenize_email"), "mail"),
    **dict.fromkeys(("META_FEATURES", "N_META", "MailAnalysis"), "mail_meta"),
    "strip_html": "markup",
    **dict.fromkeys(("DEFAULT_FEATURE_LIMITS", "PAYLOAD_KINDS", "FeatureLimits", "Payload"),
                    "payload"),
    **dict.fromkeys(("WordRules", "tokenize_text"), "text"),
}

__all__ = [
    "COUNT_MODES",
    "DEFAULT_FEATURE_LIMITS",
    "DEFAULT_HEADERS",
    "META_FEATURES",
    "N_META",
    "PAYLOAD_KINDS",
    "EmailFeaturizer",
    "FeatureLimits",
    "Featurizer",
    "MailAnalysis",
    "MailTokenizer",
    "Payload",
    "Row",
    "rows_to_bytes",
    "TextFeaturizer",
    "TokenHasher",
    "WordRules",
    "strip_html",
    "token_hash64",
    "token_hashes",
    "tokenize_email",
    "tokenize_text",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'streamnb.features' has no attribute {name!r}")
    value = getattr(import_module(f"streamnb.features.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

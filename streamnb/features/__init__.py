"""Featurization: raw mail, text, tokens, named features and vectors -> model input.

The daemon and offline users share one code path: a :class:`Featurizer` built from the
model's stored config turns each decoded message into a :class:`Row` and stacks rows
into a CSR matrix (hashed tokens) or a dense array (``x`` vectors).

>>> X = EmailFeaturizer(bits=16).transform([b"Subject: cheap meds\\n\\nbuy now"])
>>> X.shape
(1, 65536)
>>> "subject:cheap" in tokenize_email(b"Subject: cheap meds\\n\\nbuy now")
True
"""

from streamnb.features.featurizer import (
    COUNT_MODES,
    EmailFeaturizer,
    Featurizer,
    Row,
    TextFeaturizer,
    rows_to_bytes,
)
from streamnb.features.hashing import TokenHasher, token_hash64, token_hashes
from streamnb.features.mail import (
    DEFAULT_HEADERS,
    META_FEATURES,
    N_META,
    MailAnalysis,
    MailTokenizer,
    tokenize_email,
)
from streamnb.features.markup import strip_html
from streamnb.features.payload import DEFAULT_FEATURE_LIMITS, PAYLOAD_KINDS, FeatureLimits, Payload
from streamnb.features.text import WordRules, tokenize_text

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

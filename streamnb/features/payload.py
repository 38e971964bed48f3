"""What a featurizer takes: a payload of one kind, and the bounds on what it may cost.

A :class:`Payload` is one message's content, whatever carried it (a stream entry, a
file, a Python call): ``raw`` RFC 822 bytes, ``text``, ``tokens`` (a list of str),
``hashes`` (the tokens' 64-bit hashes, :func:`streamnb.features.token_hashes`, a uint64
array), ``features`` (a map of name -> value >= 0) or ``x`` (a float64 vector).

>>> Payload("text", "cheap meds").kind
'text'
>>> FeatureLimits().max_tokens
50000
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["DEFAULT_FEATURE_LIMITS", "PAYLOAD_KINDS", "FeatureLimits", "Payload"]

#: Default size of raw mail that is read (1 MiB, ``--max-bytes``): a larger mail is cut
#: (streamnb.features.truncate), then judged like any other.
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20

#: Every kind of payload, in the order the wire format lists them.
PAYLOAD_KINDS = ("raw", "text", "tokens", "hashes", "features", "x")


class Payload(NamedTuple):
    """One message's content: its ``kind`` (one of :data:`PAYLOAD_KINDS`) and ``value``."""

    kind: str
    value: Any


@dataclass(frozen=True, slots=True)
class FeatureLimits:
    """Bounds on what featurizing one message may cost. Defaults suit mail.

    >>> FeatureLimits(max_tokens=10).max_mime_parts
    64
    """

    #: Bytes of raw mail read; the rest is not looked at.
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Tokens kept per message (tokenizers stop after this many).
    max_tokens: int = 50_000
    #: MIME: nesting depth, number of parts, decoded text bytes (all parts together).
    max_mime_depth: int = 8
    max_mime_parts: int = 64
    max_decoded_bytes: int = 2 * DEFAULT_MAX_MESSAGE_BYTES
    #: Characters of a text payload or of all body text that are tokenized.
    max_text_chars: int = 2 * DEFAULT_MAX_MESSAGE_BYTES
    #: Characters of one header value read before RFC 2047 decoding and address parsing
    #: (the standard library's decoders are quadratic in the number of encoded words).
    max_header_chars: int = 16_384


DEFAULT_FEATURE_LIMITS = FeatureLimits()

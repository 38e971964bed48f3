"""A ``tokens`` payload as it came on the wire: the msgpack array of str of a stream
entry, hashed in one C pass without a Python ``str`` per token.

A worker reads pre-tokenized messages of about 1,300 tokens each; msgpack makes a
``str`` of every token, which the token table then hashes. Where the C module is built,
:func:`split_tokens` walks the entry's msgpack map instead: it finds the ``tokens`` array,
checks each item (a str of valid UTF-8 within the limits), looks each up in the token
table (:mod:`streamnb.features.hashing`) straight from its bytes, and gives back the map
without that pair, for msgpack to decode as usual, and a :class:`WireTokens`: the tokens'
stable hashes, and the tokens themselves decoded only when something asks for them
(token names, explanations, counted values). The entry's other fields, and every entry
the C function declines (not a map, no tokens array, a malformed or too large item,
several ``tokens`` keys), take msgpack's path, which is the reference: the tokens a
:class:`WireTokens` stands for are exactly those msgpack decodes, their hashes and learn-once
key exactly those of that list (tests/streamnb/features/test_wire_tokens.py compares both
paths with msgpack and hashlib).

>>> import msgpack
>>> entry = msgpack.packb({"tokens": ["cheap", "meds"], "label": "spam"})
>>> split = split_tokens(entry, max_tokens=100, max_str_len=100, max_map_len=100)
>>> if split is not None:  # the C module is built
...     rest, tokens = split
...     assert msgpack.unpackb(rest) == {"label": "spam"} and list(tokens) == ["cheap", "meds"]
...     assert tokens.joined_utf8() == b"cheap\\x00meds"
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import msgpack
import numpy as np

from streamnb._cmodules import optional_c_module
from streamnb.features.hashing import C_TABLE

__all__ = ["WireTokens", "split_tokens"]

_c = optional_c_module("streamnb.features._speedups")
#: The C functions (None without the C module, or with the token table turned off: the
#: hashes come from that table).
_WIRE_TOKENS = getattr(_c, "wire_tokens", None) if C_TABLE is not None else None
_JOINED = getattr(_c, "wire_tokens_joined", None)
_DISTINCT = getattr(_c, "wire_tokens_distinct", None)


class WireTokens(Sequence[str]):
    """The tokens of a msgpack array ``data[start:end]`` (already checked: str items of
    valid UTF-8), with their stable 64-bit hashes ``hashes`` (uint64, in order). The
    tokens are decoded by msgpack on first use."""

    __slots__ = ("_decoded", "data", "end", "hashes", "start")

    def __init__(self, data: bytes, start: int, end: int, hashes: np.ndarray) -> None:
        self.data, self.start, self.end, self.hashes = data, start, end, hashes
        self._decoded: list[str] | None = None

    def tokens(self) -> list[str]:
        """The tokens as a list of str (decoded once)."""
        if self._decoded is None:
            self._decoded = msgpack.unpackb(memoryview(self.data)[self.start:self.end], raw=False)
        return self._decoded

    def distinct(self) -> list[str]:
        """The distinct tokens, in the order of their first appearance
        (``list(dict.fromkeys(tokens))``): told apart by their 64-bit stable hashes, only
        the first of each decoded (what counting token names needs, without a str for
        every token)."""
        if self._decoded is not None or _DISTINCT is None:
            return list(dict.fromkeys(self.tokens()))
        return _DISTINCT(self.data, self.start, self.end, self.hashes)

    def joined_utf8(self) -> bytes:
        """The tokens' UTF-8 bytes joined by NUL: ``"\\0".join(tokens).encode()``, the
        canonical form a learn-once key hashes (workers/wire/learn_keys.py), made from the
        bytes as they came."""
        if _JOINED is not None:
            return _JOINED(self.data, self.start, self.end)
        return "\x00".join(self.tokens()).encode("utf-8", "surrogatepass")

    def __len__(self) -> int:
        return int(self.hashes.size)

    def __iter__(self) -> Iterator[str]:
        return iter(self.tokens())

    def __getitem__(self, i: Any) -> Any:
        return self.tokens()[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, WireTokens):
            other = other.tokens()
        return isinstance(other, (list, tuple)) and self.tokens() == list(other)

    __hash__ = None  # type: ignore[assignment]  # (a sequence, compared by its items)

    def __repr__(self) -> str:
        return f"WireTokens({self.tokens()!r})"


def split_tokens(data: bytes, *, max_tokens: int, max_str_len: int, max_map_len: int,
                 ) -> tuple[bytes, WireTokens] | None:
    """``(the map without its tokens pair, its tokens)`` of an entry's msgpack map ``data``
    whose ``tokens`` holds at most ``max_tokens`` str items of at most ``max_str_len``
    bytes each, in a map of at most ``max_map_len`` pairs; None for any other entry and
    where the C module is not built (msgpack then decodes the entry)."""
    if _WIRE_TOKENS is None:
        return None
    split = _WIRE_TOKENS(data, max_tokens, max_str_len, max_map_len)
    if split is None:
        return None
    rest, hashes, start, end = split
    return rest, WireTokens(data, start, end, np.frombuffer(hashes, dtype=np.uint64))

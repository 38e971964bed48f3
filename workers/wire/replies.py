"""Redis replies read the same way whether the client decodes responses or not.

redis-py returns ``bytes`` from a client made with ``decode_responses=False`` (the
workers' own) and ``str`` from one made with ``decode_responses=True`` (a user's, in the
CLI, the demo and the tests); these two helpers take either.

>>> as_str(b"1700000000000-0"), as_str("1700000000000-0"), as_str(3)
('1700000000000-0', '1700000000000-0', '3')
>>> entry_field({b"data": b"x"}, "data"), entry_field({"data": "x"}, "data")
(b'x', 'x')
>>> entry_field({}, "data") is None
True
"""

from __future__ import annotations

from typing import Any

__all__ = ["as_str", "entry_field"]


def as_str(v: Any) -> str:
    """A reply value (stream id, field, name) as ``str``: bytes decoded as UTF-8."""
    return v.decode() if isinstance(v, bytes) else str(v)


def entry_field(fields: dict | None, name: str) -> Any:
    """The field ``name`` of a stream entry (bytes or str keys), None when absent."""
    if not fields:
        return None
    value = fields.get(name.encode())
    return fields.get(name) if value is None else value

"""Redis stream entry ids (``<milliseconds>-<sequence>``): parsed, timed and ordered.

>>> parse_id("1700000000000-3") < parse_id("1700000000001-0")
True
>>> entry_time("1700000000123-4")
1700000000.123
>>> first_id([(b"5-1", {}), (b"5-0", {}), (b"12-0", {})]), first_id([])
('5-0', '0-0')
"""

from __future__ import annotations

from typing import Any

from streamnb_workers.wire.replies import as_str

__all__ = ["entry_time", "first_id", "parse_id"]


def parse_id(entry_id: Any) -> tuple[int, int]:
    """``"1700000000000-3"`` -> ``(1700000000000, 3)``; compares stream ids correctly."""
    s = as_str(entry_id)
    ms, _, seq = s.partition("-")
    return int(ms), int(seq or 0)


def entry_time(entry_id: str) -> float:
    """Unix time in seconds of a stream entry id (a str): ``"1700000000123-4"`` ->
    ``1700000000.123``, what ``parse_id(entry_id)[0] / 1000.0`` gives, without parsing the
    sequence number (a worker takes it of every message).

    >>> entry_time("1700000000123-4") == parse_id("1700000000123-4")[0] / 1000.0
    True
    """
    return int(entry_id.partition("-")[0]) / 1000.0


def first_id(entries: list) -> str:
    """The smallest entry id of a batch of ``(id, fields)`` ("0-0" for none): where it
    starts in the stream."""
    return min((as_str(e[0]) for e in entries), key=parse_id) if entries else "0-0"

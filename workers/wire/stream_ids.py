"""Redis stream entry ids (``<milliseconds>-<sequence>``): parsed, timed and ordered.

>>> parse_id("1700000000000-3") < parse_id("1700000000001-0")
True
>>> entry_time("1700000000123-4")
1700000000.123
>>> first_id([(b"5-1", {}), (b"5-0", {}), (b"12-0", {})]), first_id([])
('5-0', '0-0')
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from streamnb_workers.wire.replies import as_str

__all__ = ["entry_time", "entry_times", "first_id", "parse_id", "stream_ranks"]


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


def _parsed(ids: Sequence[str]) -> np.ndarray | None:
    """The ``(milliseconds, sequence)`` of each id as an (n, 2) int64 array, parsed in one
    numpy call (no Python step an id); None where an id is not of that form."""
    text = " ".join(ids)
    if text.count("-") != len(ids) or not (text.isascii() and
                                           text.replace("-", "").replace(" ", "").isdigit()):
        return None
    text = text.replace("-", " ")
    parts = text.split(" ")
    if len(parts) != 2 * len(ids) or max(map(len, parts)) > 18:
        return None  # (a part empty, or too long for int64: the slow way)
    # (digits and single spaces only, each number of at most 18 digits: numpy's text
    # parser reads them all, about five times as fast as from a list of str)
    return np.fromstring(text, dtype=np.int64, sep=" ").reshape(-1, 2)


def entry_times(ids: Sequence[str]) -> np.ndarray:
    """:func:`entry_time` of each id (float64).

    >>> entry_times(["1700000000123-4", "5-0"]).tolist()
    [1700000000.123, 0.005]
    """
    parsed = _parsed(ids) if ids else None
    if parsed is None:
        return np.array([entry_time(i) for i in ids], dtype=np.float64)
    return parsed[:, 0] / 1000.0


def stream_ranks(ids: Sequence[str]) -> dict[str, int]:
    """Each id's position in stream order (ids distinct): sorting by it is sorting by
    :func:`parse_id`, with no Python step an id.

    >>> stream_ranks(["5-1", "12-0", "5-0", "9-10", "9-9"])
    {'5-0': 0, '5-1': 1, '9-9': 2, '9-10': 3, '12-0': 4}
    """
    parsed = _parsed(ids) if ids else None
    if parsed is None:
        ordered = sorted(ids, key=parse_id)
    else:
        ordered = [ids[i] for i in np.lexsort((parsed[:, 1], parsed[:, 0])).tolist()]
    return {eid: i for i, eid in enumerate(ordered)}


def first_id(entries: list) -> str:
    """The smallest entry id of a batch of ``(id, fields)`` ("0-0" for none): where it
    starts in the stream."""
    if not entries:
        return "0-0"
    ids = [as_str(e[0]) for e in entries]
    parsed = _parsed(ids)
    if parsed is None:
        return min(ids, key=parse_id)
    return ids[int(np.lexsort((parsed[:, 1], parsed[:, 0]))[0])]

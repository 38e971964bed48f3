"""How a worker serving many models reads their new entries within its memory bound: in
groups of streams, each read bringing at most :attr:`ReadPlan.room` bytes.

One ``XREADGROUP`` naming every model's ``:in`` with ``COUNT batch`` returns up to
``batch`` entries of each: at 10,000 models, a backlog of any size at once, before any
of it is measured. :class:`ReadPlan` bounds a read by entries, ``room`` over the bytes an
entry takes (the largest mean of the recent reads, :meth:`ReadPlan.observe`):

- when every stream's ``batch`` fits, one read as with few models (:meth:`groups` gives one
  group);
- else the streams of the entries read full last time (*hot*: they hold more) are read
  with ``batch`` each, as many a read as fit, and the others with the count that lets
  all of them fit the fewest reads (at least 1 each), in groups of as many as fit;
- the worker processes each group's batches before it reads the next
  (workers/worker/intake.py ``read_groups``), and makes room for the read first
  (workers/replication/replica_cache.py ``before_read``): the step holds one group's
  entries at a time.

>>> plan = ReadPlan(room=100 * 1024, entry_bytes=1024)   # 100 entries a read
>>> plan.groups(["a", "b"], count=50)                     # both fit: one read
[([0, 1], 50)]
>>> [(len(g), c) for g, c in plan.groups([str(i) for i in range(250)], count=50)]
[(100, 1), (100, 1), (50, 1)]
>>> plan.observe([("7", 1), ("8", 0)], count=1, batch=50)    # "7" came full: it is hot
>>> [(g[:3], c) for g, c in plan.groups([str(i) for i in range(250)], count=50)][:2]
[([7], 50), ([0, 1, 2], 1)]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["ENTRY_BYTES", "ENTRY_OBJECTS", "READ_ROOM", "ReadPlan", "entries_bytes"]

#: Bytes a worker's read may bring at most, by default: within a bound, the smaller of this
#: and a 16th of it (workers/worker/loop.py).
READ_ROOM = 16 * 2**20
#: Bytes an entry read costs before any is measured (a pre-tokenized mail: 2-4 KiB).
ENTRY_BYTES = 4096
#: Bytes an entry's Python objects take besides its values (its id, its tuple and dict,
#: the headers of its bytes objects).
ENTRY_OBJECTS = 512
#: How much of the largest recent mean an entry's estimate keeps at each read (it follows
#: smaller entries slowly, larger ones at once).
DECAY = 0.9


def entries_bytes(entries: Iterable[tuple[Any, dict[Any, Any]]]) -> tuple[int, int]:
    """(how many, bytes) of entries as read: their values' lengths and their objects.

    >>> entries_bytes([(b"1-0", {b"data": b"x" * 100})])
    (1, 619)
    """
    n = size = 0
    for eid, fields in entries:
        n += 1
        size += ENTRY_OBJECTS + len(eid) + sum(len(k) + len(v) for k, v in fields.items())
    return n, size


class ReadPlan:
    """Groups of streams a read each (see the module docstring). ``room``: bytes a read
    may bring."""

    def __init__(self, room: int, entry_bytes: int = ENTRY_BYTES) -> None:
        self.room = int(room)
        #: Bytes an entry is taken to cost: the largest mean of the recent reads.
        self.entry_bytes = max(ENTRY_OBJECTS, int(entry_bytes))
        #: Names of the models whose last read came full at a count below the batch.
        self.hot: set[str] = set()

    @classmethod
    def within(cls, budget: int) -> ReadPlan | None:
        """The plan of a worker bounded to ``budget`` bytes: reads of at most
        :data:`READ_ROOM` or a 16th of it; None without a bound (one read).

        >>> ReadPlan.within(512 * 2**20).room == READ_ROOM, ReadPlan.within(0)
        (True, None)
        """
        return cls(min(READ_ROOM, budget // 16)) if budget > 0 else None

    @property
    def cap(self) -> int:
        """Entries a read may bring (at least 1)."""
        return max(1, self.room // self.entry_bytes)

    def groups(self, names: Sequence[str], count: int) -> list[tuple[list[int], int]]:
        """``(indices into names, count)`` of each read, in order: the hot streams first
        (``count`` each), then the others."""
        n, cap = len(names), self.cap
        if self.room <= 0 or n * count <= cap:
            return [(list(range(n)), count)] if n else []
        hot = [i for i, name in enumerate(names) if name in self.hot]
        cold = (
            [i for i, name in enumerate(names) if name not in self.hot] if hot else list(range(n))
        )
        out: list[tuple[list[int], int]] = []
        each = min(count, cap)
        per = max(1, cap // each)
        out += [(hot[i : i + per], each) for i in range(0, len(hot), per)]
        if cold:
            each = max(1, min(count, cap // len(cold)))
            per = max(1, cap // each)
            out += [(cold[i : i + per], each) for i in range(0, len(cold), per)]
        return out

    def observe(
        self, read: Iterable[tuple[str, int]], count: int, batch: int, nbytes: int = 0
    ) -> None:
        """After a read at ``count`` (``batch``: the worker's): ``(name, entries)`` of
        the models it named, and the bytes of the entries it brought (``nbytes``)."""
        got = 0
        for name, k in read:
            got += k
            if count < batch and k >= count:
                self.hot.add(name)
            elif k < count:
                self.hot.discard(name)
        if got:
            mean = max(ENTRY_OBJECTS, nbytes // got)
            self.entry_bytes = max(mean, int(self.entry_bytes * DECAY))

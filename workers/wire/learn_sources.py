"""Who taught a model what: the source of a learnt message, and its epoch.

Every message learnt is learnt under a *source*: the one its producer names (``source``
on the wire, ``streamnb produce --source NAME``), else :data:`DEFAULT_SOURCE`; the daemon
names its own (:data:`AUTOLEARN`). A source name is spelled like a model name (1-100
letters, digits and ``._-``); a producer may not use a name the daemon sets.

A model keeps what each source contributed (workers/replication/replica.py) and can take
one out whole (``streamnb forget --source NAME``). Each forget of a source starts a new
*epoch* of it: a contribution is made, and a learnt key is recorded, under a
``(source, epoch)`` pair, the :data:`Teacher`; one whose epoch is older than the
source's current one was taken out with it, so it is applied nowhere and its key counts
as not learnt.

>>> check_source("imap-retrain")
'imap-retrain'
>>> check_source("autolearn", producer=True)
Traceback (most recent call last):
...
ValueError: source 'autolearn' is set by the daemon; a producer may not send it
>>> check_source("bad name")
Traceback (most recent call last):
...
ValueError: source must be 1..100 characters of letters, digits and ._-, got 'bad name'
>>> is_stale(("imap", 0), {"imap": 1}), is_stale(("imap", 1), {"imap": 1}), is_stale(DEFAULT, {})
(True, False, False)
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["AUTOLEARN", "DAEMON_SOURCES", "DEFAULT", "DEFAULT_SOURCE", "Teacher",
           "check_source", "is_stale", "teacher_of"]

#: The source of a message learnt without one named.
DEFAULT_SOURCE = "default"
#: The source of what ``worker --autolearn`` learns from its own confident verdicts.
AUTOLEARN = "autolearn"
#: Names the daemon sets: a producer that sends one gets ``bad_source``.
DAEMON_SOURCES = frozenset({AUTOLEARN})

#: ``(source, epoch)``: whose contribution, and of which epoch of that source.
Teacher = tuple[str, int]
#: The teacher of a message learnt without a source before any forget of the default one.
DEFAULT: Teacher = (DEFAULT_SOURCE, 0)

_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")


def check_source(name: Any, producer: bool = False) -> str:
    """``name`` if it is a valid source name (``producer``: and one a producer may send),
    else ValueError saying why."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"source must be 1..100 characters of letters, digits and ._-, got {name!r}")
    if producer and name in DAEMON_SOURCES:
        raise ValueError(f"source {name!r} is set by the daemon; a producer may not send it")
    return name


def teacher_of(source: str | None, epochs: dict[str, int]) -> Teacher:
    """The teacher a message of ``source`` (None: the default) is learnt under now, given
    the current epoch of each source (``epochs``; a source absent is at epoch 0)."""
    name = DEFAULT_SOURCE if source is None else source
    return name, epochs.get(name, 0)


def is_stale(teacher: Teacher, epochs: dict[str, int]) -> bool:
    """True if ``teacher``'s contributions were taken out (its source forgotten since)."""
    return teacher[1] < epochs.get(teacher[0], 0)

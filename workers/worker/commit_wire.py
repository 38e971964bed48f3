"""A model's commit on the wire (pipelined commits): a batch's commit as built
(:class:`Built`), sent without waiting with the commands it carries behind its script, and held (:class:`InFlight`) until its reply is read.

>>> wire = CommitWire(None, None, "w1", out_maxlen=100, dead_maxlen=100)
>>> wire.take() is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamnb_workers.store.commit import CommitRequest, SentCommit, send_commit
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.worker.commit_content import CommitContent, PredictedBatch

__all__ = ["Built", "CommitWire", "InFlight"]


@dataclass(frozen=True, slots=True)
class Built:
    """A batch's commit as built: what it writes, and the request that writes it."""

    content: CommitContent
    request: CommitRequest


@dataclass(frozen=True, slots=True)
class InFlight:
    """A commit on the wire: the batch it commits, the commit as built, and the call whose
    reply is still to be read."""

    batch: PredictedBatch
    built: Built
    sent: SentCommit


class CommitWire:
    """At most one commit of one model on the wire: :meth:`send` it, :meth:`take` it
    back to read its reply, or :meth:`abandon` it."""

    __slots__ = ("client", "keys", "consumer", "out_maxlen", "dead_maxlen", "in_flight")

    def __init__(self, client: Any, keys: ModelKeys | None, consumer: str, out_maxlen: int,
                 dead_maxlen: int) -> None:
        self.client, self.keys, self.consumer = client, keys, consumer
        self.out_maxlen, self.dead_maxlen = out_maxlen, dead_maxlen
        self.in_flight: InFlight | None = None

    def send(self, batch: PredictedBatch, built: Built, after: list[list[Any]]) -> None:
        """Send ``built`` (the commit of ``batch``) in one write with the commands
        ``after`` its script, without waiting for the reply."""
        sent = send_commit(self.client, self.keys, self.consumer, built.request,
                           self.out_maxlen, self.dead_maxlen, after)
        self.in_flight = InFlight(batch, built, sent)

    def take(self) -> InFlight | None:
        """The commit on the wire (None: none), no longer held."""
        f, self.in_flight = self.in_flight, None
        return f

    def abandon(self) -> None:
        """Forget the commit on the wire (its entries stay pending)."""
        f = self.take()
        if f is not None:
            f.sent.abandon()

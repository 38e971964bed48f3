"""One reader of the verdicts of every model a protocol server uses, on one Redis server.

A protocol server (spamd, rspamd: workers/protocols/mail_service.py) sends each mail to
its user's model and waits for the prediction in the model's ``:out``. With a reader per
model (a thread and a connection each, as :class:`VerdictClient.start` runs) a server of
10,000 users would hold 10,000 blocked connections. :class:`SharedVerdictReader` reads
the ``:out`` streams of every model it was given in one ``XREAD BLOCK`` and hands each
stream's entries to its model's :class:`VerdictClient` (``deliver``).

A model added while the read blocks is read from at once: a new reader (a thread and a
connection) starts over every model, and the one before it stops after its read
returns (at most ``block_ms``; models added before the new reader has taken the list
start no other); two readers may read the same entries meanwhile, which are handed
over once (each stream's entries after its position only). No key is
written: the protocol servers' Redis user (``streamnb-scorer``) reads ``:out`` only.

On Redis Cluster the streams are in different slots, which one ``XREAD`` cannot read:
there each model keeps its own reader (mail_service.py).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.client.verdicts import VerdictClient
from streamnb_workers.store.backoff import Backoff
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id

__all__ = ["SharedVerdictReader"]

log = logging.getLogger("streamnb.protocols")


class SharedVerdictReader:
    """Reads every added model's ``:out`` in one ``XREAD`` (module docstring)."""

    def __init__(self, settings: RedisSettings, block_ms: int = 1000,
                 read_count: int = 1000) -> None:
        self.settings, self.block_ms, self.read_count = settings, block_ms, read_count
        self._models: dict[str, VerdictClient] = {}
        self._lock = threading.Lock()
        #: One hand-over at a time (two readers may overlap while one stops).
        self._handing = threading.Lock()
        #: The newest reader's number: an older one stops after its read.
        self.generation = 0
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        #: The newest reader has not taken the models yet: it will read one added now.
        self._fresh = False

    @property
    def readers(self) -> int:
        """Reader threads alive (one, but briefly two after a model is added)."""
        return sum(t.is_alive() for t in self._threads)

    def add(self, client: VerdictClient) -> VerdictClient:
        """Read ``client``'s model's verdicts from now on (a reader over every model
        started); returns ``client``."""
        with self._lock:
            self._models[client.model] = client
            if self._fresh:  # (a burst of new models: one new reader)
                return client
            self._fresh = True
            self.generation += 1
            thread = threading.Thread(target=self._read, args=(self.generation,), daemon=True,
                                      name=f"streamnb-verdicts-{self.generation}")
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()
        return client

    def _read(self, generation: int) -> None:
        conn: Any = None
        failing, backoff = False, Backoff(base=0.05, cap=1.0)
        try:
            while not self._stop.is_set() and generation == self.generation:
                try:
                    if conn is None:
                        conn = self.settings.make_client(
                            socket_timeout=self.settings.reader_timeout(self.block_ms))
                    with self._lock:
                        models = list(self._models.values())
                        if generation == self.generation:
                            self._fresh = False
                    streams: dict[str, str] = {}
                    owners: dict[str, VerdictClient] = {}
                    for vc in models:
                        for out, last in vc.positions(conn).items():
                            streams[out], owners[out] = last, vc
                    reply = conn.xread(streams, count=self.read_count, block=self.block_ms)
                except (redis.RedisError, SettingsError) as exc:
                    if not failing:
                        log.warning("reading the verdicts of %d models failed (%s: %s); "
                                    "retrying with backoff", len(self._models),
                                    type(exc).__name__, exc)
                    failing = True
                    self._stop.wait(backoff.next_delay())
                    continue
                if failing:
                    log.info("reading the verdicts again")
                    failing = False
                backoff.reset()
                self._hand_over(reply or [], owners, conn)
        finally:
            if conn is not None:
                conn.close()

    def _hand_over(self, reply: Any, owners: dict[str, VerdictClient], conn: Any) -> None:
        """Each stream's entries after its model's position, to its model."""
        with self._handing:
            for stream, entries in reply:
                out = as_str(stream)
                vc = owners.get(out)
                if vc is None:
                    continue
                last = parse_id(vc.positions(conn)[out])
                new = [e for e in entries if parse_id(as_str(e[0])) > last]
                if new:
                    vc.deliver(out, new)

    def close(self) -> None:
        """Stop the readers (within ``block_ms``)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(self.block_ms / 1000.0 + self.settings.socket_timeout)

"""Entries a model's worker takes again rather than new ones: idle entries claimed from
other consumers when the claim timer is due, and this consumer's own pending entries
after a (re)start, a reconnect or an error, each processed as a batch
(workers/worker/process.py).
"""

from __future__ import annotations

import logging
import time

from streamnb_workers.worker.intake import delivery_counts, read_pending
from streamnb_workers.worker.process import process_batch
from streamnb_workers.worker.runtime import ModelRuntime

__all__ = ["claim_idle_entries", "redo_pending"]

log = logging.getLogger("streamnb.worker")


def claim_idle_entries(rt: ModelRuntime) -> int:
    """Claim and process entries idle in other consumers, when the claim timer is due;
    returns how many."""
    if not rt.timers.claim.fire(time.monotonic()):
        return 0
    entries = rt.claim()
    if not entries:
        return 0
    if rt.claim_cursor != "0-0":  # claimed entries are handled at once; more: soon
        rt.timers.claim.due_at_once()
    rt.series(rt.metrics.messages_claimed).inc(len(entries))
    log.info("model %s: claimed %d idle entries", rt.name, len(entries))
    return process_batch(rt, entries, delivery_counts(rt.client, rt.keys, rt.consumer, entries))


def redo_pending(rt: ModelRuntime) -> int:
    """Redo a batch of this consumer's pending entries (one entry after an unexpected
    error: :meth:`ModelRuntime.isolate_next`); the pending phase ends when none is left.
    Returns how many."""
    entries = read_pending(rt.client, rt.keys, rt.consumer,
                           1 if rt.isolate else rt.options.batch)
    if not entries:
        rt.pending_done()
        return 0
    log.info("model %s: re-processing %d pending entries", rt.name, len(entries))
    return process_batch(rt, entries, delivery_counts(rt.client, rt.keys, rt.consumer, entries))

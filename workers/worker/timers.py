"""A worker's timers: each of a model's duties (workers/worker/housekeeping.py) and its
claims of idle entries is due on a period of its own.

>>> t = Timer(5.0)
>>> t.fire(now=100.0), t.fire(now=104.0), t.fire(now=105.0)
(True, False, True)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from streamnb_workers.worker.options import WorkerOptions

__all__ = ["GAUGES_S", "IDLE_TAIL_S", "TOKEN_NAMES_S", "Timer", "Timers"]

#: Seconds between two samples of the stream gauges (by the lease holder).
GAUGES_S = 5.0
#: Seconds between two publications of a worker's token names (when they changed).
TOKEN_NAMES_S = 60.0
#: Seconds between two tails of the log of a held replica that had no batch (a worker
#: serving many models: workers/worker/housekeeping.py ``DutyRound``).
IDLE_TAIL_S = 30.0


class Timer:
    """Due every ``period_s`` seconds (``time.monotonic()``), and at once at first (or
    at ``first_at``)."""

    __slots__ = ("period_s", "next_at", "stagger")

    def __init__(self, period_s: float, first_at: float = 0.0, stagger: float = 0.0) -> None:
        self.period_s = period_s
        self.next_at = first_at
        #: The first period is shorter by this share of it (then none): the timers of a
        #: worker's many models, all due at its start, come due apart afterwards.
        self.stagger = stagger

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def restart(self, now: float) -> None:
        """Due again ``period_s`` after ``now`` (the first time, less ``stagger`` of it)."""
        self.next_at = now + self.period_s * (1.0 - self.stagger)
        self.stagger = 0.0

    def fire(self, now: float) -> bool:
        """If due: True, and due again ``period_s`` from now."""
        if now < self.next_at:
            return False
        self.restart(now)
        return True

    def due_at_once(self) -> None:
        """Due at once."""
        self.next_at = 0.0


@dataclass(slots=True)
class Timers:
    """One model's timers in one worker."""

    heartbeat: Timer
    lease: Timer
    gauges: Timer
    cleanup: Timer
    observe: Timer
    claim: Timer
    trim_input: Timer
    names: Timer
    idle_tail: Timer

    @classmethod
    def for_options(cls, o: WorkerOptions, stagger: float = 0.0) -> Timers:
        """``stagger`` (0 to 1, a model's own: from its name): the periodic duties' first
        periods are shorter by half that share, so those of thousands of models started
        together are not all due in the same step ever after (not the removal of dead
        consumers: others get their whole ``stale_s`` to write a heartbeat)."""
        s = 0.5 * stagger
        return cls(heartbeat=Timer(o.heartbeat_s, stagger=s),
                   lease=Timer(o.lease_ms / 3000.0, stagger=s),
                   gauges=Timer(GAUGES_S, stagger=s), cleanup=Timer(o.stale_s),
                   observe=Timer(o.observe_model_s, stagger=s),
                   claim=Timer(max(0.05, o.claim_idle_ms / 2000.0), stagger=s),
                   names=Timer(TOKEN_NAMES_S), idle_tail=Timer(IDLE_TAIL_S, stagger=s),
                   # not at start: a worker just started has acknowledged nothing, and a
                   # group just set to start after old entries may yet be set back
                   trim_input=Timer(o.input_trim_s, time.monotonic() + o.input_trim_s))

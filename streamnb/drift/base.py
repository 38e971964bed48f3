"""The drift detector protocol and its alarm cool-down."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

#: Updates during which a detector's further alarms are suppressed after it alarmed.
DRIFT_COOLDOWN_SAMPLES = 500


class DriftDetector(ABC):
    """Base of every detector: counts updates and deduplicates alarms with a cool-down.

    A subclass decides when its test fires and calls :meth:`_alarm`, which returns True
    unless an alarm was already raised fewer than ``cooldown`` updates ago (then the alarm is
    counted in ``n_suppressed`` and dropped). ``drift_detected`` is True right after an
    update that raised an alarm, as in River.
    """

    #: Short name used as the ``detector`` metric label and in drift events.
    name: ClassVar[str] = "drift"

    def __init__(self, cooldown: int = DRIFT_COOLDOWN_SAMPLES) -> None:
        if cooldown < 0:
            raise ValueError(f"cooldown must be >= 0 updates, got {cooldown}")
        self.cooldown = int(cooldown)
        self.n_seen = 0
        self.n_alarms = 0
        self.n_suppressed = 0
        self.last_alarm_at: int | None = None
        self.drift_detected = False
        #: What moved at the last alarm (detector specific, msgpack/JSON friendly).
        self.last_change: dict[str, Any] = {}

    def _alarm(self, change: dict[str, Any]) -> bool:
        """Record an alarm at update ``n_seen`` unless it falls in the cool-down."""
        if self.last_alarm_at is not None and self.n_seen - self.last_alarm_at < self.cooldown:
            self.n_suppressed += 1
            return False
        self.last_alarm_at = self.n_seen
        self.n_alarms += 1
        self.last_change = change
        self.drift_detected = True
        return True

    @abstractmethod
    def _state(self) -> dict[str, Any]:
        """Detector-specific part of :meth:`state`."""

    def state(self) -> dict[str, Any]:
        """What the detector watches now, plus its alarm bookkeeping."""
        return {"detector": self.name, "n_seen": self.n_seen, "n_alarms": self.n_alarms,
                "n_suppressed": self.n_suppressed, "last_alarm_at": self.last_alarm_at,
                **self._state()}

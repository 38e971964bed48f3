"""A named group of statistics that merges, subtracts, scales and encodes as one.

A model's ``stats`` is a bundle, e.g. ``{"classes": ClassCounts, "features": FeatureCounts}``;
the daemon ships bundles as deltas without knowing what is inside.
"""

from __future__ import annotations

from typing import Any, Self

from streamnb.exceptions import FormatError
from streamnb.stats.base import Statistic


class StatsBundle(Statistic):
    """Statistics under fixed names; every operation applies part by part.

    >>> from streamnb.stats import ClassCounts
    >>> a = StatsBundle(classes=ClassCounts())
    >>> a["classes"].update(["x", "y", "x"])
    ClassCounts(x=2.0, y=1.0)
    >>> b = StatsBundle.from_bytes(a.to_bytes())
    >>> b["classes"].counts.tolist()
    [2.0, 1.0]
    """

    TYPE = "bundle"

    def __init__(self, **parts: Statistic) -> None:
        self.parts: dict[str, Statistic] = dict(parts)

    def __getitem__(self, name: str) -> Statistic:
        return self.parts[name]

    def __contains__(self, name: str) -> bool:
        return name in self.parts

    def __repr__(self) -> str:
        return f"StatsBundle({', '.join(self.parts)})"

    def _check_same_parts(self, other: StatsBundle) -> None:
        if not isinstance(other, StatsBundle):
            raise FormatError(f"expected a statistics bundle, got a {type(other).__name__}")
        if set(other.parts) != set(self.parts):
            raise FormatError(f"cannot combine bundles with parts {sorted(self.parts)} and "
                              f"{sorted(other.parts)}")

    def check_mergeable(self, other: Any) -> None:
        """FormatError unless ``other`` is a bundle of the same parts, each mergeable into
        this one's (see :meth:`Statistic.check_mergeable`): a worker's check of a delta.

        >>> from streamnb.stats import ClassCounts, FeatureCounts
        >>> model = StatsBundle(classes=ClassCounts(), features=FeatureCounts(4))
        >>> model.check_mergeable(StatsBundle(classes=ClassCounts(), features=FeatureCounts(5)))
        Traceback (most recent call last):
        streamnb.exceptions.FormatError: part 'features': feature_counts of 5 features do not fit 4
        """
        self._check_same_parts(other)
        for name, part in self.parts.items():
            try:
                part.check_mergeable(other.parts[name])
            except FormatError as exc:
                raise FormatError(f"part {name!r}: {exc}") from None

    def check_subtractable(self, other: StatsBundle) -> None:
        self._check_same_parts(other)
        for name, part in self.parts.items():
            part.check_subtractable(other.parts[name])

    def merge(self, other: StatsBundle) -> Self:
        self._check_same_parts(other)
        for name, part in self.parts.items():
            part.merge(other.parts[name])
        return self

    def subtract(self, other: StatsBundle, clip: bool = False) -> Self:
        """Every part checked before any changes (ValueError: nothing changed), unless
        ``clip`` (see :meth:`Statistic.subtract`)."""
        self._check_same_parts(other)
        if not clip:
            self.check_subtractable(other)
        for name, part in self.parts.items():
            part.subtract(other.parts[name], clip=True)  # (checked above)
        return self

    def remove_class(self, label: Any) -> bool:
        """Drop class ``label`` from every part (each a per-class statistic); True if some
        part held it.

        >>> from streamnb.stats import ClassCounts
        >>> b = StatsBundle(classes=ClassCounts(["Spam", "ham"], [2.0, 1.0]))
        >>> b.remove_class("Spam"), b["classes"].as_dict(), b.remove_class("Spam")
        (True, {'ham': 1.0}, False)
        """
        found = False
        for part in self.parts.values():
            found = part.remove_class(label) or found
        return found

    def scale(self, g: float) -> Self:
        for part in self.parts.values():
            part.scale(g)
        return self

    def copy(self) -> Self:
        return type(self)(**{k: v.copy() for k, v in self.parts.items()})

    def is_empty(self) -> bool:
        return all(p.is_empty() for p in self.parts.values())

    def to_dict(self) -> dict[str, Any]:
        return {"parts": {k: v.encode() for k, v in self.parts.items()}}

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> Self:
        parts = body.get("parts")
        if not isinstance(parts, dict) or not all(isinstance(k, str) for k in parts):
            raise FormatError("bundle without a map of named parts")
        return cls(**{k: Statistic.decode(v) for k, v in parts.items()})

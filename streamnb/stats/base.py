"""The statistic protocol and the class index every per-class statistic shares.

A *statistic* is a mergeable summary of data: ``merge`` adds another summary of other
data (associative, commutative up to float rounding, the empty statistic is its
identity), ``subtract`` removes one (unlearning), ``scale`` multiplies every weight by
``g`` (exponential forgetting). All four work in place and return ``self``.
``to_bytes`` / ``from_bytes`` give a compact, versioned msgpack encoding (never pickle).

Per-class statistics keep their rows in the order classes first arrived; they are
aligned *by label* when merged, so two workers that saw classes in a different order
still merge correctly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Self

import numpy as np

from streamnb.constants import STATS_FORMAT_VERSION
from streamnb.encoding import check_header, dumps, loads
from streamnb.exceptions import FormatError

Label = str | int

#: Every concrete statistic type by its ``TYPE`` tag, for decoding bundles.
STAT_TYPES: dict[str, type[Statistic]] = {}


def normalize_label(label: Any) -> Label:
    """Return ``label`` as a plain ``str`` or ``int``; raise ValueError for anything else."""
    if isinstance(label, (bool, np.bool_)):
        raise ValueError(f"labels must be str or int, got bool {label!r}")
    if isinstance(label, str):
        return str(label)  # np.str_ and other str subclasses become plain str
    if isinstance(label, (int, np.integer)):
        return int(label)
    raise ValueError(f"labels must be str or int, got {type(label).__name__} {label!r}")


def normalize_labels(labels: Iterable[Any]) -> list[Label]:
    """Normalise a sequence of labels, refusing a mix of str and int.

    >>> normalize_labels(["spam", np.str_("ham")]), normalize_labels([np.int64(3), 1])
    (['spam', 'ham'], [3, 1])
    """
    out = list(labels)
    kinds = set(map(type, out))  # the common case, labels of exactly str or int: no loop
    if kinds == {str} or kinds == {int} or not kinds:
        return out
    out = [normalize_label(v) for v in out]
    kinds = {type(v) for v in out}
    if len(kinds) > 1:
        raise ValueError("labels of mixed types: expected all str or all int, got both")
    return out


def check_scale_factor(g: float) -> float:
    g = float(g)
    if not (0.0 < g <= 1.0) or not np.isfinite(g):
        raise ValueError(f"scale factor must be in (0, 1], got {g}")
    return g


class ClassIndex:
    """Ordered set of class labels with label -> row lookup.

    >>> idx = ClassIndex(["spam"])
    >>> idx.rows_for(["ham", "spam"]).tolist()
    [1, 0]
    >>> idx.labels
    ['spam', 'ham']
    """

    __slots__ = ("labels", "_row")

    def __init__(self, labels: Sequence[Label] = ()) -> None:
        self.labels: list[Label] = []
        self._row: dict[Label, int] = {}
        self.rows_for(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __contains__(self, label: object) -> bool:
        return label in self._row

    def row(self, label: Label) -> int:
        return self._row[label]

    def rows_for(self, labels: Iterable[Any], add: bool = True) -> np.ndarray:
        """Row of each label, appending unseen labels when ``add`` (else KeyError)."""
        labels = normalize_labels(labels)
        if labels and self.labels and type(labels[0]) is not type(self.labels[0]):
            raise ValueError(
                f"labels of mixed types: the model has {type(self.labels[0]).__name__} "
                f"labels, got {type(labels[0]).__name__} {labels[0]!r}"
            )
        found = list(map(self._row.get, labels))  # one C-level lookup per label
        if None in found:
            for lab in dict.fromkeys(labels):  # distinct labels, in order of first appearance
                if lab not in self._row:
                    if not add:
                        raise KeyError(lab)
                    self._row[lab] = len(self.labels)
                    self.labels.append(lab)
            found = list(map(self._row.get, labels))
        return np.array(found, dtype=np.intp)

    def copy(self) -> ClassIndex:
        return ClassIndex(self.labels)

    def permutation_to(self, labels: Sequence[Any]) -> np.ndarray | None:
        """Rows that put this index in the order of ``labels`` (the same set), None if
        it is already in that order.

        >>> ClassIndex(["a", "b", "c"]).permutation_to(["c", "a", "b"]).tolist()
        [2, 0, 1]
        """
        labels = normalize_labels(labels)
        if labels == self.labels:
            return None
        if set(labels) != set(self.labels) or len(labels) != len(self.labels):
            raise ValueError(f"cannot reorder classes {self.labels!r} as {labels!r}")
        return self.rows_for(labels, add=False)


class Statistic(ABC):
    """Abstract mergeable statistic (see the module docstring)."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = STATS_FORMAT_VERSION

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "TYPE" in cls.__dict__:
            STAT_TYPES[cls.TYPE] = cls

    @abstractmethod
    def merge(self, other: Self) -> Self:
        """Add ``other``'s data to this statistic, in place."""

    @abstractmethod
    def subtract(self, other: Self) -> Self:
        """Remove ``other``'s data (previously merged or learnt) from this statistic."""

    @abstractmethod
    def scale(self, g: float) -> Self:
        """Multiply every weight by ``g`` in (0, 1] (exponential forgetting)."""

    @abstractmethod
    def copy(self) -> Self:
        """An independent deep copy."""

    @abstractmethod
    def is_empty(self) -> bool:
        """True when the statistic summarises no data (the identity of ``merge``)."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The msgpack-ready body of the encoding (without the type/version header)."""

    @classmethod
    @abstractmethod
    def from_dict(cls, body: dict[str, Any], version: int) -> Self:
        """Inverse of :meth:`to_dict`; must validate shapes and raise FormatError."""

    def encode(self) -> dict[str, Any]:
        return {"type": self.TYPE, "v": self.VERSION, **self.to_dict()}

    @classmethod
    def decode(cls, obj: Any) -> Statistic:
        """Decode an encoded map of this type (or, called on Statistic, of any type)."""
        if cls is Statistic or getattr(cls, "TYPE", None) is None:
            import streamnb.stats  # noqa: F401 - registers every statistic type

            if not isinstance(obj, dict) or obj.get("type") not in STAT_TYPES:
                tag = obj.get("type") if isinstance(obj, dict) else None
                raise FormatError(f"unknown statistic type {tag!r}")
            target = STAT_TYPES[obj["type"]]
        else:
            target = cls
        version = check_header(obj, target.TYPE, target.VERSION)
        body = {k: v for k, v in obj.items() if k not in ("type", "v")}
        try:
            return target.from_dict(body, version)
        except FormatError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"corrupt encoded {target.TYPE}: {exc}") from None

    def to_bytes(self) -> bytes:
        return dumps(self.encode())

    @classmethod
    def from_bytes(cls, data: bytes) -> Statistic:
        return cls.decode(loads(data))

"""The statistic protocol and the class index every per-class statistic shares.

A *statistic* is a mergeable summary of data: ``merge`` adds another summary of other
data (associative, commutative up to float rounding, the empty statistic is its
identity), ``subtract`` removes one (unlearning), ``scale`` multiplies every weight by
``g`` (exponential forgetting). All four work in place and return ``self``.
``to_bytes`` / ``from_bytes`` give a compact, versioned msgpack encoding (never pickle).

A statistic checks what it is given before changing anything: ``check_mergeable(other)``
raises :class:`~streamnb.exceptions.FormatError` unless ``other`` is a statistic of the
same kind and shape holding finite numbers (what a worker checks of every delta it reads
from the log), and ``subtract`` raises ValueError, leaving the statistic as it was,
when it would remove more weight than was learnt.

Per-class statistics keep their rows in sorted label order (:class:`ClassIndex`); they
are aligned *by label* when merged, so two workers that saw classes in a different
order hold the same arrays.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Self

import numpy as np

from streamnb.encoding import check_header, dumps, loads
from streamnb.exceptions import FormatError

#: Version of the statistics encoding written by ``to_bytes``. Readers refuse newer versions.
STATS_FORMAT_VERSION = 1

#: Unlearning (``subtract``) refuses to remove more weight than a statistic holds, beyond
#: this share of the numbers involved (rounding); a Gaussian class's M2 likewise may not
#: go below 0 by more than this share of its weighted sum of squares.
UNLEARN_RTOL = 1e-9

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
    """Sorted set of class labels with label -> row lookup.

    Rows follow the sorted order of the labels (scikit-learn's order of ``classes_``), so
    two statistics of the same data have the same layout whatever order their classes
    arrived in. Adding a label can move the rows after it: :meth:`add` says where each
    earlier row went, and the statistic moves its arrays to match.

    >>> idx = ClassIndex(["spam"])
    >>> idx.add(["ham", "spam", "eggs"]).tolist()     # spam moved from row 0 to row 2
    [2]
    >>> idx.labels, idx.rows_for(["spam", "ham"]).tolist()
    (['eggs', 'ham', 'spam'], [2, 1])
    """

    __slots__ = ("labels", "_row")

    def __init__(self, labels: Sequence[Label] = ()) -> None:
        self.labels: list[Label] = []
        self._row: dict[Label, int] = {}
        if labels:
            self.add(labels)

    @classmethod
    def of(cls, labels: Sequence[Any]) -> tuple[ClassIndex, np.ndarray | None]:
        """The index of distinct ``labels`` given in any order, and the rows of data laid
        out in that order that put it in sorted order (None: already sorted).

        >>> idx, order = ClassIndex.of(["b", "c", "a"])
        >>> idx.labels, order.tolist()
        (['a', 'b', 'c'], [2, 0, 1])
        """
        if not labels:
            return cls(), None
        labels = normalize_labels(labels)
        if len(set(labels)) != len(labels):
            raise ValueError(f"class labels must be distinct, got {labels!r}")
        index = cls(labels)
        if index.labels == labels:
            return index, None
        given = {lab: i for i, lab in enumerate(labels)}
        return index, np.array([given[lab] for lab in index.labels], dtype=np.intp)

    def __len__(self) -> int:
        return len(self.labels)

    def __contains__(self, label: object) -> bool:
        return label in self._row

    def row(self, label: Label) -> int:
        return self._row[label]

    def _check_type(self, labels: list[Label]) -> None:
        if labels and self.labels and type(labels[0]) is not type(self.labels[0]):
            raise ValueError(
                f"labels of mixed types: the model has {type(self.labels[0]).__name__} "
                f"labels, got {type(labels[0]).__name__} {labels[0]!r}"
            )

    def add(self, labels: Iterable[Any]) -> np.ndarray | None:
        """Insert the labels not known yet in sorted position; return the new row of each
        earlier row, or None when no label was new (no row moved)."""
        labels = normalize_labels(labels)
        self._check_type(labels)
        return self._insert(labels)

    def _insert(self, labels: list[Label]) -> np.ndarray | None:
        new = [lab for lab in dict.fromkeys(labels) if lab not in self._row]
        if not new:
            return None
        old = self.labels
        self.labels = sorted(old + new)  # type: ignore[type-var]
        self._row = {lab: i for i, lab in enumerate(self.labels)}
        if not old:
            return _NO_ROWS
        return np.fromiter(map(self._row.__getitem__, old), dtype=np.intp, count=len(old))

    def rows_adding(self, labels: Iterable[Any]) -> tuple[np.ndarray, np.ndarray | None]:
        """The row of each label, inserting the new ones (:meth:`add`), and where each
        earlier row went (None: none moved); one pass when every label is known."""
        labels = normalize_labels(labels)
        self._check_type(labels)
        found = list(map(self._row.get, labels))  # one C-level lookup per label
        moved = None
        if None in found:
            moved = self._insert(labels)
            found = list(map(self._row.get, labels))
        return np.array(found, dtype=np.intp), moved

    def rows_for(self, labels: Iterable[Any]) -> np.ndarray:
        """Row of each label (KeyError for a label not in the index)."""
        labels = normalize_labels(labels)
        self._check_type(labels)
        found = list(map(self._row.get, labels))  # one C-level lookup per label
        if None in found:
            raise KeyError(labels[found.index(None)])
        return np.array(found, dtype=np.intp)

    def remove(self, label: Any) -> int | None:
        """Take ``label`` out of the index; return the row it had (the rows after it move
        up by one), or None when it is not a class here.

        >>> idx = ClassIndex(["ham", "Spam", "spam"])
        >>> idx.remove("Spam"), idx.labels, idx.row("spam")
        (0, ['ham', 'spam'], 1)
        >>> idx.remove("eggs") is None
        True
        """
        try:
            label = normalize_label(label)
        except ValueError:
            return None
        row = self._row.get(label)
        if row is None or type(self.labels[row]) is not type(label):
            return None
        del self.labels[row]
        self._row = {lab: i for i, lab in enumerate(self.labels)}
        return row

    def copy(self) -> ClassIndex:
        out = ClassIndex.__new__(ClassIndex)
        out.labels, out._row = list(self.labels), dict(self._row)
        return out


#: No earlier rows (what :meth:`ClassIndex.add` answers for an index that was empty).
_NO_ROWS = np.zeros(0, dtype=np.intp)
_NO_ROWS.flags.writeable = False


def spread_rows(a: np.ndarray, moved: np.ndarray, n_rows: int) -> np.ndarray:
    """``a``'s rows at rows ``moved`` of a zero array of ``n_rows`` rows (what a statistic
    does with :meth:`ClassIndex.add`'s answer).

    >>> spread_rows(np.array([[1.0], [2.0]]), np.array([0, 2]), 3).tolist()
    [[1.0], [0.0], [2.0]]
    """
    out = np.zeros((n_rows,) + a.shape[1:], dtype=a.dtype)
    if moved.size:
        out[moved] = a
    return out


def check_removable(held: np.ndarray, removed: np.ndarray, what: str) -> None:
    """Raise ValueError where ``removed`` weight exceeds the ``held`` weight by more than
    rounding (:data:`~UNLEARN_RTOL`): unlearning data never learnt.

    >>> check_removable(np.array([2.0, 1.0]), np.array([2.0, 0.5]), "counts")
    >>> check_removable(np.array([2.0]), np.array([3.0]), "counts of class 'a'")
    Traceback (most recent call last):
    ValueError: cannot unlearn counts of class 'a': 3 to remove where 2 was learnt (data that was never learnt?); nothing changed
    """
    excess = removed - held
    bad = excess > UNLEARN_RTOL * (np.abs(held) + np.abs(removed))
    if bad.any():
        i = np.flatnonzero(bad.ravel())[0]
        raise ValueError(
            f"cannot unlearn {what}: {removed.ravel()[i]:g} to remove where "
            f"{held.ravel()[i]:g} was learnt (data that was never learnt?); nothing changed"
        )


class Statistic(ABC):
    """Abstract mergeable statistic (see the module docstring)."""

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = STATS_FORMAT_VERSION

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if "TYPE" in cls.__dict__:
            STAT_TYPES[cls.TYPE] = cls

    @abstractmethod
    def check_mergeable(self, other: Any) -> None:
        """Raise FormatError unless ``other`` can be merged into (or subtracted from) this
        statistic: the same type, the same fixed shape, finite non-negative weights."""

    @abstractmethod
    def check_subtractable(self, other: Self) -> None:
        """Raise ValueError if ``subtract(other)`` would remove weight never learnt."""

    @abstractmethod
    def merge(self, other: Self) -> Self:
        """Add ``other``'s data to this statistic, in place."""

    @abstractmethod
    def subtract(self, other: Self, clip: bool = False) -> Self:
        """Remove ``other``'s data (previously merged or learnt) from this statistic;
        ValueError, and nothing changed, if it holds more than was learnt. ``clip``:
        remove at most what is held instead, unchecked (a correction of data that a
        decay has shrunk since it was learnt)."""

    def remove_class(self, label: Any) -> bool:
        """Drop class ``label``'s row from this statistic, in place, as if none of its data
        had ever been learnt; False (nothing changed) when it is not a class here."""
        raise NotImplementedError(f"{type(self).__name__} has no per-class rows")

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
    def from_dict(cls, body: dict[str, Any]) -> Self:
        """Inverse of :meth:`to_dict`; must validate shapes and raise FormatError."""

    def _check_type(self, other: Any) -> None:
        if type(other) is not type(self):
            raise FormatError(f"cannot combine a {type(self).__name__} with a {type(other).__name__}")

    def encode(self) -> dict[str, Any]:
        return {"type": self.TYPE, "v": self.VERSION, **self.to_dict()}

    @classmethod
    def decode(cls, obj: Any) -> Statistic:
        """Decode an encoded map of this type (or, called on Statistic, of any type)."""
        if cls is Statistic or getattr(cls, "TYPE", None) is None:
            # deferred: the package streamnb.stats imports this module, then registers every
            # statistic type
            import streamnb.stats  # noqa: F401

            if not isinstance(obj, dict) or obj.get("type") not in STAT_TYPES:
                tag = obj.get("type") if isinstance(obj, dict) else None
                raise FormatError(f"unknown statistic type {tag!r}")
            target = STAT_TYPES[obj["type"]]
        else:
            target = cls
        check_header(obj, target.TYPE, target.VERSION)
        body = {k: v for k, v in obj.items() if k not in ("type", "v")}
        try:
            return target.from_dict(body)
        except FormatError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise FormatError(f"corrupt encoded {target.TYPE}: {exc}") from None

    def to_bytes(self) -> bytes:
        return dumps(self.encode())

    @classmethod
    def from_bytes(cls, data: bytes) -> Statistic:
        return cls.decode(loads(data))


def check_finite(what: str, *arrays: np.ndarray, nonnegative: bool = True) -> None:
    """FormatError if an array holds NaN or infinity (or, with ``nonnegative``, a weight
    below 0)."""
    for a in arrays:
        if a.size and not np.isfinite(a).all():
            raise FormatError(f"{what} holds NaN or infinity")
        if nonnegative and a.size and (a < 0).any():
            raise FormatError(f"{what} holds a negative weight")

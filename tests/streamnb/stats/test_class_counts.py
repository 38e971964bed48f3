"""ClassCounts against numpy: merge, subtract, scale, encoding, label alignment."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.encoding import dumps, loads
from streamnb.exceptions import FormatError
from streamnb.stats import ClassCounts

LABELS = ["ham", "spam", "eggs"]


def expected(labels: list[str], weights: np.ndarray) -> dict[str, float]:
    out: dict[str, float] = {}
    for lab, w in zip(labels, weights, strict=True):
        out[lab] = out.get(lab, 0.0) + float(w)
    return out


batches = st.lists(
    st.tuples(st.sampled_from(LABELS), st.floats(0.0, 10.0, allow_nan=False)), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(batch=batches, cuts=st.lists(st.integers(0, 40), max_size=4))
def test_merge_of_parts_equals_whole(batch, cuts):
    labels = [b[0] for b in batch]
    w = np.array([b[1] for b in batch])
    bounds = sorted({0, len(batch), *[min(c, len(batch)) for c in cuts]})
    total = ClassCounts()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        total.merge(ClassCounts().update(labels[lo:hi], w[lo:hi]))
    want = expected(labels, w)
    assert total.as_dict() == pytest.approx(want, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(batch=batches, cut=st.integers(0, 40))
def test_subtract_part_leaves_rest(batch, cut):
    labels = [b[0] for b in batch]
    w = np.array([b[1] for b in batch])
    cut = min(cut, len(batch))
    whole = ClassCounts().update(labels, w)
    whole.subtract(ClassCounts().update(labels[:cut], w[:cut]))
    rest = expected(labels[cut:], w[cut:])
    got = whole.as_dict()
    for lab, c in got.items():
        assert c == pytest.approx(rest.get(lab, 0.0), abs=1e-9)
        assert c >= 0.0


def test_scale_multiplies_weights():
    c = ClassCounts().update(["a", "b", "a"], [1.0, 4.0, 2.0]).scale(0.25)
    assert c.as_dict() == {"a": 0.75, "b": 1.0}
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        c.scale(1.5)


def test_empty_is_identity_and_alignment_by_label():
    a = ClassCounts().update(["x", "y"], [1.0, 2.0])
    before = a.as_dict()
    assert a.merge(ClassCounts()).as_dict() == before
    assert a.subtract(ClassCounts()).as_dict() == before
    b = ClassCounts().update(["y", "z", "x"], [10.0, 5.0, 1.0])
    assert a.merge(b).as_dict() == {"x": 2.0, "y": 12.0, "z": 5.0}
    assert ClassCounts().is_empty() and not a.is_empty()


def test_mixed_label_types_refused():
    a = ClassCounts().update(["x"])
    with pytest.raises(ValueError, match="mixed types"):
        a.update([1])
    with pytest.raises(ValueError, match="mixed types"):
        ClassCounts().update(["x", 1])


def test_round_trip_exact_and_corruption():
    a = ClassCounts().update([3, 1, 3], [0.1, 0.2, 1e-300])
    b = ClassCounts.from_bytes(a.to_bytes())
    assert b.labels == [1, 3] and b.counts.tobytes() == a.counts.tobytes()  # sorted
    enc = a.encode()
    enc["v"] = 99
    with pytest.raises(FormatError, match="version 99 is not 1"):
        ClassCounts.from_bytes(dumps(enc))
    enc = loads(a.to_bytes())
    enc["labels"] = [3]
    with pytest.raises(FormatError):
        ClassCounts.from_bytes(dumps(enc))
    with pytest.raises(FormatError):
        ClassCounts.from_bytes(a.to_bytes()[:-3])

"""Outputs and cache entries as the worker packs them (``streamnb._kernels.pack_map`` and
``pack_array`` where built, msgpack's dict and list without) against the oracle: the
bytes ``msgpack.packb(..., use_bin_type=True)`` gives for the map and list that
docs/protocol.md and workers/store/label_cache.py describe, built here by hand."""

from __future__ import annotations

import math
import struct

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamnb_workers.store import label_cache
from streamnb_workers.wire import outputs
from streamnb_workers.wire.codec import InputMessage
from streamnb_workers.worker.batch import Verdict

PATHS = [
    pytest.param(True, marks=pytest.mark.skipif(outputs._PACK_MAP is None, reason="no C")),
    False,
]


@pytest.fixture(params=PATHS, ids=["C", "msgpack"])
def c_path(request, monkeypatch):
    if not request.param:
        monkeypatch.setattr(outputs, "_PACK_MAP", None)
        monkeypatch.setattr(label_cache, "_PACK_ARRAY", None)
    return request.param


def oracle_output(msg, v, version, worker, learned, reason, was, challenger) -> bytes:
    """docs/protocol.md's output map, by hand: id, entry, label, log_proba, model_version,
    worker, then true_label and learned (labelled), reason (labelled or autolearnt), was
    (labelled), meta, a finite score, explain, threshold, proba and prior (not NaN),
    challenger, each where it has a value."""
    obj = {
        "id": msg.id,
        "entry": msg.entry_id,
        "label": v.label,
        "log_proba": {k: float(x) for k, x in v.log_proba.items()},
        "model_version": version,
        "worker": worker,
    }
    auto = msg.label is None and reason == "autolearnt"
    if msg.label is not None:
        obj["true_label"] = msg.label
        obj["learned"] = bool(learned)
    elif auto and learned is not None:
        obj["learned"] = bool(learned)
    if reason is not None and (msg.label is not None or auto):
        obj["reason"] = reason
    if was is not None and msg.label is not None:
        obj["was"] = was
    if msg.meta is not None:
        obj["meta"] = msg.meta
    if v.score is not None and math.isfinite(v.score):
        obj["score"] = float(v.score)
    if v.explanation is not None:
        obj["explain"] = v.explanation
    for name in ("threshold", "proba", "prior"):
        x = getattr(v, name)
        if x is not None and not math.isnan(x):
            obj[name] = float(x)
    if challenger is not None:
        obj["challenger"] = challenger
    return msgpack.packb(obj, use_bin_type=True)


labels = st.none() | st.sampled_from(["spam", "ham", "é"]) | st.integers(-3, 300)
maybe_float = st.none() | st.floats(allow_infinity=True, allow_nan=True)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # (c_path: one patch for all)
@given(
    label=labels,
    true_label=labels,
    lp=st.dictionaries(st.sampled_from(["spam", "ham", 7]), st.floats(allow_nan=False), max_size=3),
    score=maybe_float,
    threshold=maybe_float,
    proba=maybe_float,
    prior=maybe_float,
    learned=st.none() | st.booleans(),
    reason=st.none() | st.sampled_from(["already_learnt", "relearnt", "autolearnt"]),
    was=labels,
    meta=st.none()
    | st.dictionaries(st.text(max_size=4), st.integers(-(2**63), 2**64 - 1), max_size=2),
    explain=st.none() | st.just({"top": [["cheap", 1.5]]}),
    challenger=st.none() | st.just({"label": "spam", "log_proba": {"spam": -0.1}}),
    numpy_floats=st.booleans(),
)
def test_an_output_is_the_protocols_map(
    c_path,
    label,
    true_label,
    lp,
    score,
    threshold,
    proba,
    prior,
    learned,
    reason,
    was,
    meta,
    explain,
    challenger,
    numpy_floats,
):
    if numpy_floats:
        lp = {k: np.float32(x) if abs(x) < 1e30 else x for k, x in lp.items()}
    msg = InputMessage(
        entry_id="1-0", id="m1", payload_kind="tokens", payload=None, label=true_label, meta=meta
    )
    v = Verdict(label, lp, None, score, 1.0, explain, threshold, proba, None, prior)
    want = oracle_output(msg, v, "7", "w1", learned, reason, was, challenger)
    assert outputs.verdict_output(msg, v, "7", "w1", learned, reason, was, challenger) == want
    assert (
        outputs.output_for(
            msg,
            label,
            lp,
            "7",
            "w1",
            learned=learned,
            score=score,
            reason=reason,
            explain=explain,
            was=was,
            threshold=threshold,
            proba=proba,
            challenger=challenger,
            prior=prior,
        )
        == want
    )


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # (c_path: one patch for all)
@given(
    learnt=st.binary(max_size=300),
    row=st.binary(max_size=70000),
    pred=labels,
    lp=st.dictionaries(st.sampled_from(["spam", "ham"]), st.floats(allow_nan=False)),
    weight=st.floats(0.1, 5) | st.integers(1, 3),
    ts=st.floats(0, 2e9),
    key=st.none() | st.text(min_size=1, max_size=40),
    challenger=st.none() | st.tuples(st.none() | st.binary(max_size=20), st.floats(0.1, 3)),
)
def test_a_cache_entry_is_its_documented_list(
    c_path, learnt, row, pred, lp, weight, ts, key, challenger
):
    fields = [1, row, pred, {k: float(x) for k, x in lp.items()}, float(weight), float(ts)]
    if key is not None or challenger is not None:
        fields.append(key)
    if challenger is not None:
        fields.append([challenger[0], float(challenger[1])])
    want = struct.pack(">H", len(learnt)) + learnt + msgpack.packb(fields, use_bin_type=True)
    got = label_cache.encode_entry(learnt, row, pred, lp, weight, ts, key, challenger)
    assert got == want

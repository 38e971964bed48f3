"""The metric families: names, labels, and the vectorised histogram helper."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from streamnb_workers.observe.metrics import AGE_BUCKETS, Metrics, default_metrics, observe_many

ALLOWED_LABELS = {"model", "worker", "class", "predicted", "reason", "stage", "detector", "kind",
                  "stream", "other", "side", "right"}


def families():
    reg = CollectorRegistry()
    m = Metrics(reg)
    return m, [v for v in vars(m).values() if isinstance(v, (Counter, Gauge, Histogram))]


def test_every_family_is_namespaced_with_small_label_sets():
    m, fams = families()
    assert len(fams) >= 40
    for f in fams:
        assert f._name.startswith("streamnb_"), f._name
        assert set(f._labelnames) <= ALLOWED_LABELS, (f._name, f._labelnames)
        assert len(f._labelnames) <= 4, f._name
        if isinstance(f, Histogram):
            assert f._upper_bounds == sorted(f._upper_bounds)


def test_counters_expose_total_and_units_are_base():
    reg = CollectorRegistry()
    m = Metrics(reg)
    m.messages_read.labels(model="m", worker="w").inc(2)
    m.stage_seconds.labels(model="m", worker="w", stage="predict").observe(0.002)
    names = {s.name for fam in reg.collect() for s in fam.samples}
    assert "streamnb_messages_read_total" in names
    assert "streamnb_stage_duration_seconds_bucket" in names
    for fam in reg.collect():
        if fam.type == "counter":
            assert not fam.name.endswith("_total")   # the client appends it
        assert not any(unit in fam.name for unit in ("_ms", "_millis", "_kb"))


@pytest.mark.parametrize("buckets", [(0.5, 0.9, 0.99), AGE_BUCKETS])
def test_observe_many_equals_observe_one_by_one(buckets):
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.exponential(1.0, 500), [0.5, 0.9, 0.99, 0.0, 1e9]])
    values_with_nan = np.append(values, np.nan)
    reg_a, reg_b = CollectorRegistry(), CollectorRegistry()
    ha = Histogram("h", "x", ["model"], buckets=buckets, registry=reg_a).labels(model="m")
    hb = Histogram("h", "x", ["model"], buckets=buckets, registry=reg_b).labels(model="m")
    observe_many(ha, values_with_nan)
    for v in values:
        hb.observe(v)
    samples_a = {(s.name, tuple(sorted(s.labels.items()))): s.value
                 for fam in reg_a.collect() for s in fam.samples if not s.name.endswith("_created")}
    samples_b = {(s.name, tuple(sorted(s.labels.items()))): s.value
                 for fam in reg_b.collect() for s in fam.samples if not s.name.endswith("_created")}
    assert samples_a.keys() == samples_b.keys()
    for k in samples_a:
        assert samples_a[k] == pytest.approx(samples_b[k]), k
    assert reg_a.get_sample_value("h_count", {"model": "m"}) == len(values)


def test_observe_many_on_empty_input_records_nothing():
    reg = CollectorRegistry()
    h = Histogram("h", "x", buckets=(1.0,), registry=reg)
    observe_many(h, [])
    assert reg.get_sample_value("h_count") == 0.0


def test_default_metrics_is_a_process_singleton():
    assert default_metrics() is default_metrics()

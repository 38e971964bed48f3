"""Every series the Grafana dashboard queries exists on a fresh worker's ``/metrics``, at 0
until the first event: counters by reason, kind, stage and class included, so no panel
says "No data" on a healthy run.

A real ``streamnb worker`` process on a real redis-server is scraped right after it
started, before it handled any message: once on a model that has learnt two classes (a
restarted worker), once on a model no worker has served (only the series by class are
missing then: no class is known yet).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgpack
import pytest

from streamnb_workers.observe.metrics import REDIS_ERROR_KINDS, STAGES
from streamnb_workers.store.keys import ModelKeys
from tests.helpers.acl import cli_env, drained, start_worker_cli, stop, wait_until
from tests.helpers.http import get, sample
from tests.helpers.redis_server import free_port

pytestmark = [pytest.mark.redis, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "streamnb.json"
#: Series of Gaussian models only (a count model has no moments to compare).
GAUSSIAN_ONLY = {"streamnb_bhattacharyya_distance", "streamnb_bhattacharyya_bound",
                 "streamnb_feature_drift_divergence"}
#: Series of a model run with --target-fpr (a window of labelled scores) only.
OPERATING_POINT_ONLY = {"streamnb_operating_threshold", "streamnb_operating_point_supported",
                        "streamnb_operating_point_negatives", "streamnb_operating_prior"}
#: Series of a model run with --challenger only (workers/replication/challenger.py).
CHALLENGER_ONLY = {"streamnb_challenger_paired_total", "streamnb_challenger_verdicts_total"}
#: Series by class: they exist once the model knows a class.
#: Series of the worker, not of a model.
PER_WORKER = {"streamnb_redis_up"}
BY_CLASS = {"streamnb_model_class_weight", "streamnb_messages_learned_total",
            "streamnb_prequential_correct_total", "streamnb_prequential_predictions_total",
            "streamnb_delayed_correct_total", "streamnb_delayed_predictions_total"}


def dashboard_series() -> set[str]:
    """Every streamnb_* series name in the dashboard's queries."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    exprs += [v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
              for v in dash.get("templating", {}).get("list", [])]
    return set(re.findall(r"\bstreamnb_[a-z_]+", " ".join(str(e) for e in exprs)))


def documented_reasons() -> set[str]:
    """The reason codes of docs/protocol.md's table, plus the worker's own (docs/worker.md)."""
    text = (ROOT / "docs" / "protocol.md").read_text()
    table = text.split("## Reason codes", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", table, re.M)) | {"poison", "ref_expired"}


def fresh_worker_scrape(server, model: str, tmp_path: Path, learn: list[dict] | None) -> str:
    """/metrics of a worker process started on ``model`` (after another one learnt
    ``learn``), as soon as it sampled its gauges, before it handles any message."""
    r = server.client()
    if learn:
        log = tmp_path / "first.log"
        first = start_worker_cli(server.url, model, "first", log, env=cli_env())
        try:
            for m in learn:
                r.xadd(ModelKeys(model).input, {"data": msgpack.packb(m)})
            wait_until(lambda: drained(r, model), 60, "the first worker done", [first], [log])
        finally:
            assert stop([first]) == [0]
    port = free_port()
    log = tmp_path / "fresh.log"
    proc = start_worker_cli(server.url, model, "fresh", log, "--metrics-port", str(port),
                            env=cli_env())
    try:
        wait_until(lambda: sample(get(port, "/metrics")[1], "streamnb_snapshot_age_seconds",
                                  model=model) is not None, 30, "the gauges sampled", [proc], [log])
        wait_until(lambda: not learn or sample(get(port, "/metrics")[1],
                                               "streamnb_model_class_weight", model=model) is not None,
                   30, "the model observed", [proc], [log])
        return get(port, "/metrics")[1]
    finally:
        stop([proc])


def present(body: str, name: str, **labels: str) -> bool:
    if name in PER_WORKER:
        labels = {}
    for suffix in ("", "_count", "_bucket"):  # a histogram's samples
        if sample(body, name + suffix, **labels) is not None:
            return True
    return False


def test_a_restarted_worker_serves_every_dashboard_series(redis_server, tmp_path):
    learn = [{"text": "cheap meds now", "label": "spam"}, {"text": "meeting notes", "label": "ham"}]
    body = fresh_worker_scrape(redis_server, "dash", tmp_path, learn)
    missing = [n for n in sorted(dashboard_series() - GAUSSIAN_ONLY - OPERATING_POINT_ONLY - CHALLENGER_ONLY)
               if not present(body, n, model="dash")]
    assert not missing, f"series the dashboard reads, absent on a fresh worker: {missing}"
    mw = {"model": "dash", "worker": "fresh"}
    assert sample(body, "streamnb_messages_read_total", **mw) == 0.0, "fresh: nothing read yet"
    for reason in documented_reasons():
        assert sample(body, "streamnb_dead_letters_total", **mw, reason=reason) == 0.0, reason
    for kind in REDIS_ERROR_KINDS:
        assert sample(body, "streamnb_redis_errors_total", **mw, kind=kind) == 0.0, kind
    for stage in STAGES:
        assert sample(body, "streamnb_stage_duration_seconds_count", **mw, stage=stage) == 0.0
    for c in ("spam", "ham"):
        assert sample(body, "streamnb_prequential_correct_total", **mw, **{"class": c}) == 0.0
        for p in ("spam", "ham"):
            assert sample(body, "streamnb_prequential_predictions_total", **mw,
                          **{"class": c, "predicted": p}) == 0.0
    assert sample(body, "streamnb_redis_up", worker="fresh") == 1.0


def test_a_new_model_lacks_only_the_series_by_class(redis_server, tmp_path):
    body = fresh_worker_scrape(redis_server, "newdash", tmp_path, None)
    missing = {n for n in dashboard_series() - GAUSSIAN_ONLY - OPERATING_POINT_ONLY - CHALLENGER_ONLY if not present(body, n, model="newdash")}
    assert missing <= BY_CLASS, sorted(missing - BY_CLASS)
    assert sample(body, "streamnb_snapshot_age_seconds", model="newdash") == 0.0

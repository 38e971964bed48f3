"""End to end with a real Prometheus: redis-server, two worker processes, Prometheus scraping
them every second; labelled mail streamed through; then every PromQL expression of the
dashboard and of the alert rules evaluated through Prometheus's HTTP API.

Skips when prometheus or redis-server is missing. Uses the SpamAssassin corpus when present,
else synthetic token messages.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.helpers.prometheus import (
    MODEL,
    PROMETHEUS,
    http_get,
    labelled_messages,
    out_entries,
    query,
    scalar,
    send,
    wait_for,
)
from tests.helpers.prometheus_rules import (
    ALERTS,
    DASHBOARD,
    alert_rules,
    dashboard_exprs,
    substitute,
)

pytestmark = [
    pytest.mark.redis, pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package "
                       "prometheus; .ci/run installs it)"),
]


def test_dashboard_and_alert_queries_against_real_prometheus(stack):
    client, url = stack["client"], stack["prometheus"]
    messages = labelled_messages(800)
    send(client, messages[:700])
    # the last 100 arrive unlabelled; their labels come later (delayed labels)
    send(client, [{k: v for k, v in m.items() if k != "label"} for m in messages[700:]])
    wait_for(lambda: client.xlen(f"streamnb:{{{MODEL}}}:out") >= 800, 120, "800 predictions")
    send(client, [{"ref": m["id"], "label": m["label"]} for m in messages[700:]])

    def scored() -> list[dict]:
        return [e for e in out_entries(client)
                if e.get("true_label") is not None and e.get("label") is not None
                and e.get("id") in {m["id"] for m in messages[:700]}]

    # both workers took part
    wait_for(lambda: all(scalar(url, f'sum(streamnb_messages_read_total{{worker="w{i}"}})')
                         for i in (1, 2)), 30, "both workers to read messages")
    n_scored = len(scored())
    assert n_scored >= 600
    wait_for(lambda: scalar(url, "sum(streamnb_prequential_predictions_total)") == n_scored,
             30, f"Prometheus to scrape {n_scored} scored predictions")
    wait_for(lambda: (scalar(url, "sum(streamnb_delayed_predictions_total)") or 0) >= 100
             or None, 60, "delayed labels to be scored")

    # rate() and increase() need two samples in their window: let a few scrapes happen
    wait_for(lambda: (scalar(url, 'min(count_over_time(up{job="streamnb"}[15s]))') or 0) >= 4,
             30, "four scrapes of each worker")
    time.sleep(3.5)       # and a few more since the last series appeared (scrape interval 1s)

    # accuracy in PromQL == accuracy from :out (true_label vs the arg-max of log_proba: the
    # model's own class, which the label is unless the decision rule says "unsure")
    entries = scored()
    out_accuracy = sum(max(e["log_proba"], key=e["log_proba"].get) == e["true_label"]
                       for e in entries) / len(entries)
    promql_accuracy = scalar(url, "sum(streamnb_prequential_correct_total) / "
                                  "sum(streamnb_prequential_predictions_total)")
    assert promql_accuracy == pytest.approx(out_accuracy, abs=1e-12)
    assert out_accuracy > 0.5

    # every dashboard expression parses; overview and quality panels return data
    dash = json.loads(DASHBOARD.read_text())
    row = None
    empty: list[str] = []
    for p in dash["panels"]:
        if p["type"] == "row":
            row = p["title"]
            continue
        got_data = False
        for t in p["targets"]:
            expr = substitute(t["expr"], window="5m", rate_interval="15s")
            res = query(url, expr)
            assert res["status"] == "success", (p["title"], expr, res)
            got_data = got_data or bool(res["data"]["result"])
        if row in ("Overview", "Quality") and not got_data:
            empty.append(f"{p['title']}: {[t['expr'] for t in p['targets']]}")
    assert not empty, f"panels without data: {empty}"
    # a false-positive rate with no false positive is a series, not "no data" (the counter
    # of that confusion cell does not exist yet): a positive class nothing was ever
    # predicted as. Its value is 0, or NaN (0 / 0) where the counters were all created
    # before Prometheus first scraped them, as here, so increase() sees no change.
    fp_panel = next(p for p in dash["panels"] if p["title"].startswith("False-positive rate"))
    fp_expr = substitute(fp_panel["targets"][0]["expr"].replace("$positive", "no-such-class"),
                         window="5m")
    fp = query(url, fp_expr)["data"]["result"]
    assert [(r["metric"]["model"], r["value"][1] in ("0", "NaN")) for r in fp] == [(MODEL, True)]
    cell = ('sum by (model) (increase(streamnb_prequential_predictions_total'
            '{class!="no-such-class", predicted="no-such-class"}[5m]))')
    assert query(url, cell)["data"]["result"] == []  # (what the panel divided before)
    for title, expr in dashboard_exprs():
        res = query(url, substitute(expr))
        assert res["status"] == "success", (title, res)

    # every alert expression parses (and Prometheus loaded the rules without error)
    for rule in alert_rules():
        res = query(url, rule["expr"])
        assert res["status"] == "success", (rule["alert"], res)
    rules = json.loads(http_get(f"{url}/api/v1/rules"))["data"]["groups"]
    loaded = {r["name"]: r for g in rules for r in g["rules"]}
    assert set(ALERTS) <= set(loaded)
    assert all(r.get("health") in ("ok", "unknown") for r in loaded.values()), loaded
    # the two workers are up: no StreamnbWorkerDown
    assert scalar(url, 'count(up{job="streamnb"} == 1)') == 2
    # the confusion counters add up to what :out says per cell (the model's own class)
    for true in ("ham", "spam"):
        for pred in ("ham", "spam"):
            expected = sum(e["true_label"] == true and
                           max(e["log_proba"], key=e["log_proba"].get) == pred for e in entries)
            got = scalar(url, f'sum(streamnb_prequential_predictions_total{{class="{true}",'
                              f'predicted="{pred}"}})') or 0.0
            assert got == expected, (true, pred)

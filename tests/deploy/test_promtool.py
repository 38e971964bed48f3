"""Prometheus config, alert rules and the Grafana dashboard, checked offline (promtool)."""

from __future__ import annotations

import json
import re
import shutil

import yaml

from tests.helpers.prometheus_rules import (
    ALERTS,
    DASHBOARD,
    GRAFANA,
    PROM,
    ROOT,
    alert_rules,
    dashboard_exprs,
    needs_promtool,
    promtool,
    substitute,
)


@needs_promtool
def test_prometheus_config_is_valid():
    out = promtool("check", "config", "prometheus.yml")
    assert "1 rule files found" in out


@needs_promtool
def test_static_example_is_valid_when_uncommented(tmp_path):
    text = (PROM / "prometheus.yml").read_text()
    begin, end = text.index("(BEGIN STATIC EXAMPLE)"), text.index("(END STATIC EXAMPLE)")
    block = text[begin:end].splitlines()[1:-1]
    uncommented = [re.sub(r"^  # ", "  ", line) for line in block
                   if not line.strip().startswith("# #")]
    (tmp_path / "prometheus.yml").write_text(text[:begin] + "\n" + "\n".join(uncommented) + "\n")
    shutil.copy(PROM / "alerts.yml", tmp_path / "alerts.yml")
    promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    doc = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    assert jobs["streamnb-static"]["static_configs"][0]["targets"][1].endswith(":9501")
    assert jobs["streamnb"]["dns_sd_configs"][0]["names"] == ["worker"]


@needs_promtool
def test_alert_rules_are_valid():
    out = promtool("check", "rules", "alerts.yml")
    assert f"{len(ALERTS)} rules found" in out


@needs_promtool
def test_alert_rules_unit_tests_pass():
    out = promtool("test", "rules", "alerts_test.yml")
    assert "SUCCESS" in out


@needs_promtool
def test_every_dashboard_expression_parses(tmp_path):
    """promtool check rules parses each expression (as a recording rule)."""
    rules = [{"record": f"streamnb:dashboard:expr{i}", "expr": substitute(expr)}
             for i, (_, expr) in enumerate(dashboard_exprs())]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = promtool("check", "rules", str(path), cwd=tmp_path)
    assert f"{len(rules)} rules found" in out


def test_alerts_are_the_documented_set_with_runbooks():
    rules = alert_rules()
    assert [r["alert"] for r in rules if "alert" in r] == ALERTS or sorted(
        r["alert"] for r in rules) == sorted(ALERTS)
    runbook = ROOT / "docs" / "operations.md"
    headings = set()
    if runbook.exists():
        headings = {line.lstrip("#").strip().lower() for line in runbook.read_text().splitlines()
                    if line.startswith("#")}
    for r in rules:
        assert r["labels"]["severity"] in {"critical", "warning", "info"}
        url = r["annotations"]["runbook_url"]
        assert url == f"docs/operations.md#{r['alert'].lower()}"
        if headings:
            assert r["alert"].lower() in headings, f"no runbook section for {r['alert']}"
    tested = yaml.safe_load((PROM / "alerts_test.yml").read_text())
    covered = {t["alertname"] for case in tested["tests"] for t in case["alert_rule_test"]}
    assert covered == set(ALERTS)


def test_dashboard_is_provisionable():
    text = DASHBOARD.read_text()
    assert "${DS_" not in text and "__inputs" not in text
    dash = json.loads(text)
    assert dash["uid"] == "streamnb-overview"
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]
            for t in p["targets"]:
                assert t["datasource"]["uid"] == "${datasource}"
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows == ["Overview", "Quality", "Drift", "Internals", "Challenger"]


def test_dashboard_rows_cover_the_required_panels():
    dash = json.loads(DASHBOARD.read_text())
    by_row: dict[str, list[str]] = {}
    current = None
    for p in dash["panels"]:
        if p["type"] == "row":
            current = p["title"]
            by_row[current] = []
        else:
            by_row[current].append(" ".join([p["title"]] + [t["expr"] for t in p["targets"]]))
    need = {
        "Overview": ["messages_read", "group_lag", "worker_up", "Accuracy", "False-positive"],
        "Quality": ["Confusion", "Precision", "Recall", "log_loss", "confidence"],
        "Drift": ["drift_events", "oov", "prior_shift", "feature_drift"],
        "Internals": ["stage_duration", "batch_size", "commit_conflicts", "reconnects",
                      "dead_letters"],
        "Challenger": ["challenger_paired", "McNemar", "challenger_verdicts", "recall"],
    }
    for row, words in need.items():
        text = "\n".join(by_row[row])
        for w in words:
            assert w in text, (row, w)
    annotations = [a for a in dash["annotations"]["list"] if "expr" in a]
    assert any("streamnb_drift_events_total" in a["expr"] for a in annotations)


def test_grafana_provisioning_files():
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "streamnb.yml").read_text())
    assert prov["providers"][0]["type"] == "file"
    assert prov["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"

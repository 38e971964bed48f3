"""The alert rules and dashboard of deploy/, and promtool."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


PROM = ROOT / "deploy" / "prometheus"


GRAFANA = ROOT / "deploy" / "grafana"


DASHBOARD = GRAFANA / "dashboards" / "streamnb.json"


PROMTOOL = shutil.which("promtool")


ALERTS = ["StreamnbWorkerDown", "StreamnbRedisDown", "StreamnbModelUnreachable", "StreamnbLagGrowing",
          "StreamnbAccuracyLow",
          "StreamnbFalsePositiveRateHigh", "StreamnbDriftDetected", "StreamnbDeadLettersRising",
          "StreamnbSnapshotStale", "StreamnbWorkerErrors", "StreamnbTargetFprUnsupported"]


needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed "
                                    "(Debian package prometheus)")


def promtool(*args: str, cwd: Path = PROM) -> str:
    proc = subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


def substitute(expr: str, window: str = "5m", rate_interval: str = "1m") -> str:
    """Grafana variables -> concrete values, as Grafana would send the query."""
    return (expr.replace("$__rate_interval", rate_interval).replace("$__interval", "15s")
            .replace("$window", window).replace("$model", ".*").replace("$positive", "spam"))


def dashboard_exprs() -> list[tuple[str, str]]:
    """(panel title, expr) of every panel target and annotation of the dashboard."""
    dash = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in dash["panels"] for t in p.get("targets", [])]
    out += [(f"annotation {a['name']}", a["expr"]) for a in dash["annotations"]["list"]
            if "expr" in a]
    return out


def alert_rules() -> list[dict]:
    doc = yaml.safe_load((PROM / "alerts.yml").read_text())
    return [r for g in doc["groups"] for r in g["rules"]]

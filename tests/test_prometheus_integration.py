"""End to end with a real Prometheus: redis-server, two worker processes, Prometheus scraping
them every second; labelled mail streamed through; then every PromQL expression of the
dashboard and of the alert rules evaluated through Prometheus's HTTP API.

Skips when prometheus or redis-server is missing. Uses the SpamAssassin corpus when present,
else synthetic token messages.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
import yaml
from _redis_server import free_port
from conftest import CORPUS
from test_promtool import ALERTS, DASHBOARD, PROM, alert_rules, dashboard_exprs, substitute

PROMETHEUS = shutil.which("prometheus")
MODEL = "mail"
ROOT = Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.redis, pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package "
                       "prometheus; .ci/run installs it)"),
]


# ------------------------------------------------------------------------- processes
def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - localhost only
        return resp.read()


def wait_http(url: str, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}: {out[-3000:]}")
        try:
            http_get(url, timeout=1.0)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer on {url} within {timeout}s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_worker(redis_url: str, consumer: str, port: int, log: Path,
                 extra: tuple[str, ...] = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "streamnb_workers", "worker", "--redis", redis_url, "--model", MODEL,
           "--kind", "multinomial", "--metrics-port", str(port), "--consumer", consumer,
           "--block-ms", "100", "--log-level", "WARNING", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wait_http(f"http://127.0.0.1:{port}/metrics", proc, f"worker {consumer} (log {log})")
    return proc


def start_prometheus(ports: list[int], tmp: Path) -> tuple[subprocess.Popen, str]:
    shutil.copy(PROM / "alerts.yml", tmp / "alerts.yml")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["alerts.yml"],
        "scrape_configs": [{"job_name": "streamnb", "static_configs": [
            {"targets": [f"127.0.0.1:{p}" for p in ports]}]}],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    proc = subprocess.Popen(
        [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/-/ready", proc, "prometheus")
    return proc, url


def query(url: str, expr: str) -> dict:
    q = urllib.parse.urlencode({"query": expr, "time": f"{time.time():.3f}"})
    try:
        body = http_get(f"{url}/api/v1/query?{q}")
    except urllib.error.HTTPError as exc:      # 400: the expression does not parse
        body = exc.read()
    return json.loads(body)


def scalar(url: str, expr: str) -> float | None:
    res = query(url, expr)
    assert res["status"] == "success", (expr, res)
    result = res["data"]["result"]
    return float(result[0]["value"][1]) if result else None


# ------------------------------------------------------------------------- messages
def labelled_messages(n: int) -> list[dict]:
    """n labelled messages: corpus mail (seeded sample) if present, else synthetic tokens."""
    rng = random.Random(5)
    index = CORPUS / "index.tsv"
    if index.exists():
        rows = [line.split("\t") for line in index.read_text().splitlines()[1:]]
        rows = rng.sample(rows, n)
        return [{"id": f"m{i}", "raw": (CORPUS / path).read_bytes(), "label": label}
                for i, (path, label, _) in enumerate(rows)]
    spam_words = ["cheap", "offer", "money", "click", "free", "win"]
    ham_words = ["meeting", "project", "lunch", "report", "team", "patch", "review"]
    out = []
    for i in range(n):
        spam = rng.random() < 0.3
        words = [rng.choice(spam_words if spam and rng.random() < 0.5 else ham_words)
                 for _ in range(20)]
        out.append({"id": f"m{i}", "tokens": words, "label": "spam" if spam else "ham"})
    return out


def send(client, messages: list[dict]) -> None:
    pipe = client.pipeline(transaction=False)
    for m in messages:
        pipe.xadd(f"streamnb:{{{MODEL}}}:in", {"data": msgpack.packb(m, use_bin_type=True)})
    pipe.execute()


def out_entries(client) -> list[dict]:
    return [msgpack.unpackb(f[b"data"], raw=False)
            for _, f in client.xrange(f"streamnb:{{{MODEL}}}:out")]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


# ------------------------------------------------------------------------- fixture
@pytest.fixture
def stack(redis_server) -> Iterator[dict]:
    tmp = Path(tempfile.mkdtemp(prefix="streamnb-prom-"))
    procs: list[subprocess.Popen] = []
    try:
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            procs.append(start_worker(redis_server.url, f"w{i + 1}", port, tmp / f"w{i + 1}.log"))
        prom, url = start_prometheus(ports, tmp)
        procs.append(prom)
        yield {"client": redis_server.client(), "prometheus": url, "ports": ports, "tmp": tmp}
    finally:
        for p in procs:
            stop(p)
        shutil.rmtree(tmp, ignore_errors=True)


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

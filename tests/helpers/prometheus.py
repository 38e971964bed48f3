"""A real Prometheus scraping real workers."""

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

from tests.helpers.corpus import CORPUS
from tests.helpers.prometheus_rules import (
    PROM,
)
from tests.helpers.redis_server import free_port

PROMETHEUS = shutil.which("prometheus")


MODEL = "mail"


ROOT = Path(__file__).resolve().parents[2]


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
           "--block-ms", "100", "--log-level", "WARNING", "--classes", "any", *extra]
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

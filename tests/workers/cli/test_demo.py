"""streamnb demo: runs with no Redis given, on a private server or fakeredis, never on 6379."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tarfile
import threading
from importlib import resources

import pytest

from streamnb_workers.cli.demo import SAMPLE_NAME, load_sample


class PortWatch:
    """Listen on 127.0.0.1:6379 (if free) and count connections: the demo must make none."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind(("127.0.0.1", 6379))
        except OSError:
            self.sock.close()
            self.sock = None
            return
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                continue

    def close(self) -> None:
        if self.sock is not None:
            self.stop.set()
            self.thread.join(2)
            self.sock.close()


def run_demo(*extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")}
    return subprocess.run([sys.executable, "-m", "streamnb_workers", "demo", *extra],
                          capture_output=True, text=True, timeout=90, env=env)


def check_report(proc, n=600):
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"predicted  {n}/{n}" in out
    m = re.search(r"online accuracy: ([\d.]+)% of (\d+)", out)
    assert m and int(m.group(2)) == n
    spam = re.search(r"spam caught (\d+)/(\d+), ham recognised (\d+)/(\d+)", out)
    n_spam = sum(1 for s in load_sample(limit=n) if s.label == "spam")
    assert spam and int(spam.group(2)) == n_spam and int(spam.group(4)) == n - n_spam
    # accuracy printed = (spam caught + ham recognised) / n, recomputed from the printed counts
    right = int(spam.group(1)) + int(spam.group(3))
    assert float(m.group(1)) == pytest.approx(100.0 * right / n, abs=0.05)
    assert "both workers at the same version" in out
    shares = re.search(r"predictions by worker: demo-worker-0 (\d+), demo-worker-1 (\d+)", out)
    assert shares and int(shares.group(1)) > 0 and int(shares.group(2)) > 0  # both took part
    assert int(shares.group(1)) + int(shares.group(2)) == n
    assert re.search(r"metrics were served at http://127\.0\.0\.1:\d+/metrics, http://127\.0\.0\.1:\d+/metrics", out)
    assert "tokens:" in out
    assert "learnt: 600 messages" in out or n != 600
    return out


@pytest.mark.parametrize("extra, backend", [((), None), (("--embedded", "fakeredis"), "in-process fakeredis")])
def test_demo_without_redis(extra, backend):
    watch = PortWatch()
    try:
        proc = run_demo(*extra)
    finally:
        watch.close()
    out = check_report(proc)
    if backend:
        assert f"redis:   {backend}" in out
    else:
        assert ("private redis-server at redis://127.0.0.1:" in out) or ("in-process fakeredis" in out)
        assert ":6379/" not in out
    if watch.sock is not None:
        assert watch.connections == 0


@pytest.mark.redis
def test_demo_on_a_given_redis_refuses_existing_model(redis_server):
    proc = run_demo("--redis", redis_server.url, "--messages", "120")
    check_report(proc, n=120)
    again = run_demo("--redis", redis_server.url, "--messages", "120")
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1].endswith("pick another name with --model")


def test_shipped_sample_is_small_and_has_its_notice():
    data = resources.files("streamnb").joinpath("data")
    sample = data.joinpath(SAMPLE_NAME)
    with resources.as_file(sample) as p:
        assert p.stat().st_size <= 2 * 1024 * 1024
        with tarfile.open(p, "r:xz") as tar:
            names = tar.getnames()
    notice = data.joinpath("NOTICE").read_text()
    assert "https://spamassassin.apache.org/old/publiccorpus/" in notice
    msgs = load_sample()
    assert len(msgs) == len(names) - 1 == 600
    ts = [m.ts for m in msgs]
    assert ts == sorted(ts)  # index (date) order


def test_sample_matches_the_corpus(corpus_dir):
    lines = (corpus_dir / "index.tsv").read_text().splitlines()[1:]
    rows = [line.split("\t") for line in lines]
    spam_share = sum(r[1] == "spam" for r in rows) / len(rows)
    msgs = load_sample()
    assert sum(m.label == "spam" for m in msgs) / len(msgs) == pytest.approx(spam_share, abs=0.02)
    by_path = {r[0]: r for r in rows}
    for m in msgs[::50]:
        assert by_path[m.path][1] == m.label
        assert (corpus_dir / m.path).read_bytes() == m.raw

"""Benchmark: ``streamnb spamd`` and ``streamnb rspamd`` - requests/s and the latency of a
check, next to ``streamnb milter``'s mails/s on the same mails and workers.

A private redis-server; a model with the daemon's defaults learnt from the first
``--train`` mails of the corpus; the three front ends in front of the same workers. The
next ``--mails`` mails (unlabelled) are checked by ``--sessions`` concurrent clients, each
mail after the previous one:

- milter: a direct milter-protocol client, one kept connection per session
  (benchmarks.milter_client, as benchmarks.milter drives it);
- spamd: ``CHECK SPAMC/1.5`` on a new connection per mail (as spamc does), a socket
  client in this process, so that starting a spamc process is not counted; then the real
  ``spamc -c`` (one process per mail, as an MTA's pipe runs it);
- rspamd: ``POST /checkv2`` on a new connection per mail (http.client; rspamc speaks
  HTTP/1.0 with one request per connection).

``requests/s`` is mails answered / wall time; ``p50``/``p99`` the whole exchange of one
mail. Then each with one session (no queueing).

    python -m benchmarks.protocols [--mails 400] [--train 2000] [--workers 1] [--sessions 8]
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from benchmarks._common import (
    DEFAULT_CORPUS,
    ROOT,
    Corpus,
    RedisServer,
    corpus_or_synthetic,
    format_table,
    free_port,
    percentiles,
    print_header,
)
from benchmarks.end_to_end import default_spec, encode_messages, keys, prefill, wait_for, workers
from benchmarks.milter import SPAMC, MilterServer, Run, milter_run, run_sessions

TIMEOUT_S = 30.0


class ProtocolServer:
    """``streamnb spamd|rspamd`` for model ``name`` on a free port (killed on exit)."""

    def __init__(self, command: str, url: str, name: str) -> None:
        self.port = free_port()
        self.argv = [sys.executable, "-m", "streamnb_workers", command, "--redis", url,
                     "--model", name, "--listen", f"127.0.0.1:{self.port}", "--timeout",
                     str(TIMEOUT_S), "--max-connections", "256", "--log-level", "WARNING"]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ProtocolServer:
        from streamnb_workers.cli.launch import blas_env

        self.proc = subprocess.Popen(self.argv, cwd=ROOT, env=blas_env(dict(os.environ)))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return self
            except OSError:
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"{self.argv[3]} did not start")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _spamd_check(port: int, raw: bytes) -> str | None:
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S + 10) as s:
        s.sendall(b"CHECK SPAMC/1.5\r\nContent-length: %d\r\n\r\n" % len(raw) + raw)
        s.shutdown(socket.SHUT_WR)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    if not reply.startswith(b"SPAMD/1.1 0 EX_OK"):
        return None
    return "spam" if b"Spam: True" in reply else "ham"


def _spamc_check(port: int, raw: bytes) -> str | None:
    proc = subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(port), "-c"], input=raw,
                          capture_output=True, timeout=TIMEOUT_S + 10)
    if proc.stdout.startswith(b"0/0"):
        return None
    return "spam" if proc.returncode == 1 else "ham"


def _rspamd_check(port: int, raw: bytes) -> str | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S + 10)
    try:
        conn.request("POST", "/checkv2", body=raw)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200:
        return None
    return "spam" if b'"action": "add header"' in body else "ham"


def client_run(system: str, check: Any, port: int, mails: Sequence[tuple[bytes, str]],
               n_workers: int, n_sessions: int) -> Run:
    run = Run(system, n_workers, n_sessions)

    def one(state: dict[str, Any], raw: bytes, label: str) -> tuple[float, str | None, str]:
        t0 = time.perf_counter()
        verdict = check(port, raw)
        return time.perf_counter() - t0, verdict, label

    run.seconds, results = run_sessions(n_sessions, mails, one)
    run.mails = len(results)
    run.whole = [r[0] for r in results]
    run.right = sum(1 for r in results if r[1] == r[2])
    run.not_scored = sum(1 for r in results if r[1] is None)
    return run


def bench(corpus: Corpus, n_train: int, n_mails: int, worker_counts: Sequence[int],
          n_sessions: int) -> list[Run]:
    train = encode_messages(Corpus(corpus.raws[:n_train], corpus.labels[:n_train]), "raw")
    held = list(zip(corpus.raws[n_train:], corpus.labels[n_train:], strict=True))
    mails = [held[i % len(held)] for i in range(n_mails)]
    few = mails[: max(n_mails // 4, 20)]
    runs: list[Run] = []
    with RedisServer() as server:
        client = server.client()
        for n_workers in worker_counts:
            name = f"protocols-{n_workers}w"
            prefill(client, name, train)
            with workers(server.url, default_spec(name), n_workers) as procs:
                if not wait_for(client, keys(name)["out"], len(train), 900, procs,
                                keys(name)["dead"]):
                    raise RuntimeError("the workers did not learn the training mails")
                with MilterServer(server.url, name) as milter:
                    milter_run(milter.port, mails[:20], n_workers, 2)  # warm-up
                    runs.append(milter_run(milter.port, mails, n_workers, n_sessions))
                    runs.append(milter_run(milter.port, few, n_workers, 1))
                clients = [("streamnb spamd (CHECK)", "spamd", _spamd_check),
                           ("streamnb rspamd (/checkv2)", "rspamd", _rspamd_check)]
                if SPAMC is not None:
                    clients.append(("spamc -c -> streamnb spamd", "spamd", _spamc_check))
                for system, command, check in clients:
                    with ProtocolServer(command, server.url, name) as srv:
                        client_run(system, check, srv.port, mails[:20], n_workers, 2)
                        runs.append(client_run(system, check, srv.port, mails, n_workers,
                                               n_sessions))
                        runs.append(client_run(system, check, srv.port, few, n_workers, 1))
            client.flushdb()
    return runs


HEADERS = ["system", "workers", "sessions", "mails", "requests/s", "p50 ms", "p99 ms",
           "right", "not scored"]


def _row(run: Run) -> list[Any]:
    whole = percentiles([s * 1e3 for s in run.whole])
    return [run.system, run.workers, run.sessions, run.mails,
            run.mails / run.seconds if run.seconds else float("nan"), *whole,
            run.right / run.mails if run.mails else float("nan"), run.not_scored]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--train", type=int, default=2000, help="mails learnt first (labelled)")
    ap.add_argument("--mails", type=int, default=400, help="mails measured (unlabelled)")
    ap.add_argument("--workers", default="1", help="worker counts")
    ap.add_argument("--sessions", type=int, default=8, help="concurrent clients")
    args = ap.parse_args(argv)
    print_header("streamnb spamd and rspamd next to the milter: requests/s, latency",
                 "benchmarks.protocols", argv)
    corpus = corpus_or_synthetic(args.corpus)
    if len(corpus) <= args.train:
        args.train = len(corpus) // 2
    runs = bench(corpus, args.train, args.mails, [int(w) for w in args.workers.split(",")],
                 args.sessions)
    print(f"{len(corpus)} corpus mails: {args.train} learnt first, {args.mails} measured "
          "(held-out, repeated if fewer); milter: one kept milter connection per session; "
          "spamd, rspamd: a new connection per mail; p50/p99 = one mail's whole exchange "
          "(spamc: the whole spamc run); right = verdict equal to the corpus label")
    print(format_table(HEADERS, [_row(r) for r in runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

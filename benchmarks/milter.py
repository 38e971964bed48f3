"""Benchmark: ``streamnb milter`` - mails/s and the latency it adds per mail, with 1 and
2 workers, next to ``spamc`` against ``spamd`` (SpamAssassin) on the same mails.

A private redis-server; a model with the daemon's defaults learnt from the first
``--train`` mails of the corpus (labelled, chronological); ``streamnb milter`` in front
of it. The milter is driven by a **direct milter-protocol client** (benchmarks.milter_client,
the MTA's side as Postfix speaks it: protocol 6, the steps and replies the milter
negotiated away not sent), not through Postfix, so that Postfix's own costs (queue files,
fsync, delivery) are not counted. The next ``--mails`` mails of the corpus (unlabelled)
are sent by ``--sessions`` concurrent connections, each mail after the previous one on
its connection:

- ``mails/s``: mails answered / wall time of the measured run;
- ``eod p50/p99``: from the end of the mail's data to the milter's answer, what an SMTP
  client waits for at the final ``.`` beyond the MTA's own work (the added latency);
- ``mail p50/p99``: the whole milter conversation of one mail (headers, body, answer).

Then one session alone (no queueing): the latency of one mail at a time.

With ``--postfix`` (root, Debian's postfix), the same mails go over SMTP (smtplib, one kept
connection per session) through a private Postfix (benchmarks.postfix_instance) whose
``smtpd_milters`` is the milter on TCP, then on a unix socket, then no milter at all: the
difference is what the milter adds to an SMTP transaction, Postfix's side included.

spamd (when ``spamd`` and ``spamc`` are installed): started on loopback with its children
running as ``debian-spamd``, ``--max-children`` = the worker count, local tests only
(``-L``: no network here) and no user configs; each mail is one ``spamc`` process (as an
MTA's pipe or a content filter runs it), full message back, ``--sessions`` at a time.
``mail p50/p99`` for spamc is the whole ``spamc`` run.

    python -m benchmarks.milter [--mails 400] [--train 2000] [--workers 1,2] [--sessions 8]
        [--postfix] [--no-spamd]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
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
from benchmarks.milter_client import MilterClient

SPAMD = shutil.which("spamd") or ("/usr/sbin/spamd" if os.path.exists("/usr/sbin/spamd") else None)
SPAMC = shutil.which("spamc")
#: The milter's deadline in this benchmark: long, so that no mail goes unscored.
TIMEOUT_S = 30.0


@dataclass
class Run:
    """One measured run: who, with how many workers (or spamd children) and sessions."""

    system: str
    workers: int
    sessions: int
    mails: int = 0
    seconds: float = 0.0
    #: end of data -> answer, per mail (milter only), seconds
    eod: list[float] = field(default_factory=list)
    #: the whole conversation (milter) or spamc run, per mail, seconds
    whole: list[float] = field(default_factory=list)
    #: mails whose verdict matched the corpus label (milter), or scored as spam/ham (spamc)
    right: int = 0
    not_scored: int = 0

    def row(self) -> list[Any]:
        eod = percentiles([s * 1e3 for s in self.eod]) if self.eod else [float("nan")] * 2
        whole = percentiles([s * 1e3 for s in self.whole])
        right = self.right / self.mails if self.mails and self.right >= 0 else float("nan")
        return [self.system, self.workers, self.sessions, self.mails,
                self.mails / self.seconds if self.seconds else float("nan"),
                *eod, *whole, right, self.not_scored]


def run_sessions(n_sessions: int, mails: Sequence[tuple[bytes, str]], one: Any) -> tuple[float, list]:
    """Run ``one(session index, mail, label)`` for every mail, ``n_sessions`` threads taking
    mails in turn; (wall seconds, the results in order of completion)."""
    results: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def session(k: int) -> None:
        try:
            state: dict[str, Any] = {}
            try:
                for i in range(k, len(mails), n_sessions):
                    r = one(state, *mails[i])
                    with lock:
                        results.append(r)
            finally:
                if "close" in state:
                    state["close"]()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=session, args=(k,)) for k in range(n_sessions)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return seconds, results


# ----------------------------------------------------------------------- milter
class MilterServer:
    """``streamnb milter`` for model ``name`` on a free port and a unix socket (two
    processes; killed on exit)."""

    def __init__(self, url: str, name: str) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="streamnb-bench-milter-"))
        self.socket = self.dir / "milter.sock"
        self.log = self.dir / "milter.log"
        self.argvs = [[sys.executable, "-m", "streamnb_workers", "milter", "--redis", url,
                       "--model", name, "--listen", listen, "--socket-mode", "666",
                       "--timeout", str(TIMEOUT_S), "--log-level", "WARNING"]
                      for listen in (f"inet:{self.port}@127.0.0.1", f"unix:{self.socket}")]
        self.procs: list[subprocess.Popen] = []

    @property
    def postfix_addresses(self) -> dict[str, str]:
        """How Postfix names the two sockets, by kind."""
        return {"inet": f"inet:127.0.0.1:{self.port}", "unix": f"unix:{self.socket}"}

    def __enter__(self) -> MilterServer:
        from streamnb_workers.cli.launch import blas_env

        self.dir.chmod(0o755)  # Postfix's processes reach the socket
        with open(self.log, "ab") as out:
            self.procs = [subprocess.Popen(argv, cwd=ROOT, env=blas_env(dict(os.environ)),
                                           stdout=out, stderr=subprocess.STDOUT)
                          for argv in self.argvs]
        deadline = time.monotonic() + 30
        if not _listening(self.port, 30, self.procs[0]) or not _until(
                self.socket.exists, deadline, self.procs[1]):
            self.__exit__()
            raise RuntimeError(f"streamnb milter did not start: {self.log.read_text()}")
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # a graceful stop waits for libmilter's 5 s poll
                proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _until(done: Any, deadline: float, proc: subprocess.Popen) -> bool:
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _listening(port: int, timeout: float, proc: subprocess.Popen) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def milter_run(port: int, mails: Sequence[tuple[bytes, str]], n_workers: int,
               n_sessions: int) -> Run:
    run = Run("streamnb milter", n_workers, n_sessions)

    def one(state: dict[str, Any], raw: bytes, label: str) -> tuple[float, float, str | None, str]:
        if "mta" not in state:
            state["mta"] = MilterClient(("127.0.0.1", port), timeout=TIMEOUT_S + 10)
            state["close"] = state["mta"].close
        t0 = time.perf_counter()
        result = state["mta"].send_mail(raw)
        return (time.perf_counter() - t0, result.end_of_data_seconds,
                result.header("X-Streamnb-Verdict"), label)

    run.seconds, results = run_sessions(n_sessions, mails, one)
    run.mails = len(results)
    run.whole = [r[0] for r in results]
    run.eod = [r[1] for r in results]
    run.right = sum(1 for r in results if r[2] == r[3])
    run.not_scored = sum(1 for r in results if r[2] is None or r[2].startswith("not-scored"))
    return run


def bench_milter(corpus: Corpus, n_train: int, n_mails: int, worker_counts: Sequence[int],
                 n_sessions: int, postfix: bool = False) -> list[Run]:
    train = encode_messages(Corpus(corpus.raws[:n_train], corpus.labels[:n_train]), "raw")
    held = list(zip(corpus.raws[n_train:], corpus.labels[n_train:], strict=True))
    mails = [held[i % len(held)] for i in range(n_mails)]
    runs: list[Run] = []
    with RedisServer() as server:
        client = server.client()
        for n_workers in worker_counts:
            name = f"milter-{n_workers}w"
            prefill(client, name, train)
            with workers(server.url, default_spec(name), n_workers) as procs:
                if not wait_for(client, keys(name)["out"], len(train), 900, procs, keys(name)["dead"]):
                    raise RuntimeError("the workers did not learn the training mails")
                with MilterServer(server.url, name) as milter:
                    milter_run(milter.port, mails[:20], n_workers, 2)  # warm-up
                    runs.append(milter_run(milter.port, mails, n_workers, n_sessions))
                    runs.append(milter_run(milter.port, mails[: max(n_mails // 4, 20)],
                                           n_workers, 1))
                    if postfix:
                        for kind, address in milter.postfix_addresses.items():
                            runs += bench_postfix(mails, n_workers, n_sessions,
                                                  f"Postfix + milter ({kind})", address)
            client.flushdb()
    if postfix:
        runs += bench_postfix(mails, 0, n_sessions, "Postfix, no milter", "")
    return runs


# ---------------------------------------------------------------------- Postfix
def bench_postfix(mails: Sequence[tuple[bytes, str]], n_workers: int, n_sessions: int,
                  system: str, milter: str) -> list[Run]:
    """SMTP transactions through a private Postfix whose smtpd_milters is ``milter``:
    ``n_sessions`` connections at a time, then one."""
    from benchmarks.postfix_instance import PostfixInstance

    crlf = [(re.sub(rb"\r?\n", b"\r\n", raw), label) for raw, label in mails]
    runs = []
    with PostfixInstance(free_port(), milter) as pf:
        sent = smtp_run(pf, crlf[:20], system, n_workers, 2).mails  # warm-up
        for sessions, some in ((n_sessions, crlf), (1, crlf[: max(len(crlf) // 4, 20)])):
            _delivered(pf, sent)  # the mails before are all in the mailbox
            run = smtp_run(pf, some, system, n_workers, sessions)
            new = _delivered(pf, sent + run.mails)[sent:]
            sent += run.mails
            run.not_scored = (run.mails - len(new)) + (sum(
                1 for m in new if (v := _verdict(m)) is None or v.startswith("not-scored"))
                if milter else 0)
            runs.append(run)
    return runs


def _delivered(pf: Any, n: int, timeout: float = 120.0) -> list[bytes]:
    """The mailbox once it holds ``n`` messages (or after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while len(got := pf.delivered()) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def _verdict(message: bytes) -> str | None:
    head = message.split(b"\r\n\r\n", 1)[0].split(b"\n\n", 1)[0]
    m = re.search(rb"^X-Streamnb-Verdict: (.*?)\r?$", head, re.M)
    return m.group(1).decode() if m else None


def smtp_run(pf: Any, mails: Sequence[tuple[bytes, str]], system: str, n_workers: int,
             n_sessions: int) -> Run:
    from benchmarks.postfix_instance import MAILBOX

    run = Run(system, n_workers, n_sessions)

    def one(state: dict[str, Any], raw: bytes, label: str) -> float:
        if "smtp" not in state:
            state["smtp"] = pf.connect()
            state["close"] = state["smtp"].quit
        t0 = time.perf_counter()
        state["smtp"].sendmail("sender@example.org", [MAILBOX], raw)
        return time.perf_counter() - t0

    run.seconds, results = run_sessions(n_sessions, mails, one)
    run.mails = len(results)
    run.whole = list(results)
    run.right = -1  # not looked at
    return run


# ------------------------------------------------------------------------ spamd
class Spamd:
    """spamd on 127.0.0.1:<free port>, ``children`` children as debian-spamd."""

    def __init__(self, children: int) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="streamnb-bench-spamd-"))
        self.children = children
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Spamd:
        argv = [SPAMD, "-u", "debian-spamd", "-L", "-x", "-i", "127.0.0.1", "-A", "127.0.0.1",
                "-p", str(self.port), "--max-children", str(self.children),
                "--min-children", str(self.children), "--pidfile", str(self.dir / "spamd.pid"),
                "-s", str(self.dir / "spamd.log")]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if not _listening(self.port, 120, self.proc):
            log = (self.dir / "spamd.log")
            raise RuntimeError(f"spamd did not start: {log.read_text() if log.exists() else ''}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # spamd stops its children
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def spamc_run(port: int, mails: Sequence[tuple[bytes, str]], children: int,
              n_sessions: int) -> Run:
    run = Run("spamc -> spamd", children, n_sessions)

    def one(state: dict[str, Any], raw: bytes, label: str) -> tuple[float, bool, str, str]:
        t0 = time.perf_counter()
        proc = subprocess.run([SPAMC, "-d", "127.0.0.1", "-p", str(port), "-x"], input=raw,
                              capture_output=True, timeout=120)
        seconds = time.perf_counter() - t0
        head = proc.stdout.split(b"\n\n", 1)[0]
        verdict = "spam" if b"X-Spam-Flag: YES" in head else "ham"
        return seconds, proc.returncode == 0 and b"X-Spam-Status:" in head, verdict, label

    run.seconds, results = run_sessions(n_sessions, mails, one)
    run.mails = len(results)
    run.whole = [r[0] for r in results]
    run.right = sum(1 for r in results if r[1] and r[2] == r[3])
    run.not_scored = sum(1 for r in results if not r[1])
    return run


def bench_spamd(corpus: Corpus, n_train: int, n_mails: int, child_counts: Sequence[int],
                n_sessions: int) -> list[Run]:
    held = list(zip(corpus.raws[n_train:], corpus.labels[n_train:], strict=True))
    mails = [held[i % len(held)] for i in range(n_mails)]
    runs: list[Run] = []
    for children in child_counts:
        with Spamd(children) as spamd:
            spamc_run(spamd.port, mails[:20], children, 2)  # warm-up (rules compiled, cached)
            runs.append(spamc_run(spamd.port, mails, children, n_sessions))
            runs.append(spamc_run(spamd.port, mails[: max(n_mails // 4, 20)], children, 1))
    return runs


HEADERS = ["system", "workers", "sessions", "mails", "mails/s", "eod p50 ms", "eod p99 ms",
           "mail p50 ms", "mail p99 ms", "right", "not scored"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--train", type=int, default=2000, help="mails learnt first (labelled)")
    ap.add_argument("--mails", type=int, default=400, help="mails measured (unlabelled)")
    ap.add_argument("--workers", default="1,2", help="worker counts (spamd: children)")
    ap.add_argument("--sessions", type=int, default=8, help="concurrent MTA connections")
    ap.add_argument("--no-spamd", action="store_true", help="skip the spamc/spamd runs")
    ap.add_argument("--postfix", action="store_true",
                    help="also through a private Postfix (root; Debian package postfix): SMTP "
                         "transactions with the milter on TCP, on a unix socket, and without it")
    args = ap.parse_args(argv)
    print_header("streamnb milter and spamc/spamd: mails/s, added latency", "benchmarks.milter", argv)
    corpus = corpus_or_synthetic(args.corpus)
    if len(corpus) <= args.train:
        args.train = len(corpus) // 2
    counts = [int(w) for w in args.workers.split(",")]
    if args.postfix:
        from benchmarks.postfix_instance import unavailable

        if unavailable():
            print(f"Postfix: {unavailable()}: skipped")
            args.postfix = False
    runs = bench_milter(corpus, args.train, args.mails, counts, args.sessions, args.postfix)
    if args.no_spamd:
        print("spamd: skipped (--no-spamd)")
    elif SPAMD is None or SPAMC is None:
        print("spamd: not installed (Debian packages spamd and spamc): skipped")
    else:
        runs += bench_spamd(corpus, args.train, args.mails, counts, args.sessions)
    print(f"{len(corpus)} corpus mails: {args.train} learnt first, {args.mails} measured "
          f"(held-out, repeated if fewer); milter: a direct milter-protocol client; "
          f"eod = end of data -> answer; mail = whole conversation (spamc: the whole spamc run); "
          f"right = verdict equal to the corpus label; Postfix rows: mail = one SMTP "
          f"transaction (MAIL, RCPT, DATA) on a kept connection, not scored = delivered without a verdict")
    print(format_table(HEADERS, [r.row() for r in runs]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: ``streamnb predict -p -`` as a delivery agent runs it (one process per mail)
and ``streamnb predict MBOX`` (many mails in one call).

A private redis-server; one worker of a model with the daemon's defaults, learnt from the
first ``--train`` mails of the corpus (labelled, chronological). Then:

- ``pipe``: the next ``--mails`` mails, each through its own ``streamnb predict -p -``
  process, one after the other (as procmail or an Exim pipe transport runs it): the wall
  time of the whole process per mail (interpreter start and imports included) at p50/p99;
- ``pipe, process only``: ``streamnb predict --help``, the same process start and imports
  of the command line without a mail: what is left is the mail's round trip;
- ``mbox``: the same mails in one mbox, one ``streamnb predict MBOX`` call: mails/s.

``right``: the verdict equals the corpus label.

    python -m benchmarks.pipe [--mails 100] [--train 1000]
"""

from __future__ import annotations

import argparse
import mailbox
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import (
    DEFAULT_CORPUS,
    ROOT,
    Corpus,
    RedisServer,
    corpus_or_synthetic,
    format_table,
    percentiles,
    print_header,
)
from benchmarks.end_to_end import default_spec, encode_messages, keys, prefill, wait_for, workers

HEADERS = ["run", "mails", "seconds", "mails/s", "p50 ms", "p99 ms", "right"]


def _streamnb(*args: str, stdin: bytes = b"") -> tuple[float, subprocess.CompletedProcess]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "streamnb_workers", *args], input=stdin,
                          capture_output=True, cwd=ROOT, env=env, timeout=120)
    return time.perf_counter() - t0, proc


def _verdict(mail: bytes) -> str | None:
    for line in mail.split(b"\n\n", 1)[0].replace(b"\r\n", b"\n").split(b"\n"):
        if line.startswith(b"X-Streamnb-Verdict: "):
            return line.split(b": ", 1)[1].decode()
    return None


def run(corpus: Corpus, n_train: int, n_mails: int) -> list[list]:
    name = "pipe"
    train = encode_messages(Corpus(corpus.raws[:n_train], corpus.labels[:n_train]), "raw")
    held = list(zip(corpus.raws[n_train:n_train + n_mails], corpus.labels[n_train:n_train + n_mails],
                    strict=True))
    rows = []
    with RedisServer() as server:
        client = server.client()
        prefill(client, name, train)
        with workers(server.url, default_spec(name), 1) as procs:
            if not wait_for(client, keys(name)["out"], len(train), 900, procs, keys(name)["dead"]):
                raise RuntimeError("the worker did not learn the training mails")
            base = ("predict", "--redis", server.url, "--model", name, "--timeout", "30")
            _streamnb(*base, "-p", "-", stdin=held[0][0])  # warm-up (page cache)
            times, right = [], 0
            for raw, label in held:
                seconds, proc = _streamnb(*base, "-p", "-", stdin=raw)
                times.append(seconds)
                right += _verdict(proc.stdout) == label
            p50, p99 = percentiles([t * 1000 for t in times])
            rows.append(["pipe: predict -p - per mail", len(held), round(sum(times), 1),
                         round(len(held) / sum(times), 1), round(p50), round(p99), right])
            bare = [_streamnb("predict", "--help")[0] * 1000 for _ in range(10)]
            b50, b99 = percentiles(bare)
            rows.append(["pipe, process only: predict --help", 10, round(sum(bare) / 1000, 1), "-",
                         round(b50), round(b99), "-"])
            with tempfile.TemporaryDirectory() as tmp:
                box_path = Path(tmp) / "held.mbox"
                box = mailbox.mbox(str(box_path))
                for raw, _label in held:
                    box.add(mailbox.mboxMessage(raw))
                box.close()
                seconds, proc = _streamnb(*base, str(box_path))
            lines = [ln.split("\t") for ln in proc.stdout.decode().splitlines()]
            right = sum(1 for ln, (_raw, label) in zip(lines, held, strict=False) if ln[1] == label)
            rows.append(["mbox: predict MBOX, one call", len(lines), round(seconds, 1),
                         round(len(lines) / seconds, 1), "-", "-", right])
    return rows


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--train", type=int, default=1000, help="mails learnt first (labelled)")
    ap.add_argument("--mails", type=int, default=100, help="mails measured (unlabelled)")
    args = ap.parse_args(argv)
    print_header("streamnb predict -p - (a process per mail) and predict MBOX",
                 "benchmarks.pipe", argv)
    corpus = corpus_or_synthetic(args.corpus)
    if len(corpus) <= args.train + args.mails:
        args.train = len(corpus) // 2
        args.mails = min(args.mails, len(corpus) - args.train)
    print(format_table(HEADERS, run(corpus, args.train, args.mails)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

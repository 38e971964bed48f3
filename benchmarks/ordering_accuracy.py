"""Ordered against unordered predictions: accuracy, ham FPR and (1-ROCA)% of the corpus
replay through 1, 2 and 4 workers, in one run, with what the ordering costs.

The corpus in index (chronological) order as labelled raw mail on a private
redis-server, a model made with only ``kind=multinomial``; the workers start together
(:func:`benchmarks.end_to_end.run_e2e`: the group opens once every worker blocks in
``XREADGROUP``). *Ordered* is the default (``order_wait_ms`` 1000: a labelled batch is
predicted once every earlier labelled batch of the other workers is committed);
*unordered* is ``order_wait_ms`` 0: each worker predicts with the model as of its last
log tail, so a prediction may miss up to N - 1 batches of the latest labels. Each
prediction in ``:out`` is scored against the message's label (benchmarks/_trec.py: a
missing prediction is an error; the score ranked for ROC is the spam log-odds). Next to
the scores: the order wait and the ordered section per labelled batch (the workers' own
timers) and the workers' CPU per message, from the first output on.

    python -m benchmarks.ordering_accuracy [--workers 1,2,4] [--limit N] [--batch 200]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks._common import (
    DEFAULT_CORPUS,
    Corpus,
    corpus_or_synthetic,
    format_table,
    print_header,
)
from benchmarks._trec import Measures, measure
from benchmarks.end_to_end import E2EResult, RedisServer, encode_messages, keys, run_e2e
from benchmarks.peers import output_score

#: Worker options of each mode; the rest are the daemon's defaults.
MODES: dict[str, dict[str, Any]] = {"ordered": {}, "unordered": {"order_wait_ms": 0}}


@dataclass
class ModeRun:
    mode: str
    workers: int
    scores: Measures
    run: E2EResult


def replay(corpus: Corpus, mode: str, n_workers: int, options: dict[str, Any] | None = None,
           timeout: float = 600.0) -> ModeRun:
    """One replay of ``corpus`` through ``n_workers`` workers in ``mode``; scored."""
    from streamnb_workers.wire.outputs import decode_output

    msgs = encode_messages(corpus, "raw", labelled=True)
    name = f"order-{mode}-{n_workers}w"
    with RedisServer() as server:
        run = run_e2e(server, name, msgs, n_workers, "raw", timeout,
                      {**(options or {}), **MODES[mode]})
        outputs = {}
        for _, fields in server.client().xrange(keys(name)["out"]):
            out = decode_output(fields[b"data"])
            outputs[out["id"]] = out
    got = [outputs.get(f"m{i}", {}) for i in range(len(corpus))]
    verdicts = [None if o.get("label") is None else o["label"] == "spam" for o in got]
    scores = measure([output_score(o) for o in got], verdicts,
                     [label == "spam" for label in corpus.labels])
    return ModeRun(mode, n_workers, scores, run)


def rows(runs: Sequence[ModeRun]) -> list[list[Any]]:
    out = []
    for r in runs:
        s, e = r.scores, r.run
        out.append([r.mode, r.workers, f"{s.accuracy:.2%}", f"{s.ham_fpr:.2%} ({s.ham_errors})",
                    f"{s.spam_fnr:.2%} ({s.spam_errors})", f"{s.roca_pct:.3f}", s.no_verdict,
                    e.wait_ms, e.section_ms, e.window_worker_cpu_us, e.per_second])
    return out


HEADER = ["mode", "workers", "accuracy", "ham FPR (errors)", "spam FNR (errors)",
          "(1-ROCA)%", "no verdict", "order wait ms/batch", "ordered section ms/batch",
          "workers' CPU us/msg", "msg/s"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="first N corpus messages only")
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--batch", type=int, default=None, help="worker batch (default: the daemon's)")
    args = ap.parse_args(argv)
    print_header("ordered and unordered predictions: accuracy and cost", "benchmarks.ordering_accuracy",
                 argv)
    corpus = corpus_or_synthetic(args.corpus, args.limit, n_synthetic=1000)
    options = {"batch": args.batch} if args.batch else {}
    runs = [replay(corpus, mode, int(n), options)
            for n in args.workers.split(",") for mode in MODES]
    print(f"{len(corpus):,} labelled raw mails in index order, a fresh model each run")
    print(format_table(HEADER, rows(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

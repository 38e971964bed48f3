"""Autolearn on the corpus replay with only a share of the labels given.

The corpus is pre-filled in index order as raw mail on a private redis-server, only every
k-th message labelled (10%: k = 10; 1%: k = 100), and replayed through 2 worker processes
with the daemon's defaults, once without and once with ``--autolearn`` (its default
thresholds unless ``--options`` says otherwise). Each message is predicted before it is
learnt (test-then-train), so the accuracy over all messages is that of a filter trained
on the labels given (and, with autolearn, on its own confident verdicts). An ``unsure``
verdict counts as not spam, as the TREC measures read it (benchmarks.peers).

Next to them, bogofilter on the same stream (``--bogofilter``): ``-TT`` judges each
message, then a labelled one is learnt with ``-s``/``-n`` and an unlabelled one, with
``-u``, registered as bogofilter classified it (unsure ones are not).

The check: ``forget --source autolearn`` after the autolearn run gives the statistics of
the run without autolearn (same statistics digest, benchmarks.replay_digest), with the
error weight 1 (``--check``: two more replays of the first share). With the default error
weight (2) a labelled message's weight depends on its verdict, which what autolearn
learnt before it changed, so the two runs' labelled contributions differ and only the
autolearnt part is taken out exactly.

    python -m benchmarks.autolearn [--limit N] [--shares 10,100] [--bogofilter] [--check]
        [--options '{"autolearn_score": 0.5}']
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

from benchmarks._common import (
    DEFAULT_CORPUS,
    Corpus,
    RedisServer,
    corpus_or_synthetic,
    format_table,
    print_header,
)
from benchmarks.end_to_end import default_spec, keys, prefill, wait_for, workers
from benchmarks.peers import BOGOFILTER, bogofilter_judge, run
from benchmarks.replay_digest import stats_arrays, stats_digest

SPAM = "spam"


def messages(corpus: Corpus, k: int) -> list[bytes]:
    """The corpus as raw mail, every ``k``-th message (index 0, k, 2k, ...) labelled."""
    from streamnb_workers.wire.codec import encode_input

    return [encode_input("raw", raw, id=f"m{i}", label=label if i % k == 0 else None)
            for i, (raw, label) in enumerate(zip(corpus.raws, corpus.labels, strict=True))]


def replay(corpus: Corpus, k: int, options: dict[str, Any], spec: dict[str, Any],
           forget: bool = False) -> tuple[list[dict[str, Any]], str, str | None]:
    """Outputs in index order, the statistics digest, and (``forget``) the digest after
    ``forget --source autolearn``."""
    from streamnb_workers.client.forget import forget_source
    from streamnb_workers.replication.shards import load_model
    from streamnb_workers.wire.outputs import decode_output

    name = spec["name"]
    msgs = messages(corpus, k)
    with RedisServer() as server:
        client = server.client()
        prefill(client, name, msgs)
        with workers(server.url, spec, 2, options) as procs:
            if not wait_for(client, keys(name)["out"], len(msgs), 1800, procs, keys(name)["dead"]):
                raise RuntimeError("the workers did not process the corpus in time")
        outs = {}
        for _, fields in client.xrange(keys(name)["out"]):
            out = decode_output(fields[b"data"])
            outs[out["id"]] = out
        digest = stats_digest(stats_arrays(load_model(client, name)[0].stats))
        after = None
        if forget:
            forget_source(client, name, "autolearn")
            after = stats_digest(stats_arrays(load_model(client, name)[0].stats))
    return [outs.get(f"m{i}", {}) for i in range(len(corpus))], digest, after


def bogofilter(corpus: Corpus, k: int, unlabelled: bool) -> list[bool]:
    """bogofilter's verdicts (spam or not) judging then learning, as the module says."""
    flagged = []
    with tempfile.TemporaryDirectory(prefix="autolearn-bogofilter-") as d:
        args = [BOGOFILTER or "bogofilter", "-C", "-d", d]
        for i, (raw, label) in enumerate(zip(corpus.raws, corpus.labels, strict=True)):
            labelled = i % k == 0
            proc = run([*args, "-TT", *(["-u"] if unlabelled and not labelled else [])], raw)
            flagged.append(bool(bogofilter_judge(proc)[1]))
            if labelled:
                run([*args, "-s" if label == SPAM else "-n"], raw)
    return flagged


def figures(flagged: list[bool], corpus: Corpus) -> tuple[float, float, int]:
    """(accuracy, ham FPR, ham flagged) of spam-or-not verdicts."""
    truth = [lab == SPAM for lab in corpus.labels]
    right = sum(f == t for f, t in zip(flagged, truth, strict=True))
    ham_flagged = sum(f and not t for f, t in zip(flagged, truth, strict=True))
    n_ham = sum(not t for t in truth)
    return right / len(truth), ham_flagged / max(1, n_ham), ham_flagged


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--shares", default="10,100", help="k of 'every k-th message labelled'")
    ap.add_argument("--options", default="{}", help="worker options with autolearn (JSON)")
    ap.add_argument("--bogofilter", action="store_true")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    print_header("autolearn with a share of the labels", "benchmarks.autolearn", argv)
    corpus = corpus_or_synthetic(a.corpus, a.limit)
    auto = {"autolearn": True, **json.loads(a.options)}
    rows = []
    for k in (int(s) for s in a.shares.split(",")):
        share = f"{100 / k:g}% ({len(range(0, len(corpus), k))})"
        runs = [("streamnb", {}), ("streamnb --autolearn", auto)]
        for what, options in runs:
            outs, _, _ = replay(corpus, k, options, default_spec("auto"))
            acc, fpr, n = figures([o.get("label") == SPAM for o in outs], corpus)
            learnt = sum(o.get("reason") == "autolearnt" for o in outs)
            rows.append([share, what, f"{acc:.2%}", f"{fpr:.2%} ({n})", learnt])
            print(format_table(["labels", "filter", "accuracy", "ham FPR", "autolearnt"], rows[-1:]),
                  flush=True)
        if a.bogofilter:
            for what, u in (("bogofilter", False), ("bogofilter -u", True)):
                acc, fpr, n = figures(bogofilter(corpus, k, u), corpus)
                rows.append([share, what, f"{acc:.2%}", f"{fpr:.2%} ({n})", "-"])
                print(format_table(["labels", "filter", "accuracy", "ham FPR", "autolearnt"],
                                   rows[-1:]), flush=True)
    print()
    print(format_table(["labels", "filter", "accuracy", "ham FPR", "autolearnt"], rows))
    if a.check:
        k = int(a.shares.split(",")[0])
        spec = {**default_spec("check"), "error_weight": 1.0}
        _, without, _ = replay(corpus, k, {}, spec)
        _, with_auto, forgotten = replay(corpus, k, auto, spec, forget=True)
        print(f"\nerror weight 1, {100 / k:g}% of labels: statistics without autolearn {without[:16]}, "
              f"with it {with_auto[:16]}, after forget --source autolearn {forgotten[:16]}: "
              f"{'the same' if forgotten == without else 'DIFFERENT'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

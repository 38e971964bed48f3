"""Accuracy and tokenizer throughput on the SpamAssassin 2002 corpus, test-then-train.

Replays ``index.tsv`` in its order (chronological). For each message: predict with the
model as it is, then learn the message (batches of ``--batch`` messages: all of a batch
is predicted before any of it is learnt; the default 1 is pure test-then-train).
Reports accuracy, ham false-positive rate and spam false-negative rate for the
multinomial and Bernoulli token models, with and without the Gaussian meta block
(the hybrid model), next to River's MultinomialNB fed the same tokens in the same run;
then tokenizer throughput (messages/s, one process) with its C steps and with the Python
code alone, next to bare ``email.message_from_bytes`` on the same messages; token hashing
with the C table and with the dict; and the featurizing of a worker
(``Featurizer.featurize_batch``, batches of 100: tokens, hashing and rows).

    python benchmarks/accuracy.py [--corpus DIR] [--bits 20] [--alpha A] [--batch 1] [--passes 3]
"""

from __future__ import annotations

import argparse
import csv
import email
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from streamnb.features import Featurizer, MailTokenizer, Payload, TokenHasher, hashing, mail_headers
from streamnb.features.mail import N_META
from streamnb.features.steps import C_STEPS, REFERENCE_STEPS
from streamnb.models.bernoulli import BernoulliNB
from streamnb.models.hybrid import HybridNB
from streamnb.models.multinomial import MultinomialNB
from streamnb_workers.defaults import DEFAULT_MAIL_ALPHA

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "spamassassin-2002"
#: The daemon's mail default (docs/features.md): hashed tokens, m = buckets seen.
MAIL_ALPHA = DEFAULT_MAIL_ALPHA


def load_corpus(root: Path) -> tuple[list[bytes], list[str]]:
    with open(root / "index.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return [(root / r["path"]).read_bytes() for r in rows], [r["label"] for r in rows]


def replay(model, X, y: list[str], batch: int) -> list:
    """Test-then-train: predictions of each message made before it was learnt."""
    pred: list = []
    for start in range(0, len(y), batch):
        Xb, yb = X[start : start + batch], y[start : start + batch]
        try:
            pred.extend(model.predict(Xb).tolist())
        except ValueError:  # nothing learnt yet (NotFittedError)
            pred.extend([None] * len(yb))
        model.partial_fit(Xb, yb)
    return pred


def replay_river(token_counts: list[dict], y: list[str]) -> list:
    from river.naive_bayes import MultinomialNB as RiverMNB

    model = RiverMNB(alpha=1.0)
    pred = []
    for x, label in zip(token_counts, y, strict=True):
        pred.append(model.predict_one(x))
        model.learn_one(x, label)
    return pred


def scores(pred: list, y: list[str]) -> tuple[float, float, float, int, int]:
    ham = [p for p, t in zip(pred, y, strict=True) if t == "ham"]
    spam = [p for p, t in zip(pred, y, strict=True) if t == "spam"]
    fp = sum(p != "ham" for p in ham)
    fn = sum(p != "spam" for p in spam)
    acc = 1 - (fp + fn) / len(y)
    return acc, fp / len(ham), fn / len(spam), fp, fn


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu or 'unknown CPU'}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, numpy {np.__version__}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    ap.add_argument("--bits", type=int, default=20)
    ap.add_argument("--alpha", type=float, default=MAIL_ALPHA)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--no-river", action="store_true", help="skip River's MultinomialNB")
    ap.add_argument("--passes", type=int, default=3,
                    help="tokenizer throughput: best of N alternating passes (CPU time, memos "
                    "emptied before each tokenizer pass)")
    args = ap.parse_args(argv)
    if not (args.corpus / "index.tsv").exists():
        print(f"corpus not found at {args.corpus}", file=sys.stderr)
        return 2

    raws, y = load_corpus(args.corpus)
    print(f"corpus: {args.corpus} ({len(y)} messages: {Counter(y)['ham']} ham, {Counter(y)['spam']} spam)")
    print(f"machine: {machine()}")
    print(f"command: python benchmarks/accuracy.py --bits {args.bits} --alpha {args.alpha} "
          f"--batch {args.batch} --passes {args.passes}")

    # ---- tokenizer throughput: best of N alternating passes, CPU time, cold memos
    tokenizer = MailTokenizer()
    reference = MailTokenizer(steps=REFERENCE_STEPS)
    parse_s = tok_s = pure_s = float("inf")
    for _ in range(max(1, args.passes)):
        t0 = time.process_time()
        for raw in raws:
            email.message_from_bytes(raw)
        parse_s = min(parse_s, time.process_time() - t0)
        mail_headers.clear_memos()
        t0 = time.process_time()
        analyses = [tokenizer.analyse(raw) for raw in raws]
        tok_s = min(tok_s, time.process_time() - t0)
        if C_STEPS is not None:  # the same with the Python code alone (the reference steps)
            mail_headers.clear_memos()
            t0 = time.process_time()
            pure = [reference.analyse(raw) for raw in raws]
            pure_s = min(pure_s, time.process_time() - t0)
            if pure != analyses:
                raise SystemExit("the tokenizer's C and Python steps gave different tokens or counts")
    # ---- token hashing, batches of 100 fresh str (as a worker gets them): the C table
    # (when built) and the dict, each emptied (cold: every distinct token a miss, hashed
    # by hashing._blake64) then again (warm), alternating passes, best of each
    tables = {t.name: t for t in (hashing.C_TABLE, hashing.REFERENCE_TABLE) if t is not None}
    hash_s = {(name, state): float("inf") for name in tables for state in ("cold", "warm")}
    hasher = TokenHasher(bits=args.bits)
    for _ in range(max(1, args.passes)):
        for name, table in tables.items():
            table.clear()
            for state in ("cold", "warm"):
                fresh = [[t.encode().decode() for t in a.tokens] for a in analyses]
                t0 = time.process_time()
                for i in range(0, len(fresh), 100):
                    batch = fresh[i : i + 100]
                    sizes = np.fromiter(map(len, batch), dtype=np.int64, count=len(batch))
                    out = np.empty(int(sizes.sum()), dtype=np.uint64)
                    table.hash_lists(batch, out)
                    hasher.unique_buckets_many(out, sizes)
                hash_s[name, state] = min(hash_s[name, state], time.process_time() - t0)
    # ---- the worker's path: featurize_batch in batches of 100 (the daemon's default
    # featurizer: no meta vector), best of the passes, memos emptied before each
    worker_featurizer = Featurizer(bits=args.bits)
    messages = [Payload("raw", raw) for i, raw in enumerate(raws)]
    batch_s = float("inf")
    for _ in range(max(1, args.passes)):
        mail_headers.clear_memos()
        t0 = time.process_time()
        for i in range(0, len(messages), 100):
            worker_featurizer.featurize_batch(messages[i : i + 100])
        batch_s = min(batch_s, time.process_time() - t0)
    featurizer = Featurizer(bits=args.bits, meta=True)
    t0 = time.perf_counter()
    rows = [featurizer.featurize(Payload("raw", raw)) for raw in raws]
    feat_s = time.perf_counter() - t0
    X = featurizer.stack(rows)
    n_tok = X[:, : 2**args.bits]
    n_tokens = sum(len(a.tokens) for a in analyses)
    print()
    print(f"bare email.message_from_bytes: {len(raws) / parse_s:8.0f} messages/s of CPU "
          f"(best of {max(1, args.passes)} passes)")
    print(f"tokenize_email (parse + tokens + meta): {len(raws) / tok_s:8.0f} messages/s of CPU "
          f"({n_tokens / len(raws):.0f} tokens/message; C steps "
          f"{'on' if C_STEPS is not None else 'off'})")
    if C_STEPS is not None:
        print(f"tokenize_email, C steps off (Python): {len(raws) / pure_s:8.0f} messages/s of CPU "
              f"(C steps: {pure_s / tok_s:.2f}x)")
    print(f"featurize (tokens + hashing + meta): {len(raws) / feat_s:8.0f} messages/s")
    print(f"featurize_batch, a worker's path (batches of 100, no meta): {len(raws) / batch_s:8.0f} "
          f"messages/s of CPU ({batch_s / len(raws) * 1e6:.1f} us/message, best of "
          f"{max(1, args.passes)} passes)")
    distinct = len({t for a in analyses for t in a.tokens})
    print(f"token hashing (hashes and unique buckets, batches of 100; {distinct} distinct tokens "
          f"of {n_tokens}), us/message of CPU: "
          + "; ".join(f"{name} table {hash_s[name, 'cold'] / len(raws) * 1e6:.1f} cold (emptied first), "
                      f"{hash_s[name, 'warm'] / len(raws) * 1e6:.1f} warm" for name in tables))

    # ---- accuracy, test-then-train
    print()
    print(f"test-then-train, batch {args.batch}, alpha {args.alpha}, 2**{args.bits} buckets, "
          f"smoothing m = buckets seen, token values = {featurizer.counts}")
    print(f"{'model':38s} {'accuracy':>9s} {'ham FP':>14s} {'spam FN':>14s} {'seconds':>8s}")
    n = 2**args.bits
    models = [
        ("multinomial", MultinomialNB(args.alpha, n_features=n, smoothing_m="seen"), n_tok),
        ("bernoulli", BernoulliNB(args.alpha, n_features=n, smoothing_m="seen"), n_tok),
        ("hybrid multinomial + gaussian meta",
         HybridNB(N_META, "multinomial", args.alpha, n_features=n + N_META), X),
        ("hybrid bernoulli + gaussian meta",
         HybridNB(N_META, "bernoulli", args.alpha, n_features=n + N_META), X),
    ]
    for name, model, data in models:
        t0 = time.perf_counter()
        pred = replay(model, data, y, args.batch)
        _report(name, pred, y, time.perf_counter() - t0)
    if not args.no_river:
        token_counts = [
            dict.fromkeys(a.tokens, 1) if featurizer.counts == "binary" else dict(Counter(a.tokens))
            for a in analyses
        ]
        t0 = time.perf_counter()
        pred = replay_river(token_counts, y)
        _report("river MultinomialNB (same tokens, alpha 1)", pred, y, time.perf_counter() - t0)
    return 0


def _report(name: str, pred: list, y: list[str], seconds: float) -> None:
    acc, fpr, fnr, fp, fn = scores(pred, y)
    print(f"{name:38s} {acc:9.2%} {fpr:7.2%} ({fp:4d}) {fnr:7.2%} ({fn:4d}) {seconds:8.1f}")


if __name__ == "__main__":
    sys.exit(main())

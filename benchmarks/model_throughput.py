"""Benchmark 1: model only, test-then-train on the SpamAssassin corpus tokenized beforehand.

Every message is tokenized once with streamnb's mail tokenizer (the daemon's default
featurizer: 2**20 hashed buckets, binary token values). Then, in one process and one
run, each library predicts a batch with the model as it is and learns it:

* streamnb ``MultinomialNB`` / ``BernoulliNB`` (alpha 1, m = buckets seen: the daemon's
  defaults) on the CSR rows, batches of 1, 10 and 100;
* River ``MultinomialNB`` / ``BernoulliNB`` ``predict_one`` + ``learn_one`` on
  ``{token: 1}`` dicts of the same tokens;
* scikit-learn ``MultinomialNB`` / ``BernoulliNB`` ``predict`` + ``partial_fit`` over
  ``HashingVectorizer(n_features=2**20, alternate_sign=False, binary=True)`` output of the
  same tokens, batches of 1, 10 and 100.

A run stops after ``--cap`` seconds (River's BernoulliNB and scikit-learn at batch 1 are
slow); the rate is then over the messages done, as the table says. Then the per-message
cost of BernoulliNB against the number of features already seen (vocabulary), to show
that streamnb's is flat and River's grows linearly.

    python -m benchmarks.model_throughput [--limit N] [--cap SECONDS] [--short]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from benchmarks._common import (
    DEFAULT_CORPUS,
    Corpus,
    corpus_or_synthetic,
    format_table,
    print_header,
    rate,
)

BITS = 20
ALPHA = 1.0
#: Share of the stream after which the "steady" rate starts (first-prediction set-up,
#: such as deriving the whole 2**20-column table once, falls before it).
WARMUP_SHARE = 0.2


@dataclass
class Prepared:
    """The corpus tokenized once: streamnb CSR, token dicts (River), HashingVectorizer CSR."""

    labels: list[str]
    X: sp.csr_matrix
    token_dicts: list[dict[str, int]]
    X_sklearn: sp.csr_matrix | None
    bits: int
    tokenize_seconds: float


@dataclass
class Result:
    library: str
    model: str
    batch: int
    messages: int
    seconds: float
    accuracy: float
    #: Rate after the first WARMUP_SHARE of the messages (one-time set-up excluded).
    steady: float = float("nan")

    @property
    def per_second(self) -> float:
        return rate(self.messages, self.seconds)


def prepare(corpus: Corpus, bits: int = BITS, sklearn: bool = True) -> Prepared:
    """Tokenize and hash every message once (timed, for reference)."""
    from streamnb.features import Featurizer, Payload

    featurizer = Featurizer(bits=bits)
    t0 = time.perf_counter()
    msgs = [Payload("raw", raw) for raw in corpus.raws]
    rows = [featurizer.featurize(m) for m in msgs]
    tokenize_seconds = time.perf_counter() - t0
    X = featurizer.stack(rows)
    token_dicts = [dict.fromkeys(featurizer.tokens(m), 1) for m in msgs]
    X_sk = None
    if sklearn:
        from sklearn.feature_extraction.text import HashingVectorizer

        hv = HashingVectorizer(n_features=2**bits, alternate_sign=False, binary=True, norm=None,
                               analyzer=_identity)
        X_sk = hv.transform([list(d) for d in token_dicts]).tocsr()
    return Prepared(list(corpus.labels), X, token_dicts, X_sk, bits, tokenize_seconds)


def _identity(tokens: list[str]) -> list[str]:
    return tokens


def _accuracy(pred: list, y: list) -> float:
    scored = [(p, t) for p, t in zip(pred, y, strict=False) if p is not None]
    return sum(p == t for p, t in scored) / len(scored) if scored else float("nan")


class _Clock:
    """Total time, and the rate after the warm-up share of the stream."""

    def __init__(self, total: int) -> None:
        self.warm = int(total * WARMUP_SHARE)
        self.t0 = time.perf_counter()
        self.t_warm: float | None = None
        self.done_warm = 0

    def tick(self, done: int) -> float:
        now = time.perf_counter()
        if self.t_warm is None and done >= self.warm:
            self.t_warm, self.done_warm = now, done
        return now - self.t0

    def steady(self, done: int) -> float:
        if self.t_warm is None or done <= self.done_warm:
            return float("nan")
        return rate(done - self.done_warm, time.perf_counter() - self.t_warm)


def run_batches(predict: Callable[[Any], Any], learn: Callable[[Any, list], Any], X: Any,
                y: list, batch: int, cap: float) -> tuple[int, float, float, float]:
    """Test-then-train over pre-sliced batches: (messages done, seconds, accuracy, steady msg/s)."""
    chunks = [(X[i : i + batch], y[i : i + batch]) for i in range(0, len(y), batch)]
    pred: list = []
    done = 0
    clock = _Clock(len(y))
    for Xb, yb in chunks:
        if done:
            pred.extend(predict(Xb))
        else:
            pred.extend([None] * len(yb))
        learn(Xb, yb)
        done += len(yb)
        if clock.tick(done) > cap:
            break
    seconds = time.perf_counter() - clock.t0
    return done, seconds, _accuracy(pred, y[:done]), clock.steady(done)


def run_river(model: Any, dicts: list[dict], y: list, cap: float) -> tuple[int, float, float, float]:
    """River test-then-train, one message at a time."""
    pred: list = []
    clock = _Clock(len(y))
    done = 0
    for x, label in zip(dicts, y, strict=True):
        pred.append(model.predict_one(x))
        model.learn_one(x, label)
        done += 1
        if clock.tick(done) > cap:
            break
    return done, time.perf_counter() - clock.t0, _accuracy(pred, y[:done]), clock.steady(done)


def benchmark(prep: Prepared, batches: tuple[int, ...] = (1, 10, 100), cap: float = 20.0,
              river: bool = True, sklearn: bool = True,
              kinds: tuple[str, ...] = ("multinomial", "bernoulli")) -> list[Result]:
    """Every (library, model, batch) combination in one run."""
    from streamnb.models.bernoulli import BernoulliNB
    from streamnb.models.multinomial import MultinomialNB

    ours = {"multinomial": MultinomialNB, "bernoulli": BernoulliNB}
    n = 2**prep.bits
    y = prep.labels
    results: list[Result] = []
    for kind in kinds:
        for b in batches:
            model = ours[kind](ALPHA, n_features=n, smoothing_m="seen")
            out = run_batches(lambda X, m=model: m.predict(X).tolist(),
                              lambda X, yb, m=model: m.partial_fit(X, yb), prep.X, y, b, cap)
            results.append(Result("streamnb", kind, b, *out))
        if river:
            from river import naive_bayes as rnb

            rmodel = rnb.MultinomialNB(alpha=ALPHA) if kind == "multinomial" else rnb.BernoulliNB(alpha=ALPHA)
            results.append(Result("river", kind, 1, *run_river(rmodel, prep.token_dicts, y, cap)))
        if sklearn and prep.X_sklearn is not None:
            from sklearn import naive_bayes as sknb

            classes = sorted(set(y))
            for b in batches:
                skm = sknb.MultinomialNB(alpha=ALPHA) if kind == "multinomial" else sknb.BernoulliNB(alpha=ALPHA)
                out = run_batches(lambda X, m=skm: m.predict(X).tolist(),
                                  lambda X, yb, m=skm, c=classes: m.partial_fit(X, yb, classes=c),
                                  prep.X_sklearn, y, b, cap)
                results.append(Result("scikit-learn", kind, b, *out))
    return results


def ratios(results: list[Result], batch: int = 100, steady: bool = False) -> dict[str, float]:
    """streamnb at ``batch`` over River (one at a time) and over scikit-learn at ``batch``."""
    def get(lib: str, kind: str, b: int) -> float | None:
        r = next((r for r in results if (r.library, r.model, r.batch) == (lib, kind, b)), None)
        if r is None:
            return None
        return r.steady if steady else r.per_second

    out: dict[str, float] = {}
    for kind in ("multinomial", "bernoulli"):
        ours = get("streamnb", kind, batch)
        if ours is None:
            continue
        riv, skl = get("river", kind, 1), get("scikit-learn", kind, batch)
        if riv:
            out[f"{kind}: streamnb b{batch} / river"] = ours / riv
        if skl:
            out[f"{kind}: streamnb b{batch} / sklearn b{batch}"] = ours / skl
    return out


# ------------------------------------------------------ Bernoulli vs vocabulary
def _vocab_rows(n_docs: int, vocab: int, n_features: int, seed: int) -> sp.csr_matrix:
    """``n_docs`` documents that together contain ``vocab`` distinct columns."""
    rng = np.random.default_rng(seed)
    cols = rng.choice(n_features, size=vocab, replace=False)
    doc = np.arange(vocab) % n_docs
    return sp.csr_matrix((np.ones(vocab), (doc, cols)), shape=(n_docs, n_features))


def bernoulli_vs_vocabulary(prep: Prepared, vocabularies: tuple[int, ...] = (10**3, 10**4, 10**5, 10**6),
                            probe: int = 200, river_max_vocab: int = 30_000,
                            river_probe: int = 20) -> list[tuple[str, int, float]]:
    """(library, features seen, microseconds per message) of test-then-train one at a time,
    after learning documents that introduce ``vocab`` distinct features."""
    from streamnb.models.bernoulli import BernoulliNB

    n = 2**prep.bits
    y = prep.labels
    out: list[tuple[str, int, float]] = []
    probe = min(probe, len(y))
    for vocab in vocabularies:
        vocab = min(vocab, n)
        model = BernoulliNB(ALPHA, n_features=n, smoothing_m="seen")
        model.partial_fit(_vocab_rows(2, vocab, n, 0), ["ham", "spam"])
        seen = int(model.stats["features"].n_seen)
        rows = [prep.X[i : i + 1] for i in range(probe)]
        t0 = time.perf_counter()
        for i, Xi in enumerate(rows):
            model.predict(Xi)
            model.partial_fit(Xi, [y[i]])
        out.append(("streamnb", seen, 1e6 * (time.perf_counter() - t0) / probe))
    try:
        from river.naive_bayes import BernoulliNB as RiverBNB
    except ImportError:
        return out
    for vocab in vocabularies:
        if vocab > river_max_vocab:
            continue
        rmodel = RiverBNB(alpha=ALPHA)
        words = [f"w{i}" for i in range(vocab)]
        rmodel.learn_one(dict.fromkeys(words[::2], 1), "ham")
        rmodel.learn_one(dict.fromkeys(words[1::2], 1), "spam")
        k = min(river_probe, len(y))
        t0 = time.perf_counter()
        for i in range(k):
            rmodel.predict_one(prep.token_dicts[i])
            rmodel.learn_one(prep.token_dicts[i], y[i])
        out.append(("river", vocab, 1e6 * (time.perf_counter() - t0) / k))
    return out


def print_results(results: list[Result], total: int) -> None:
    rows = [[r.library, r.model, r.batch, r.messages if r.messages == total else f"{r.messages} (cap)",
             r.per_second, r.steady, r.accuracy] for r in results]
    print(format_table(["library", "model", "batch", "messages", "msg/s", "steady msg/s", "accuracy"],
                       rows))
    print(f"(steady: after the first {WARMUP_SHARE:.0%} of the messages; accuracy is test-then-train"
          " over the messages done)")
    print()
    whole, steady = ratios(results), ratios(results, steady=True)
    for k, v in whole.items():
        s = steady.get(k, float("nan"))
        # (no steady rate: the run of one of the two was capped before its warm-up ended)
        print(f"{k}: {v:,.1f}x whole run, " + ("no steady rate" if math.isnan(s) else f"{s:,.1f}x steady"))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="first N messages only")
    ap.add_argument("--cap", type=float, default=20.0, help="seconds per run at most")
    ap.add_argument("--short", action="store_true", help="cap 5 s, skip the vocabulary sweep")
    args = ap.parse_args(argv)
    print_header("benchmark 1: model only, test-then-train, tokenized beforehand",
                 "benchmarks.model_throughput", argv)
    corpus = corpus_or_synthetic(args.corpus, args.limit)
    cap = 5.0 if args.short else args.cap
    prep = prepare(corpus)
    print(f"{len(corpus)} messages, {prep.X.nnz / len(corpus):.0f} distinct hashed tokens/message; "
          f"tokenizing + hashing (not timed below): {rate(len(corpus), prep.tokenize_seconds):,.0f} msg/s")
    print()
    results = benchmark(prep, cap=cap)
    print_results(results, len(corpus))
    if not args.short:
        print()
        print("BernoulliNB test-then-train, one message at a time, against features already seen:")
        sweep = bernoulli_vs_vocabulary(prep)
        print(format_table(["library", "features seen", "us/message"], [list(r) for r in sweep]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

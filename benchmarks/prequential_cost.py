"""Cost of prequential prediction within a batch, in one process (no Redis).

For batches of hashed mail (the daemon's default featurizer, 2**20 buckets) predicted by a
model that has learnt ``--train`` messages, per batch of ``--batch`` messages:

* ``batch``: ``predict_log_proba`` of the whole batch with the model before it (the old
  worker behaviour, ``WorkerOptions(prequential=False)``);
* ``prequential``: ``predict_log_proba_prequential`` (MultinomialNB: the exact path, by
  the C loop of ``streamnb._kernels`` when built, and by its numpy form on the row
  "numpy form"; BernoulliNB: the generic path, a scratch copy of the statistics per batch);
* ``generic``: the generic path forced on MultinomialNB, for comparison.

    python -m benchmarks.prequential_cost [--train 1000] [--batch 100] [--batches 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks._common import (
    DEFAULT_CORPUS,
    corpus_or_synthetic,
    format_table,
    print_header,
)


def _per_batch_ms(fn: Callable[[Any, list], Any], batches: list[tuple[Any, list]]) -> float:
    times = []
    for X, y in batches:
        t0 = time.perf_counter()
        fn(X, y)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--batches", type=int, default=15)
    a = ap.parse_args(argv)
    print_header("prequential prediction cost per batch (median)", "benchmarks.prequential_cost",
                 sys.argv[1:] if argv is None else argv)
    from streamnb.features import Featurizer
    from streamnb.models import make_model, prequential
    from streamnb.models.prequential import generic_prequential
    from streamnb_workers.defaults import DEFAULT_MAIL_ALPHA
    from streamnb_workers.wire.codec import decode_input, encode_input

    n = a.train + a.batch * a.batches
    corpus = corpus_or_synthetic(DEFAULT_CORPUS, n)
    f = Featurizer()
    rows = [f.featurize(decode_input(encode_input("raw", raw), "0-0").as_payload()) for raw in corpus.raws]
    labels = list(corpus.labels)
    X_all = f.stack(rows)
    table = []
    c_loop = prequential.MULTINOMIAL_JLL
    # (kind, row name, the C loop or None, the generic column: None to time it)
    forms = [("multinomial", "multinomial" if c_loop else "multinomial (no C loop built)",
              c_loop, None)]
    if c_loop is not None:
        forms.append(("multinomial", "multinomial, numpy form", None, "(= multinomial)"))
    forms.append(("bernoulli", "bernoulli", None, "(= prequential)"))
    try:
        for kind, name, loop, generic in forms:
            prequential.MULTINOMIAL_JLL = loop
            model = make_model(kind, alpha=DEFAULT_MAIL_ALPHA, n_features=f.n_columns,
                               smoothing_m="seen")
            model.partial_fit(X_all[: a.train], labels[: a.train])
            model.predict_log_proba(X_all[:1])  # derived parameters up to date
            batches = [(X_all[s:s + a.batch], labels[s:s + a.batch])
                       for s in range(a.train, min(n, len(labels)) - a.batch + 1, a.batch)]
            base = _per_batch_ms(lambda X, y, m=model: m.predict_log_proba(X), batches)
            preq = _per_batch_ms(lambda X, y, m=model: m.predict_log_proba_prequential(X, y),
                                 batches)
            if generic is None:
                gen_ms = _per_batch_ms(lambda X, y, m=model: generic_prequential(m, X, y), batches)
                generic = f"{gen_ms:.2f}"
            table.append([name, f"{base:.2f}", f"{preq:.2f}", f"{preq / base:.1f}x",
                          f"{1e3 * preq / a.batch:.0f}", generic])
    finally:
        prequential.MULTINOMIAL_JLL = c_loop
    print(format_table(["model (2**20 buckets)", "batch ms", "prequential ms", "ratio",
                        "prequential us/msg", "generic ms"], table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

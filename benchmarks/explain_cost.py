"""Cost of the worker's ``--explain K`` and ``--token-names``, in one process (no Redis
for the timings), on corpus mail with the daemon's default featurizer and model.

Per message, the median over batches of ``--batch`` messages of the worker's own steps:

* ``featurize``: the batch's rows (what every worker does, for scale);
* ``predict``: ``predict_log_proba`` of the batch (for scale);
* ``tokens``: each message's tokens again (hashing keeps no names; ``--explain`` needs
  them for every message, ``--token-names`` for one in ``--every``);
* ``explain``: the explanations of the batch, named (``explain_matrix``);
* ``names``: counting the names of one message in ``--every`` (amortised per message).

Then the memory of the token names after the corpus: the worker's counts (tracemalloc)
and the ``{M}:tokens`` hash in a private redis-server (``MEMORY USAGE``), if one is on PATH.

    python -m benchmarks.explain_cost [--train 1000] [--batch 200] [--batches 10] [--k 10]
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from collections.abc import Callable

import numpy as np

from benchmarks._common import (
    DEFAULT_CORPUS,
    REDIS_SERVER,
    RedisServer,
    corpus_or_synthetic,
    format_table,
    print_header,
)


def _median_us(fn: Callable[[int], object], starts: list[int], per: int) -> float:
    times = []
    for s in starts:
        t0 = time.perf_counter()
        fn(s)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) / per * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=200)
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--every", type=int, default=32, help="--token-names-every")
    ap.add_argument("--capacity", type=int, default=20_000, help="--token-names")
    a = ap.parse_args(argv)
    print_header("cost of --explain K and --token-names per message (median)",
                 "benchmarks.explain_cost", sys.argv[1:] if argv is None else argv)
    from streamnb.decision import DecisionRule
    from streamnb_workers.observe.token_names import TokenNames, message_tokens, publish
    from streamnb_workers.store.model_config import ModelSpec, resolve_spec
    from streamnb_workers.wire.codec import decode_input, encode_input
    from streamnb_workers.wire.explanations import explain_matrix

    cfg = resolve_spec(ModelSpec("bench", kind="multinomial"))
    f, rule = cfg.make_featurizer(), DecisionRule()
    corpus = corpus_or_synthetic(DEFAULT_CORPUS, a.train + a.batch * a.batches)
    msgs = [decode_input(encode_input("raw", raw), "0-0") for raw in corpus.raws]
    payloads = [m.as_payload() for m in msgs]
    X_all = f.stack(f.featurize_batch(payloads))
    model = cfg.make_model().partial_fit(X_all[: a.train], list(corpus.labels[: a.train]))
    model.predict_log_proba(X_all[:1])  # derived parameters up to date
    starts = list(range(a.train, len(msgs) - a.batch + 1, a.batch))
    B = a.batch
    tokens = {s: [message_tokens(f, m) for m in msgs[s:s + B]] for s in starts}
    rows = [
        ["featurize", _median_us(lambda s: f.featurize_batch(payloads[s:s + B]), starts, B)],
        ["predict", _median_us(lambda s: model.predict_log_proba(X_all[s:s + B]), starts, B)],
        ["tokens (every message)",
         _median_us(lambda s: [message_tokens(f, m) for m in msgs[s:s + B]], starts, B)],
        [f"explain K={a.k}, named",
         _median_us(lambda s: explain_matrix(model, rule, f, X_all[s:s + B], a.k, tokens[s]),
                    starts, B)],
    ]
    names = TokenNames(a.capacity, a.every)

    def count(s: int) -> None:
        for i in names.sample(B):
            names.add(message_tokens(f, msgs[s + i]))  # type: ignore[arg-type]

    rows.append([f"names, 1 in {a.every} (tokens + counts)", _median_us(count, starts, B)])
    print(format_table(["step", "us/msg"], [[n, f"{v:.0f}"] for n, v in rows]))
    explain_total = rows[2][1] + rows[3][1]
    print(f"\n--explain {a.k} adds {explain_total:.0f} us/msg (tokens + explain) to a worker's "
          f"featurize + predict of {rows[0][1] + rows[1][1]:.0f} us/msg")

    # memory: the counts after every message of the corpus, and the published hash
    names = TokenNames(a.capacity, 1)
    tracemalloc.start()
    for m in msgs:
        toks = message_tokens(f, m)
        if toks:
            names.add(toks)
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    table = names.table(f.hasher)
    print(f"\ntoken names, capacity {a.capacity}, after {len(msgs)} messages: "
          f"{len(names.counts)} names counted in {current / 2**20:.1f} MiB (tracemalloc); "
          f"{len(table)} buckets published")
    if REDIS_SERVER is not None:
        with RedisServer() as server:
            client = server.client()
            publish(client, "streamnb:{bench}:tokens", table)
            used = client.memory_usage("streamnb:{bench}:tokens")
            print(f"{{M}}:tokens in Redis: {used / 2**20:.1f} MiB (MEMORY USAGE), "
                  f"{used / max(len(table), 1):.0f} bytes per bucket")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A vocabulary flood (1M distinct random tokens) through a real worker process on a real
redis-server: the model's tables stay fixed-size (hashing), the worker's RSS growth stays
bounded, and the model still predicts a held-out clean set well."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest

from streamnb.features import Featurizer
from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.codec import decode_input
from tests.helpers.hostile import rss_bytes
from tests.helpers.workers import produce, spawn_worker, token_messages

pytestmark = [pytest.mark.redis, pytest.mark.slow]

N_TOKENS = 1_000_000
TOKENS_PER_MESSAGE = 1000
#: RSS the worker may gain while learning 1M new tokens: the token-hash LRU cache
#: (HASH_CACHE_SIZE entries) and allocator slack; the model itself must not grow at all.
RSS_GROWTH_BOUND = 160 << 20
FCFG = {"bits": 20}


def _wait_done(r, keys: ModelKeys, n_out: int, proc, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the worker died"
        if r.xlen(keys.out) >= n_out and int(r.xpending(keys.input, GROUP)["pending"]) == 0:
            return
        time.sleep(0.2)
    raise TimeoutError(f"{r.xlen(keys.out)} of {n_out} predictions after {timeout}s")


def _idle_rss(pid: int) -> int:
    """The worker's RSS once it has gone idle: an empty read of block_ms (100 ms) after
    its last batch, where it hands freed heap pages back (workers/worker/heap.py)."""
    time.sleep(0.5)
    return rss_bytes(pid)


def _accuracy(model, msgs) -> float:
    f = Featurizer.from_config(FCFG)
    X = f.stack([f.featurize(decode_input(msgpack.packb({"tokens": m["tokens"]}), "0-0").as_payload())
                 for m in msgs])
    return float(np.mean(model.predict(X) == np.array([m["label"] for m in msgs])))


def _features_nbytes(model) -> int:
    return sum(p.nbytes for p in model.stats.parts.values() if hasattr(p, "nbytes"))


def test_vocabulary_flood_keeps_memory_bounded_and_model_usable(redis_server, tmp_path):
    r = redis_server.client()
    keys = ModelKeys("flood")
    msgs = token_messages(1200, seed=21)
    train, held_out = msgs[:900], msgs[900:]
    # error weight 1: the class weights count the messages learnt
    spec = ModelSpec("flood", kind="multinomial", featurizer_config=FCFG, error_weight=1)
    proc = spawn_worker(redis_server.url, spec, {"consumer": "w1", "batch": 100, "block_ms": 100,
                                                 "cache_ttl_s": 0},
                        log_path=tmp_path / "worker.log")
    try:
        produce(r, "flood", train)
        _wait_done(r, keys, len(train), proc)
        clean_model, _ = load_model(r, "flood")
        clean_acc = _accuracy(clean_model, held_out)
        nbytes = _features_nbytes(clean_model)
        rss0 = _idle_rss(proc.pid)

        rng = np.random.default_rng(22)
        classes = ["spam", "ham", "news"]
        n_msg = N_TOKENS // TOKENS_PER_MESSAGE
        rss_half = 0
        for start in range(0, n_msg, 100):  # 100 messages (100k tokens) per produce call
            if start == n_msg // 2:  # once the LRU token cache is full, RSS must stop growing
                _wait_done(r, keys, len(train) + start, proc)
                rss_half = _idle_rss(proc.pid)
            batch = []
            for i in range(start, min(start + 100, n_msg)):
                base = i * TOKENS_PER_MESSAGE
                batch.append({"id": f"f{i}", "label": classes[int(rng.integers(3))],
                              "tokens": [f"zq{base + j:07d}{rng.integers(1 << 30):x}"
                                         for j in range(TOKENS_PER_MESSAGE)]})
            produce(r, "flood", batch)
        _wait_done(r, keys, len(train) + n_msg, proc, timeout=300)
        rss_end = _idle_rss(proc.pid)
        grown, second_half = rss_end - rss0, rss_end - rss_half
    finally:
        proc.terminate()
        proc.wait(30)

    model, _ = load_model(r, "flood")
    assert _features_nbytes(model) == nbytes  # hashed: fixed-size tables
    feats = model.stats["features"]
    assert feats.n_features == 2 ** FCFG["bits"]
    assert feats.n_seen > 0.5 * 2 ** FCFG["bits"]  # the flood really filled the buckets
    assert model.stats["classes"].counts.sum() == len(train) + n_msg
    assert grown < RSS_GROWTH_BOUND, f"worker RSS grew by {grown >> 20} MiB"
    assert second_half < RSS_GROWTH_BOUND // 4, f"+{second_half >> 20} MiB in the second 500k"
    flood_acc = _accuracy(model, held_out)
    print(f"\nvocabulary flood: {N_TOKENS} tokens, worker RSS +{grown >> 20} MiB "
          f"(+{second_half >> 20} MiB in the second half), "
          f"model tables {nbytes >> 20} MiB, held-out accuracy {clean_acc:.3f} -> {flood_acc:.3f}")
    assert clean_acc > 0.9
    assert flood_acc > 0.8 and flood_acc > clean_acc - 0.15

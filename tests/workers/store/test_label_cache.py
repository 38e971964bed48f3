"""The delayed-label cache's bucket layout (workers/store/label_cache.py, cache_get.lua), written
by the real commit script, on fakeredis[lua] and on a real redis-server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib

import numpy as np

from streamnb.features import Row
from streamnb_workers.store.commit import CommitRequest, commit_batch
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.label_cache import (
    LABEL_CACHE_SHARDS,
    batch_writes,
    bucket_width_ms,
    decode_entry,
    encode_entry,
    encode_label,
    entry_field,
    fetch_cached,
    label_change,
    relabel,
    shard_of,
)

K = ModelKeys("lc")
DAY_MS = 86_400_000


def _row(seed: int) -> Row:
    idx = np.unique(np.random.default_rng(seed).integers(0, 2**20, size=40)).astype(np.int32)
    return Row(indices=idx, values=np.ones(idx.size), n_tokens=int(idx.size))


def _write(r, ids: list[str], ttl_ms: int, now_ms: int, learnt: str | None = None,
           tag: str = "") -> None:
    """Cache ``ids`` as a worker's commit at ``now_ms`` (its clock) does."""
    if not r.exists(K.input):
        r.xgroup_create(K.input, GROUP, id="0", mkstream=True)
    eid = r.xadd(K.input, {"data": b"m"}).decode()
    r.xreadgroup(GROUP, "w1", {K.input: ">"})
    entries = [(i, encode_entry(encode_label(learnt), _row(n).to_bytes(), "spam" + tag,
                                {"spam": -0.25, "ham": -1.5}, 1.0, now_ms / 1000))
               for n, i in enumerate(ids)]
    writes, registry = batch_writes(K, ttl_ms, now_ms, entries)
    req = CommitRequest(ids=[eid], cache_writes=writes, cache_registry=registry)
    assert commit_batch(r, K, "w1", req).ok


def test_a_batch_goes_to_one_hash_per_shard_and_lives_between_ttl_and_ttl_plus_a_bucket(r):
    now, ttl = int(time.time() * 1000), 2 * DAY_MS
    ids = [f"msg-{i}" for i in range(200)]
    _write(r, ids, ttl, now)
    width = bucket_width_ms(ttl)
    assert width == ttl // 8
    keys = sorted(k.decode() for k in r.scan_iter(match=K.cache_bucket_prefix + "*"))
    expected = sorted({K.cache_bucket(width, now // width, zlib.crc32(i.encode()) % 16) for i in ids})
    assert keys == expected and len(keys) == LABEL_CACHE_SHARDS
    assert sum(r.hlen(k) for k in keys) == 200
    for k in keys:  # expires at the end of the bucket plus the TTL, by the writer's clock
        left = r.pttl(k)
        assert ttl - 5_000 <= left <= ttl + width
        assert abs(now + left - ((now // width + 1) * width + ttl)) < 5_000
    found = fetch_cached(r, K, ids + ["never"], now)
    assert found["never"] is None
    for n, i in enumerate(ids):
        c = found[i]
        assert c.row == _row(n) and c.learnt is None and c.pred_label == "spam"
        assert c.log_proba == {"spam": -0.25, "ham": -1.5} and c.weight == 1.0
        assert c.field == entry_field(i) and c.key == K.cache_bucket(width, now // width, shard_of(i))


def test_the_newest_entry_of_an_id_wins(r):
    ttl = 80_000
    now = int(time.time() * 1000)
    _write(r, ["a", "b"], ttl, now - 3 * bucket_width_ms(ttl), learnt="ham", tag="-old")
    _write(r, ["a"], ttl, now, tag="-new")
    found = fetch_cached(r, K, ["a", "b"], now)
    assert (found["a"].pred_label, found["a"].learnt) == ("spam-new", None)
    assert (found["b"].pred_label, found["b"].learnt) == ("spam-old", "ham")


def test_writers_with_other_ttls_and_clocks_are_found(r):
    """Each width in use is in the registry with its TTL: a reader finds the entries of
    writers with other TTLs, and of a writer whose clock is up to a bucket ahead or behind."""
    now = int(time.time() * 1000)
    _write(r, ["short"], 80_000, now)
    _write(r, ["long"], 7 * DAY_MS, now - 6 * DAY_MS)  # written 6 days ago, kept for 7
    _write(r, ["ahead"], 80_000, now + bucket_width_ms(80_000) - 1)
    _write(r, ["behind"], 80_000, now - 80_000 + 10)  # near the end of its TTL
    found = fetch_cached(r, K, ["short", "long", "ahead", "behind"], now)
    assert all(found[i] is not None for i in found), found
    assert set(r.hgetall(K.cache_buckets)) == {b"10000", str(7 * DAY_MS // 8).encode()}


def test_a_width_whose_last_write_expired_leaves_the_registry(r):
    now = int(time.time() * 1000)
    _write(r, ["old"], 80_000, now - 200_000)  # its TTL and two buckets are over
    _write(r, ["new"], 800_000, now)
    r.hset(K.cache_buckets, "10000", b"80000:%d" % (now - 200_000))  # as that write left it
    found = fetch_cached(r, K, ["old", "new"], now)
    assert found["old"] is None and found["new"] is not None
    assert set(r.hgetall(K.cache_buckets)) == {b"100000"}


def test_a_label_change_replaces_the_whole_entry_read(r):
    """label_change: the commit compares the entry's bytes as read and writes the same
    entry with the new label; once the entry has changed, the same change conflicts."""
    now = int(time.time() * 1000)
    _write(r, ["m"], 80_000, now)
    before = fetch_cached(r, K, ["m"], now)["m"]
    change = label_change(before, "ham")
    assert change.expected == before.entry and change.new == relabel(before.entry, encode_label("ham"))
    eid = r.xadd(K.input, {"data": b"label"}).decode()
    r.xreadgroup(GROUP, "w1", {K.input: ">"})
    assert commit_batch(r, K, "w1", CommitRequest(ids=[eid], cache_cas=[change])).ok
    after = fetch_cached(r, K, ["m"], now)["m"]
    assert after.learnt == "ham" and after.entry == change.new
    assert (after.row, after.pred_label, after.log_proba, after.weight, after.ts) == \
        (before.row, before.pred_label, before.log_proba, before.weight, before.ts)
    eid = r.xadd(K.input, {"data": b"label"}).decode()
    r.xreadgroup(GROUP, "w1", {K.input: ">"})
    stale = label_change(before, "spam")
    assert commit_batch(r, K, "w1", CommitRequest(ids=[eid], cache_cas=[stale])).conflicts == [0]
    assert fetch_cached(r, K, ["m"], now)["m"].learnt == "ham"


def test_without_any_write_a_lookup_finds_nothing(r):
    assert fetch_cached(r, K, ["a", "b"], int(time.time() * 1000)) == {"a": None, "b": None}
    assert fetch_cached(r, K, [], 0) == {}


def test_an_entry_that_does_not_decode_is_as_good_as_expired():
    good = encode_entry(encode_label("spam"), _row(0).to_bytes(), "ham", {"ham": 0.0}, 1.0, 2.0)
    assert decode_entry("k", "rx", good).learnt == "spam"
    for bad in (b"", b"\x00", b"\x00\x05ab", b"\x00\x00\x93\x01\x02\x03", good[:-3],
                good + b"\xc1", b"\x00\x00" + good[2 + len(encode_label("spam")):].replace(b"\x96\x01", b"\x96\x02", 1)):
        assert decode_entry("k", "rx", bad) is None


def test_entries_expire_with_their_bucket(redis_server):
    r = redis_server.client()
    _write(r, ["soon"], 200, int(time.time() * 1000))  # buckets of 25 ms
    assert fetch_cached(r, K, ["soon"], int(time.time() * 1000))["soon"] is not None
    time.sleep(0.4)
    assert fetch_cached(r, K, ["soon"], int(time.time() * 1000))["soon"] is None
    assert not list(r.scan_iter(match=K.cache_bucket_prefix + "*"))


def test_shards_are_the_same_in_every_process():
    ids = ["m1", "é-2", "x" * 300]
    code = ("import sys; from streamnb_workers.store.label_cache import shard_of; "
            f"print([shard_of(i) for i in {ids!r}])")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=dict(os.environ, PYTHONHASHSEED=str(seed))).stdout
            for seed in (1, 2, 3)}
    assert outs == {f"{[shard_of(i) for i in ids]}\n"}


def test_a_batch_of_entries_is_the_msgpack_of_each(monkeypatch):
    """``encode_entries`` (C packer, and without it) against msgpack itself: the learnt
    label (with its teacher unless the default's) after its length, then the fields."""
    import struct

    import msgpack

    from streamnb_workers.store import label_cache
    from streamnb_workers.store.label_cache import encode_entries

    parts = [(None, ("default", 0), b"r1", "ham", {"ham": -0.25, "spam": -1.5}, 1.0, 5.5, None, None),
             ("spam", ("default", 0), b"r2", "spam", {"spam": np.float64(-0.5)}, 2, 6.0, "k2", None),
             (3, ("src", 4), b"r3", 3, {3: -1.0}, 0.5, 7.0, "k3", None),
             ("spam", ("default", 0), b"r4", "ham", {}, 1.0, 8.0, None, (b"c", 0.75))]

    def want(label, teacher, row, pred, lp, w, ts, key, ch):
        learnt = b"" if label is None else msgpack.packb(label) + (
            b"" if teacher == ("default", 0) else msgpack.packb(list(teacher)))
        fields = [1, row, pred, {k: float(v) for k, v in lp.items()}, float(w), float(ts)]
        fields += [key] if key is not None or ch is not None else []
        fields += [[ch[0], ch[1]]] if ch is not None else []
        return struct.pack(">H", len(learnt)) + learnt + msgpack.packb(fields, use_bin_type=True)

    expected = [want(*p) for p in parts]
    assert encode_entries(parts) == expected
    monkeypatch.setattr(label_cache, "_PACK_ARRAY", None)
    assert encode_entries(parts) == expected

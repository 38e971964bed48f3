"""redis-server's own time per message in the commit script, and what the cache rows cost.

A private redis-server; batches of ``--batch`` pending entries committed by the daemon's
commit script (``streamnb_workers.store.commit.commit_batch``) with payloads of the sizes a batch of
corpus mail has (``--row-bytes`` per cached row, ``--out-bytes`` per prediction,
``--delta-bytes`` of log delta per message: the defaults are the figures of
``python -m benchmarks.end_to_end``, docs/performance.md). Redis' own accounting
(``INFO commandstats``: microseconds inside each command, the script included) is read
after each variant:

* the commit as the daemon sends it (a cache entry per message, as a field of one of the
  batch's bucket hashes: an ``HSET`` and a ``PEXPIRE`` per hash, at most 16 a batch,
  workers/store/label_cache.py);
* without cache entries (``--no-cache-labelled`` on labelled traffic);
* for comparison, by a script doing nothing else: the same entries in the other layout
  the cache could have, a hash of 5 fields and its ``PEXPIRE`` per message;
* the same arguments as the default commit sent to a script that returns at once: what
  getting them into Lua alone costs (Redis copies every argument into a Lua string);
* the commit's ownership check alone (its first step, cut from workers/store/scripts/commit.lua: one
  ``XPENDING`` from the first id to the last, then each id looked up in its reply), and
  that ``XPENDING`` with nothing else: what the lookups add;
* a batch's outputs written to a stream (an ``XADD`` each), from one argument each as the
  commit sends them, and from one argument holding them all, cut with ``string.sub`` in
  the script (of equal widths: a lower bound for outputs of varying size, which would also
  need their lengths): whether fewer arguments would cost Redis less;
* reading a batch of input entries of ``--entry-bytes``: a plain ``XREADGROUP`` (what a
  worker serving a model with others sends) against workers/store/scripts/read.lua's announcement and
  that ``XREADGROUP`` in one ``MULTI`` (what a worker alone sends behind each commit);
* redis-server's CPU for the default commit, sent to the script and as the same writes
  in plain commands in one ``MULTI`` (the ownership check's ``XPENDING`` included, its
  reply unused): what the Lua layer costs, arguments and ``redis.call`` included. A
  ``MULTI`` cannot make its writes depend on that check, so this measures the layer; it
  is not a way to commit.

Then the price of narrowing what a failover can lose (docs/operations.md): a master with
one replica, the default commit sent as the worker sends it, asynchronously replicated (the
default), on a master set to ``min-replicas-to-write 1``, and followed by ``WAIT 1 0`` on
the same connection; per variant the worker's milliseconds per batch (the round trips)
and the master's CPU per message (``INFO cpu``), the replica checked to hold every log
entry afterwards.

Then the worker's side of the same commit: the time to pack its ``EVALSHA`` (about 9
arguments a message) in the Redis protocol with redis-py (hiredis) and with
``hiredis.pack_command`` alone, as the worker does (the best of ``--repeat`` timings of 20
packings each).

Before all that, with the corpus at hand (``--corpus``), the mean bytes of a corpus
message's row as the worker caches it (pre-tokenized, the default 2**20 buckets), next to
the map form of the same rows; that mean is the default of ``--row-bytes``.

    python -m benchmarks.commit_cost [--batches 40] [--batch 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import hiredis

from benchmarks._common import (
    DEFAULT_CORPUS,
    RedisServer,
    best_ms,
    command_stats,
    format_table,
    print_header,
    redis_cpu_s,
)
from benchmarks.end_to_end import prefill
from streamnb_workers.defaults import DEFAULT_BATCH_SIZE
from streamnb_workers.store import commit as commit_module
from streamnb_workers.store.commit import CommitRequest, LuaScript, commit_batch
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.label_cache import batch_writes, encode_entry
from streamnb_workers.worker import intake

#: The cache's TTL in these runs: the daemon's default, 2 days.
TTL_MS = 172_800_000

#: The cache entries of a batch in the layout of a hash per message, for comparison: a
#: hash of five fields per message (row, prediction, learnt label, weight, time), and its
#: ``PEXPIRE``.
_HASH_PER_MESSAGE = LuaScript("""
for i = 1, #KEYS do
  local a = 5 * (i - 1)
  redis.call('HSET', KEYS[i], 'row', ARGV[a + 1], 'pred', ARGV[a + 2], 'learnt', ARGV[a + 3],
             'w', ARGV[a + 4], 't', ARGV[a + 5])
  redis.call('PEXPIRE', KEYS[i], 172800000)
end
return 1
""")


def message_hash(keys: ModelKeys, msg_id: str) -> str:
    """The key of one message's hash in the comparison above."""
    return f"{keys.prefix}:cache:{msg_id}"


def cache_writes(keys: ModelKeys, b: int, batch: int, row_bytes: int, now_ms: int,
                 rows: list[bytes] | None = None) -> Any:
    """The cache writes and registry record of batch ``b`` as the daemon makes them, with
    ``rows`` (default: ``batch`` random rows of ``row_bytes``) and a two-class prediction."""
    rows = [os.urandom(row_bytes) for _ in range(batch)] if rows is None else rows
    entries = [(f"{b}-{i}", encode_entry(b"\xa4spam", row, "spam",
                                         {"spam": -0.01, "ham": -4.6}, 1.0, now_ms / 1000))
               for i, row in enumerate(rows)]
    return batch_writes(keys, TTL_MS, now_ms, entries)


def _pending_ids(client: Any, keys: ModelKeys, n: int) -> list[str]:
    prefill(client, keys.name, [b"m"] * n)
    reply = client.xreadgroup(GROUP, "bench", {keys.input: ">"}, count=n)
    return [e[0].decode() for e in reply[0][1]]


def _us_per_message(client: Any, command: str, messages: int) -> float:
    stats = command_stats(client).get(command)
    return 1e6 * stats[1] / messages if stats else float("nan")


def commit_cost(client: Any, batches: int = 40, batch: int = 100, row_bytes: int = 789,
                out_bytes: int = 144, delta_bytes: int = 351) -> dict[str, float]:
    """redis-server microseconds per message for each variant (see the module docstring)."""
    results = {}
    now_ms = 1_700_000_000_000
    for variant in ("commit, cache entries (default: bucket hashes)", "commit, no cache entries"):
        keys = ModelKeys(f"cost{len(results)}")
        client.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
        client.config_resetstat()
        for b in range(batches):
            ids = _pending_ids(client, keys, batch)
            writes, registry = ([], None) if "no cache" in variant else \
                cache_writes(keys, b, batch, row_bytes, now_ms + 1000 * b)
            req = CommitRequest(ids=ids, outputs=[os.urandom(out_bytes) for _ in ids],
                                log_data=os.urandom(delta_bytes * batch), n_learnt=batch,
                                cache_writes=writes, cache_registry=registry)
            if not commit_batch(client, keys, "bench", req, 1_000_000, 100_000).ok:
                raise RuntimeError("the commit failed")
        results[variant] = _us_per_message(client, "evalsha", batches * batch)
    results["cache entries alone, a hash per message"] = hash_per_message_cost(
        client, batches, batch, row_bytes)
    results["the default commit's arguments, to a script returning at once"] = arguments_cost(
        client, batches, batch, row_bytes, out_bytes, delta_bytes)
    return results


_RETURN = LuaScript("return 1")


def arguments_cost(client: Any, batches: int = 40, batch: int = 100, row_bytes: int = 789,
                   out_bytes: int = 144, delta_bytes: int = 351) -> float:
    """redis-server microseconds per message for a script that returns at once, given the
    keys and arguments of the default commit: the cost of the arguments alone."""
    keys = ModelKeys("cost-args")
    total = 0.0
    for b in range(batches):
        writes, registry = cache_writes(keys, b, batch, row_bytes, 1_700_000_000_000 + 1000 * b)
        req = CommitRequest(ids=[f"1700000000000-{i}" for i in range(batch)],
                            outputs=[os.urandom(out_bytes) for _ in range(batch)],
                            log_data=os.urandom(delta_bytes * batch), n_learnt=batch,
                            cache_writes=writes, cache_registry=registry)
        script_keys, args = commit_module.script_args(keys, "bench", req, 1_000_000, 100_000)
        client.config_resetstat()
        _RETURN(client, script_keys, args)
        total += command_stats(client)["evalsha"][1]
    return 1e6 * total / (batches * batch)


_XADD_EACH_ARGUMENT = LuaScript("""
for i = 1, #ARGV do redis.call('XADD', KEYS[1], '*', 'data', ARGV[i]) end
return #ARGV
""")
_XADD_CUT_FROM_ONE = LuaScript("""
local all, n, w = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 0, n - 1 do
  redis.call('XADD', KEYS[1], '*', 'data', string.sub(all, i * w + 1, (i + 1) * w))
end
return n
""")


def outputs_cost(client: Any, batches: int = 40, batch: int = 100, out_bytes: int = 144,
                 ) -> dict[str, float]:
    """redis-server microseconds per message to ``XADD`` a batch's outputs of ``out_bytes``
    to a stream: one argument per output, against all of them in one argument cut in the
    script. For each, the script's own time (``INFO commandstats``) and redis-server's
    CPU over the calls (``INFO cpu``: the reading and parsing of the arguments on the way
    in too, which one argument would save). Each variant's stream is checked to hold
    every output, byte for byte."""
    ways = {
        "outputs written: one argument each (the commit's way)":
            lambda key, outputs: _XADD_EACH_ARGUMENT(client, [key], outputs),
        "outputs written: one argument for the batch, cut in the script":
            lambda key, outputs: _XADD_CUT_FROM_ONE(client, [key], [b"".join(outputs), len(outputs),
                                                                   out_bytes]),
    }
    out = {}
    for i, (variant, write) in enumerate(ways.items()):
        key = f"outputs-{i}"
        batches_of = [[os.urandom(out_bytes) for _ in range(batch)] for _ in range(batches)]
        client.config_resetstat()
        cpu0 = redis_cpu_s(client)
        for outputs in batches_of:
            write(key, outputs)
        cpu = redis_cpu_s(client) - cpu0
        us = _us_per_message(client, "evalsha", batches * batch)
        written = [fields[b"data"] for _, fields in client.xrange(key)]
        if written != [o for outputs in batches_of for o in outputs]:
            raise RuntimeError(f"{variant}: the stream does not hold the outputs sent")
        out[variant + ": the script"] = us
        out[variant + ": redis-server CPU"] = 1e6 * cpu / (batches * batch)
    return out


def _plain_commit(client: Any, keys: ModelKeys, ids: list[str], req: CommitRequest) -> bool:
    """``req``'s writes as workers/store/scripts/commit.lua makes them when it succeeds (the log entry
    after the log's last id is read, the learnt count, the outputs and their trim, the
    cache entries, their expiry and the registry, the acknowledgements), and the ownership
    check's ``XPENDING`` (its reply unused), as plain commands in one ``MULTI``; True
    (a ``MULTI`` has no check that could refuse it)."""
    pipe = client.pipeline(transaction=True)
    pipe.xpending_range(keys.input, GROUP, min=ids[0], max=ids[-1], count=len(ids) + 16,
                        consumername="bench")
    pipe.xrevrange(keys.log, count=1)
    pipe.xadd(keys.log, {"data": req.log_data})
    pipe.incrby(keys.learnt, req.n_learnt)
    for output in req.outputs:
        pipe.xadd(keys.out, {"data": output})
    pipe.xtrim(keys.out, maxlen=1_000_000, approximate=True)
    for w in req.cache_writes:
        pipe.hset(w.key, items=w.values)
        pipe.pexpire(w.key, w.ttl_ms)
    if req.cache_registry is not None:
        pipe.hset(req.cache_registry[0], req.cache_registry[1], req.cache_registry[2])
    pipe.xack(keys.input, GROUP, *ids)
    pipe.execute()
    return True


def lua_layer_cost(client: Any, batches: int = 40, batch: int = 100, row_bytes: int = 789,
                   out_bytes: int = 144, delta_bytes: int = 351) -> dict[str, float]:
    """redis-server's CPU per message (``INFO cpu``: parsing and networking included) for
    the default commit sent to workers/store/scripts/commit.lua, against the same writes sent as plain
    commands in one ``MULTI`` (:func:`_plain_commit`: what the commit would cost without
    the Lua layer, its ownership check reduced to the one ``XPENDING`` a ``MULTI`` cannot
    act on). The same payloads go both ways, and both must leave the same outputs, log
    data, learnt count and cache entries, with nothing pending."""
    now_ms = 1_700_000_000_000
    payloads = [([os.urandom(out_bytes) for _ in range(batch)], os.urandom(delta_bytes * batch),
                 [os.urandom(row_bytes) for _ in range(batch)]) for _ in range(batches)]
    ways = {"the commit script (workers/store/scripts/commit.lua)":
            lambda keys, ids, req: commit_batch(client, keys, "bench", req, 1_000_000, 100_000).ok,
            "the same writes as plain commands in one MULTI":
            lambda keys, ids, req: _plain_commit(client, keys, ids, req)}
    out, left = {}, []
    for i, (way, commit) in enumerate(ways.items()):
        keys = ModelKeys(f"lua-layer-{i}")
        client.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
        work = []
        for b, (outputs, log_data, rows) in enumerate(payloads):
            ids = _pending_ids(client, keys, batch)
            writes, registry = cache_writes(keys, b, batch, row_bytes, now_ms + 1000 * b, rows)
            work.append((ids, CommitRequest(ids=ids, outputs=outputs, log_data=log_data,
                                            n_learnt=batch, cache_writes=writes,
                                            cache_registry=registry)))
        cpu0 = redis_cpu_s(client)
        for ids, req in work:
            if not commit(keys, ids, req):
                raise RuntimeError(f"{way}: the commit failed")
        out[way + ": redis-server CPU"] = 1e6 * (redis_cpu_s(client) - cpu0) / (batches * batch)
        cache = {}
        for key in client.keys(keys.cache_bucket_prefix + "*"):
            cache.update(client.hgetall(key))
        left.append(([f[b"data"] for _, f in client.xrange(keys.out)],
                     [f[b"data"] for _, f in client.xrange(keys.log)], client.get(keys.learnt),
                     cache, client.xpending(keys.input, GROUP)["pending"]))
    if left[0] != left[1] or left[0][-1] != 0 or len(left[0][0]) != batches * batch:
        raise RuntimeError("the two ways did not leave the same writes")
    return out


#: The ways of replicating a commit that :func:`replication_cost` compares.
REPLICATION_VARIANTS = ("asynchronous replication (the default)", "min-replicas-to-write 1",
                        "WAIT 1 0 after each commit")


def wait_synced(replica: Any, timeout: float = 20.0) -> None:
    """Wait until ``replica`` (a client of it) has its link to the master up."""
    deadline = time.monotonic() + timeout
    while replica.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not sync with its master")
        time.sleep(0.05)


def rotated(items: tuple, k: int) -> tuple:
    """``items`` rotated left by ``k``.

    >>> rotated(("a", "b", "c"), 4)
    ('b', 'c', 'a')
    """
    k %= len(items)
    return items[k:] + items[:k]


def replication_cost(batches: int = 40, batch: int = 100, row_bytes: int = 789,
                     out_bytes: int = 144, delta_bytes: int = 351,
                     ) -> dict[str, tuple[float, float]]:
    """Per variant of :data:`REPLICATION_VARIANTS`: (the worker's median milliseconds per
    batch committed, the master's mean CPU microseconds per message), on a private master
    with one replica. The variants take turns batch by batch (so a busy moment of a shared
    host falls on all of them), each on a model of its own, with the same payloads; the
    replica must hold every log entry afterwards."""
    now_ms = 1_700_000_000_000
    payloads = [([os.urandom(out_bytes) for _ in range(batch)], os.urandom(delta_bytes * batch),
                 [os.urandom(row_bytes) for _ in range(batch)]) for _ in range(batches)]
    walls: dict[str, list[float]] = {v: [] for v in REPLICATION_VARIANTS}
    cpus = dict.fromkeys(REPLICATION_VARIANTS, 0.0)
    with RedisServer() as master, \
            RedisServer(["--replicaof", "127.0.0.1", str(master.port)]) as replica_server:
        client, replica = master.client(), replica_server.client()
        wait_synced(replica)
        commit_module.COMMIT_SCRIPT.load(client)
        work = {}
        for i, variant in enumerate(REPLICATION_VARIANTS):
            keys = ModelKeys(f"replication-{i}")
            client.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
            work[variant] = (keys, [])
            for b, (outputs, log_data, rows) in enumerate(payloads):
                ids = _pending_ids(client, keys, batch)
                writes, registry = cache_writes(keys, b, batch, row_bytes, now_ms + 1000 * b, rows)
                work[variant][1].append(CommitRequest(
                    ids=ids, outputs=outputs, log_data=log_data, n_learnt=batch,
                    cache_writes=writes, cache_registry=registry))
        client.execute_command("WAIT", 1, 10_000)
        for b in range(batches):
            for variant in rotated(REPLICATION_VARIANTS, b):  # (no variant always first)
                keys, reqs = work[variant]
                client.config_set("min-replicas-to-write", 1 if "min-replicas" in variant else 0)
                wait = "WAIT" in variant
                cpu0, t0 = redis_cpu_s(client), time.perf_counter()
                if not commit_batch(client, keys, "bench", reqs[b], 1_000_000, 100_000).ok:
                    raise RuntimeError(f"{variant}: the commit failed")
                # (the pool hands back the connection the commit used: WAIT waits for it)
                if wait and client.execute_command("WAIT", 1, 0) < 1:
                    raise RuntimeError("WAIT returned before the replica had the commit")
                walls[variant].append(time.perf_counter() - t0)
                cpus[variant] += redis_cpu_s(client) - cpu0
        client.config_set("min-replicas-to-write", 0)
        client.execute_command("WAIT", 1, 10_000)
        for keys, _ in work.values():
            if replica.xlen(keys.log) != batches:
                raise RuntimeError("the replica does not hold every log entry")
    return {v: (1e3 * statistics.median(walls[v]), 1e6 * cpus[v] / (batches * batch))
            for v in REPLICATION_VARIANTS}


def corpus_row_bytes(corpus_root: Any, batch: int = DEFAULT_BATCH_SIZE,
                     ) -> dict[str, float] | None:
    """Of a corpus message's row: mean bytes as cached (``rows_to_bytes``) and in the map
    form (a map of arrays), the share cached as gaps, and the microseconds per row
    of encoding the corpus in batches of ``batch`` each way (best of 3); None without the
    corpus."""
    from benchmarks._common import corpus_available, load_corpus
    from benchmarks.end_to_end import corpus_tokens, encode_messages
    from streamnb.features import Featurizer, rows_to_bytes
    from streamnb_workers.wire.codec import decode_input

    if not corpus_available(corpus_root):
        return None
    corpus = load_corpus(corpus_root)
    featurizer = Featurizer.from_config({})
    rows = [featurizer.featurize(decode_input(m, f"{i}-0").as_payload()) for i, m in
            enumerate(encode_messages(corpus, "tokens", tokens=corpus_tokens(corpus)))]
    cached = rows_to_bytes(rows)
    mapped = [r._map_bytes() for r in rows]  # (the map form, without the gaps)
    batches = [rows[i:i + batch] for i in range(0, len(rows), batch)]
    gaps_ms = best_ms(lambda: [rows_to_bytes(b) for b in batches], 3)
    map_ms = best_ms(lambda: [r._map_bytes() for r in rows], 3)
    n = len(rows)
    return {"cached": sum(map(len, cached)) / n, "map": sum(map(len, mapped)) / n,
            "gaps share": sum(c != m for c, m in zip(cached, mapped, strict=True)) / n,
            "gaps us": 1e3 * gaps_ms / n, "map us": 1e3 * map_ms / n}


#: What the ownership check of workers/store/scripts/commit.lua needs from the script before it.
_OWNERSHIP_PRELUDE = """local group, consumer = ARGV[1], ARGV[2]
local n_ids = tonumber(ARGV[3])
local first_id = 4
"""


def ownership_script() -> LuaScript:
    """The ownership check of workers/store/scripts/commit.lua (its step 1) as a script of its own:
    ``KEYS[1]`` the input stream, ``ARGV`` group, consumer, n, then the n ids; returns
    ``"ok"``, or ``{"lost", ids...}`` as the commit does."""
    source = commit_module.COMMIT_SCRIPT.source
    start, end = source.index("-- 1. ownership"), source.index("-- 2. compare-and-set")
    return LuaScript(_OWNERSHIP_PRELUDE + source[start:end] + "return 'ok'\n")


_XPENDING_RANGE = LuaScript(_OWNERSHIP_PRELUDE + """
local p = redis.call('XPENDING', KEYS[1], group, ARGV[first_id], ARGV[first_id + n_ids - 1],
                     n_ids + 16, consumer)
return #p
""")


def ownership_cost(client: Any, batches: int = 40, batch: int = 100) -> dict[str, float]:
    """redis-server microseconds per message of the commit's ownership check, and of one
    ``XPENDING`` over the batch's range alone, on batches of pending entries."""
    out = {}
    for name, script in (("the commit's ownership check alone", ownership_script()),
                         ("one XPENDING over the batch's range alone", _XPENDING_RANGE)):
        keys = ModelKeys(f"own-{len(out)}")
        client.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
        id_batches = [_pending_ids(client, keys, batch) for _ in range(batches)]
        client.config_resetstat()
        for ids in id_batches:
            reply = script(client, [keys.input], [GROUP, "bench", len(ids), *ids])
            if reply not in (b"ok", len(ids)):
                raise RuntimeError(f"{name}: unexpected reply {reply!r}")
        out[name] = _us_per_message(client, "evalsha", batches * batch)
    return out


def hash_per_message_cost(client: Any, batches: int = 40, batch: int = 100, row_bytes: int = 789,
                          ) -> float:
    """redis-server microseconds per message to write a batch's cache entries as the daemon
    in the layout of a hash per message (row, prediction, label, weight, time as text)."""
    keys = ModelKeys("cost-hash")
    client.config_resetstat()
    for b in range(batches):
        args = [x for _ in range(batch) for x in (os.urandom(row_bytes), os.urandom(60),
                                                  b"\xa4spam", b"1.0", b"1700000000.123456")]
        _HASH_PER_MESSAGE(client, [message_hash(keys, f"{b}-{i}") for i in range(batch)], args)
    return _us_per_message(client, "evalsha", batches * batch)


def read_cost(client: Any, batches: int = 40, batch: int = 100, entry_bytes: int = 3161,
              ) -> dict[str, float]:
    """redis-server microseconds per message to read batches of ``entry_bytes`` entries:
    a plain ``XREADGROUP`` (what a worker serving a model with others sends) and
    workers/store/scripts/read.lua with the ``XREADGROUP`` behind it in one ``MULTI`` (the announcement
    and the read in one step: what a worker alone sends behind each commit)."""
    out = {}
    for variant in ("XREADGROUP", "workers/store/scripts/read.lua"):
        keys = ModelKeys(f"read-{len(out)}")
        prefill(client, keys.name, [os.urandom(entry_bytes) for _ in range(batches * batch)])
        client.xgroup_create(keys.input, GROUP, id="0")
        intake.READ_SCRIPT.load(client)
        client.config_resetstat()
        for _ in range(batches):
            if variant == "XREADGROUP":
                client.xreadgroup(GROUP, "bench", {keys.input: ">"}, count=batch)
            else:
                intake.read_now(client, keys, "bench", batch, True)
        # EXEC's time is the transaction's, the script and the read included
        commands = ("xreadgroup",) if variant == "XREADGROUP" else ("multi", "exec")
        out[f"read a batch: {variant}"] = sum(
            _us_per_message(client, command, batches * batch) for command in commands)
    return out


def packing_cost(batch: int = 100, row_bytes: int = 789, out_bytes: int = 144,
                 delta_bytes: int = 351, repeat: int = 5) -> dict[str, float]:
    """Milliseconds to pack one batch's commit command, per packer (the same bytes)."""
    import fakeredis

    keys = ModelKeys("pack")
    writes, registry = cache_writes(keys, 0, batch, row_bytes, 1_700_000_000_000)
    req = CommitRequest(ids=[f"17000000000{i:02d}-0" for i in range(batch)],
                        outputs=[os.urandom(out_bytes) for _ in range(batch)],
                        log_data=os.urandom(delta_bytes * batch), n_learnt=batch,
                        cache_writes=writes, cache_registry=registry,
                        inflight_key=keys.inflight, inflight_field="w|1-0")
    script_keys, args = commit_module.script_args(keys, "w", req, 1_000_000, 100_000)
    command = ["EVALSHA", commit_module.COMMIT_SCRIPT.sha, len(script_keys), *script_keys, *args]
    conn = fakeredis.FakeRedis().connection_pool.get_connection()  # (redis-py's own packer)
    packers = {"redis-py (hiredis)": lambda: conn.pack_commands([command])}
    if hiredis.pack_command(tuple(command)) != b"".join(conn.pack_commands([command])):
        raise RuntimeError("the two packers disagree")
    packers["hiredis.pack_command (the worker's way)"] = lambda: hiredis.pack_command(tuple(command))
    return {name: best_ms(pack, repeat) for name, pack in packers.items()}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH_SIZE, help="the worker's default")
    ap.add_argument("--row-bytes", type=int, default=None,
                    help="bytes of a cached row (default: the corpus mean, else 403)")
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--out-bytes", type=int, default=144)
    ap.add_argument("--delta-bytes", type=int, default=351)
    ap.add_argument("--entry-bytes", type=int, default=3161,
                    help="bytes of an input entry in the read rows (a token payload's mean)")
    args = ap.parse_args(argv)
    print_header("redis-server time per message in the commit script", "benchmarks.commit_cost",
                 argv)
    sizes = corpus_row_bytes(Path(args.corpus), args.batch)
    if sizes is not None:
        print(f"a corpus row as cached: {sizes['cached']:,.0f} bytes on average "
              f"({sizes['map']:,.0f} in the map form; "
              f"{sizes['gaps share']:.0%} of the rows cached as gaps)")
        print(f"encoding it: {sizes['gaps us']:.2f} us a row with rows_to_bytes in batches of "
              f"{args.batch} ({sizes['map us']:.2f} us one by one in the map form)")
    if args.row_bytes is None:
        args.row_bytes = round(sizes["cached"]) if sizes is not None else 403
    with RedisServer() as server:
        client = server.client()
        res = commit_cost(client, args.batches, args.batch, args.row_bytes,
                          args.out_bytes, args.delta_bytes)
        res.update(ownership_cost(client, args.batches, args.batch))
        res.update(outputs_cost(client, args.batches, args.batch, args.out_bytes))
        res.update(read_cost(client, args.batches, args.batch, args.entry_bytes))
        res.update(lua_layer_cost(client, args.batches, args.batch, args.row_bytes,
                                  args.out_bytes, args.delta_bytes))
    print(format_table(["variant", "redis-server us/message"], [[k, v] for k, v in res.items()]))
    default, bare = res["commit, cache entries (default: bucket hashes)"], res["commit, no cache entries"]
    print(f"cache entries: {default - bare:.1f} us of {default:.1f} us per message in the commit "
          f"(a hash per message: "
          f"{res['cache entries alone, a hash per message']:.1f} us alone)")
    replication = replication_cost(args.batches, args.batch, args.row_bytes, args.out_bytes,
                                   args.delta_bytes)
    print(format_table(["a master and one replica: the commit with", "worker ms per batch",
                        "master CPU us/message"], [[k, *v] for k, v in replication.items()]))
    packing = packing_cost(args.batch, args.row_bytes, args.out_bytes, args.delta_bytes)
    print(format_table(["the worker packing the commit command", "ms per batch"],
                       [[k, v] for k, v in packing.items()]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

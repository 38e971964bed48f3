"""The atomic commit script, on fakeredis[lua] and on a real redis-server."""

from __future__ import annotations

import pytest
import redis

from streamnb_workers.store import commit as commit_module
from streamnb_workers.store.commit import (
    CacheCas,
    CacheWrite,
    CommitRequest,
    commit_batch,
    send_commit,
)
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.label_cache import encode_label, relabel
from streamnb_workers.worker import intake

K = ModelKeys("t")


def _read(r, consumer: str, n: int) -> list[str]:
    for i in range(n):
        r.xadd(K.input, {"data": f"m{i}".encode()})
    r.xgroup_create(K.input, GROUP, id="0", mkstream=True)
    reply = r.xreadgroup(GROUP, consumer, {K.input: ">"}, count=n)
    return [e[0].decode() for e in reply[0][1]]


def _nothing_written(r) -> bool:
    return r.xlen(K.log) == 0 and r.xlen(K.out) == 0 and r.xlen(K.dead) == 0 and not r.exists(K.learnt)


def test_commit_writes_everything_and_acks(r):
    ids = _read(r, "w1", 3)
    bucket_a, bucket_b = K.cache_bucket(10, 7, 0), K.cache_bucket(10, 7, 5)
    req = CommitRequest(ids=ids, outputs=[b"o1", b"o2"], dead=[b"d"], log_data=b"delta", n_learnt=2,
                        cache_writes=[CacheWrite(bucket_a, 60000, ["ra", b"\x00\x00A", "rb", b"B"]),
                                      CacheWrite(bucket_b, 30000, ["rc", b"C"])],
                        cache_registry=(K.cache_buckets, "10", "80:75"))
    res = commit_batch(r, K, "w1", req)
    assert res.ok and res.log_id == r.xrange(K.log)[0][0].decode()
    assert [f[b"data"] for _, f in r.xrange(K.out)] == [b"o1", b"o2"]
    assert r.xlen(K.dead) == 1 and int(r.get(K.learnt)) == 2
    assert r.hgetall(bucket_a) == {b"ra": b"\x00\x00A", b"rb": b"B"}
    assert r.hgetall(bucket_b) == {b"rc": b"C"}
    assert 30000 < r.pttl(bucket_a) <= 60000 and 0 < r.pttl(bucket_b) <= 30000
    assert r.hgetall(K.cache_buckets) == {b"10": b"80:75"}
    assert r.xpending(K.input, GROUP)["pending"] == 0


def test_a_cache_write_of_more_than_500_values_is_whole(r):
    """The script writes a bucket's fields in HSETs of 500 values (Lua's unpack has a
    limit): every field arrives, the odd ones out included."""
    ids = _read(r, "w1", 1)
    values = [x for i in range(1201) for x in (f"r{i}", f"v{i}".encode())]
    req = CommitRequest(ids=ids, cache_writes=[CacheWrite(K.cache_bucket(10, 1, 2), 60000, values)])
    assert commit_batch(r, K, "w1", req).ok
    got = r.hgetall(K.cache_bucket(10, 1, 2))
    assert len(got) == 1201 and got[b"r0"] == b"v0" and got[b"r1200"] == b"v1200"


def test_lost_ids_write_nothing(r):
    ids = _read(r, "w1", 3)
    r.xclaim(K.input, GROUP, "w2", 0, [ids[1]])  # another worker took one
    res = commit_batch(r, K, "w1", CommitRequest(ids=ids, outputs=[b"o"], log_data=b"d", n_learnt=3))
    assert not res.ok and res.lost == [ids[1]]
    assert _nothing_written(r)
    assert r.xpending(K.input, GROUP)["pending"] == 3  # nothing acked
    # the worker drops the lost id and commits the rest
    res = commit_batch(r, K, "w1", CommitRequest(ids=[ids[0], ids[2]], log_data=b"d", n_learnt=2))
    assert res.ok and r.xpending(K.input, GROUP)["pending"] == 1


def test_ids_out_of_stream_order_are_checked_one_by_one(r):
    """The ownership check lists the consumer's pending entries between the first id and
    the last; ids outside that range (a batch not in stream order) are asked alone: the
    commit still succeeds when all are pending, and still finds one that is not."""
    ids = _read(r, "w1", 6)
    shuffled = [ids[3], ids[0], ids[5], ids[1], ids[4], ids[2]]
    r.xclaim(K.input, GROUP, "w2", 0, [ids[5]])
    res = commit_batch(r, K, "w1", CommitRequest(ids=shuffled, log_data=b"d", n_learnt=6))
    assert not res.ok and res.lost == [ids[5]] and _nothing_written(r)
    backwards = [i for i in reversed(ids) if i != ids[5]]  # an empty range: every id alone
    res = commit_batch(r, K, "w1", CommitRequest(ids=backwards, log_data=b"d", n_learnt=5))
    assert res.ok and r.xpending(K.input, GROUP)["pending"] == 1


def test_replayed_commit_is_a_no_op(r):
    ids = _read(r, "w1", 2)
    req = CommitRequest(ids=ids, outputs=[b"o1", b"o2"], log_data=b"d", n_learnt=2)
    assert commit_batch(r, K, "w1", req).ok
    again = commit_batch(r, K, "w1", req)  # e.g. a retry after a timeout
    assert sorted(again.lost) == sorted(ids)
    assert r.xlen(K.log) == 1 and r.xlen(K.out) == 2 and int(r.get(K.learnt)) == 2


def test_cache_compare_and_set_conflict_writes_nothing(r):
    """The compare-and-set of a cache entry: an entry that is no longer the one read writes
    nothing; the one read is replaced by the new entry, whatever the two labels' lengths."""
    ids = _read(r, "w1", 1)
    bucket = K.cache_bucket(10, 3, 1)
    ham = len(encode_label("ham")).to_bytes(2, "big") + encode_label("ham") + b"REST"
    r.hset(bucket, "rm", ham)
    spam = relabel(ham, encode_label("spam"))
    stale = CacheCas(bucket, "rm", expected=spam, new=relabel(ham, encode_label("news")))
    res = commit_batch(r, K, "w1", CommitRequest(ids=ids, log_data=b"d", cache_cas=[stale]))
    assert res.conflicts == [0] and r.xlen(K.log) == 0 and r.hget(bucket, "rm") == ham
    longer = encode_label("a much longer label than ham")
    good = CacheCas(bucket, "rm", expected=ham, new=relabel(ham, longer))
    assert commit_batch(r, K, "w1", CommitRequest(ids=ids, log_data=b"d", cache_cas=[good])).ok
    assert r.hget(bucket, "rm") == len(longer).to_bytes(2, "big") + longer + b"REST"
    # a missing (expired) entry is a conflict too, and so is a missing bucket
    for key, field in ((bucket, "rgone"), (K.cache_bucket(10, 9, 9), "rm")):
        ids = [r.xadd(K.input, {"data": b"z"}).decode()]
        r.xreadgroup(GROUP, "w1", {K.input: ">"})
        gone = CacheCas(key, field, expected=ham, new=spam)
        assert commit_batch(r, K, "w1", CommitRequest(ids=ids, cache_cas=[gone])).conflicts == [0]


def test_the_second_of_two_compare_and_sets_conflicts_alone(r):
    """Conflicts are numbered by compare-and-set; one conflict writes nothing at all."""
    ids = _read(r, "w1", 1)
    a, b = K.cache_bucket(10, 1, 1), K.cache_bucket(10, 1, 2)
    r.hset(a, "ra", b"\x00\x00A")
    r.hset(b, "rb", b"\x00\x00B")
    cas = [CacheCas(a, "ra", b"\x00\x00A", b"\x00\x01xA"), CacheCas(b, "rb", b"\x00\x00X", b"")]
    res = commit_batch(r, K, "w1", CommitRequest(ids=ids, log_data=b"d", cache_cas=cas))
    assert res.conflicts == [1] and r.hget(a, "ra") == b"\x00\x00A" and r.xlen(K.log) == 0
    cas[1] = CacheCas(b, "rb", b"\x00\x00B", b"\x00\x01yB")
    assert commit_batch(r, K, "w1", CommitRequest(ids=ids, log_data=b"d", cache_cas=cas)).ok
    assert (r.hget(a, "ra"), r.hget(b, "rb")) == (b"\x00\x01xA", b"\x00\x01yB")


def test_the_script_reads_its_arguments_by_name():
    """script_args names every value it passes; the lists sit where the names say."""
    req = CommitRequest(ids=["1-0", "2-0"], outputs=[b"o"], dead=[b"d1", b"d2"],
                        cache_writes=[CacheWrite("kw", 500, ["rf", b"e"])],
                        cache_cas=[CacheCas("kc", "rc", b"old", b"new")],
                        cache_registry=("kr", "10", "80:1"), inflight_key="ki",
                        inflight_field="w1|1-0")
    keys, args = commit_module.script_args(K, "w1", req, 7, 8)
    assert keys == [K.input, K.out, K.dead, K.log, K.learnt, "kw", "kc", "kr", "ki"]
    named = dict(zip(args[1:1 + 2 * args[0]:2], args[2:2 + 2 * args[0]:2], strict=True))

    def at(name: str, n: int) -> list:  # ARGV is 1-based
        return args[named[name] - 1:named[name] - 1 + n]

    assert at("ids_at", named["n_ids"]) == ["1-0", "2-0"]
    assert at("outputs_at", named["n_outputs"]) == [b"o"]
    assert at("dead_at", named["n_dead"]) == [b"d1", b"d2"]
    assert at("writes_at", 4) == [500, 2, "rf", b"e"] and named["n_writes"] == 1
    assert at("cas_at", 3) == ["rc", b"old", b"new"] and named["n_cas"] == 1
    assert [keys[named[k] - 1] for k in ("write_keys_at", "cas_keys_at", "registry_key_at",
                                         "inflight_key_at")] == ["kw", "kc", "kr", "ki"]
    assert (named["group"], named["consumer"], named["out_maxlen"], named["dead_maxlen"]) == \
        (GROUP, "w1", 7, 8)
    assert (named["registry_field"], named["registry_value"], named["inflight_field"]) == \
        ("10", "80:1", "w1|1-0")
    assert len(args) == 1 + 2 * args[0] + 2 + 1 + 2 + 4 + 3


def test_decay_events_every_k_learnt_messages(r):
    ids = _read(r, "w1", 3)
    for i, n in enumerate([3, 4, 5]):  # 3, 7, 12 learnt: boundaries of 5 crossed at 7 and 12
        res = commit_batch(r, K, "w1", CommitRequest(ids=[ids[i]], log_data=f"d{i}".encode(),
                                                     n_learnt=n, decay_every=5, decay_data=b"decay"))
        assert res.ok
    assert [f[b"data"] for _, f in r.xrange(K.log)] == [b"d0", b"d1", b"decay", b"d2", b"decay"]


def test_a_commit_says_which_log_entry_came_before_its_delta(r):
    """The reply names the delta's entry and :log's last entry before the commit wrote any
    (what a worker needs to apply its own delta without reading it back); "" where there is
    none. Decay entries written after the delta make the log id another id than the delta's."""
    ids = _read(r, "w1", 4)
    first = commit_batch(r, K, "w1", CommitRequest(ids=[ids[0]], log_data=b"d0", n_learnt=1))
    assert (first.prev_id, first.delta_id) == ("", first.log_id)
    second = commit_batch(r, K, "w1", CommitRequest(ids=[ids[1]], log_data=b"d1", n_learnt=1))
    assert (second.prev_id, second.delta_id) == (first.log_id, second.log_id)
    assert [eid.decode() for eid, _ in r.xrange(K.log)] == [first.log_id, second.log_id]
    quiet = commit_batch(r, K, "w1", CommitRequest(ids=[ids[2]], outputs=[b"o"]))
    assert (quiet.log_id, quiet.prev_id, quiet.delta_id) == ("", "", "")
    decayed = commit_batch(r, K, "w1", CommitRequest(ids=[ids[3]], log_data=b"d3", n_learnt=2,
                                                     decay_every=4, decay_data=b"decay"))
    log = [(eid.decode(), f[b"data"]) for eid, f in r.xrange(K.log)]
    assert [data for _, data in log] == [b"d0", b"d1", b"d3", b"decay"]
    assert decayed.prev_id == second.log_id
    assert (decayed.delta_id, decayed.log_id) == (log[2][0], log[3][0])


def test_out_is_capped_and_the_script_survives_a_flush(r):
    ids = _read(r, "w1", 1)
    outs = [f"o{i}".encode() for i in range(1000)]
    r.script_flush()
    assert commit_batch(r, K, "w1", CommitRequest(ids=ids, outputs=outs), out_maxlen=100).ok
    assert 100 <= r.xlen(K.out) < 1000
    assert r.xrevrange(K.out, count=1)[0][1][b"data"] == b"o999"


def test_dead_letters_are_capped_separately_from_out(r):
    ids = _read(r, "w1", 1)
    dead = [f"d{i}".encode() for i in range(1000)]
    res = commit_batch(r, K, "w1", CommitRequest(ids=ids, outputs=[b"o"], dead=dead),
                       out_maxlen=0, dead_maxlen=100)
    assert res.ok
    assert 100 <= r.xlen(K.dead) < 1000 and r.xlen(K.out) == 1
    assert r.xrevrange(K.dead, count=1)[0][1][b"data"] == b"d999"


def test_commit_withdraws_the_inflight_announcement_only_when_it_succeeds(r):
    ids = _read(r, "w1", 2)
    r.hset(K.inflight, mapping={"w1": b"mine", "w2": b"theirs"})
    cache = [CacheWrite(K.cache_bucket(10, 1, 1), 60000, ["ra", b"row"])]
    lost = commit_batch(r, K, "w2", CommitRequest(ids=ids, log_data=b"d", inflight_key=K.inflight))
    assert not lost.ok and r.hgetall(K.inflight) == {b"w1": b"mine", b"w2": b"theirs"}
    res = commit_batch(r, K, "w1", CommitRequest(ids=ids, log_data=b"d", cache_writes=cache,
                                                 cache_registry=(K.cache_buckets, "10", "80:1"),
                                                 inflight_key=K.inflight))
    assert res.ok and r.hgetall(K.inflight) == {b"w2": b"theirs"}
    # the keys before it are still what they were
    assert r.hget(K.cache_bucket(10, 1, 1), "ra") == b"row" and r.hget(K.cache_buckets, "10") == b"80:1"


def test_commit_withdraws_only_its_own_batch_announcement(r):
    """One field per batch: the commit of a worker's first batch leaves the announcement
    of the next one it has already read (pipelined commits)."""
    ids = _read(r, "w1", 2)
    r.hset(K.inflight, mapping={"w1|1-0": b"first", "w1|2-0": b"next"})
    res = commit_batch(r, K, "w1", CommitRequest(ids=ids, log_data=b"d", inflight_key=K.inflight,
                                                 inflight_field="w1|1-0"))
    assert res.ok and r.hgetall(K.inflight) == {b"w1|2-0": b"next"}


def test_the_log_entry_names_the_announcement_its_commit_withdraws(r):
    """A worker waiting for that batch knows it is committed from the entry alone."""
    ids = _read(r, "w1", 2)
    r.hset(K.inflight, "w1|1-0", b"first")
    assert commit_batch(r, K, "w1", CommitRequest(ids=ids[:1], log_data=b"d1",
                                                  inflight_key=K.inflight,
                                                  inflight_field="w1|1-0")).ok
    assert commit_batch(r, K, "w1", CommitRequest(ids=ids[1:], log_data=b"d2")).ok
    (_, announced), (_, plain) = r.xrange(K.log)
    assert announced == {b"data": b"d1", b"inflight": b"w1|1-0"} and plain == {b"data": b"d2"}


def test_a_sent_commit_gives_what_the_direct_call_gives_and_the_client_stays_usable(r):
    ids = _read(r, "w1", 3)
    sent = send_commit(r, K, "w1", CommitRequest(ids=ids[:2], outputs=[b"o1", b"o2"],
                                                 log_data=b"delta", n_learnt=2))
    assert r.xlen(K.input) == 3  # the client's own connection is free meanwhile
    res = sent.result()
    assert res.ok and res.log_id == r.xrange(K.log)[0][0].decode()
    assert sent.result() is res  # read once
    assert r.xpending(K.input, GROUP)["pending"] == 1
    lost = send_commit(r, K, "w1", CommitRequest(ids=ids[:2])).result()
    assert lost.lost == ids[:2] and r.xlen(K.log) == 1  # a replay writes nothing, as before


def test_a_sent_commit_loads_the_script_after_a_flush(r):
    ids = _read(r, "w1", 1)
    r.script_flush()  # as after a restart of Redis: the first EVALSHA finds no script
    res = send_commit(r, K, "w1", CommitRequest(ids=ids, outputs=[b"o"], log_data=b"d")).result()
    assert res.ok and r.xlen(K.out) == 1 and r.xlen(K.log) == 1


def test_an_abandoned_commit_ran_whole_or_not_at_all(redis_server):
    r = redis_server.client()
    ids = _read(r, "w1", 50)
    sent = send_commit(r, K, "w1", CommitRequest(ids=ids, outputs=[b"o"] * 50, log_data=b"d",
                                                 n_learnt=50))
    sent.abandon()  # its connection is closed without reading the reply
    assert r.ping()  # the pool hands out a working connection
    pending = r.xpending(K.input, GROUP)["pending"]
    if pending == 0:
        assert r.xlen(K.log) == 1 and r.xlen(K.out) == 50 and int(r.get(K.learnt)) == 50
    else:
        assert pending == 50 and _nothing_written(r)
    with pytest.raises(RuntimeError, match="abandoned"):
        sent.result()


def test_read_script_reads_and_announces_in_one_step(r):
    """workers/store/scripts/read.lua and the XREADGROUP behind it in one MULTI: the announcement
    ordering.py would write, byte for byte, of the batch the read returns."""
    from streamnb_workers.replication.ordering import InflightBoard

    for i in range(700):
        r.xadd(K.input, {"data": f"m{i}".encode()})
    r.xgroup_create(K.input, GROUP, id="0", mkstream=True)
    intake.READ_SCRIPT.load(r)
    board = InflightBoard(r, K, "w1")
    seen = 0
    for count in (1, 127, 128, 255, 189):
        reply = intake.read_now(r, K, "w1", count, True, now=1.7e9 + 0.25)
        field, entries = intake.read_reply(reply)
        assert [e[1] for e in entries] == [{b"data": f"m{i}".encode()} for i in range(seen, seen + count)]
        first = entries[0][0].decode()
        name, (_, key, want_field, want_value) = board.announcement(first, count, now=1.7e9 + 0.25)
        assert field == name == want_field and r.hget(key, field) == want_value
        seen += count
    assert r.xpending(K.input, GROUP)["pending"] == seen == 700
    assert intake.read_reply(intake.read_now(r, K, "w1", 5, True)) == (None, [])
    r.xadd(K.input, {"data": b"late"})
    field, entries = intake.read_reply(intake.read_now(r, K, "w2", 5, False),
                                              announced=False)
    assert field is None and entries[0][1] == {b"data": b"late"}  # not announced
    assert len(r.hgetall(K.inflight)) == 5


def test_commands_sent_after_a_commit_run_after_it_and_keep_their_replies(r):
    ids = _read(r, "w1", 2)
    r.xadd(K.input, {"data": b"next"})
    intake.READ_SCRIPT.load(r)
    commit_module.COMMIT_SCRIPT.load(r)  # (else: NOSCRIPT, and the commit runs after them)
    after = [*intake.read_commands(K, "w1", 10, True), ["GET", K.learnt], ["HGET", K.out]]
    sent = send_commit(r, K, "w1", CommitRequest(ids=ids, log_data=b"d", n_learnt=2), after=after)
    assert sent.result().ok
    *read, learnt, error = sent.after
    assert read[:3] == [b"OK", b"QUEUED", b"QUEUED"]
    field, ((next_id, fields),) = intake.read_reply(read[3])
    assert field == f"w1|{next_id.decode()}" and r.hexists(K.inflight, field)
    assert fields == {b"data": b"next"}
    assert learnt == b"2"  # behind the script: it saw the commit
    assert isinstance(error, Exception) and r.ping()  # a failed command: its error, in step
    r.script_flush()  # both scripts gone: the commit runs again; the read still reads,
    r.xadd(K.input, {"data": b"later"})  # without its announcement
    sent = send_commit(r, K, "w1", CommitRequest(ids=[next_id.decode()], log_data=b"d2"),
                       after=intake.read_commands(K, "w1", 10, True))
    assert sent.result().ok and r.xlen(K.log) == 2
    assert isinstance(sent.after[-1][0], redis.exceptions.NoScriptError)
    field, ((later_id, fields),) = intake.read_reply(sent.after[-1])
    assert field is None and fields == {b"data": b"later"}
    assert r.xpending(K.input, GROUP)["pending"] == 1


def test_a_sent_commit_needs_a_connection_pool():
    class NoPool:  # as a Redis Cluster client: the worker does not pipeline there
        connection_pool = None

    with pytest.raises(TypeError, match="connection pool"):
        send_commit(NoPool(), K, "w1", CommitRequest(ids=["1-0"]))


def test_a_class_removal_is_logged_after_the_delta_and_releases_its_keys(r):
    """The drop entry follows the delta; every key whose record holds the class is deleted
    (with its order), over more records than one HSCAN page, whichever source taught it
    (a record with a teacher holds 4 fields); no other key, not even one of a label the
    class's label starts."""
    from streamnb_workers.wire.learn_keys import encode_record, record_prefix
    from streamnb_workers.wire.learn_sources import DEFAULT

    ids = _read(r, "w1", 2)
    records = {f"k{i}": encode_record(["Spam", "Spammer", "spam"][i % 3], 1.0 + i % 2,
                                      ("imap", i % 7) if i % 5 == 0 else DEFAULT)
               for i in range(3000)}
    r.hset(K.learnt_keys, mapping=records)
    r.zadd(K.key_order, {k: i for i, k in enumerate(records)})
    req = CommitRequest(ids=[ids[0]], log_data=b"delta", n_learnt=1,
                        key_store=(K.learnt_keys, K.key_order),
                        learn_keys=[("new-spam", encode_record("Spam", 1.0))],
                        class_drops=[(b"drop", record_prefix("Spam"))])
    res = commit_batch(r, K, "w1", req)
    assert res.ok
    log = [(eid.decode(), f[b"data"]) for eid, f in r.xrange(K.log)]
    assert [data for _, data in log] == [b"delta", b"drop"]
    assert (res.delta_id, res.log_id) == (log[0][0], log[1][0])
    left = {k.decode() for k in r.hkeys(K.learnt_keys)}
    assert left == {k for i, k in enumerate(records) if i % 3}  # the batch's own Spam key too
    assert {k.decode() for k in r.zrange(K.key_order, 0, -1)} == left
    # a removal alone (no delta): its entry, nothing else
    alone = commit_batch(r, K, "w1", CommitRequest(
        ids=[ids[1]], key_store=(K.learnt_keys, K.key_order),
        class_drops=[(b"drop2", record_prefix("Spam"))]))
    assert alone.ok and alone.delta_id == "" and alone.prev_id == log[1][0]
    assert r.xrange(K.log)[-1][1][b"data"] == b"drop2" and r.hlen(K.learnt_keys) == len(left)

"""Least privilege: real ``streamnb worker`` processes run under deploy/redis/users.acl.

A real redis-server loads the shipped ACL file. Two worker processes logged in as
``streamnb-worker`` process a labelled stream with a crashed consumer's pending entries,
delayed labels and a malformed message; afterwards the statistics equal one offline fit,
every message has exactly one prediction, and Redis's ACL LOG holds no refusal for the
worker user (so every command the worker sends, Lua calls included, is granted). A wrong
password, a user lacking one command, and a user of another role fail at start with one
line, exit status 2, no traceback, and change nothing.
"""

from __future__ import annotations

import re
import time

import msgpack
import pytest
import redis

from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.connection import RedisSettings, UrlConnector
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.worker import Worker, WorkerOptions
from tests.helpers.acl import (
    FEATURIZER,
    PRODUCER_PASSWORD,
    PRODUCER_USER,
    WORKER_PASSWORD,
    WORKER_USER,
    AclRedis,
    acl_refusals,
    cli,
    drained,
    one_line_failure,
    start_worker_cli,
    stop,
    wait_until,
    write_acl,
)
from tests.helpers.redis_server import REDIS_SERVER
from tests.helpers.workers import (
    assert_same_stats,
    count_spec,
    offline_model,
    produce,
    token_messages,
)

pytestmark = pytest.mark.redis


@pytest.mark.slow
def test_workers_run_a_whole_stream_under_the_shipped_acl(acl_redis, tmp_path):
    admin = acl_redis.client()
    name = "acl-mail"
    k = ModelKeys(name)
    msgs = token_messages(600, seed=11, labelled_share=0.7)
    msgs.insert(100, {"id": "bad", "tokens": "not a list"})  # a dead letter
    produce(admin, name, msgs[:300])
    # A consumer that crashed holding entries: the workers must claim them (XAUTOCLAIM).
    admin.xgroup_create(k.input, GROUP, id="0")
    ghost = admin.xreadgroup(GROUP, "ghost", {k.input: ">"}, count=25)
    assert len(ghost[0][1]) == 25

    url = acl_redis.url_for(WORKER_USER, WORKER_PASSWORD)
    logs = [tmp_path / f"w{i}.log" for i in range(2)]
    procs = [start_worker_cli(url, name, f"acl-w{i}", logs[i], "--log-level", "DEBUG")
             for i in range(2)]
    try:
        wait_until(lambda: admin.hlen(k.workers) == 2, 60, "both workers' heartbeats", procs, logs)
        produce(admin, name, msgs[300:])
        wait_until(lambda: drained(admin, name), 60, "the first pass", procs, logs)
        # Delayed labels for the unlabelled messages (cache reads and compare-and-set).
        late = [m for m in msgs if "label" not in m and m["id"] != "bad"][:60]
        labels = ["spam", "ham", "news"]
        refs = [{"ref": m["id"], "label": labels[i % 3]} for i, m in enumerate(late)]
        for m, r in zip(late, refs, strict=True):
            m["label"] = r["label"]
        for r in refs:
            admin.xadd(k.input, {"data": msgpack.packb(r)})
        wait_until(lambda: drained(admin, name), 60, "the delayed labels", procs, logs)
    finally:
        codes = stop(procs)
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]

    good = [m for m in msgs if m["id"] != "bad"]
    labelled = [m for m in good if "label" in m]
    model, _version = load_model(admin, name)
    assert_same_stats(model, offline_model("multinomial", {"n_features": 1024}, FEATURIZER, labelled))
    assert int(admin.get(k.learnt)) == len(labelled)
    out_ids = [msgpack.unpackb(f[b"data"])["id"] for _, f in admin.xrange(k.out)]
    assert sorted(out_ids) == sorted(m["id"] for m in good)
    dead = admin.xrange(k.dead)
    assert len(dead) == 1
    assert admin.xpending(k.input, GROUP)["pending"] == 0  # the ghost's 25 entries were claimed
    # Operators may use the worker's credentials for status and export.
    status = cli("status", "--redis", url, "--model", name, "--json")
    assert status.returncode == 0 and '"exists": true' in status.stdout, status.stderr
    export = cli("export", "--redis", url, "--model", name, "-o", str(tmp_path / "m.snb"))
    assert export.returncode == 0, export.stderr
    # Every command the workers sent (Lua calls included) was granted.
    assert acl_refusals(admin) == []
    assert not any(admin.keys(f"streamnb:{{{name}}}:access-check*"))
    assert len({msgpack.unpackb(f[b"data"])["worker"] for _, f in admin.xrange(k.out)}) == 2


def test_worker_api_under_the_acl_sends_only_granted_commands(acl_redis):
    admin = acl_redis.client()
    msgs = token_messages(300, seed=5, labelled_share=0.8)
    produce(admin, "acl-api", msgs)
    settings = RedisSettings(acl_redis.url_for(WORKER_USER, WORKER_PASSWORD), client_name="api-1")
    w = Worker(UrlConnector(settings), [count_spec("acl-api")],
               WorkerOptions(consumer="api-1", batch=50, block_ms=20, snapshot_every=3,
                             claim_idle_ms=200, heartbeat_s=0.1, stale_s=0.5, lease_ms=1500))
    w.run_until_idle(timeout=30)
    w.shutdown()
    labelled = [m for m in msgs if "label" in m]
    assert_same_stats(w.models["acl-api"].replica.model,
                      offline_model("multinomial", {"n_features": 1024}, FEATURIZER, labelled))
    assert admin.xlen(ModelKeys("acl-api").out) == len(msgs)
    assert admin.hget(ModelKeys("acl-api").snapshot, "log_id") is not None  # snapshot + trim ran
    assert acl_refusals(admin) == []


def test_wrong_password_fails_at_start_with_one_line(acl_redis):
    admin = acl_redis.client()
    produce(admin, "acl-pw", token_messages(5))
    before = sorted(admin.keys("*"))
    url = acl_redis.url_for(WORKER_USER, "not-the-password")
    t0 = time.monotonic()
    proc = cli("worker", "--redis", url, "--model", "acl-pw", "--kind", "multinomial",
               "--metrics-port", "0")
    elapsed = time.monotonic() - t0
    line = one_line_failure(proc)
    assert "refused the credentials" in line and "not-the-password" not in line, line
    assert elapsed < 20, elapsed
    assert sorted(admin.keys("*")) == before


def test_wrong_password_is_not_retried(acl_redis):
    """In process: the refusal comes back at once (redis-py would retry a ConnectionError)."""
    settings = RedisSettings(acl_redis.url_for(WORKER_USER, "wrong"))
    w = Worker(UrlConnector(settings), [count_spec("acl-fast")], WorkerOptions(consumer="f1"))
    t0 = time.monotonic()
    with pytest.raises(redis.AuthenticationError, match="refused the credentials"):
        w.run(install_signals=False)
    assert time.monotonic() - t0 < 1.0
    log = acl_refusals(acl_redis.client())
    assert [e["reason"] for e in log] == ["auth"] and log[0]["count"] == 1, log


def test_a_user_lacking_one_command_fails_at_start_naming_it(tmp_path):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")

    def without_xautoclaim(line: str) -> str:
        return line.replace(" +xautoclaim", "") if line.startswith(f"user {WORKER_USER} ") else line

    with AclRedis(write_acl(tmp_path, without_xautoclaim)) as server:
        admin = server.client()
        produce(admin, "acl-less", token_messages(5))
        before = sorted(admin.keys("*"))
        proc = cli("worker", "--redis", server.url_for(WORKER_USER, WORKER_PASSWORD),
                   "--model", "acl-less", "--kind", "multinomial", "--metrics-port", "0")
        line = one_line_failure(proc)
        assert re.search(r"may not run XAUTOCLAIM on streamnb:\{acl-less\}", line), line
        assert WORKER_PASSWORD not in line
        assert sorted(admin.keys("*")) == before  # no config, no group, no leftovers


def test_the_producer_user_cannot_run_a_worker(acl_redis):
    admin = acl_redis.client()
    produce(admin, "acl-prod", token_messages(5))
    before = sorted(admin.keys("*"))
    proc = cli("worker", "--redis", acl_redis.url_for(PRODUCER_USER, PRODUCER_PASSWORD),
               "--model", "acl-prod", "--kind", "multinomial", "--metrics-port", "0")
    line = one_line_failure(proc)
    assert "may not run" in line and "XREADGROUP" in line and "EVALSHA" in line, line
    assert sorted(admin.keys("*")) == before


def test_the_producer_user_can_produce_to_a_model_that_declares_its_classes(acl_redis, tmp_path):
    """``streamnb produce`` reads what it needs of the model's config with HMGET, the one
    command the producer user has for it (its classes, its number of shards)."""
    admin = acl_redis.client()
    from streamnb_workers.store.model_config import ModelSpec, ensure_config

    ensure_config(admin, ModelSpec("acl-cls", kind="multinomial", classes=["ham", "spam"]))
    src = tmp_path / "m.jsonl"
    src.write_text('{"id": "a", "text": "cheap meds", "label": "spam"}\n'
                   '{"id": "b", "text": "meeting", "label": "eggs"}\n')
    proc = cli("produce", "--redis", acl_redis.url_for(PRODUCER_USER, PRODUCER_PASSWORD),
               "--model", "acl-cls", str(src))
    # "eggs" is not a class: skipped, with its reason, and said by the exit code
    assert proc.returncode == 1 and "'eggs' is not one of the model's classes" in proc.stderr
    assert admin.xlen(ModelKeys("acl-cls").input) == 1
    assert acl_refusals(admin) == []

"""Redis passwords never reach logs or ``streamnb status`` output.

A real redis-server with the shipped ACL gives the worker user three extra passwords, one per
source: the URL, ``STREAMNB_REDIS_PASSWORD`` and ``--redis-password-file``. Worker processes
run a stream with ``--log-level DEBUG`` (redis-py's own debug lines included), then
``status`` (text and JSON), a refused password and a refused command are run the same way;
none of the outputs holds a password, while they do show the redacted URL.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamnb_workers.cli.settings import redis_settings
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.redaction import redact, redact_url, register_secret
from tests.helpers.acl import (
    WORKER_USER,
    AclRedis,
    cli,
    cli_env,
    drained,
    start_worker_cli,
    stop,
    wait_until,
    write_acl,
)
from tests.helpers.redis_server import REDIS_SERVER
from tests.helpers.workers import produce, token_messages

pytestmark = pytest.mark.redis

SECRETS = {"url": "Url-s3cret-7f3a", "env": "Env-s3cret-91bd", "file": "File-s3cret-c0de"}
WRONG = "Wrong-s3cret-5e5e"


@pytest.fixture
def server(tmp_path):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with AclRedis(write_acl(tmp_path)) as s:
        s.client().execute_command("ACL", "SETUSER", WORKER_USER, *(f">{p}" for p in SECRETS.values()))
        yield s


def sources(server: AclRedis, tmp_path: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    """source -> (connection flags, environment) giving the password that way."""
    bare = f"redis://{WORKER_USER}@127.0.0.1:{server.port}/0"
    pw_file = tmp_path / "redis-password"
    pw_file.write_text(SECRETS["file"] + "\n")
    pw_file.chmod(0o600)
    return {
        "url": (["--redis", server.url_for(WORKER_USER, SECRETS["url"])], cli_env()),
        "env": (["--redis", bare], cli_env(STREAMNB_REDIS_PASSWORD=SECRETS["env"])),
        "file": (["--redis", bare, "--redis-password-file", str(pw_file)], cli_env()),
    }


def assert_no_secret(text: str, where: str) -> None:
    for s in (*SECRETS.values(), WRONG):
        assert s not in text, f"{where} shows a password:\n{text[-3000:]}"


@pytest.mark.slow
def test_worker_logs_and_status_never_show_the_password(server, tmp_path):
    admin = server.client()
    src = sources(server, tmp_path)
    procs, logs = [], []
    for name, (flags, env) in src.items():
        logs.append(tmp_path / f"{name}.log")
        procs.append(start_worker_cli(None, f"red-{name}", f"red-{name}", logs[-1], *flags,
                                      "--log-level", "DEBUG", env=env))
    try:
        for name in src:
            k = ModelKeys(f"red-{name}")
            wait_until(lambda k=k: admin.hlen(k.workers) == 1, 60, f"worker {name} up", procs, logs)
            produce(admin, f"red-{name}", token_messages(60, seed=1))
        for name in src:
            wait_until(lambda n=name: drained(admin, f"red-{n}"), 60, f"{name} drained", procs, logs)
    finally:
        codes = stop(procs)
    assert codes == [0, 0, 0], [log.read_text()[-2000:] for log in logs]
    for name, log in zip(src, logs, strict=True):
        text = log.read_text()
        assert "serves model" in text, text[-2000:]  # it did log
        assert_no_secret(text, f"the {name} worker's log")
    assert "redis://streamnb-worker:***@127.0.0.1" in logs[0].read_text()

    for name, (flags, env) in src.items():
        for extra in ([], ["--json"]):
            proc = cli("status", *flags, "--model", f"red-{name}", "--log-level", "DEBUG", *extra,
                       env=env)
            assert proc.returncode == 0, proc.stderr
            assert "red-" + name in proc.stdout
            assert_no_secret(proc.stdout + proc.stderr, f"status {extra} ({name})")
            if name == "url":
                assert f"{WORKER_USER}:***@" in proc.stdout


def test_refusals_never_show_the_password(server, tmp_path):
    bad_url = server.url_for(WORKER_USER, WRONG)
    for command in (["worker", "--kind", "multinomial", "--metrics-port", "0"], ["status"]):
        proc = cli(*command, "--redis", bad_url, "--model", "red-bad", "--log-level", "DEBUG")
        assert proc.returncode == 2, proc.stderr
        assert "refused the credentials" in proc.stderr
        assert_no_secret(proc.stdout + proc.stderr, " ".join(command[:1]))
    env = cli_env(STREAMNB_REDIS_PASSWORD=WRONG)
    proc = cli("worker", "--kind", "multinomial", "--metrics-port", "0", "--redis",
               f"redis://{WORKER_USER}@127.0.0.1:{server.port}/0", "--model", "red-bad", env=env)
    assert proc.returncode == 2 and "refused the credentials" in proc.stderr, proc.stderr
    assert_no_secret(proc.stdout + proc.stderr, "worker (env password)")
    # a refused command (the producer user running a worker) names the user, not the password
    proc = cli("worker", "--kind", "multinomial", "--metrics-port", "0", "--redis",
               server.url_for("streamnb-producer", "streamnb-producer-dev-CHANGE-ME"),
               "--model", "red-bad")
    assert proc.returncode == 2 and "may not run" in proc.stderr, proc.stderr
    assert "streamnb-producer-dev-CHANGE-ME" not in proc.stderr


def test_settings_and_clients_do_not_print_the_password():
    s = redis_settings("rediss://bob:p%40ss%3Aword@db.example:6380/2", env={})
    assert s.password == "p@ss:word"
    for text in (repr(s), str(s), s.describe(), redact_url(s.url)):
        assert "p@ss:word" not in text and "p%40ss%3Aword" not in text, text
    assert redact_url(s.url) == "rediss://bob:***@db.example:6380/2"
    register_secret("hunter2-plain")
    assert redact("login failed for hunter2-plain") == "login failed for ***"
    client = RedisSettings("redis://u:Client-s3cret@127.0.0.1:1/0").make_client()
    assert "Client-s3cret" not in repr(client) and "Client-s3cret" not in str(client.connection_pool)

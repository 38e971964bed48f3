"""Redis ACL users of deploy/redis/users.acl and workers run as `streamnb worker` processes under them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from streamnb_workers.store.keys import GROUP, ModelKeys
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.workers import (
    ROOT,
)

ACL_FILE = ROOT / "deploy" / "redis" / "users.acl"


WORKER_USER, WORKER_PASSWORD = "streamnb-worker", "streamnb-worker-dev-CHANGE-ME"


ADMIN_USER, ADMIN_PASSWORD = "streamnb-admin", "streamnb-admin-dev-CHANGE-ME"


PRODUCER_USER, PRODUCER_PASSWORD = "streamnb-producer", "streamnb-producer-dev-CHANGE-ME"


SCORER_USER, SCORER_PASSWORD = "streamnb-scorer", "streamnb-scorer-dev-CHANGE-ME"


TRAINER_USER, TRAINER_PASSWORD = "streamnb-trainer", "streamnb-trainer-dev-CHANGE-ME"


FEATURIZER = {"bits": 10, "counts": "raw"}


class AclRedis(RedisServer):
    """A redis-server loading an ACL file; :meth:`client` logs in as the admin user."""

    def __init__(self, acl_file: Path, extra: list[str] | None = None, port: int | None = None) -> None:
        super().__init__(extra=["--aclfile", str(acl_file), *(extra or [])], port=port)

    def client(self, **kw: Any) -> redis.Redis:
        kw.setdefault("username", ADMIN_USER)
        kw.setdefault("password", ADMIN_PASSWORD)
        return super().client(**kw)

    def url_for(self, user: str, password: str, scheme: str = "redis") -> str:
        return f"{scheme}://{user}:{password}@127.0.0.1:{self.port}/0"


def acl_refusals(admin: Any, user: str = WORKER_USER) -> list[dict]:
    """ACL LOG entries (refused commands, keys, logins) of ``user``."""
    entries = admin.execute_command("ACL", "LOG", "128")
    out = []
    for e in entries:
        e = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
             for k, v in (e.items() if isinstance(e, dict) else zip(e[::2], e[1::2], strict=True))}
        if e.get("username") == user:
            out.append(e)
    return out


def write_acl(tmp_path: Path, edit: Callable[[str], str] = lambda line: line) -> Path:
    """A copy of deploy/redis/users.acl with ``edit`` applied to every line."""
    path = tmp_path / "users.acl"
    path.write_text("\n".join(edit(line) for line in ACL_FILE.read_text().splitlines()) + "\n")
    return path


@pytest.fixture
def acl_redis(tmp_path):
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with AclRedis(write_acl(tmp_path)) as server:
        yield server


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamnb_workers", *args], capture_output=True,
                          text=True, timeout=timeout, env=env or cli_env(), cwd=ROOT)


def start_worker_cli(url: str | None, model: str, consumer: str, log: Path, *extra: str,
                     env: dict[str, str] | None = None) -> subprocess.Popen:
    out = open(log, "ab")  # noqa: SIM115 - closed by the OS when the child exits
    return subprocess.Popen(
        [sys.executable, "-m", "streamnb_workers", "worker", *(["--redis", url] if url else []), "--model", model,
         "--kind", "multinomial", "--bits", "10", "--counts", "raw", "--consumer", consumer,
         "--batch", "40", "--block-ms", "100", "--claim-idle-ms", "500", "--metrics-port", "0",
         "--error-weight", "1", "--classes", "any", *extra], stdout=out, stderr=subprocess.STDOUT, env=env or cli_env(), cwd=ROOT)


def one_line_failure(proc: subprocess.CompletedProcess, code: int = 2) -> str:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def wait_until(cond: Callable[[], bool], timeout: float, what: str,
               procs: list[subprocess.Popen] = (), logs: list[Path] = ()) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            if p.poll() is not None:
                text = "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)
                raise AssertionError(f"a worker exited ({p.returncode}) while waiting for {what}:\n{text}")
        if time.monotonic() > deadline:
            text = "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)
            raise AssertionError(f"timed out waiting for {what}:\n{text}")
        time.sleep(0.1)


def drained(admin: Any, name: str) -> bool:
    """Nothing undelivered and nothing pending in the group."""
    k = ModelKeys(name)
    groups = {g["name"].decode(): g for g in admin.xinfo_groups(k.input)} if admin.exists(k.input) else {}
    if GROUP not in groups:
        return False
    last = admin.xrevrange(k.input, count=1)
    return (int(admin.xpending(k.input, GROUP)["pending"]) == 0 and bool(last)
            and groups[GROUP]["last-delivered-id"] == last[0][0])


def stop(procs: list[subprocess.Popen], timeout: float = 30) -> list[int]:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes

"""Shared fixtures: private redis-server processes (and ``r``: fakeredis or a real one), the
corpus location."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from streamnb_workers.cli.settings import StderrHandler
from tests.helpers.acl import acl_redis  # noqa: F401 - shared fixtures
from tests.helpers.cluster import cluster  # noqa: F401
from tests.helpers.corpus import CORPUS
from tests.helpers.prometheus import stack  # noqa: F401
from tests.helpers.redis_server import REDIS_SERVER, RedisServer


@pytest.fixture
def redis_server():
    """A fresh real redis-server (no persistence) on a free port."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield server


@pytest.fixture(scope="module")
def server():
    """One real redis-server for a whole test module, whose tests keep apart by model names
    or databases of their own (a module may define its own ``server`` instead)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as s:
        yield s


@pytest.fixture(params=["fake", "real"])
def r(request):
    """A client of fakeredis[lua], then of a fresh real redis-server: for the tests of
    Redis-side code (Lua scripts) that must behave alike on both."""
    if request.param == "fake":
        import fakeredis

        yield fakeredis.FakeRedis()
    else:
        yield request.getfixturevalue("redis_server").client()


@pytest.fixture
def redis_url(redis_server) -> str:
    return redis_server.url


@pytest.fixture
def corpus_dir() -> Path:
    if not (CORPUS / "index.tsv").exists():
        pytest.skip(f"SpamAssassin corpus not found at {CORPUS}")
    return CORPUS


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Repeat each failure's message in full after the short summary, which cuts them at
    the terminal's width: a CI log is often read from its end (the fault tests put what
    the streams and workers were doing in theirs)."""
    try:
        return (yield)
    finally:
        failed = terminalreporter.stats.get("failed", [])
        if failed:
            terminalreporter.section("failure messages in full")
            for rep in failed:
                crash = getattr(rep.longrepr, "reprcrash", None)
                terminalreporter.line(f"{rep.nodeid}: {crash.message if crash else rep.longrepr}")


@pytest.fixture(autouse=True)
def cli_logging_undone():
    """A command run in-process sets up the root logger (``setup_logging``); the tests after
    it, in the same process, start without its handler and level. (The handler writes to
    the sys.stderr of each record's moment, never a closed capture of an earlier test.)"""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in [h for h in root.handlers if isinstance(h, StderrHandler)]:
        root.removeHandler(handler)
    root.setLevel(level)

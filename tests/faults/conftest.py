"""Fixtures of the fault tests (the helpers live in faults.harness)."""

from faults.harness import procs, redis_factory, redis_server, threads  # noqa: F401

"""Fixtures of the fault tests (the helpers live in faults.harness)."""

from tests.faults.harness import procs, redis_factory, redis_server, threads  # noqa: F401
from tests.helpers.failover import cluster  # noqa: F401 - the failover's own cluster

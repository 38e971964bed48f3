"""The worker daemon's public entry: :class:`Worker` and :class:`WorkerOptions`, and
``python -m streamnb_workers.worker``, a bare worker for tests and debugging.

Public API (for ``streamnb worker``, the demo and tests)::

    from streamnb_workers.connection import RedisSettings, UrlConnector
    from streamnb_workers.model_config import ModelSpec
    from streamnb_workers.worker import Worker, WorkerOptions

    w = Worker(UrlConnector(RedisSettings("redis://localhost:6379/0")),
               [ModelSpec("mail", kind="multinomial")], WorkerOptions(batch=200))
    exit_code = w.run()          # blocks; SIGTERM/SIGINT once: finish the batch and exit 0
    w.request_stop()             # the same, from another thread
    w.run_until_idle()           # tests/demo: process until nothing is undelivered or pending

Where the work is done: workers/loop.py (the loop), workers/process.py (one batch),
workers/batch.py (its steps as pure functions), workers/commit_pipeline.py (its commit),
workers/housekeeping.py, workers/intake.py, workers/runtime.py. See docs/worker.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging

from streamnb_workers.intake import ensure_group
from streamnb_workers.loop import Worker
from streamnb_workers.model_config import ModelSpec
from streamnb_workers.options import WorkerOptions
from streamnb_workers.redis_errors import error_kind

__all__ = ["Worker", "WorkerOptions", "ModelSpec", "ensure_group", "error_kind", "main", "tune_gc"]

#: Young-generation threshold of the garbage collector in a worker process (CPython's
#: default is 700). A batch keeps a few thousand containers alive at once (decoded maps,
#: token lists, items), so with the default every batch ran collections that traversed
#: them (and promoted them, to be traversed again): ~15 us per message. They are freed by
#: reference counting at the end of the batch; cycles are still collected, less often.
GC_YOUNG_THRESHOLD = 20_000


def tune_gc() -> None:
    """For a worker process (called by its entry points, not by :class:`Worker`): move the
    objects made while starting out of the collector's way (``gc.freeze``) and raise the
    young-generation threshold to :data:`GC_YOUNG_THRESHOLD`.

    >>> import gc
    >>> before = gc.get_threshold()
    >>> tune_gc(); gc.get_threshold()[0] >= GC_YOUNG_THRESHOLD
    True
    >>> gc.set_threshold(*before); gc.unfreeze()
    """
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


def main(argv: list[str] | None = None) -> int:
    """``python -m streamnb_workers.worker``: a bare worker for tests and debugging (the
    supported command is ``streamnb worker``). Specs and options are JSON."""
    from streamnb_workers.connection import RedisSettings, UrlConnector

    p = argparse.ArgumentParser(prog="python -m streamnb_workers.worker")
    p.add_argument("--redis", required=True)
    p.add_argument("--spec", action="append", required=True,
                   help='JSON ModelSpec, e.g. {"name": "mail", "kind": "multinomial"}')
    p.add_argument("--options", default="{}", help="JSON WorkerOptions fields")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics on 127.0.0.1:PORT (0: none)")
    p.add_argument("--cluster", action="store_true", help="--redis is a Redis Cluster node")
    a = p.parse_args(argv)
    if a.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(a.metrics_port, addr="127.0.0.1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    specs = [ModelSpec(**json.loads(s)) for s in a.spec]
    worker = Worker(UrlConnector(RedisSettings(a.redis, cluster=a.cluster)), specs,
                    WorkerOptions(**json.loads(a.options)))
    tune_gc()
    return worker.run()


if __name__ == "__main__":
    raise SystemExit(main())

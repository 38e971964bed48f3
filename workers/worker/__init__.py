"""The worker: :class:`Worker` and :class:`WorkerOptions` (``python -m
streamnb_workers.worker``: a bare worker for tests and debugging, workers/worker/__main__.py).

Public API (for ``streamnb worker``, the demo and tests)::

    from streamnb_workers.store.connection import RedisSettings, UrlConnector
    from streamnb_workers.store.model_config import ModelSpec
    from streamnb_workers.worker import Worker, WorkerOptions

    w = Worker(UrlConnector(RedisSettings("redis://localhost:6379/0")),
               [ModelSpec("mail", kind="multinomial")], WorkerOptions(batch=200))
    exit_code = w.run()          # blocks; SIGTERM/SIGINT once: finish the batch and exit 0
    w.request_stop()             # the same, from another thread
    w.run_until_idle()           # tests/demo: process until nothing is undelivered or pending

Where the work is done: workers/worker/loop.py (the loop), workers/worker/process.py (one batch),
workers/worker/batch.py (its steps as pure functions), workers/worker/committing.py (its commit),
workers/worker/accounting.py (what a commit is counted and scored as), workers/worker/housekeeping.py,
workers/worker/intake.py, workers/worker/redo.py, workers/worker/runtime.py. See docs/worker.md.
"""

from __future__ import annotations

import gc

from streamnb_workers.worker.loop import Worker
from streamnb_workers.worker.options import WorkerOptions

__all__ = ["Worker", "WorkerOptions", "tune_gc"]

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

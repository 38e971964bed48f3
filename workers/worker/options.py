"""How a worker runs: :class:`WorkerOptions` (see docs/worker.md, "Tuning").

>>> WorkerOptions(consumer="w1", batch=50).batch
50
>>> WorkerOptions(batch=0)
Traceback (most recent call last):
...
ValueError: batch must be >= 1, got 0
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb_workers.defaults import (
    DEFAULT_AUTOLEARN_MIN_CLASS_WEIGHT,
    DEFAULT_AUTOLEARN_PER_BATCH,
    DEFAULT_AUTOLEARN_SCORE,
    DEFAULT_BATCH_SIZE,
    DEFAULT_LABEL_CACHE_TTL_S,
    DEFAULT_LEARNT_KEYS_MAX,
    DEFAULT_MAX_SOURCES,
    DEFAULT_ORDER_WAIT_MS,
    DEFAULT_REPLICA_MEMORY,
    DEFAULT_TOKEN_NAMES,
    DEFAULT_TOKEN_NAMES_EVERY,
)
from streamnb_workers.observe.health import DEFAULT_HEALTHZ_GRACE_S
from streamnb_workers.wire.codec import DEFAULT_LIMITS, Limits

__all__ = ["WorkerOptions"]


@dataclass
class WorkerOptions:
    """Tuning of a worker (see docs/worker.md for guidance)."""

    #: Consumer name in the group; default ``<host>-<pid>``. Reuse it across restarts to
    #: re-read the same pending entries at once instead of after ``claim_idle_ms``.
    consumer: str | None = None
    batch: int = DEFAULT_BATCH_SIZE
    block_ms: int = 1000
    #: Entries pending longer than this in another consumer are claimed (XAUTOCLAIM).
    claim_idle_ms: int = 60_000
    #: A message delivered more than this many times goes to :dead (reason ``poison``).
    max_deliveries: int = 5
    #: Approximate caps (``MAXLEN ~``) of ``:out`` and ``:dead``, applied at each commit
    #: (0: no cap).
    out_maxlen: int = 1_000_000
    dead_maxlen: int = 100_000
    #: Every this many seconds the lease holder trims ``:in`` of the entries every
    #: consumer group has read and acknowledged (0: never; see workers/store/input_trim.py).
    input_trim_s: float = 10.0
    events_maxlen: int = 10_000
    #: Snapshot after this many applied log entries, or this many seconds.
    snapshot_every: int = 1000
    snapshot_interval_s: float = 60.0
    #: Log entries younger than this (before the snapshot id) are kept when trimming.
    trim_margin_ms: int = 60_000
    lease_ms: int = 15_000
    #: TTL of cached message features for delayed labels (0: no cache).
    cache_ttl_s: float = DEFAULT_LABEL_CACHE_TTL_S
    #: Cache the messages learnt in their batch too (a label in the message, or a ref in
    #: the same batch), so that a later label can correct them. False: only messages
    #: still unlabelled are cached (delayed labels keep working; a correction of a message
    #: learnt on arrival goes to :dead as ref_expired); most of the cache's Redis memory
    #: and of a commit's bytes when most traffic comes labelled.
    cache_labelled: bool = True
    #: Learn-once keys kept per model (the oldest learnt are dropped beyond it; about 270
    #: bytes of Redis memory each, docs/worker.md "Learn-once keys"). 0: no keys, every
    #: labelled message is learnt, however often it comes.
    learnt_keys_max: int = DEFAULT_LEARNT_KEYS_MAX
    #: Sources a model keeps apart at most (docs/worker.md, "Sources"): a label from one
    #: more is a dead letter ``too_many_sources``.
    max_sources: int = DEFAULT_MAX_SOURCES
    #: Learn unlabelled messages from their own confident verdicts, under the source
    #: ``autolearn`` (docs/worker.md, "Autolearn"; workers/worker/learn_weights.py): a score
    #: at least ``autolearn_score`` from 0, a model holding at least
    #: ``autolearn_min_class_weight`` of each of its two classes, at most
    #: ``autolearn_per_batch`` messages a batch.
    autolearn: bool = False
    autolearn_score: float = DEFAULT_AUTOLEARN_SCORE
    autolearn_min_class_weight: float = DEFAULT_AUTOLEARN_MIN_CLASS_WEIGHT
    autolearn_per_batch: int = DEFAULT_AUTOLEARN_PER_BATCH
    heartbeat_s: float = 5.0
    #: A heartbeat older than this marks a dead worker.
    stale_s: float = 30.0
    observe_model_s: float = 5.0
    backoff_base_s: float = 0.05
    backoff_cap_s: float = 5.0
    max_commit_attempts: int = 8
    #: Bounds on decoding one entry; ``limits.max_message_bytes`` (8 MiB) is the largest
    #: entry decoded at all (a larger one is a ``too_large`` dead letter).
    limits: Limits = DEFAULT_LIMITS
    #: Raw mail read per message: a larger mail is cut at a MIME boundary (headers kept,
    #: ``defect:truncated``), then predicted and learnt (``--max-bytes``).
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Predict message i of a batch with the model plus the labelled messages before it in
    #: the batch (as one-at-a-time processing), for the models that do it cheaply (every
    #: kind but bernoulli and hybrid, whose exact method copies their 2**20-wide tables per
    #: batch); False: the whole batch with the model as it was before the batch. What is
    #: committed is the same either way.
    prequential: bool = True
    #: Before predicting, wait at most this long for other workers' labelled batches that
    #: start before this one to be committed, so predictions see the same labels as with
    #: one worker (0: predict at once). See workers/replication/ordering.py.
    order_wait_ms: int = DEFAULT_ORDER_WAIT_MS
    #: While a full batch commits, read the next one and decode and featurize it (the
    #: commit script runs in Redis meanwhile; its reply is read before the next batch is
    #: predicted, so predictions and what is learnt are the same). False: one batch after
    #: the other. The command line's ``--pipeline`` (``STREAMNB_PIPELINE``, the TOML key
    #: ``pipeline``) sets it. See docs/worker.md, "Pipelined commits".
    send_ahead: bool = True
    #: Return freed heap memory to the system (glibc ``malloc_trim``) when the worker goes
    #: idle after work, and at most this often while it stays busy (0: only when idle).
    #: See workers/worker/heap.py.
    release_memory_s: float = 60.0
    #: Put the K tokens that moved each prediction's log-odds most, with their weights,
    #: into its output (key ``explain``, docs/protocol.md); 0: none. Costs a second
    #: tokenization of each message (docs/worker.md, "Explanations"). A model setting, stored
    #: in its config when it is created (a worker given another K refuses to serve it);
    #: None: as stored.
    explain: int | None = None
    #: Keep the most frequent token names of the messages seen, at most this many, and
    #: publish them per bucket to ``{M}:tokens`` (``streamnb tokens``); 0: none.
    token_names: int = DEFAULT_TOKEN_NAMES
    #: Count the names of one message in this many (each costs a second tokenization).
    token_names_every: int = DEFAULT_TOKEN_NAMES_EVERY
    #: A challenger learnt from the same entries (workers/replication/challenger.py):
    #: its SPEC, stored with the model; None: the stored one, if any.
    challenger: str | None = None
    #: ``/healthz`` on the metrics port fails (503) once Redis has been unreachable for
    #: longer than this (workers/observe/health.py).
    healthz_grace_s: float = DEFAULT_HEALTHZ_GRACE_S
    #: Bytes of replica arrays held in memory; beyond it the least recently used replicas
    #: are evicted and loaded again from their snapshot and log for their next batch
    #: (workers/replication/replica_cache.py). 0: no bound.
    replica_memory: int = DEFAULT_REPLICA_MEMORY
    #: Metrics by model (``model="NAME"``); False: pooled over the models under
    #: ``model="*"`` (a worker serving thousands of per-user models: the series by model
    #: cost about 110 KiB each; docs/observability.md).
    model_metrics: bool = True
    #: Serve the per-user and per-domain models registered for each model served
    #: (``streamnb:{M}:users``), looking for new ones this often in seconds; 0: none.
    #: See docs/worker.md, "Per-user models".
    per_user_s: float = 0.0
    #: A per-user model's statistics count in its verdicts once they weigh this much
    #: (workers/replication/user_sum.py); every worker of a model must be given the same.
    user_min_weight: float = 10.0

    def __post_init__(self) -> None:
        if self.batch < 1:
            raise ValueError(f"batch must be >= 1, got {self.batch}")
        if self.block_ms < 0:
            raise ValueError(f"block_ms must be >= 0, got {self.block_ms}")
        if self.order_wait_ms < 0:
            raise ValueError(f"order_wait_ms must be >= 0, got {self.order_wait_ms}")
        if self.release_memory_s < 0:
            raise ValueError(f"release_memory_s must be >= 0, got {self.release_memory_s}")
        if not 1024 <= self.max_bytes <= self.limits.max_message_bytes:
            raise ValueError(f"max_bytes must be from 1024 to the entry limit "
                             f"{self.limits.max_message_bytes}, got {self.max_bytes}")
        if self.input_trim_s < 0:
            raise ValueError(f"input_trim_s must be >= 0, got {self.input_trim_s}")
        if self.out_maxlen < 0 or self.dead_maxlen < 0:
            raise ValueError(f"out_maxlen and dead_maxlen must be >= 0, got "
                             f"{self.out_maxlen} and {self.dead_maxlen}")
        for name in ("explain", "token_names"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.token_names_every < 1:
            raise ValueError(f"token_names_every must be >= 1, got {self.token_names_every}")
        if not self.healthz_grace_s > 0:
            raise ValueError(f"healthz_grace_s must be > 0, got {self.healthz_grace_s}")
        if self.autolearn and self.learnt_keys_max == 0:
            raise ValueError("autolearn needs learn-once keys (learnt_keys_max > 0): a user's "
                             "label replaces what autolearn learnt by its key")
        if not self.autolearn_score >= 0 or not self.autolearn_min_class_weight >= 0 or \
                self.autolearn_per_batch < 1:
            raise ValueError("autolearn_score and autolearn_min_class_weight must be >= 0, "
                             "autolearn_per_batch >= 1")
        if self.max_sources < 1:
            raise ValueError(f"max_sources must be >= 1, got {self.max_sources}")
        if self.per_user_s < 0 or self.user_min_weight < 0:
            raise ValueError(f"per_user_s and user_min_weight must be >= 0, got "
                             f"{self.per_user_s} and {self.user_min_weight}")
        if self.learnt_keys_max < 0:
            raise ValueError(f"learnt_keys_max must be >= 0, got {self.learnt_keys_max}")
        if self.replica_memory < 0:
            raise ValueError(f"replica_memory must be >= 0, got {self.replica_memory}")
        if self.max_deliveries < 1:
            raise ValueError(f"max_deliveries must be >= 1, got {self.max_deliveries}")
        if self.consumer is None:
            self.consumer = f"{socket.gethostname()}-{os.getpid()}"

"""Defaults of the daemon's settings: one place for the CLI parser, the worker's options
and the docs that quote them (docs/cli.md, docs/worker.md)."""

from __future__ import annotations

#: First Prometheus metrics port; worker process i of ``--processes N`` serves base + i.
DEFAULT_METRICS_PORT = 9500

#: Outputs of ``:out`` over which ``streamnb status`` reports recent accuracy and throughput.
DEFAULT_STATUS_LAST = 1000

#: Seconds a worker may go without a successful step against Redis before ``/healthz`` on
#: its metrics port fails (503): longer than a Redis restart or failover, short enough that
#: a worker cut off from Redis (or stuck) is restarted by its orchestrator within minutes.
DEFAULT_HEALTHZ_GRACE_S = 60.0

#: Address the metrics server binds by default (loopback: expose it on purpose).
DEFAULT_METRICS_ADDR = "127.0.0.1"

#: Entries read per XREADGROUP by a worker: the most in one batch (one commit). A batch
#: has a fixed cost (round trips, the commit, numpy calls) that a larger one takes over
#: more messages; a larger one also holds Redis longer in its commit (docs/worker.md).
DEFAULT_BATCH_SIZE = 200

#: Milliseconds a worker's XREADGROUP blocks waiting for entries.
DEFAULT_BLOCK_MS = 2000

#: Longest wait (ms) before predicting for other workers' earlier labelled batches to
#: commit (ordered predictions, workers/replication/ordering.py; 0: off). A bound for a slow or stuck
#: worker, not the usual wait: a batch of 500 raw mails takes a few hundred ms to commit.
DEFAULT_ORDER_WAIT_MS = 1000

#: Token names a worker keeps for ``{M}:tokens`` (docs/worker.md, "Token names").
DEFAULT_TOKEN_NAMES = 20_000

#: A worker counts the token names of one message in this many.
DEFAULT_TOKEN_NAMES_EVERY = 32

#: Milliseconds an entry may stay pending before another worker claims it.
DEFAULT_CLAIM_IDLE_MS = 60_000

#: Entries per pipelined XADD round trip in ``streamnb produce``.
DEFAULT_PRODUCE_CHUNK = 500

#: Seconds ``streamnb predict`` waits for the prediction of the message it sent.
DEFAULT_PREDICT_TIMEOUT_S = 30.0

#: Messages the embedded demo replays by default (all of the shipped sample).
DEFAULT_DEMO_MESSAGES = 600

#: Smoothing alpha recommended for count models over hashed mail tokens (with
#: smoothing_m="seen"); measured on the SpamAssassin replay (docs/features.md).
DEFAULT_MAIL_ALPHA = 0.1

#: The decision options a new model over hashed mail starts with (docs/features.md): the
#: score per feature to rank by, and "unsure" while a class has learnt less weight than 3.
MAIL_DECISION_DEFAULTS = {"score": "per_feature", "min_class_weight": 3.0}

#: The classes ``streamnb worker`` declares for a new count model of hashed mail when
#: ``--classes`` is not given: a label outside them (a typo, ``Spam``) is a dead letter
#: (``bad_label``), never a third class. ``--classes`` sets others; ``--classes any``
#: lets any label become a class.
MAIL_CLASSES = ("spam", "ham")

#: A labelled message whose verdict was wrong is learnt with this many times its weight
#: (a new count model of hashed mail; measured on the SpamAssassin replay, docs/features.md).
DEFAULT_ERROR_WEIGHT = 2.0

#: How long a worker keeps a message's features for a delayed label (seconds). Redis memory
#: for the cache is about rate x TTL x 0.6-1 kB per mail (docs/operations.md, sizing): 2
#: days at 10 msg/s is 3-4 GB less than 7 days would be. ``streamnb worker
#: --label-cache-ttl`` changes it (0: no cache).
DEFAULT_LABEL_CACHE_TTL_S = 2 * 86400.0

#: Learn-once keys a model keeps (about 270 bytes of Redis memory each: ~68 MB).
DEFAULT_LEARNT_KEYS_MAX = 250_000
#: Sources a model keeps apart at most (``worker --max-sources``; docs/worker.md, "Sources"):
#: each costs one copy of the model's statistics in every worker and in its snapshot.
DEFAULT_MAX_SOURCES = 8
#: Seconds of ``:log`` kept behind each snapshot (``worker --log-keep``): how far back
#: ``forget --source NAME --since TIME`` reaches (workers/client/forget_since.py).
DEFAULT_LOG_KEEP_S = 60.0
#: Autolearn (``worker --autolearn``; docs/worker.md, "Autolearn"): the least distance of a
#: verdict's score from 0, the least weight of each class the model must hold, and the most
#: messages autolearnt per batch.
DEFAULT_AUTOLEARN_SCORE = 0.5
DEFAULT_AUTOLEARN_MIN_CLASS_WEIGHT = 50.0
DEFAULT_AUTOLEARN_PER_BATCH = 50

#: A worker's resident memory (``--replica-memory``): beyond it, the least recently used
#: replicas are evicted and loaded again on demand (docs/worker.md, "Many models"). 512
#: MiB: about 150 replicas of a 2**16-bucket model of two classes next to a worker's
#: 100-150 MiB of its own.
DEFAULT_REPLICA_MEMORY = 512 * 2**20

#: Per-user and per-domain models a global model registers at most (``--max-users``):
#: every worker of the global model serves every one (docs/operations.md, "Per-user
#: models"); past it a new user's learning goes to its domain's model or the global one.
DEFAULT_MAX_USERS = 10_000

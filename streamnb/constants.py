"""Constants shared by the library and the daemon."""

from __future__ import annotations

#: Version of the statistics encoding written by ``to_bytes``. Readers refuse newer versions.
STATS_FORMAT_VERSION = 1
#: Version of the model file / snapshot envelope (kind + params + statistics).
MODEL_FORMAT_VERSION = 1

#: Default number of hash bits for hashed (text, token, mail) input: 2**20 buckets.
DEFAULT_HASH_BITS = 20

#: Model kinds, as accepted by ``streamnb.models.make_model`` and ``streamnb worker --kind``.
MODEL_KINDS = ("multinomial", "bernoulli", "categorical", "gaussian", "lda", "qda", "hybrid")

# --------------------------------------------------------------- wire format & featurization
#: The one stream field that holds a message's msgpack map.
DATA_FIELD = "data"
#: Default size limit of one encoded input message (1 MiB).
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
#: Key of the stable token hash (blake2b, 8-byte digest). Changing it changes every bucket.
HASH_KEY = b"streamnb-hash-v1"
#: Entries kept in the per-process token -> hash cache (an LRU).
HASH_CACHE_SIZE = 1 << 18
#: Version of the featurizer config and of encoded feature rows.
FEATURIZER_FORMAT_VERSION = 1

# --- Gaussian models (streamnb.stats.moments, streamnb.models.gaussian/lda/qda)
#: A class whose weight falls below this fraction of what it held before an unlearn
#: (``GaussianMoments.subtract``) is reset to exactly empty (n = 0, mean 0, M2 0).
MOMENTS_EMPTY_RTOL = 1e-10
#: Unlearning (``subtract``) refuses to remove more weight than a statistic holds, beyond
#: this share of the numbers involved (rounding); a Gaussian class's M2 likewise may not
#: go below 0 by more than this share of its weighted sum of squares.
UNLEARN_RTOL = 1e-9
#: First Cholesky jitter, as a fraction of each diagonal entry; multiplied by 10 per retry.
CHOLESKY_JITTER_INITIAL = 1e-10
#: Retries before falling back to the diagonal alone (jitter up to 1e-10 * 10**(n-1)).
CHOLESKY_JITTER_MAX_TRIES = 12
#: A Cholesky pivot with L_ii**2 below this fraction of S_ii (the variance of feature i
#: left unexplained by the previous features) is treated as singular.
CHOLESKY_PIVOT_RTOL = 1e-12
#: GaussianNB variance used when the var_smoothing floor is zero (constant data or
#: var_smoothing=0), relative to the data's scale (largest variance or squared mean, else 1).
GAUSSIAN_FALLBACK_VARIANCE = 1e-9

# --- drift detection and quality metrics (streamnb.drift, streamnb_workers.observer)
#: Per-sample log-loss is capped at -log(1e-15) (scikit-learn's eps), so one confidently
#: wrong prediction cannot dominate a sum; also the loss charged for an unknown true class.
LOG_LOSS_CAP = 34.538776394910684
#: ADWIN confidence: the probability of a false cut per check is at most this.
ADWIN_DELTA = 0.002
#: Samples between two ADWIN cut checks (River's ``clock``).
ADWIN_CLOCK = 32
#: Prior-shift G-test: false-alarm probability per check (Bonferroni over the windows).
PRIOR_SHIFT_ALPHA = 1e-5
#: Gaussian feature drift: false-alarm probability per window test (chi-square tests).
GAUSSIAN_DRIFT_ALPHA = 1e-5
#: Updates during which a detector's further alarms are suppressed after it alarmed.
DRIFT_COOLDOWN_SAMPLES = 500
#: Seconds during which the observer emits no second event for the same detector.
DRIFT_EVENT_COOLDOWN_S = 60.0

# --------------------------------------------------------------- CLI, daemon defaults
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
#: commit (ordered predictions, workers/ordering.py; 0: off). A bound for a slow or stuck
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
#: Exit codes of the ``streamnb`` command (documented in docs/cli.md).
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
#: Smoothing alpha recommended for count models over hashed mail tokens (with
#: smoothing_m="seen"); measured on the SpamAssassin replay (docs/features.md).
DEFAULT_MAIL_ALPHA = 0.1
#: The decision options a new model over hashed mail starts with (docs/features.md): the
#: score per feature to rank by, and "unsure" while a class has learnt less weight than 3.
MAIL_DECISION_DEFAULTS = {"score": "per_feature", "min_class_weight": 3.0}
#: A labelled message whose verdict was wrong is learnt with this many times its weight
#: (train-on-error weighting; measured on the SpamAssassin replay, docs/features.md).
DEFAULT_ERROR_WEIGHT = 2.0

#: How long a worker keeps a message's features for a delayed label (seconds). Redis memory
#: for the cache is about rate x TTL x 0.6-1 kB per mail (docs/operations.md, sizing): 2
#: days at 10 msg/s is 3-4 GB less than 7 days would be. ``streamnb worker
#: --label-cache-ttl`` changes it (0: no cache).
DEFAULT_LABEL_CACHE_TTL_S = 2 * 86400.0
#: Learn-once keys a model keeps (about 270 bytes of Redis memory each: ~68 MB).
DEFAULT_LEARNT_KEYS_MAX = 250_000
#: The delayed-label cache writes its entries into time buckets of TTL / this width
#: (workers/label_cache.py): an entry lives between TTL and TTL * (1 + 1/8); a lookup
#: probes about this many + 3 bucket hashes.
LABEL_CACHE_BUCKETS_PER_TTL = 8
#: Hashes per time bucket of the delayed-label cache, chosen by a CRC-32 of the message
#: id: a batch's entries take at most this many ``HSET`` + ``PEXPIRE`` pairs, and no one
#: hash holds more than 1/(8 x this) of the cache.
LABEL_CACHE_SHARDS = 16

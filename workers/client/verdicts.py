"""Submit a mail to a model's workers and await its prediction; the verdict headers.

A :class:`VerdictClient` serves many concurrent callers (one per SMTP session of the
milter) in one process: :meth:`VerdictClient.submit` XADDs the mail, unlabelled and with a
fresh id, to ``streamnb:{M}:in`` as any producer does, and returns a :class:`Pending`;
one reader thread XREADs ``streamnb:{M}:out`` from where it started and hands each
prediction to the caller waiting for its id. N sessions in flight cost N XADDs and one
blocking read, not N polling loops. A prediction is always written after its input, and
the reader's starting point is taken before the first XADD, so none is missed.

A model stored with K shards (workers/replication/shards.py; K read once, with the starting point) gets
each mail in the ``:in`` of its id's shard, and its predictions are read from the K
``:out``: by one XREAD of them all, or on a Redis Cluster, where they are in different
slots, by a reader thread (and client) per shard.

When Redis cannot be reached the XADD fails at once and :class:`NotScored` says so; no
prediction within the caller's deadline is :class:`NotScored` too (the reason codes are
:data:`REASONS`). The reader reconnects with bounded backoff on its own.

:func:`verdict_headers` builds the headers a scored mail gets from its prediction; the
score is the one the worker published to threshold and rank by (:func:`score_of`), else
the natural-log odds of the positive class (:func:`log_odds`).

>>> p = {"label": "spam", "log_proba": {"ham": -3.0, "spam": -0.0497870684}}
>>> verdict_headers(p, msg_id="milter-1")
[('X-Streamnb-Verdict', 'spam'), ('X-Streamnb-Score', '2.95'), ('X-Streamnb-Id', 'milter-1')]
>>> not_scored_headers("timeout")
[('X-Streamnb-Verdict', 'not-scored (timeout)')]

Every header written here is one the tokenizer takes out of a mail before it is learnt or
scored (:mod:`streamnb.features.own_headers`): a delivered copy is the mail it was.

>>> from streamnb.features.own_headers import is_own_header
>>> all(map(is_own_header, OWN_HEADERS))
True
"""

from __future__ import annotations

import base64
import copy
import logging
import math
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import redis

from streamnb.decision import DecisionRule
from streamnb.exceptions import MalformedMessage, SettingsError
from streamnb_workers.client.shard_streams import router_of
from streamnb_workers.replication.shards import Router
from streamnb_workers.store.backoff import Backoff
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.codec import DATA_FIELD, encode_input
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.replies import as_str, entry_field

__all__ = [
    "ID_HEADER",
    "OWN_HEADERS",
    "NOT_SCORED",
    "REASONS",
    "SCORE_HEADER",
    "TOKENS_HEADER",
    "VERDICT_HEADER",
    "NotScored",
    "Pending",
    "VerdictClient",
    "format_score",
    "score_of",
    "log_odds",
    "not_scored_headers",
    "verdict_headers",
]

log = logging.getLogger("streamnb.verdicts")

VERDICT_HEADER = "X-Streamnb-Verdict"
SCORE_HEADER = "X-Streamnb-Score"
#: The id the mail was sent with: a later ``{"ref": id, "label": ...}`` corrects or teaches it.
ID_HEADER = "X-Streamnb-Id"
#: The tokens that most favoured the verdict, where the prediction carries them
#: (``streamnb predict --snapshot`` does; the workers' outputs do not).
TOKENS_HEADER = "X-Streamnb-Tokens"
#: The headers written here.
OWN_HEADERS = (VERDICT_HEADER, SCORE_HEADER, ID_HEADER, TOKENS_HEADER)

#: The verdict of a mail that was not scored.
NOT_SCORED = "not-scored"
#: Why a mail was not scored.
TIMEOUT = "timeout"            # no prediction within the deadline
UNAVAILABLE = "redis-unavailable"  # the XADD failed: Redis down, refused, or too slow
UNTRAINED = "untrained"        # the model knows no class yet (a prediction without label)
ERROR = "error"                # anything else (logged)
REASONS = (TIMEOUT, UNAVAILABLE, UNTRAINED, ERROR)


class NotScored(Exception):
    """A mail got no prediction: ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# ------------------------------------------------------------------------- headers
def log_odds(log_proba: Mapping[Any, float], positive: Any = None) -> float:
    """``log P(positive | x) - log P(not positive | x)`` from a prediction's log posteriors.

    The positive class is ``positive`` if given, else the last class in sorted order, as
    for the model's decision rule (``"spam"`` of ``{"ham", "spam"}``). With two classes it
    is ``log P(spam) - log P(ham)``; with more, the odds against all others together. A
    one-class model gives ``inf``.

    >>> round(log_odds({"ham": math.log(0.25), "spam": math.log(0.75)}), 6)  # log 3
    1.098612
    >>> round(log_odds({"a": math.log(0.2), "b": math.log(0.3), "c": math.log(0.5)}, "a"), 6)
    -1.386294
    """
    if not log_proba:
        raise ValueError("a prediction without log_proba has no score")
    classes = list(log_proba)
    pos = DecisionRule(positive=positive).positive_index(classes)
    lp_pos = float(log_proba[classes[pos]])
    rest = [float(log_proba[c]) for i, c in enumerate(classes) if i != pos]
    if not rest:
        return math.inf
    top = max(rest)
    if top == -math.inf:
        return math.inf
    return lp_pos - (top + math.log(sum(math.exp(v - top) for v in rest)))


def score_of(prediction: Mapping[str, Any], positive: Any = None) -> float:
    """The score of a prediction to threshold and rank by: the ``score`` its worker
    published (docs/protocol.md; per feature for mail by default), which is for the
    model's positive class, else (no ``score``, or another ``positive``) :func:`log_odds`.

    >>> score_of({"log_proba": {"ham": math.log(0.25), "spam": math.log(0.75)}, "score": 0.05})
    0.05
    >>> round(score_of({"log_proba": {"ham": math.log(0.25), "spam": math.log(0.75)}}), 6)
    1.098612
    """
    score = prediction.get("score")
    if positive is None and isinstance(score, int | float) and math.isfinite(score):
        return float(score)
    return log_odds(prediction.get("log_proba") or {}, positive)


def format_score(score: float) -> str:
    """Two decimals (``inf`` / ``-inf`` as such)."""
    return f"{score:.2f}" if math.isfinite(score) else ("inf" if score > 0 else "-inf")


def _header_value(text: str) -> str:
    """``text`` as a one-line header value: printable ASCII as is, anything else (a label
    may hold any character, a line break included) as RFC 2047 encoded words of at most
    45 UTF-8 bytes each (so each word stays within 75 characters).

    >>> _header_value("spam"), _header_value("sp\\r\\nBcc: x")
    ('spam', '=?utf-8?b?c3ANCkJjYzogeA==?=')
    """
    if text.isascii() and text.isprintable():
        return text
    words, chunk = [], b""
    for ch in text:
        b = ch.encode("utf-8", "surrogatepass")
        if len(chunk) + len(b) > 45:
            words.append(chunk)
            chunk = b""
        chunk += b
    words.append(chunk)
    return " ".join(f"=?utf-8?b?{base64.b64encode(w).decode()}?=" for w in words)


def verdict_headers(prediction: Mapping[str, Any], positive: Any = None,
                    msg_id: str | None = None) -> list[tuple[str, str]]:
    """The headers of a scored mail: verdict (the prediction's label), score
    (:func:`score_of`, two decimals), the id it was sent with (when given)
    and its top tokens (when the prediction has them: ``top_tokens``, or the ``explain``
    map of a worker run with ``--explain K``, as ``token=+weight``)."""
    label = prediction.get("label")
    if label is None:
        raise NotScored(UNTRAINED, "the model knows no class yet")
    headers = [(VERDICT_HEADER, _header_value(str(label))),
               (SCORE_HEADER, format_score(score_of(prediction, positive)))]
    if msg_id is not None:
        headers.append((ID_HEADER, _header_value(msg_id)))
    tokens = prediction.get("top_tokens")
    explained = prediction.get("explain")
    if not tokens and isinstance(explained, Mapping):  # a worker run with --explain K
        tokens = [f"{name}={weight:+.2f}" for name, weight in explained.get("tokens") or []
                  if isinstance(weight, (int, float))]
    if tokens:
        headers.append((TOKENS_HEADER, _header_value(" ".join(map(str, tokens)))))
    return headers


def not_scored_headers(reason: str, msg_id: str | None = None) -> list[tuple[str, str]]:
    """The headers of a mail accepted without a score (``reason``: one of :data:`REASONS`)."""
    headers = [(VERDICT_HEADER, f"{NOT_SCORED} ({reason})")]
    if msg_id is not None:
        headers.append((ID_HEADER, _header_value(msg_id)))
    return headers


# -------------------------------------------------------------------------- client
class Pending:
    """A mail sent and not yet answered: :meth:`result` waits for its prediction."""

    __slots__ = ("id", "_client", "_future")

    def __init__(self, client: VerdictClient, msg_id: str, future: Future) -> None:
        self.id = msg_id
        self._client = client
        self._future = future

    def result(self, timeout: float) -> dict[str, Any]:
        """The prediction (the decoded ``:out`` map); :class:`NotScored` (``timeout``) when
        none came within ``timeout`` seconds."""
        try:
            return self._future.result(timeout=max(timeout, 0.0))
        except TimeoutError:
            self._client.forget(self.id)
            raise NotScored(TIMEOUT, "no prediction within the deadline") from None


class VerdictClient:
    """Send mails to model ``model`` and route its predictions back (module docstring).

    ``send_timeout`` bounds one XADD (connect and reply), so a Redis that is down or stuck
    costs a caller at most that long. ``block_ms``: the reader's XREAD BLOCK, also how long
    :meth:`close` may wait for it. Use as a context manager, or :meth:`start` and
    :meth:`close`.
    """

    def __init__(self, settings: RedisSettings, model: str, *, send_timeout: float = 2.0,
                 block_ms: int = 1000, read_count: int = 1000, id_prefix: str = "mail-",
                 backoff: Backoff | None = None) -> None:
        self.keys = ModelKeys(model)
        self.model = model
        self.settings = settings
        self.block_ms = block_ms
        self.read_count = read_count
        self.id_prefix = id_prefix
        self._sender = replace(settings, socket_timeout=send_timeout,
                               connect_timeout=min(send_timeout, settings.connect_timeout)
                               ).make_client()
        self._reader = settings.make_client(socket_timeout=self._read_timeout)
        self._backoff = backoff or Backoff(base=0.05, cap=1.0)
        self._lock = threading.Lock()
        self._waiters: dict[str, Future] = {}
        #: The shards' ``:in`` keys by id (None until the starting point is known).
        self._router: Router | None = None
        #: The last entry id read of each shard's ``:out`` (None until the starting point
        #: is known); each reader thread updates its own streams'.
        self._last: dict[str, str] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: The reader threads of the other shards on a cluster, and their clients.
        self._shard_threads: list[threading.Thread] = []
        self._shard_clients: list[Any] = []

    @property
    def _read_timeout(self) -> float:
        return self.settings.reader_timeout(self.block_ms)

    @property
    def shards(self) -> int | None:
        """The model's shards (None until the starting point is known)."""
        return None if self._router is None else len(self._router.keys)

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> VerdictClient:
        if self._thread is None:
            self._thread = threading.Thread(target=self._read, args=(self._reader,),
                                            name="streamnb-verdicts", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        """Stop the readers (within ``block_ms``); callers still waiting get NotScored."""
        self._stop.set()
        for thread in [t for t in (self._thread,) if t is not None] + self._shard_threads:
            thread.join(self.block_ms / 1000.0 + self.settings.socket_timeout)
        with self._lock:
            waiters, self._waiters = self._waiters, {}
        for fut in waiters.values():
            fut.set_exception(NotScored(ERROR, "the verdict client was closed"))
        for client in (self._sender, self._reader, *self._shard_clients):
            client.close()

    def __enter__(self) -> VerdictClient:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def ping(self) -> Any:
        """PING through the sending connection (raises redis errors as they come)."""
        return self._sender.ping()

    @property
    def in_flight(self) -> int:
        """Mails sent and not yet answered (nor given up)."""
        return len(self._waiters)

    def drain(self, timeout: float) -> bool:
        """Wait until no mail waits for its prediction (at most ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while self._waiters:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    # ------------------------------------------------------------------ sending
    def submit(self, raw: bytes, hint: str = "") -> Pending:
        """XADD ``raw`` (an RFC 822 message) unlabelled to ``:in`` (its shard's);
        :class:`NotScored` (``redis-unavailable``) if that fails. ``hint`` (e.g. the MTA's
        queue id) goes into the message id, to find the mail in ``:out`` and the logs."""
        msg_id = f"{self.id_prefix}{hint + '-' if hint else ''}{uuid.uuid4().hex}"
        data = encode_input("raw", raw, id=msg_id)
        future: Future = Future()
        with self._lock:
            self._waiters[msg_id] = future
        try:
            router = self._ensure_start(self._sender)
            self._sender.xadd(router.keys_for(msg_id).input, {DATA_FIELD: data})
        except redis.RedisError as exc:
            self.forget(msg_id)
            raise NotScored(UNAVAILABLE, f"{type(exc).__name__}: {exc}") from None
        return Pending(self, msg_id, future)

    def predict(self, raw: bytes, timeout: float, hint: str = "") -> tuple[str, dict[str, Any]]:
        """:meth:`submit` then wait: (the message id, its prediction) or NotScored."""
        pending = self.submit(raw, hint)
        return pending.id, pending.result(timeout)

    def forget(self, msg_id: str) -> None:
        """Stop waiting for ``msg_id`` (its prediction, if it comes, is dropped)."""
        with self._lock:
            self._waiters.pop(msg_id, None)

    # ------------------------------------------------------------------ reading
    def positions(self, client: Any) -> dict[str, str]:
        """Each of the model's ``:out`` streams and the last entry read of it (the starting
        point taken first, through ``client``): for a reader shared by several models
        (workers/protocols/verdict_reader.py), used instead of :meth:`start`."""
        self._ensure_start(client)
        with self._lock:
            assert self._last is not None
            return dict(self._last)

    def deliver(self, stream: str, entries: Sequence[Any]) -> None:
        """Hand over what a shared reader read of ``stream`` (one of :meth:`positions`),
        entries after its position only."""
        self._deliver(stream, entries)

    def _ensure_start(self, client: Any) -> Router:
        """Read the model's shards and take the readers' starting point, the last entry of
        each ``:out``, once: before the first XADD, so every prediction of a mail sent
        from then on comes after it. Returns the shards' router."""
        if self._router is not None:
            return self._router
        # Read outside the lock (a stuck Redis must not hold up the other callers); any
        # caller's reading is a good start, all being taken before their XADDs.
        router = router_of(client, self.model)
        start = {}
        for keys in router.keys:
            last = client.xrevrange(keys.out, count=1)
            start[keys.out] = as_str(last[0][0]) if last else "0-0"
        with self._lock:
            if self._router is None:
                self._last = start
                self._router = router
        return self._router

    def _streams_to_read(self) -> list[str]:
        """The ``:out`` streams the first reader reads: all of them, or on a cluster (one
        XREAD per slot) the first shard's, a thread being started for each other one."""
        assert self._last is not None
        outs = list(self._last)
        if len(outs) == 1 or not self.settings.cluster:
            return outs
        for out in outs[1:]:
            thread = threading.Thread(target=self._read, args=(None, [out]), daemon=True,
                                      name=f"streamnb-verdicts-{out}")
            self._shard_threads.append(thread)
            thread.start()
        return outs[:1]

    def _read(self, client: Any, streams: list[str] | None = None) -> None:
        """Read ``streams`` (None: the first reader's, once the starting point is known)
        until closed, through ``client`` (None: a client of its own)."""
        failing = False
        what = self.keys.out if streams is None else ", ".join(streams)
        backoff = self._backoff if streams is None else copy.copy(self._backoff)
        while not self._stop.is_set():
            try:
                if client is None:
                    client = self.settings.make_client(socket_timeout=self._read_timeout)
                    self._shard_clients.append(client)
                if streams is None:
                    self._ensure_start(client)
                    streams = self._streams_to_read()
                    what = ", ".join(streams)
                assert self._last is not None
                reply = client.xread({out: self._last[out] for out in streams},
                                     count=self.read_count, block=self.block_ms)
            except (redis.RedisError, SettingsError) as exc:
                if not failing:
                    log.warning("reading %s failed (%s: %s); retrying with backoff",
                                what, type(exc).__name__, exc)
                failing = True
                self._stop.wait(backoff.next_delay())
                continue
            if failing:
                log.info("reading %s again", what)
                failing = False
            backoff.reset()
            for stream, entries in reply or []:
                self._deliver(as_str(stream), entries)

    def _deliver(self, stream: str, entries: Sequence[Any]) -> None:
        """Hand each prediction in ``entries`` (of ``stream``) to whoever waits for its id."""
        assert self._last is not None
        for entry_id, fields in entries:
            self._last[stream] = as_str(entry_id)
            if not self._waiters:
                continue
            try:
                out = decode_output(entry_field(fields, DATA_FIELD) or b"")
            except MalformedMessage:
                continue
            msg_id = out.get("id")
            if not isinstance(msg_id, str):
                continue
            with self._lock:
                future = self._waiters.pop(msg_id, None)
            if future is not None:
                future.set_result(out)

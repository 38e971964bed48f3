"""What both protocols ask of streamnb: score a mail, learn it as a class, forget it.

A mail is scored by the milter's path (:func:`streamnb_workers.milter.policy.score_mail`
over one :class:`~streamnb_workers.client.verdicts.VerdictClient` per model, every model's
``:out`` read by one reader: workers/protocols/verdict_reader.py): XADD to the
model's ``:in``, the workers' prediction from ``:out``, the same verdict and the same
score as the milter's ``X-Streamnb-Score``. Learning goes the way of ``streamnb produce -``
(:func:`~streamnb_workers.client.produce.produce_stdin`: the mail's learn-once key looked
up first, a mail learnt with its label is not sent again, one learnt with the other label
is sent as a correction); forgetting the way of ``streamnb forget -``. Both then wait
(up to the timeout) until the workers have committed it, so that an answer saying a mail
was learnt means the next check sees it, as spamd's and Rspamd's learning is synchronous.

The score on the protocols' scale (:class:`Scale`, docs/protocol.md): ``points =
required + scale x score``, ``score`` being the worker's (per-feature log-odds of the
positive class by default), so ``required`` sits where the score is 0, the argmax
threshold. With the defaults (required 5, scale 10) a mail with score 0.25 gets 7.5
points, as spamd's ``Spam: True ; 7.5 / 5.0``.

>>> Scale().points(0.25), Scale().points(-0.3), Scale().points(float("inf"))
(7.5, 2.0, 1000.0)
"""

from __future__ import annotations

import io
import logging
import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import redis

from streamnb.decision import DecisionRule
from streamnb.exceptions import SettingsError, StreamnbError
from streamnb_workers.client.forget import forget
from streamnb_workers.client.produce import ProduceInterrupted, produce_stdin
from streamnb_workers.client.produce_checks import NotMail
from streamnb_workers.client.shard_streams import shard_keys
from streamnb_workers.client.sources import Outgoing
from streamnb_workers.client.verdicts import VerdictClient, score_of
from streamnb_workers.milter.policy import Outcome, Policy, score_mail
from streamnb_workers.protocols.users import ModelChooser
from streamnb_workers.protocols.verdict_reader import SharedVerdictReader
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.learn_keys import decode_record, known_keys

__all__ = ["Check", "LearnRefused", "MailService", "Scale", "positive_label"]

log = logging.getLogger("streamnb.protocols")

#: Points are kept within +-this (a one-class model's score is infinite).
POINTS_BOUND = 1000.0


class LearnRefused(StreamnbError):
    """A mail that cannot be learnt as asked: not mail, or a label the model does not
    declare (the reason is the message)."""


@dataclass(frozen=True, slots=True)
class Scale:
    """``points = required + scale x score``, rounded to 0.01 and kept within +-1000."""

    required: float = 5.0
    scale: float = 10.0

    def points(self, score: float) -> float:
        if math.isnan(score):
            return self.required
        raw = self.required + self.scale * score if math.isfinite(score) else \
            math.copysign(POINTS_BOUND, score * self.scale)
        return round(max(-POINTS_BOUND, min(POINTS_BOUND, raw)), 2)


def positive_label(prediction: Mapping[str, Any], positive: str | None) -> str | None:
    """The positive class of the model a prediction came from (``positive``, else the
    last class in sorted order, as for the decision rule), None if it knows none."""
    classes = list(prediction.get("log_proba") or {})
    if not classes:
        return None
    try:
        return str(classes[DecisionRule(positive=positive).positive_index(classes)])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class Check:
    """A mail's outcome on the protocols' terms: the model asked, the milter's outcome
    (verdict headers, or why it was not scored), and for a scored mail whether the verdict
    is the positive class, its points and the top tokens the worker explained."""

    model: str
    outcome: Outcome
    spam: bool = False
    score: float = 0.0
    points: float = 0.0
    tokens: tuple[str, ...] = field(default_factory=tuple)

    @property
    def scored(self) -> bool:
        return self.outcome.failure is None


def _tokens(prediction: Mapping[str, Any]) -> tuple[str, ...]:
    explained = prediction.get("explain")
    pairs = explained.get("tokens") if isinstance(explained, Mapping) else None
    return tuple(f"{name}={weight:+.2f}" for name, weight in pairs or []
                 if isinstance(weight, int | float))


class MailService:
    """Scores, learns and forgets mail for the protocol servers (thread-safe: one per
    process, shared by every connection)."""

    def __init__(self, settings: RedisSettings, chooser: ModelChooser, *, policy: Policy,
                 scale: Scale, timeout: float, max_size: int, id_prefix: str) -> None:
        self.settings = settings
        self.chooser = chooser
        self.policy = policy
        self.scale = scale
        self.timeout = timeout
        self.max_size = max_size
        self.id_prefix = id_prefix
        self._client = settings.make_client()
        self._verdicts: dict[str, VerdictClient] = {}
        #: One reader of every model's verdicts (verdict_reader.py); a reader a model on a
        #: cluster.
        self._reader = None if settings.cluster else SharedVerdictReader(settings)
        self._lock = threading.Lock()

    def verdict_client(self, model: str) -> VerdictClient:
        """The model's verdict client, read from on first use."""
        with self._lock:
            client = self._verdicts.get(model)
            if client is None:
                client = VerdictClient(self.settings, model, send_timeout=self.timeout,
                                       id_prefix=f"{self.id_prefix}-")
                self._verdicts[model] = client.start() if self._reader is None \
                    else self._reader.add(client)
            return client

    def ping(self) -> None:
        """PING Redis (raises redis errors)."""
        self._client.ping()

    def model_for(self, user: str | None) -> str:
        """The model that scores ``user``'s mail (the global one while Redis cannot say)."""
        try:
            return self.chooser.model_for(user, self._client)
        except redis.RedisError:
            return self.chooser.default

    def model_for_all(self, users: list[str]) -> str:
        """The model that scores a mail for all of ``users`` (the model they share, else
        the global one; the global one while Redis cannot say)."""
        try:
            return self.chooser.model_for_all(users, self._client)
        except redis.RedisError:
            return self.chooser.default

    def check(self, raw: bytes, user: str | None = None,
              recipients: list[str] | None = None) -> Check:
        """Score ``raw`` for ``user``, or for all of ``recipients`` when given, within the
        timeout (never raises for a mail)."""
        model = self.model_for(user) if not recipients else self.model_for_all(recipients)
        outcome = score_mail(self.verdict_client(model), self.policy, raw, self.timeout)
        prediction = outcome.prediction
        if outcome.failure is not None or prediction is None:
            return Check(model, outcome)
        score = score_of(prediction, self.policy.positive)
        spam = outcome.verdict == positive_label(prediction, self.policy.positive)
        return Check(model, outcome, spam, score, self.scale.points(score), _tokens(prediction))

    def learn(self, raw: bytes, label: str, user: str | None = None) -> bool:
        """Learn ``raw`` as ``label``: True when sent to be learnt (new, or a correction),
        False when its key was learnt with that label already. Raises LearnRefused for
        what is not mail or a label the model does not declare, redis errors as they come."""
        model = self.chooser.learning_model(user, self._client)
        if model != self.chooser.default:
            self._await_config(model)
        try:
            report = produce_stdin(self._client, model, raw, label=label,
                                   max_bytes=self.max_size, id_prefix=self.id_prefix)
        except (NotMail, SettingsError) as exc:
            raise LearnRefused(str(exc)) from None
        except ProduceInterrupted as exc:
            if isinstance(exc.__cause__, redis.RedisError):
                raise exc.__cause__ from None
            raise
        if report.sent:
            self._wait(model, raw, lambda labels: labels == [label], "learnt")
        return report.sent > 0

    def forget(self, raw: bytes, user: str | None = None) -> bool:
        """Unlearn ``raw``: True when a forget was sent, False when its key is not learnt."""
        model = self.chooser.model_for(user, self._client)
        report = forget(self._client, model, ["-"], stdin=io.BytesIO(raw), stderr=io.StringIO())
        if report.sent:
            self._wait(model, raw, lambda labels: not labels, "forgotten")
        return report.sent > 0

    def learnt_labels(self, model: str, raw: bytes) -> list[Any]:
        """The labels ``model``'s shards have learnt ``raw`` with (its learn-once key's
        records): [] when not learnt."""
        key = Outgoing(id="-", raw=raw, source="-").key()
        if key is None:
            return []
        records = [known_keys(self._client, shard.learnt_keys, [key]).get(key)
                   for shard in shard_keys(self._client, model)]
        return [decode_record(r)[0] for r in records if r is not None]

    def _await_config(self, model: str) -> None:
        """Wait (up to the timeout) until the workers have created the config of the
        per-user model ``model`` just registered (it says where its labels go)."""
        deadline = time.monotonic() + self.timeout
        while not self._client.exists(ModelKeys(model).config):
            if time.monotonic() > deadline:
                raise LearnRefused(f"no worker created the per-user model {model!r} within "
                                   f"{self.timeout:g} s: are the workers of "
                                   f"{self.chooser.default!r} run with --per-user?")
            time.sleep(0.005)

    def _wait(self, model: str, raw: bytes, done: Any, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not done(self.learnt_labels(model, raw)):
            if time.monotonic() > deadline:
                log.warning("a mail sent to model %r was not %s within %g s; the workers "
                            "take it when they come to it", model, what, self.timeout)
                return
            time.sleep(0.005)

    def close(self, drain_s: float = 0.0) -> None:
        with self._lock:
            clients, self._verdicts = list(self._verdicts.values()), {}
        for client in clients:
            client.drain(drain_s)
        if self._reader is not None:
            self._reader.close()
        for client in clients:
            client.close()
        self._client.close()

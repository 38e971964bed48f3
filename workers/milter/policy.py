"""What the milter does with a mail: the policy per verdict and when a mail is not scored.

A scored mail gets the verdict headers (:func:`streamnb_workers.client.verdicts.verdict_headers`)
and the action its verdict is mapped to: ``accept`` (the default for every verdict),
``quarantine`` (accepted into the MTA's hold queue) or ``reject`` (a 5xx reply). A mail
that cannot be scored (no prediction within the deadline, Redis unavailable, a model that
knows no class yet) is, per ``on_failure``, accepted with a header saying why
(``X-Streamnb-Verdict: not-scored (timeout)``) or tempfailed (a 4xx reply: the sending
server retries later).

>>> policy = Policy(actions=parse_verdict_actions(["spam=reject", "unsure=quarantine"]))
>>> decide(policy, {"label": "spam", "log_proba": {"ham": -9.0, "spam": 0.0}}, "m1").action
'reject'
>>> o = decide(policy, {"label": "ham", "log_proba": {"ham": 0.0, "spam": -9.0}}, "m2")
>>> o.action, o.headers[:2]
('accept', (('X-Streamnb-Verdict', 'ham'), ('X-Streamnb-Score', '-9.00')))
>>> decide(policy, None, None, NotScored("timeout")).headers
(('X-Streamnb-Verdict', 'not-scored (timeout)'),)
>>> str(Policy(on_failure="tempfail").tempfail_reply)
'451 4.7.1 Message not scored by streamnb, try again later'
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamnb_workers.client.verdicts import (
    ERROR,
    UNTRAINED,
    NotScored,
    VerdictClient,
    not_scored_headers,
    verdict_headers,
)

__all__ = [
    "ACCEPT",
    "FAILURE_ACTIONS",
    "QUARANTINE",
    "REJECT",
    "TEMPFAIL",
    "VERDICT_ACTIONS",
    "Outcome",
    "Policy",
    "Reply",
    "decide",
    "parse_reply",
    "parse_verdict_actions",
    "score_mail",
]

log = logging.getLogger("streamnb.milter")

ACCEPT = "accept"
QUARANTINE = "quarantine"
REJECT = "reject"
TEMPFAIL = "tempfail"
#: What a verdict may be mapped to.
VERDICT_ACTIONS = (ACCEPT, QUARANTINE, REJECT)
#: What happens to a mail that could not be scored.
FAILURE_ACTIONS = (ACCEPT, TEMPFAIL)

_REPLY = re.compile(r"^(?P<code>[245]\d\d) (?P<status>[245]\.\d{1,3}\.\d{1,3}) (?P<text>\S.*)$")


@dataclass(frozen=True, slots=True)
class Reply:
    """An SMTP reply: ``550 5.7.1 Message rejected as spam``."""

    code: str
    status: str
    text: str

    def __str__(self) -> str:
        return f"{self.code} {self.status} {self.text}"


def parse_reply(text: str, klass: str) -> Reply:
    """``"550 5.7.1 text"`` -> Reply; the code and status must be of ``klass`` (``"4"`` or
    ``"5"``) and agree; the text one line of printable ASCII without ``%``.

    >>> parse_reply("554 5.7.1 Spam, go away", "5")
    Reply(code='554', status='5.7.1', text='Spam, go away')
    >>> parse_reply("451 4.7.1 later", "5")
    Traceback (most recent call last):
    ...
    ValueError: expected a 5xx reply like '550 5.7.1 Message rejected as spam', got '451 4.7.1 later'
    """
    m = _REPLY.match(text.strip())
    example = ("550 5.7.1 Message rejected as spam" if klass == "5"
               else "451 4.7.1 Try again later")
    # no "%": Sendmail reads the text as a format, Postfix as is
    if (m is None or m["code"][0] != klass or m["status"][0] != klass or "%" in m["text"]
            or not (m["text"].isascii() and m["text"].isprintable())):
        raise ValueError(f"expected a {klass}xx reply like {example!r}, got {text!r}")
    return Reply(m["code"], m["status"], m["text"])


def parse_verdict_actions(items: Iterable[str]) -> dict[str, str]:
    """``["spam=reject", "unsure=quarantine"]`` -> ``{"spam": "reject", ...}``.

    >>> parse_verdict_actions(["spam=reject", " unsure = quarantine "])
    {'spam': 'reject', 'unsure': 'quarantine'}
    >>> parse_verdict_actions(["spam=drop"])
    Traceback (most recent call last):
    ...
    ValueError: --verdict-action spam=drop: the action must be one of accept, quarantine, reject
    """
    out: dict[str, str] = {}
    for item in items:
        label, sep, action = (s.strip() for s in item.partition("="))
        if not sep or not label or not action:
            raise ValueError(f"--verdict-action expects VERDICT=ACTION (spam=reject), got {item!r}")
        if action not in VERDICT_ACTIONS:
            raise ValueError(f"--verdict-action {item.strip()}: the action must be one of "
                             f"{', '.join(VERDICT_ACTIONS)}")
        out[label] = action
    return out


@dataclass(frozen=True)
class Policy:
    """The action per verdict (``accept`` for a verdict not named), what a mail that was
    not scored gets, the SMTP replies, and the class the score is for."""

    actions: Mapping[str, str] = field(default_factory=dict)
    on_failure: str = ACCEPT
    reject_reply: Reply = Reply("550", "5.7.1", "Message rejected as spam")
    tempfail_reply: Reply = Reply("451", "4.7.1", "Message not scored by streamnb, try again later")
    positive: str | None = None

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.actions.items() if v not in VERDICT_ACTIONS}
        if bad:
            raise ValueError(f"verdict actions must be one of {VERDICT_ACTIONS}, got {bad}")
        if self.on_failure not in FAILURE_ACTIONS:
            raise ValueError(f"on_failure must be one of {FAILURE_ACTIONS}, got {self.on_failure!r}")

    def action_for(self, verdict: Any) -> str:
        return self.actions.get(str(verdict), ACCEPT)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to do with one mail: ``action`` (accept, quarantine, reject, tempfail), the
    headers to add, the SMTP reply (reject and tempfail), and either the ``verdict`` or,
    for a mail not scored, the ``failure`` reason (one of
    :data:`streamnb_workers.client.verdicts.REASONS`)."""

    action: str
    headers: tuple[tuple[str, str], ...] = ()
    reply: Reply | None = None
    verdict: str | None = None
    failure: str | None = None
    #: The prediction the verdict came from (the decoded ``:out`` map), for the protocols
    #: that answer with more than headers (workers/protocols/).
    prediction: Mapping[str, Any] | None = None

    @property
    def reason(self) -> str:
        """For the log and the quarantine: ``verdict spam`` or ``not scored (timeout)``."""
        return f"verdict {self.verdict}" if self.failure is None else f"not scored ({self.failure})"


def decide(policy: Policy, prediction: Mapping[str, Any] | None, msg_id: str | None,
           failure: NotScored | None = None) -> Outcome:
    """The outcome of a mail from its prediction (``failure`` when it has none)."""
    if failure is None and prediction is not None:
        try:
            headers = verdict_headers(prediction, policy.positive, msg_id)
        except NotScored as exc:  # a model without classes answers with no label
            failure = exc
        except ValueError as exc:  # e.g. --positive names no class of the model
            failure = NotScored(ERROR, str(exc))
        else:
            verdict = str(prediction["label"])
            action = policy.action_for(verdict)
            return Outcome(action, tuple(headers),
                           policy.reject_reply if action == REJECT else None, verdict=verdict,
                           prediction=prediction)
    if failure is None:
        failure = NotScored(ERROR, "no prediction")
    if policy.on_failure == TEMPFAIL:
        return Outcome(TEMPFAIL, (), policy.tempfail_reply, failure=failure.reason)
    return Outcome(ACCEPT, tuple(not_scored_headers(failure.reason, msg_id)),
                   failure=failure.reason)


class _OncePerReason:
    """A warning per not-scored reason at most every ``every_s`` seconds, with the count of
    those left out: with Redis down, every mail would log one."""

    def __init__(self, every_s: float = 60.0) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def warn(self, what: str, exc: NotScored) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(exc.reason)
            if last is not None and now - last < self.every_s:
                self._quiet[exc.reason] = self._quiet.get(exc.reason, 0) + 1
                return
            self._last[exc.reason] = now
            quiet = self._quiet.pop(exc.reason, 0)
        more = f" ({quiet} more not scored for this reason since the last message)" if quiet else ""
        log.warning("mail %s not scored: %s%s", what, exc, more)


_not_scored_log = _OncePerReason()


def score_mail(client: VerdictClient, policy: Policy, raw: bytes, timeout: float,
               hint: str = "") -> Outcome:
    """Send ``raw`` through the model's workers and decide within ``timeout`` seconds, the
    XADD included (never raises for a mail)."""
    deadline = time.monotonic() + timeout
    msg_id = None
    try:
        pending = client.submit(raw, hint)
        msg_id = pending.id
        return decide(policy, pending.result(deadline - time.monotonic()), msg_id)
    except NotScored as exc:
        if exc.reason != UNTRAINED:
            _not_scored_log.warn(msg_id or hint or "-", exc)
        return decide(policy, None, msg_id, exc)
    except Exception as exc:  # noqa: BLE001 - a bug must not bounce mail: policy applies
        log.exception("mail %s: unexpected error while scoring", msg_id or hint or "-")
        return decide(policy, None, msg_id, NotScored(ERROR, f"{type(exc).__name__}: {exc}"))

"""``streamnb milter``: score mail at SMTP time for Postfix or Sendmail (milter protocol).

The MTA hands each mail to the milter on ``--listen`` (``inet:PORT@HOST`` or
``unix:PATH``); the milter sends it through the model's workers like any producer (XADD
to ``streamnb:{M}:in``, the prediction from ``streamnb:{M}:out`` within ``--timeout``),
adds ``X-Streamnb-Verdict``, ``X-Streamnb-Score`` and ``X-Streamnb-Id`` and applies the
policy (:mod:`streamnb_workers.milter.policy`). It never loads the model: all its SMTP
sessions share the workers, through one :class:`~streamnb_workers.client.verdicts.VerdictClient`
per model. With ``--per-user`` a mail goes to the model its envelope recipients share
(workers/protocols/users.py ``model_for_all``: one recipient's per-user, else per-domain
model; several recipients on different models get the global one).

The protocol side is libmilter through pymilter, an optional extra
(``pip install 'streamnb[milter]'``; building it needs Debian's ``libmilter-dev``); this
module declares the command and imports the session (:mod:`streamnb_workers.milter.session`)
only when the command runs.

>>> parse_listen("inet:8894@127.0.0.1")
('inet:8894@127.0.0.1', None)
>>> parse_listen("unix:/run/streamnb/milter.sock")
('unix:/run/streamnb/milter.sock', '/run/streamnb/milter.sock')
>>> parse_listen("127.0.0.1:8894")
Traceback (most recent call last):
...
ValueError: --listen expects inet:PORT@HOST, inet6:PORT@HOST or unix:PATH, got '127.0.0.1:8894'
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import threading
from collections.abc import Mapping
from typing import Any

import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.arg_types import number_in, octal_mode, port, whole_number_in
from streamnb_workers.cli.options import add_common_options, add_model_name, redis_from_args
from streamnb_workers.cli.protocol_server import add_user_options, user_names_from_args
from streamnb_workers.cli.settings import add_option
from streamnb_workers.cli.supervisor import serve_metrics
from streamnb_workers.client.verdicts import VerdictClient
from streamnb_workers.milter.policy import (
    FAILURE_ACTIONS,
    Policy,
    parse_reply,
    parse_verdict_actions,
    score_mail,
)
from streamnb_workers.protocols.users import ModelChooser
from streamnb_workers.store.connection import is_access_error
from streamnb_workers.store.keys import check_model_name

__all__ = ["DEFAULT_LISTEN", "NAME", "add_parser", "parse_listen", "policy_from_args", "run"]

NAME = "milter"

log = logging.getLogger("streamnb.milter")

DEFAULT_LISTEN = "inet:8894@127.0.0.1"
#: Seconds from the end of a mail's data to its verdict before the mail counts as not scored.
DEFAULT_TIMEOUT_S = 5.0
#: Bytes of a mail that are scored (headers first); spamc's default limit is 500 KB.
DEFAULT_MAX_SIZE = 512 * 1024

#: The signals that stop the milter (libmilter: SIGINT aborts, SIGTERM and SIGHUP stop).
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})

_INET = re.compile(r"^(?P<family>inet6?):(?P<port>\d{1,5})(?:@(?P<host>[^\s@]+))?$")


def parse_listen(text: str) -> tuple[str, str | None]:
    """Check a libmilter socket spec: (the spec, the socket's path for ``unix:``/``local:``)."""
    text = text.strip()
    m = _INET.match(text)
    if m is not None:
        if not 1 <= int(m["port"]) <= 65535:
            raise ValueError(f"--listen: port must be 1..65535, got {m['port']}")
        return text, None
    kind, sep, path = text.partition(":")
    if sep and kind in ("unix", "local") and path.startswith("/"):
        return text, path
    raise ValueError(
        f"--listen expects inet:PORT@HOST, inet6:PORT@HOST or unix:PATH, got {text!r}")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb milter`` on the subparsers ``sub``."""
    p = sub.add_parser("milter", help="score mail at SMTP time for Postfix/Sendmail (milter)",
                       description="Serve the milter protocol: each mail goes through the model's "
                                   "workers and gets verdict headers and the policy's action.")
    add_common_options(p)
    add_model_name(p)
    add_option(p, "--listen", metavar="SOCKET", default=DEFAULT_LISTEN,
               help="where the MTA connects: inet:PORT@HOST, inet6:PORT@HOST or unix:PATH")
    add_option(p, "--timeout", type=number_in(0, 3600, "seconds", open_low=True, open_high=True), default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
               help="deadline from the end of a mail to its verdict; later, the mail is not scored")
    add_option(p, "--verdict-action", action="append", default=[], metavar="VERDICT=ACTION",
               help="what a verdict does: accept (add headers), quarantine (MTA hold queue) or "
                    "reject (5xx); repeat per verdict, e.g. spam=reject; unnamed verdicts: accept")
    add_option(p, "--on-failure", choices=FAILURE_ACTIONS, default="accept",
               help="a mail not scored (timeout, Redis down, untrained model): accept with "
                    "X-Streamnb-Verdict: not-scored (REASON), or tempfail (4xx, the sender retries)")
    add_option(p, "--reject-reply", metavar="'5XX X.Y.Z TEXT'",
               default="550 5.7.1 Message rejected as spam", help="SMTP reply of a rejected mail")
    add_option(p, "--tempfail-reply", metavar="'4XX X.Y.Z TEXT'",
               default="451 4.7.1 Message not scored by streamnb, try again later",
               help="SMTP reply of a tempfailed mail")
    add_option(p, "--positive", metavar="LABEL",
               help="the class whose log-odds is X-Streamnb-Score (default: the last class in "
                    "sorted order, spam of ham/spam)")
    add_option(p, "--max-size", type=whole_number_in(1024, 1_000_000, "bytes"), default=DEFAULT_MAX_SIZE, metavar="BYTES",
               help="bytes of a mail that are scored (headers first; the rest is not sent)")
    add_option(p, "--socket-mode", type=octal_mode, default="660", metavar="OCTAL",
               help="permissions of a unix: socket (the MTA's user must be able to write it)")
    add_user_options(p)
    add_option(p, "--metrics-port", type=port, default=0,
               help="Prometheus port of the milter's metrics (0: none)")
    add_option(p, "--metrics-addr", default="127.0.0.1", help="address the metrics server binds")
    return p


def policy_from_args(args: argparse.Namespace) -> Any:
    """The :class:`~streamnb_workers.milter.policy.Policy` the options describe (errors
    are SettingsError, one line)."""
    try:
        return Policy(actions=parse_verdict_actions(args.verdict_action or []),
                      on_failure=args.on_failure,
                      reject_reply=_reply("--reject-reply", args.reject_reply, "5"),
                      tempfail_reply=_reply("--tempfail-reply", args.tempfail_reply, "4"),
                      positive=args.positive)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _reply(flag: str, text: str, klass: str) -> Any:
    try:
        return parse_reply(text, klass)
    except ValueError as exc:
        raise SettingsError(f"{flag}: {exc}") from None


def _check_redis(client: Any) -> None:
    """A refused password or ACL stops the milter at start; an unreachable Redis does
    not (mail keeps flowing, not scored, until it is back)."""
    try:
        client.ping()
    except redis.RedisError as exc:
        if is_access_error(exc):
            raise
        log.warning("Redis not reachable yet (%s); mail is not scored until it is", exc)


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run the milter until SIGTERM/SIGINT; the exit code."""
    if not args.model:
        raise SettingsError("--model NAME is required (or set STREAMNB_MODEL)")
    try:
        model = check_model_name(args.model)
        listen, _path = parse_listen(args.listen)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    policy = policy_from_args(args)
    chooser = ModelChooser(model, user_names_from_args(args, model))
    settings = redis_from_args(args, env, client_name=f"streamnb-milter-{os.getpid()}")
    try:
        # deferred: pymilter is an optional extra, loaded only when the milter runs
        from streamnb_workers.milter import session as milter_session
    except ImportError as exc:
        raise SettingsError(
            f"streamnb milter needs pymilter ({exc}): pip install 'streamnb[milter]' "
            "(building it needs libmilter's headers: apt-get install libmilter-dev)") from None
    from streamnb_workers.observe.metrics import MilterMetrics  # deferred: prometheus_client

    metrics = MilterMetrics()
    timeout = args.timeout
    # libmilter stops the milter when its own thread, blocked in sigwait, gets one of these;
    # every other thread (the reader, the metrics server) must keep them blocked, or the
    # kernel may hand one to a thread where it ends the process at once.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        serve_metrics(args.metrics_port, args.metrics_addr)
        client = VerdictClient(settings, model, send_timeout=timeout, id_prefix="milter-")
        clients = PerUserClients(chooser, client, timeout)
        try:
            _check_redis(client)  # before the reader starts: a refused login is one line
            client.start()

            def score(raw: bytes, queue_id: str, recipients: tuple[str, ...] = ()) -> Any:
                return score_mail(clients.client_for(recipients), policy, raw, timeout, queue_id)

            log.info("milter for model %r on %s (Redis %s, timeout %g s, not scored: %s)",
                     model, listen, settings.describe(), timeout, policy.on_failure)
            milter_session.run(listen, score, max_size=args.max_size, on_error=policy.on_failure,
                               observe=lambda outcome, s: metrics.observe(model, outcome, s),
                               socket_mode=int(args.socket_mode, 8),
                               recipients=chooser.names is not None)
            # Stopped: no new connection. Mails at their end of data get their verdicts.
            clients.drain(timeout)
        finally:
            clients.close()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    log.info("milter stopped")
    return 0


class PerUserClients:
    """The verdict client of each model mail is sent to (``chooser``: the model of a
    mail's recipients; ``client``: the global model's, started by the caller)."""

    def __init__(self, chooser: ModelChooser, client: VerdictClient, timeout: float) -> None:
        self.chooser = chooser
        self.timeout = timeout
        self.clients = {chooser.default: client}
        self.settings = client.settings
        self.lookup = client.settings.make_client() if chooser.names is not None else None
        self.lock = threading.Lock()

    def client_for(self, recipients: tuple[str, ...]) -> VerdictClient:
        default = self.clients[self.chooser.default]
        if self.lookup is None or not recipients:
            return default
        try:
            model = self.chooser.model_for_all(recipients, self.lookup)
        except redis.RedisError:  # the global model's client says what Redis does
            return default
        with self.lock:
            client = self.clients.get(model)
            if client is None:
                client = self.clients[model] = VerdictClient(
                    self.settings, model, send_timeout=self.timeout,
                    id_prefix="milter-").start()
            return client

    def drain(self, timeout: float) -> None:
        for client in list(self.clients.values()):
            if not client.drain(timeout):
                log.warning("stopping with %d mails still waiting for a verdict",
                            client.in_flight)

    def close(self) -> None:
        for client in list(self.clients.values()):
            client.close()
        if self.lookup is not None:
            self.lookup.close()

"""What ``streamnb spamd`` and ``streamnb rspamd`` share: their options (where to listen,
the limits of a request, the score's scale, the verdict's deadline), the
:class:`~streamnb_workers.protocols.mail_service.MailService` those describe, and serving
until SIGTERM or SIGINT.

>>> parse_host_port("127.0.0.1:783", "--listen"), parse_host_port("[::1]:11333", "--listen")
(('127.0.0.1', 783), ('::1', 11333))
>>> parse_host_port("localhost", "--listen")
Traceback (most recent call last):
...
streamnb.exceptions.SettingsError: --listen expects HOST:PORT (127.0.0.1:783), got 'localhost'
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.arg_types import number_in, port, whole_number_in
from streamnb_workers.cli.options import add_common_options, add_model_name, redis_from_args
from streamnb_workers.cli.settings import add_option
from streamnb_workers.cli.supervisor import serve_metrics
from streamnb_workers.defaults import DEFAULT_MAX_USERS
from streamnb_workers.milter.policy import Policy
from streamnb_workers.protocols.limits import Limits
from streamnb_workers.protocols.mail_service import MailService, Scale
from streamnb_workers.protocols.users import ModelChooser, UserNames
from streamnb_workers.store.connection import is_access_error
from streamnb_workers.store.keys import check_model_name
from streamnb_workers.store.user_models import DOMAIN_TEMPLATE, USER_TEMPLATE

__all__ = ["add_server_options", "limits_from_args", "parse_host_port", "serve",
           "service_from_args"]

log = logging.getLogger("streamnb.protocols")


def parse_host_port(text: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets) -> (host, port); SettingsError otherwise."""
    host, sep, number = text.strip().rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not number.isdigit() or not 1 <= int(number) <= 65535:
        raise SettingsError(f"{flag} expects HOST:PORT (127.0.0.1:783), got {text!r}")
    return host, int(number)


def add_server_options(p: argparse.ArgumentParser, default_listen: str) -> None:
    """The options both protocol servers take."""
    add_common_options(p)
    add_model_name(p)
    add_option(p, "--listen", metavar="HOST:PORT", default=default_listen,
               help=f"where clients connect (default {default_listen})")
    add_option(p, "--timeout", type=number_in(0, 3600, "seconds", open_low=True,
                                              open_high=True),
               default=5.0, metavar="SECONDS",
               help="deadline for a mail's verdict from the workers; later, it is not scored")
    add_option(p, "--required-score", type=number_in(-1000, 1000, "points"), default=5.0,
               metavar="POINTS", help="the points where the score is 0 (the threshold shown)")
    add_option(p, "--score-scale", type=number_in(0, 1000, "points", open_low=True),
               default=10.0, metavar="FACTOR",
               help="points per unit of the workers' score: points = required + scale x score")
    add_option(p, "--positive", metavar="LABEL",
               help="the class that is spam (default: the last class in sorted order)")
    add_option(p, "--max-size", type=whole_number_in(1024, 1_000_000, "bytes"),
               default=512 * 1024, metavar="BYTES",
               help="bytes of a mail kept and scored (headers first; the rest is read and dropped)")
    add_option(p, "--max-connections", type=whole_number_in(1, 10_000, "connections"),
               default=64, metavar="N", help="connections served at once")
    add_option(p, "--read-timeout", type=number_in(0, 3600, "seconds", open_low=True),
               default=30.0, metavar="SECONDS",
               help="a client silent this long is cut off (and a request must arrive "
                    "within 4 x this)")
    add_user_options(p)
    add_option(p, "--max-users", type=whole_number_in(0, None), default=DEFAULT_MAX_USERS,
               metavar="N", help="per-user and per-domain models a user's learning registers "
               "at most; past it the learning goes to the user's domain model if registered, "
               "else the global one (0: no bound)")
    add_option(p, "--metrics-port", type=port, default=0,
               help="Prometheus port of the server's metrics (0: none)")
    add_option(p, "--metrics-addr", default="127.0.0.1", help="address the metrics server binds")


def add_user_options(p: argparse.ArgumentParser) -> None:
    """``--per-user`` and its templates (docs/operations.md, "Per-user models")."""
    add_option(p, "--per-user", action="store_true",
               help="score each user's (recipient's) mail with its per-user, else per-domain "
               "model where one is registered; what a user teaches goes to its own model")
    add_option(p, "--user-template", default=USER_TEMPLATE, metavar="TEMPLATE",
               help="a user's model name from {model}, {local} and {domain} (escaped)")
    add_option(p, "--domain-template", default=DOMAIN_TEMPLATE, metavar="TEMPLATE",
               help="a domain's model name from {model} and {domain} (escaped)")


def user_names_from_args(args: argparse.Namespace, model: str) -> UserNames | None:
    """The per-user model names of ``model`` the options describe (None: no ``--per-user``)."""
    if not args.per_user:
        return None
    try:
        return UserNames(model, args.user_template, args.domain_template)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def limits_from_args(args: argparse.Namespace) -> Limits:
    return Limits(max_size=args.max_size, read_timeout_s=args.read_timeout,
                  request_timeout_s=4 * args.read_timeout,
                  max_connections=args.max_connections, queue_s=min(5.0, args.read_timeout))


def service_from_args(args: argparse.Namespace, env: Mapping[str, str], name: str,
                      metrics: Any = None) -> MailService:
    """The mail service the options describe (``name``: the command, for ids and logs;
    ``metrics``: its ProtocolMetrics, which count the learning past ``--max-users``)."""
    if not args.model:
        raise SettingsError("--model NAME is required (or set STREAMNB_MODEL)")
    try:
        model = check_model_name(args.model)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    settings = redis_from_args(args, env, client_name=f"streamnb-{name}-{os.getpid()}")
    chooser = ModelChooser(model, user_names_from_args(args, model), args.max_users,
                           None if metrics is None else metrics.users_full.inc)
    return MailService(settings, chooser,
                       policy=Policy(positive=args.positive),
                       scale=Scale(args.required_score, args.score_scale),
                       timeout=args.timeout, max_size=args.max_size, id_prefix=name)


def serve(make_server: Callable[[tuple[str, int]], Any], listen: str, service: MailService,
          args: argparse.Namespace, what: str) -> int:
    """Bind, serve until SIGTERM or SIGINT, then let mails in flight get their verdicts.
    A refused Redis password or ACL stops the server at start (exit 2); an unreachable
    Redis does not (mail is answered not scored until it is back), as for the milter."""
    address = parse_host_port(listen, "--listen")
    try:
        service.ping()
    except redis.RedisError as exc:
        if is_access_error(exc):
            service.close()
            raise
        log.warning("Redis not reachable yet (%s); mail is not scored until it is", exc)
    try:
        server = make_server(address)
    except OSError as exc:
        service.close()
        raise SettingsError(f"--listen {listen}: cannot listen there "
                            f"({exc.strerror or exc})") from None
    server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    serve_metrics(args.metrics_port, args.metrics_addr)

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        threading.Thread(target=server.shutdown, daemon=True).start()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    log.info("%s for model %r on %s:%d (timeout %g s)", what, service.chooser.default,
             address[0], address[1], service.timeout)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        server.server_close()
        if not server.wait_idle(service.timeout + 1.0):
            log.warning("stopping with requests still in progress")
        service.close(drain_s=service.timeout)
    log.info("%s stopped", what)
    return 0

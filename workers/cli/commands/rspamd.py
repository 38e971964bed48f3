"""``streamnb rspamd``: Rspamd's HTTP protocol (``rspamc``, rspamd-proxy, webmail and
IMAP learning tools) over the workers (:mod:`streamnb_workers.protocols.rspamd_http`;
docs/protocol.md)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.protocol_server import (
    add_server_options,
    limits_from_args,
    serve,
    service_from_args,
)
from streamnb_workers.cli.settings import add_option
from streamnb_workers.protocols.rspamd_http import ACTIONS, RspamdServer

__all__ = ["DEFAULT_LISTEN", "NAME", "add_parser", "read_password", "run"]

NAME = "rspamd"
DEFAULT_LISTEN = "127.0.0.1:11333"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("rspamd", help="answer rspamc and Rspamd's HTTP clients (/checkv2, "
                                      "/learnspam, /learnham)",
                       description="Serve Rspamd's HTTP protocol: each mail goes through the "
                                   "model's workers; /learnspam and /learnham learn.")
    add_server_options(p, DEFAULT_LISTEN)
    add_option(p, "--password-file", metavar="FILE",
               help="learning needs a Password header equal to this file's first line")
    add_option(p, "--allow-learn", action="store_true", default=False,
               help="without --password-file: let every client learn (off by default)")
    add_option(p, "--spam-action", choices=ACTIONS, default="add header",
               help="the action of a verdict of the positive class (others: no action)")
    return p


def read_password(path: str | None) -> str | None:
    """The first line of ``path`` (None: no password); SettingsError if unreadable or empty."""
    if path is None:
        return None
    try:
        password = Path(path).read_text().splitlines()[0] if Path(path).stat().st_size else ""
    except OSError as exc:
        raise SettingsError(f"--password-file {path!r} cannot be read: {exc.strerror}") from None
    if not password:
        raise SettingsError(f"--password-file {path!r} is empty")
    return password


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.observe.metrics import ProtocolMetrics  # deferred: prometheus_client

    password = read_password(args.password_file)
    metrics = ProtocolMetrics()
    service = service_from_args(args, env, NAME, metrics)
    limits = limits_from_args(args)
    return serve(lambda address: RspamdServer(address, service, limits, password=password,
                                              allow_learn=args.allow_learn,
                                              spam_action=args.spam_action, metrics=metrics),
                 args.listen, service, args, "rspamd")

"""``streamnb spamd``: SpamAssassin's spamd protocol (spamc, Exim's ``spam =``, amavis)
over the workers (:mod:`streamnb_workers.protocols.spamd_server`; docs/protocol.md)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from streamnb_workers.cli.protocol_server import (
    add_server_options,
    limits_from_args,
    serve,
    service_from_args,
)
from streamnb_workers.cli.settings import add_option
from streamnb_workers.protocols.spamd_server import SpamdServer

__all__ = ["DEFAULT_LISTEN", "NAME", "add_parser", "run"]

NAME = "spamd"
DEFAULT_LISTEN = "127.0.0.1:783"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("spamd", help="answer spamc and spamd clients (SPAMD/1.x protocol)",
                       description="Serve SpamAssassin's spamd protocol: each mail goes through "
                                   "the model's workers; TELL learns and forgets.")
    add_server_options(p, DEFAULT_LISTEN)
    add_option(p, "--allow-tell", action="store_true", default=False,
               help="accept TELL (spamc -L, -C): learning and forgetting; off by default")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.observe.metrics import ProtocolMetrics  # deferred: prometheus_client

    metrics = ProtocolMetrics()
    service = service_from_args(args, env, NAME, metrics)
    limits = limits_from_args(args)
    return serve(lambda address: SpamdServer(address, service, limits,
                                             allow_tell=args.allow_tell, metrics=metrics),
                 args.listen, service, args, "spamd")

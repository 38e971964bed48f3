"""``streamnb status``: a model's kind, classes, learnt counts, version, streams, lag,
pending entries, dead letters and live workers (:mod:`streamnb_workers.client.status`),
as text or ``--json``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from streamnb_workers.cli.arg_types import non_negative_int
from streamnb_workers.cli.options import (
    add_common_options,
    add_model_name,
    model_name,
    redis_from_args,
)
from streamnb_workers.cli.settings import add_option
from streamnb_workers.defaults import DEFAULT_STATUS_LAST
from streamnb_workers.exit_codes import EXIT_FAILURE
from streamnb_workers.store.model_config import require_model

__all__ = ["NAME", "add_parser", "run"]

NAME = "status"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb status`` on the subparsers ``sub``."""
    p = sub.add_parser("status", help="show a model's counts, version, lag and workers",
                       description="Kind, classes, learnt counts, version, stream length, lag, "
                                   "pending, dead letters and live workers of a model.")
    add_common_options(p)
    add_model_name(p)
    add_option(p, "--json", action="store_true", default=False,
               help="print JSON (keys documented in docs/cli.md)")
    add_option(p, "--last", type=non_negative_int, default=DEFAULT_STATUS_LAST, metavar="N",
               help="accuracy and throughput over the last N outputs of :out")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print the model's status; exit 1 when it does not exist."""
    # deferred: the replica (to load the model's counts) loads only for status
    from streamnb_workers.client import status

    model = model_name(args)
    settings = redis_from_args(args, env)
    client = settings.make_client()
    require_model(client, model)
    info = status.collect(client, model, redis_url=settings.url, last=args.last)
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        print(status.format_text(info))
    return 0 if info["exists"] else EXIT_FAILURE

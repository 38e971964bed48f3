"""``streamnb demo``: replay the shipped sample of real mail through two workers on an
embedded Redis (or ``--redis``) and report the accuracy (:mod:`streamnb_workers.cli.demo`)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from typing import Any

from streamnb_workers.cli.arg_types import port, positive_int
from streamnb_workers.cli.options import add_common_options, redis_from_args
from streamnb_workers.cli.settings import add_option
from streamnb_workers.defaults import DEFAULT_DEMO_MESSAGES, DEFAULT_METRICS_ADDR

__all__ = ["NAME", "add_parser", "run"]

NAME = "demo"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb demo`` on the subparsers ``sub``."""
    p = sub.add_parser("demo", help="replay real mail through two workers and show the result",
                       description="Replay a sample of the SpamAssassin public corpus through two "
                                   "workers on an embedded Redis (or --redis) and report accuracy.")
    add_common_options(p, redis_required=False)
    add_option(p, "--messages", type=positive_int, default=DEFAULT_DEMO_MESSAGES,
               help="messages to replay (at most the sample's size)")
    add_option(p, "--model", metavar="NAME", default="demo", help="model name used by the demo")
    add_option(p, "--metrics-port", type=port, default=0,
               help="first metrics port of the two demo workers (0: pick free ports)")
    add_option(p, "--embedded", choices=("auto", "redis-server", "fakeredis"), default="auto",
               help="without --redis: a private redis-server if one is on PATH (auto), or force one")
    add_option(p, "--metrics-addr", default=DEFAULT_METRICS_ADDR, help="address the metrics server binds")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run the demo on ``--redis`` or an embedded Redis; the exit code."""
    # deferred: the sample reader and the embedded Redis load only for the demo
    from streamnb_workers.cli import demo

    settings = redis_from_args(args, env) if args.redis else None
    if args.log_level is None and not args.verbose:  # the default: the output is its report
        logging.getLogger().setLevel(logging.ERROR)
    return demo.run_demo(settings, messages=args.messages, model=args.model,
                         metrics_port=args.metrics_port, metrics_addr=args.metrics_addr,
                         embedded=args.embedded)

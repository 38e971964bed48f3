"""``streamnb produce``: send mail files, maildirs, mbox files or JSON lines to a model's
``:in`` (:func:`streamnb_workers.client.produce.produce`) and print the count sent."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb_workers.cli.arg_types import max_bytes, positive_int
from streamnb_workers.cli.options import (
    PROG,
    add_common_options,
    add_model_name,
    fail,
    model_name,
    redis_from_args,
)
from streamnb_workers.cli.settings import add_option
from streamnb_workers.client.produce_checks import EmptySource
from streamnb_workers.client.shard_streams import describe_inputs
from streamnb_workers.defaults import DEFAULT_PRODUCE_CHUNK
from streamnb_workers.exit_codes import EXIT_FAILURE
from streamnb_workers.store.model_config import require_model

__all__ = ["NAME", "add_parser", "run"]

NAME = "produce"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb produce`` on the subparsers ``sub``."""
    p = sub.add_parser("produce", help="send mail files, maildirs, mbox files or JSON lines",
                       description="Send messages to streamnb:{NAME}:in; prints the count sent.")
    add_common_options(p)
    add_model_name(p)
    label = p.add_mutually_exclusive_group()
    add_option(label, "--label", help="label every message sent with L")
    add_option(label, "--index", metavar="TSV",
               help="labels (and times) from an index.tsv: path, label, unix_time")
    add_option(p, "--chunk", type=positive_int, default=DEFAULT_PRODUCE_CHUNK, help="XADDs per round trip")
    add_option(p, "--max-bytes", type=max_bytes, default=DEFAULT_MAX_MESSAGE_BYTES,
               help="a mail over this size is cut (headers kept, at a MIME boundary) before "
               "it is sent, as a worker would cut it")
    add_option(p, "--allow-new", action="store_true",
               help="send to a model no worker has served yet (else that is an error naming "
               "the models that exist)")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=".eml file, maildir, mbox, directory or .jsonl file")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Send the messages of ``args.paths``; exit 1 when some were skipped."""
    # deferred: the producer (and the verdict client it waits with) loads only for produce
    from streamnb_workers.client.produce import ProduceInterrupted, produce

    model = model_name(args)
    client = redis_from_args(args, env).make_client()
    client.ping()
    if not args.allow_new:
        require_model(client, model, hint="; --allow-new sends to it before its workers start")
    try:
        report = produce(client, model, list(args.paths), label=args.label, index=args.index,
                         chunk=args.chunk, max_bytes=args.max_bytes)
    except EmptySource as exc:
        return fail(str(exc), EXIT_FAILURE)
    except ProduceInterrupted as exc:
        r, cause = exc.report, exc.__cause__
        print(f"{PROG} produce: sent {r.sent} of {r.total} messages ({r.already_learnt} "
              "already learnt, not sent); run it again to send the rest", file=sys.stderr)
        if isinstance(cause, KeyboardInterrupt):
            return 130
        return fail(f"produce stopped: {cause}", EXIT_FAILURE)
    labelled = f" ({report.labelled} labelled)" if report.labelled else ""
    skipped = f", skipped {report.skipped}" if report.skipped else ""
    relearnt = f", {report.relearnt_summary}" if report.relearnt else ""
    print(f"sent {report.sent} of {report.total} messages{labelled} to "
          f"{describe_inputs(model, report.shards)}; {report.already_learnt} already learnt, "
          f"not sent{relearnt}{skipped}")
    return EXIT_FAILURE if report.skipped else 0

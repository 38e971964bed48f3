"""``streamnb forget``: unlearn messages (:func:`streamnb_workers.client.forget.forget`) and
print what was sent and what was not learnt."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from streamnb_workers.cli.arg_types import source_name
from streamnb_workers.cli.options import add_common_options, add_model_name, fail, model_client
from streamnb_workers.client.shard_streams import describe_inputs
from streamnb_workers.exit_codes import EXIT_FAILURE

__all__ = ["NAME", "add_parser", "run"]

NAME = "forget"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb forget`` on the subparsers ``sub``."""
    p = sub.add_parser("forget", help="unlearn mail files, maildirs, mbox files or JSON lines",
                       description="Unlearn each message the model learnt (by the key produce "
                                   "gives it); prints what was sent and what was not learnt. "
                                   "With --source NAME (and no PATH): unlearn everything the "
                                   "source NAME taught.")
    add_common_options(p)
    add_model_name(p)
    p.add_argument("--source", type=source_name, default=None, metavar="NAME",
                   help="take out everything the source NAME taught the model, on every "
                   "worker, at one place of its log")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=".eml file, maildir, mbox, directory, .jsonl file, or - (stdin)")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Forget the messages of ``args.paths``; exit 1 when some were skipped."""
    # deferred: the message sources (mailbox, email) load only for forget
    from streamnb_workers.client.forget import forget, forget_source

    if (args.source is None) == (not args.paths):
        return fail("forget: give PATHs to unlearn, or --source NAME (not both)")
    model, client = model_client(args, env)
    if args.source is not None:
        entries = forget_source(client, model, args.source)
        print(f"forgetting everything source {args.source!r} taught model {model!r} (log entry "
              f"{', '.join(entries)})")
        return 0
    report = forget(client, model, list(args.paths))
    skipped = f", skipped {len(report.skipped)}" if report.skipped else ""
    print(f"forgetting {report.sent} of {report.total} messages (sent to "
          f"{describe_inputs(model, report.shards)}); {len(report.not_learnt)} not learnt, "
          f"nothing to forget{skipped}")
    return EXIT_FAILURE if report.skipped else 0

"""``streamnb forget``: unlearn messages (:func:`streamnb_workers.client.forget.forget`) and
print what was sent and what was not learnt."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.arg_types import since_time, source_name
from streamnb_workers.cli.options import add_common_options, add_model_name, model_client
from streamnb_workers.client.produce_checks import stored_training
from streamnb_workers.client.shard_streams import describe_inputs
from streamnb_workers.exit_codes import EXIT_FAILURE

__all__ = ["NAME", "add_parser", "run"]

NAME = "forget"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb forget`` on the subparsers ``sub``."""
    p = sub.add_parser("forget", help="unlearn mail files, maildirs, mbox files or JSON lines, "
                                      "or a class learnt by mistake",
                       description="Unlearn each message the model learnt (by the key produce "
                                   "gives it); prints what was sent and what was not learnt. "
                                   "With --class LABEL instead: remove that class and everything "
                                   "learnt under it, on every worker. With --source NAME "
                                   "instead: unlearn everything the source NAME taught (an "
                                   "admin's operation: it writes the model's log).")
    add_common_options(p)
    add_model_name(p)
    p.add_argument("--source", type=source_name, default=None, metavar="NAME",
                   help="take out everything the source NAME taught the model, on every "
                   "worker, at one place of its log (writes :log and :epochs: the admin user)")
    p.add_argument("--since", type=since_time, default=None, metavar="TIME",
                   help="with --source: take out only what it taught since TIME (ISO 8601, "
                   "UTC unless an offset is given, or seconds since the epoch), as far back "
                   "as the model's log reaches")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=".eml file, maildir, mbox, directory, .jsonl file, or - (stdin)")
    p.add_argument("--class", dest="forget_class", metavar="LABEL", default=None,
                   help="remove class LABEL (not a declared one) and what was learnt under it; "
                        "its learn-once keys are released")
    p.add_argument("--force", action="store_true",
                   help="with --class: remove the class even though it holds weight")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Forget the messages of ``args.paths`` (exit 1 when some were skipped), or the class
    ``--class``, or what the source ``--source`` taught."""
    # deferred: the message sources (mailbox, email) load only for forget
    from streamnb_workers.client.forget import (
        forget,
        forget_class,
        forget_source,
        send_forget_source,
    )

    if args.since is not None and args.source is None:
        raise SettingsError("--since goes with --source NAME")
    if sum((bool(args.paths), args.forget_class is not None, args.source is not None)) != 1:
        raise SettingsError("forget takes PATH... or --class LABEL or --source NAME (one of them)")
    if args.force and args.forget_class is None:
        raise SettingsError("--force goes with --class LABEL")
    model, client = model_client(args, env)
    if args.since is not None:
        return _forget_since(client, model, args.source, args.since)
    if args.source is not None:
        return _forget_source(client, model, args.source, forget_source, send_forget_source)
    if args.forget_class is not None:
        removal = forget_class(client, model, args.forget_class, force=args.force)
        held = f"weight {removal.weight:g}" if removal.weight is not None else (
            "not read: the workers remove it if the model holds it"
            + ("" if args.force else ", without weight"))
        print(f"removing class {removal.label!r} ({held}) from model {model!r} (sent to "
              f"{describe_inputs(model, removal.shards)})")
        return 0
    report = forget(client, model, list(args.paths))
    skipped = f", skipped {len(report.skipped)}" if report.skipped else ""
    print(f"forgetting {report.sent} of {report.total} messages (sent to "
          f"{describe_inputs(model, report.shards)}); {len(report.not_learnt)} not learnt, "
          f"nothing to forget{skipped}")
    return EXIT_FAILURE if report.skipped else 0


def _forget_source(client: Any, model: str, source: str, direct: Any, send: Any) -> int:
    """``forget --source NAME``: straight into the log (``direct``), or through the workers
    (``send``) for a model that learns from ``:train`` and for a user that may not write
    the log (the trainer; the producer)."""
    if stored_training(client, model) != "train":
        try:
            entries = direct(client, model, source)
        except (redis.exceptions.NoPermissionError, redis.exceptions.ExecAbortError):
            entries = None  # (a user that may not write the log)
        if entries is not None:
            print(f"forgetting everything source {source!r} taught model {model!r} (log "
                  f"entry {', '.join(entries)})")
            return 0
    sent = send(client, model, source)
    print(f"forgetting everything source {source!r} taught model {model!r} (sent to "
          f"{describe_inputs(model, len(sent))}; the workers log it)")
    return 0


def _forget_since(client: Any, model: str, source: str, since: int) -> int:
    """``forget --source NAME --since TIME``: print what each shard took out."""
    # deferred: as in run
    from streamnb_workers.client.forget_since import forget_source_since

    when = datetime.fromtimestamp(since / 1000, UTC).isoformat(timespec="seconds")
    try:
        done_all = forget_source_since(client, model, source, since)
    except redis.exceptions.NoPermissionError:
        raise SettingsError("forget --source NAME --since TIME reads and writes the model's "
                            "log: run it as a user that may (streamnb-admin)") from None
    for done in done_all:
        if done.entry is None:
            print(f"source {source!r} taught {done.shard!r} nothing since {when}")
            continue
        weight = ", ".join(f"{k}: {v:g}" for k, v in sorted(done.weight.items(), key=str))
        print(f"forgetting what source {source!r} taught {done.shard!r} since {when} "
              f"(weight {weight}; {done.released} learn-once keys released, {done.kept} "
              f"kept; log entry {done.entry})")
    return 0

"""``streamnb produce``: send mail files, maildirs, mbox files or JSON lines to a model's
``:in`` (:func:`streamnb_workers.client.produce.produce`) and print the count sent.

``streamnb produce ... -`` reads one mail from stdin, for Sieve, procmail and MTA pipes
(:func:`run_stdin`): nothing on stdout, one line on stderr when it fails (with ``-v``, one
when it succeeds), and a pipe's exit code: 0 sent or already learnt, 1 a failure worth
retrying (Redis down), 2 bad usage or input that is not mail.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, BinaryIO

import redis

from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb_workers.cli.arg_types import max_bytes, positive_int, source_name
from streamnb_workers.cli.options import (
    PROG,
    STDIN,
    add_common_options,
    add_model_name,
    fail,
    model_name,
    redis_error,
    redis_from_args,
)
from streamnb_workers.cli.settings import add_option
from streamnb_workers.client.produce_checks import EmptySource, NotMail, not_mail
from streamnb_workers.client.shard_streams import describe_inputs
from streamnb_workers.defaults import DEFAULT_PRODUCE_CHUNK
from streamnb_workers.exit_codes import EXIT_FAILURE, EXIT_UNREACHABLE, EXIT_USAGE
from streamnb_workers.store.model_config import require_model

__all__ = ["NAME", "add_parser", "run", "run_stdin"]

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
    add_option(p, "--source", type=source_name, default=None, metavar="NAME",
               help="the source the labels sent teach under (default: the source 'default'); "
               "streamnb forget --source NAME takes out all it taught")
    add_option(p, "--chunk", type=positive_int, default=DEFAULT_PRODUCE_CHUNK, help="XADDs per round trip")
    add_option(p, "--max-bytes", type=max_bytes, default=DEFAULT_MAX_MESSAGE_BYTES,
               help="a mail over this size is cut (headers kept, at a MIME boundary) before "
               "it is sent, as a worker would cut it")
    add_option(p, "--allow-new", action="store_true",
               help="send to a model no worker has served yet (else that is an error naming "
               "the models that exist)")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=".eml file, maildir, mbox, directory or .jsonl file; - (alone): one "
                        "mail on stdin, exit 0 sent or already learnt, 1 retry later, 2 not mail")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Send the messages of ``args.paths``; exit 1 when some were skipped."""
    # deferred: the producer (and the verdict client it waits with) loads only for produce
    from streamnb_workers.client.produce import ProduceInterrupted, produce

    if STDIN in args.paths:
        return run_stdin(args, env, sys.stdin.buffer)
    model = model_name(args)
    client = redis_from_args(args, env).make_client()
    client.ping()
    if not args.allow_new:
        require_model(client, model, hint="; --allow-new sends to it before its workers start")
    try:
        report = produce(client, model, list(args.paths), label=args.label, index=args.index,
                         chunk=args.chunk, max_bytes=args.max_bytes, source=args.source)
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


def run_stdin(args: argparse.Namespace, env: Mapping[str, str], stdin: BinaryIO) -> int:
    """``streamnb produce ... -``: send the one mail on ``stdin``; the pipe's exit code (module
    docstring). Nothing is written to stdout."""
    # deferred: the producer loads only for produce, as in run
    from streamnb_workers.client.produce import ProduceInterrupted, produce_stdin

    if args.paths != [STDIN]:
        return fail("produce -: - reads one mail from stdin and takes no other PATH")
    if args.index is not None:
        return fail("produce -: --index labels files; give --label for a mail on stdin")
    model = model_name(args)
    raw = stdin.read()
    reason = not_mail(raw)  # judged before Redis is asked: bad input is not worth a retry
    if reason is not None:
        return fail(f"produce -: stdin: {reason}", EXIT_USAGE)
    try:
        client = redis_from_args(args, env).make_client()
        client.ping()
        if not args.allow_new:
            require_model(client, model, hint="; --allow-new sends to it before its workers start")
        report = produce_stdin(client, model, raw, label=args.label, max_bytes=args.max_bytes,
                               source=args.source)
    except NotMail as exc:
        return fail(f"produce -: stdin: {exc}", EXIT_USAGE)
    except ProduceInterrupted as exc:
        cause = exc.__cause__
        if isinstance(cause, KeyboardInterrupt):
            return 130
        if isinstance(cause, redis.RedisError):
            return _redis_failure(cause)
        return fail(f"produce -: not sent: {cause}", EXIT_FAILURE)
    except redis.RedisError as exc:
        return _redis_failure(exc)
    if args.verbose:
        what = ("already learnt, not sent" if report.already_learnt
                else "sent" + (f" labelled {args.label}" if report.labelled else ""))
        print(f"{PROG} produce: 1 message from stdin {what} to "
              f"{describe_inputs(model, report.shards)}", file=sys.stderr)
    return 0


def _redis_failure(exc: redis.RedisError) -> int:
    """One line for a Redis error of ``produce -``: refused credentials or ACL exit 2 (a
    retry would fail again), anything else (Redis down, loading, read-only) 1."""
    message, code = redis_error(exc)
    return fail(f"produce -: not sent: {message}",
                EXIT_FAILURE if code == EXIT_UNREACHABLE else code)

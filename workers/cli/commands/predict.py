"""``streamnb predict``: a message's prediction. ``FILE`` is sent unlabelled through the
model's workers and its prediction printed; ``-`` judges a mail on stdin, its verdict the
exit code (:mod:`streamnb_workers.cli.pipe`); a directory, maildir or mbox judges every
message in it, one line each (:mod:`streamnb_workers.cli.predict_many`); ``--snapshot``
predicts offline from an exported model file
(:mod:`streamnb_workers.client.offline_predict`).

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers(dest="command")
>>> args = add_parser(sub).parse_args(["-p", "--positive", "spam", "-"])
>>> args.passthrough, args.positive, args.file
(True, 'spam', '-')
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

from streamnb.exceptions import SettingsError
from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb_workers.cli.arg_types import finite_float, max_bytes
from streamnb_workers.cli.options import (
    STDIN,
    add_common_options,
    add_model_name,
    fail,
    model_client,
    redis_from_args,
)
from streamnb_workers.cli.prediction_text import format_prediction
from streamnb_workers.cli.settings import add_option
from streamnb_workers.defaults import DEFAULT_PREDICT_TIMEOUT_S
from streamnb_workers.exit_codes import EXIT_FAILURE
from streamnb_workers.store.user_models import DOMAIN_TEMPLATE, USER_TEMPLATE

__all__ = ["NAME", "add_parser", "run"]

NAME = "predict"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb predict`` on the subparsers ``sub`` (with the options of ``predict
    -`` and ``predict DIR|MBOX``)."""
    p = sub.add_parser("predict", help="predict a message, stdin (-) or many (online or offline)",
                       description="Send FILE unlabelled and print its prediction (FILE -: a mail "
                                   "on stdin, exit code by verdict; a directory or mbox: one line "
                                   "per message), or predict offline with --snapshot.")
    add_common_options(p, redis_required=False)
    add_model_name(p)
    add_option(p, "--snapshot", metavar="MODEL_FILE",
               help="predict offline from a file written by 'streamnb export'")
    add_option(p, "--max-bytes", type=max_bytes, default=DEFAULT_MAX_MESSAGE_BYTES,
               help="a mail over this size is cut (headers kept, at a MIME boundary) before "
               "it is sent")
    add_option(p, "--timeout", type=finite_float, default=DEFAULT_PREDICT_TIMEOUT_S,
               help="seconds to wait for the prediction")
    add_option(p, "--json", action="store_true", default=False, help="print the prediction as JSON")
    add_option(p, "-p", "--passthrough", action="store_true", default=False,
               help="with FILE -: write the mail to stdout with the X-Streamnb-* headers added "
                    "(body untouched) instead of a prediction line")
    add_option(p, "-e", "--exit-zero", action="store_true", default=False,
               help="with FILE -: exit 0 for every verdict (3 still means none), for delivery "
                    "agents that take any other code as a failed filter")
    add_option(p, "--positive", metavar="LABEL",
               help="with FILE - or DIR|MBOX: the class that exits 0 and whose log-odds is the "
                    "score (default: the last class in sorted order, spam of ham/spam)")
    add_option(p, "--user", metavar="ADDRESS",
               help="with FILE -: the recipient (Dovecot's and procmail's $RECIPIENT): its "
                    "per-user, else per-domain model scores the mail where one is registered")
    add_option(p, "--user-template", default=USER_TEMPLATE, metavar="TEMPLATE",
               help="with --user: a user's model name from {model}, {local} and {domain}")
    add_option(p, "--domain-template", default=DOMAIN_TEMPLATE, metavar="TEMPLATE",
               help="with --user: a domain's model name from {model} and {domain}")
    p.add_argument("file", metavar="FILE",
                   help="an .eml file (or a .json record); - for a mail on stdin; a directory, "
                        "maildir or mbox to judge every message in it")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Predict ``args.file`` (module docstring); the exit code."""
    # deferred: the verdict client, the producer and the model file reader load only for predict
    from streamnb_workers.cli import pipe, predict_many
    from streamnb_workers.client.offline_predict import predict_file  # deferred, as above
    from streamnb_workers.client.produce import send_and_wait  # deferred, as above

    if args.file == STDIN and not args.snapshot:
        return pipe.run_on_stdin(args, lambda: redis_from_args(args, env))
    if args.user and (args.file != STDIN or args.snapshot):
        raise SettingsError("--user chooses the model of a mail on stdin: give FILE -")
    if args.passthrough or args.exit_zero:
        raise SettingsError("-p and -e judge a mail on stdin: give FILE - (without --snapshot)")
    if not args.snapshot and pipe.wants_many(args.file):
        model, client = model_client(args, env)
        return predict_many.run_many(args, model, client)
    if args.snapshot:
        result = predict_file(args.snapshot, args.file)
    else:
        model, client = model_client(args, env)
        result = send_and_wait(client, model, args.file, timeout=args.timeout,
                               max_bytes=args.max_bytes)
        if result is None:
            return fail(f"no prediction for {args.file!r} within {args.timeout:g} s: "
                        f"is a worker running for model {model!r}?", EXIT_FAILURE)
    result.setdefault("file", args.file)
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
    else:
        print(format_prediction(result))
    return 0

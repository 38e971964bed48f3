"""``streamnb explain``: the tokens that moved a message's prediction, as ``bogofilter
-vv`` shows them. The message (FILE, or ``-`` on stdin) is predicted with the model as it
is in Redis (:mod:`streamnb_workers.cli.served_model`) or in an exported file
(``--snapshot``), and the features that moved its log-odds most are printed with their
weights, named by the token names the workers publish. See docs/cli.md.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers(dest="command")
>>> add_parser(sub).parse_args(["--top", "5", "-"]).top
5
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any

from streamnb.decision import DecisionRule
from streamnb.exceptions import MalformedMessage, SettingsError
from streamnb_workers.cli.arg_types import positive_int
from streamnb_workers.cli.options import add_common_options, add_model_name
from streamnb_workers.cli.prediction_text import format_prediction
from streamnb_workers.cli.settings import add_option
from streamnb_workers.wire.codec import decode_input, encode_input

__all__ = ["MAX_STDIN_BYTES", "NAME", "add_parser", "run"]

NAME = "explain"
#: The most bytes ``explain -`` reads from stdin (a message beyond it is refused).
MAX_STDIN_BYTES = 16 * 1024 * 1024


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb explain`` on the subparsers ``sub``."""
    p = sub.add_parser("explain", help="show the tokens that moved a message's prediction",
                       description="Predict FILE (or '-', the message on stdin) with the model "
                                   "as it is in Redis (or --snapshot) and print the features "
                                   "that moved its log-odds most, with their weights.")
    add_common_options(p)
    add_model_name(p)
    add_option(p, "--snapshot", metavar="MODEL_FILE",
               help="explain with a file written by 'streamnb export' instead of Redis")
    add_option(p, "--top", type=positive_int, default=10, metavar="K", help="features to show")
    add_option(p, "--json", action="store_true", default=False, help="print JSON")
    p.add_argument("file", metavar="FILE", help="an .eml file, a .json record, or - for stdin")
    return p


def _read_stdin(stream: Any) -> Any:
    data = stream.read(MAX_STDIN_BYTES + 1)
    if len(data) > MAX_STDIN_BYTES:
        raise SettingsError(f"the message on stdin is larger than {MAX_STDIN_BYTES} bytes")
    try:
        return decode_input(encode_input("raw", data, id="-"), "-")
    except MalformedMessage as exc:
        raise SettingsError(f"stdin: {exc.detail}") from None


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print what moved the prediction of ``args.file`` (module docstring)."""
    # deferred: the replica (to load a model file or the served model), the message reader
    # and the explanations load only for explain
    from streamnb_workers.cli.served_model import open_served_model, published_names
    from streamnb_workers.client.model_files import featurizer_for, read_envelope  # deferred
    from streamnb_workers.client.sources import read_message  # deferred
    from streamnb_workers.observe.token_names import message_tokens  # deferred
    from streamnb_workers.wire.explanations import (  # deferred
        EXPLAINED_KINDS,
        explain_matrix,
        format_explanation,
    )

    client = None
    if args.snapshot:
        model, envelope = read_envelope(args.snapshot)
        featurizer = featurizer_for(model, envelope, args.snapshot)
        rule, version = DecisionRule.from_dict(envelope.get("decision")), envelope.get("log_id")
    else:
        client, model, featurizer, rule, version = open_served_model(args, env)
    if model.kind not in EXPLAINED_KINDS:
        raise SettingsError(f"a {model.kind} model does not split its log-odds per feature: "
                            f"explain is for the {', '.join(EXPLAINED_KINDS)} models")
    msg = _read_stdin(sys.stdin.buffer) if args.file == "-" else read_message(args.file)
    try:
        X = featurizer.stack([featurizer.featurize(msg.as_payload())])
    except MalformedMessage as exc:
        raise SettingsError(f"{args.file}: {exc.detail}") from None
    classes = [c.item() if hasattr(c, "item") else c for c in model.classes_]
    decision = rule.decide(model.predict_log_proba(X), classes,
                           learnt_log_prior=getattr(model, "class_log_prior_", None),
                           class_weight=[model.class_count_.tolist()])  # (none: no part)
    tokens = message_tokens(featurizer, msg)
    explained = explain_matrix(model, rule, featurizer, X, args.top, [tokens])[0]
    if explained is not None and client is not None:  # names of hashes-only messages
        unnamed = [int(n[1:]) for n, _ in explained["tokens"] if n.startswith("#")]
        if unnamed:
            explained = explain_matrix(model, rule, featurizer, X, args.top, [tokens],
                                       published_names(client, args.model, unnamed))[0]
    result = {"id": msg.id, "label": decision.labels[0], "model_version": version,
              "log_proba": {str(c): float(v) for c, v in zip(classes, decision.log_proba[0],
                                                              strict=True)},
              "explain": explained}
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
        return 0
    print(format_prediction(result))
    print(format_explanation(explained) if explained is not None else
          "(no explanation: the model holds fewer than two classes with weight)")
    return 0

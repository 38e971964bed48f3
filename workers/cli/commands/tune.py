"""``streamnb tune``: propose a model's operating point from its labelled history in
``:out`` (:mod:`streamnb_workers.client.tune`): ``--target-fpr``, its threshold and an
unsure band for ``--goal fpr=RATE`` or ``--goal accuracy``, with the figures behind them.

Exit 0 with a proposal; 1 when the history read cannot support the goal (too few labelled
messages of a class: the line says how many it needs); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.arg_types import number_in, whole_number_in
from streamnb_workers.cli.options import add_common_options, add_model_name, model_client
from streamnb_workers.client.shard_streams import shard_keys
from streamnb_workers.client.tune import (
    DEFAULT_LAST,
    MAX_LAST,
    TooLittleHistory,
    format_proposal,
    in_use,
    parse_goal,
    propose,
    read_history,
)
from streamnb_workers.exit_codes import EXIT_FAILURE

__all__ = ["NAME", "add_parser", "run"]

NAME = "tune"


def _goal(text: str) -> str:
    try:
        parse_goal(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb tune`` on the subparsers ``sub``."""
    p = sub.add_parser("tune", help="propose --target-fpr and an unsure band from the labelled "
                                    "history in :out",
                       description="Read the last --last entries of streamnb:{NAME}:out, keep "
                                   "the labelled ones (their prequential score and true label) "
                                   "and propose the operating point for --goal, with ham FPR "
                                   "(and its 95%% Clopper-Pearson bound), spam recall and "
                                   "accuracy on that history.")
    add_common_options(p)
    add_model_name(p)
    p.add_argument("--goal", type=_goal, default="accuracy", metavar="fpr=RATE|accuracy",
                   help="a ham false-positive rate to hold at 95%% confidence, or the best "
                        "accuracy (default)")
    p.add_argument("--last", type=whole_number_in(1, MAX_LAST), default=DEFAULT_LAST,
                   metavar="N", help=f"read at most the last N entries (default {DEFAULT_LAST})")
    p.add_argument("--unsure-fpr", type=number_in(0.0, 1.0, "a rate", open_low=True,
                                                  open_high=True),
                   default=None, metavar="RATE",
                   help="the ham FPR the unsure band's lower edge holds (default 10x the target)")
    p.add_argument("--positive", metavar="LABEL", default=None,
                   help="the positive class (default: the last label in sorted order)")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print the proposal: exit 0; 1 when the history cannot support the goal."""
    goal = parse_goal(args.goal)
    if goal is not None and args.unsure_fpr is not None and args.unsure_fpr <= goal:
        raise SettingsError(f"--unsure-fpr {args.unsure_fpr:g} must exceed the goal's rate {goal:g}")
    model, client = model_client(args, env)
    streams = [keys.out for keys in shard_keys(client, model)]
    stored = in_use(client, model)
    try:
        history = read_history(client, streams, args.last, args.positive)
        proposal = propose(history, goal, args.unsure_fpr)
    except TooLittleHistory as exc:
        print(f"streamnb tune: {exc}; no proposal", file=sys.stderr)
        return EXIT_FAILURE
    print("\n".join(format_proposal(proposal, history, stored["alpha"], stored["target_fpr"])))
    return 0

"""``streamnb tune``: propose a model's operating point from its labelled history in
``:out`` (:mod:`streamnb_workers.client.tune`): ``--target-fpr``, its threshold and an
unsure band for ``--goal fpr=RATE`` or ``--goal accuracy``, with the figures behind them.

With ``--replay INDEX``, alpha too: the labelled mail of the index replayed through the
daemon once per candidate alpha (:mod:`streamnb_workers.cli.alpha_replay`).

Exit 0 with a proposal; 1 when the history read cannot support the goal (too few labelled
messages of a class: the line says how many it needs); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.alpha_replay import (
    ALPHAS,
    MAX_ALPHAS,
    best_alpha,
    format_alphas,
    read_replay,
    replay_alphas,
)
from streamnb_workers.cli.arg_types import float_list, number_in, whole_number_in
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
from streamnb_workers.store.model_config import read_config

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
    p.add_argument("--replay", metavar="INDEX", default=None,
                   help="also propose alpha: replay the labelled mail of INDEX (path, label, "
                        "unix_time, in date order, as produce --index reads it) through the "
                        "daemon once per candidate alpha, on an embedded Redis")
    p.add_argument("--alphas", type=float_list, default=None, metavar="A,B,...",
                   help=f"the candidates replayed (default {','.join(map(str, ALPHAS))} and "
                        f"the alpha in use; at most {MAX_ALPHAS})")
    p.add_argument("--embedded", choices=("auto", "redis-server", "fakeredis"), default="auto",
                   help="the Redis the replay runs on (default: a private redis-server if on "
                        "PATH, else fakeredis)")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print the proposal: exit 0; 1 when the history cannot support the goal."""
    goal = parse_goal(args.goal)
    if goal is not None and args.unsure_fpr is not None and args.unsure_fpr <= goal:
        raise SettingsError(f"--unsure-fpr {args.unsure_fpr:g} must exceed the goal's rate {goal:g}")
    alphas = _alphas(args.alphas)
    model, client = model_client(args, env)
    streams = [keys.out for keys in shard_keys(client, model)]
    stored = in_use(client, model)
    messages = read_replay(args.replay) if args.replay is not None else None
    code = 0
    try:
        history = read_history(client, streams, args.last, args.positive)
        proposal = propose(history, goal, args.unsure_fpr)
        print("\n".join(format_proposal(proposal, history, stored["alpha"], stored["target_fpr"],
                                         replayed=messages is not None)))
    except TooLittleHistory as exc:
        print(f"streamnb tune: {exc}; no proposal", file=sys.stderr)
        code = EXIT_FAILURE
    if messages is not None:
        in_use_alpha = stored["alpha"]
        candidates = sorted({*(alphas or ALPHAS), *([in_use_alpha] if in_use_alpha else [])})
        figures = replay_alphas(read_config(client, model), messages, candidates, goal,
                                args.embedded)
        best = best_alpha(figures, in_use_alpha)
        print("\n".join(format_alphas(figures, best, in_use_alpha, args.replay)))
        code = code if best is not None else EXIT_FAILURE
    return code


def _alphas(given: list[float] | None) -> list[float] | None:
    """``--alphas`` checked: 1..MAX_ALPHAS finite values > 0 (SettingsError otherwise)."""
    if given is None:
        return None
    if not 1 <= len(given) <= MAX_ALPHAS or not all(0.0 < a < float("inf") for a in given):
        raise SettingsError(f"--alphas: 1 to {MAX_ALPHAS} numbers > 0, got {given}")
    return given

"""``streamnb tokens``: per-token counts per class and weights of a model in Redis, as
``bogoutil -w`` shows them: for each TOKEN (hashed as the workers hash it), or the ``--top``
N buckets by weight, its counts per class, its weight in the log-odds, and the names the
workers saw in its bucket (:mod:`streamnb_workers.cli.served_model`). See docs/cli.md.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers(dest="command")
>>> add_parser(sub).parse_args(["--top", "5", "cheap"]).tokens
['cheap']
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from typing import Any

import numpy as np

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.arg_types import non_negative_int
from streamnb_workers.cli.options import add_common_options, add_model_name
from streamnb_workers.cli.settings import add_option

__all__ = ["NAME", "TOKEN_KINDS", "add_parser", "run", "token_rows"]

NAME = "tokens"
#: The model kinds whose token columns ``tokens`` reads.
TOKEN_KINDS = ("multinomial", "bernoulli", "hybrid")


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb tokens`` on the subparsers ``sub``."""
    p = sub.add_parser("tokens", help="per-token counts per class and weights (bogoutil -w)",
                       description="For each TOKEN (hashed as the workers hash it), or the "
                                   "--top N buckets by weight: its counts per class and its "
                                   "weight in the log-odds, with the names seen in its bucket.")
    add_common_options(p)
    add_model_name(p)
    add_option(p, "--top", type=non_negative_int, default=None, metavar="N",
               help="the N buckets that move the log-odds most (default 20 without TOKEN)")
    add_option(p, "--min-count", type=non_negative_int, default=3, metavar="C",
               help="--top: only buckets counted at least C times over all classes")
    add_option(p, "--classes", metavar="NEG,POS",
               help="the log-odds of POS against NEG (default: the positive class of a "
                    "two-class model against the other)")
    add_option(p, "--json", action="store_true", default=False, help="print JSON lines")
    p.add_argument("tokens", nargs="*", metavar="TOKEN", help="tokens to look up")
    return p


def _model_pair(model: Any, rule: Any, classes: str | None) -> tuple[Any, Any] | None:
    """The (negative, positive) pair of ``--classes``, or the rule's for two classes."""
    labels = [c.item() if hasattr(c, "item") else c for c in model.classes_]
    if classes:
        parts = [c.strip() for c in classes.split(",")]
        if len(parts) != 2:
            raise SettingsError(f"--classes takes NEG,POS, got {classes!r}")
        by_text = {str(c): c for c in labels}
        missing = [c for c in parts if c not in by_text]
        if missing:
            raise SettingsError(f"--classes: the model has no classes {missing!r} (it has {labels!r})")
        return by_text[parts[0]], by_text[parts[1]]
    if len(labels) != 2:
        return None
    pos = rule.positive_index(labels)
    return labels[1 - pos], labels[pos]


def token_rows(model: Any, pair: tuple[Any, Any] | None, buckets: np.ndarray) -> dict[str, Any]:
    """Counts per class (document frequencies for BernoulliNB) and weights of ``buckets``
    in a count model's token block: ``{"classes": [...], "counts": (n_classes, n) array,
    "weights": (n,) array or None}``."""
    block = model.tokens_ if model.kind == "hybrid" else model
    labels = [c.item() if hasattr(c, "item") else c for c in block.classes_]
    counts = block.stats["features"].column_counts(buckets)
    weights = None if pair is None else block.log_odds_weights(buckets, classes=pair)
    return {"classes": labels, "counts": counts, "weights": weights}


def _top_buckets(model: Any, pair: tuple[Any, Any] | None, n: int, min_count: int) -> np.ndarray:
    block = model.tokens_ if model.kind == "hybrid" else model
    fc = block.stats["features"]
    seen = np.flatnonzero(fc.values.sum(axis=0) >= max(min_count, 1))
    if pair is None or seen.size == 0:
        order = np.argsort(-fc.values[:, seen].sum(axis=0), kind="stable")
    else:
        order = np.argsort(-np.abs(block.log_odds_weights(seen, classes=pair)), kind="stable")
    return seen[order[:n]]


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print the rows of the tokens asked for and of the ``--top`` buckets."""
    # deferred: the replica (to load the served model) loads only for tokens
    from streamnb_workers.cli.served_model import open_served_model, published_names

    client, model, featurizer, rule, _ = open_served_model(args, env)
    if model.kind not in TOKEN_KINDS or featurizer.input != "sparse":
        raise SettingsError(f"a {model.kind} model of {featurizer.input} input has no token "
                            f"counts: tokens is for {', '.join(TOKEN_KINDS)} models of hashed input")
    pair = _model_pair(model, rule, args.classes)
    hasher = featurizer.hasher
    asked = [(tok, hasher.bucket(tok)) for tok in args.tokens]
    top = args.top if args.top is not None else (0 if asked else 20)
    listed = asked + [(None, int(b)) for b in _top_buckets(model, pair, top, args.min_count)]
    buckets = np.array([b for _, b in listed], dtype=np.int64)
    rows = token_rows(model, pair, buckets)
    names = published_names(client, args.model, sorted({int(b) for b in buckets}))
    header = ["token", *map(str, rows["classes"]), "weight" if pair is None else
              f"weight({pair[1]}:{pair[0]})", "bucket", "names in bucket"]
    if not args.json:
        print("\t".join(header))
    for i, (tok, b) in enumerate(listed):
        seen = [n for n, _ in names.get(b, [])]
        name = tok if tok is not None else (seen[0] if seen else f"#{b}")
        counts = rows["counts"][:, i].tolist()
        weight = None if rows["weights"] is None else float(rows["weights"][i])
        if args.json:
            print(json.dumps({"token": name, "bucket": b, "counts": dict(zip(map(str, rows["classes"]),
                              counts, strict=True)), "weight": weight, "names": seen},
                             sort_keys=True))
        else:
            print("\t".join([name, *(f"{c:g}" for c in counts),
                             "-" if weight is None else f"{weight:+.4f}", str(b), " ".join(seen)]))
    return 0

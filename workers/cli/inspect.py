"""``streamnb explain`` and ``streamnb tokens``: look inside a model, as ``bogofilter -vv``
and ``bogoutil -w`` do. Both read the model from Redis (snapshot + log, as ``export``) or
``explain`` from an exported file (``--snapshot``), and the token names the workers
publish (``{M}:tokens``, workers/observe/token_names.py). See docs/cli.md.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers(dest="command")
>>> add_parsers(sub, lambda p: None, lambda p: p.add_argument("--model"))
>>> sub.choices["tokens"].parse_args(["--top", "5", "cheap"]).tokens
['cheap']
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from streamnb.exceptions import MalformedMessage, SettingsError
from streamnb_workers.cli.arg_types import non_negative_int, positive_int
from streamnb_workers.cli.settings import add_option

__all__ = ["COMMANDS", "add_parsers", "cmd_explain", "cmd_tokens", "token_rows"]

#: The most bytes ``explain -`` reads from stdin (a message beyond it is refused).
MAX_STDIN_BYTES = 16 * 1024 * 1024
#: The model kinds whose token columns ``tokens`` reads.
TOKEN_KINDS = ("multinomial", "bernoulli", "hybrid")


def add_parsers(sub: Any, add_common: Callable[[Any], None],
                add_model_name: Callable[[Any], None]) -> None:
    """Add the ``explain`` and ``tokens`` subcommands to ``sub``."""
    p = sub.add_parser("explain", help="show the tokens that moved a message's prediction",
                       description="Predict FILE (or '-', the message on stdin) with the model "
                                   "as it is in Redis (or --snapshot) and print the features "
                                   "that moved its log-odds most, with their weights.")
    add_common(p)
    add_model_name(p)
    add_option(p, "--snapshot", metavar="MODEL_FILE",
               help="explain with a file written by 'streamnb export' instead of Redis")
    add_option(p, "--top", type=positive_int, default=10, metavar="K", help="features to show")
    add_option(p, "--json", action="store_true", default=False, help="print JSON")
    p.add_argument("file", metavar="FILE", help="an .eml file, a .json record, or - for stdin")

    p = sub.add_parser("tokens", help="per-token counts per class and weights (bogoutil -w)",
                       description="For each TOKEN (hashed as the workers hash it), or the "
                                   "--top N buckets by weight: its counts per class and its "
                                   "weight in the log-odds, with the names seen in its bucket.")
    add_common(p)
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


# ---------------------------------------------------------------------- shared
def _online(args: argparse.Namespace, env: Mapping[str, str]) -> tuple[Any, Any, Any, Any, str]:
    """(client, model, featurizer, decision rule, version) of the model in Redis."""
    from streamnb_workers.cli.commands import _redis, _require_model
    from streamnb_workers.replication.shards import load_model
    from streamnb_workers.store.model_config import read_config

    name = _require_model(args)
    if args.log_level == "INFO":  # the default: the output is the answer, not how it was loaded
        logging.getLogger().setLevel(logging.WARNING)
    client = _redis(args, env).make_client()
    cfg = read_config(client, name)
    if cfg is None:
        raise SettingsError(f"model {name!r} has no config in Redis (no worker has served it)")
    model, version = load_model(client, name)  # a sharded model: the sum of its shards
    return client, model, cfg.make_featurizer(), cfg.make_decision_rule(), version


def _published(client: Any, name: str | None, buckets: list[int]) -> dict[int, list[tuple[str, int]]]:
    """The token names the workers published for ``buckets`` (of every shard of a sharded
    model, their counts added)."""
    from streamnb_workers.client.shard_streams import shard_keys
    from streamnb_workers.observe.token_names import read_names

    if client is None or not name:
        return {}
    shards = shard_keys(client, name)
    if len(shards) == 1:
        return read_names(client, shards[0].tokens, buckets)
    return merge_names([read_names(client, keys.tokens, buckets) for keys in shards])


Names = dict[int, list[tuple[str, int]]]


def merge_names(published: list[Names]) -> Names:
    """The token names of several shards per bucket, the counts of a name added, the most
    counted first.

    >>> merge_names([{3: [("cheap", 4), ("free", 1)]}, {3: [("free", 5)], 7: [("x", 1)]}])
    {3: [('free', 6), ('cheap', 4)], 7: [('x', 1)]}
    """
    counts: dict[int, dict[str, int]] = {}
    for names in published:
        for bucket, pairs in names.items():
            for token, n in pairs:
                counts.setdefault(bucket, {})[token] = counts.get(bucket, {}).get(token, 0) + n
    return {bucket: sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))
            for bucket, by_name in sorted(counts.items())}


def _read_stdin(stream: Any) -> Any:
    from streamnb_workers.wire.codec import decode_input, encode_input

    data = stream.read(MAX_STDIN_BYTES + 1)
    if len(data) > MAX_STDIN_BYTES:
        raise SettingsError(f"the message on stdin is larger than {MAX_STDIN_BYTES} bytes")
    try:
        return decode_input(encode_input("raw", data, id="-"), "-")
    except MalformedMessage as exc:
        raise SettingsError(f"stdin: {exc.detail}") from None


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


# ---------------------------------------------------------------------- explain
def cmd_explain(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb.decision import DecisionRule
    from streamnb_workers.client.transfer import _featurizer_for, _read_message, read_envelope
    from streamnb_workers.observe.token_names import message_tokens
    from streamnb_workers.wire.explanations import (
        EXPLAINED_KINDS,
        explain_matrix,
        format_explanation,
    )

    client = None
    if args.snapshot:
        model, envelope = read_envelope(args.snapshot)
        featurizer = _featurizer_for(model, envelope, args.snapshot)
        rule, version = DecisionRule.from_dict(envelope.get("decision")), envelope.get("log_id")
    else:
        client, model, featurizer, rule, version = _online(args, env)
    if model.kind not in EXPLAINED_KINDS:
        raise SettingsError(f"a {model.kind} model does not split its log-odds per feature: "
                            f"explain is for the {', '.join(EXPLAINED_KINDS)} models")
    msg = _read_stdin(sys.stdin.buffer) if args.file == "-" else _read_message(args.file)
    try:
        X = featurizer.stack([featurizer.featurize(msg.as_payload())])
    except MalformedMessage as exc:
        raise SettingsError(f"{args.file}: {exc.detail}") from None
    classes = [c.item() if hasattr(c, "item") else c for c in model.classes_]
    decision = rule.decide(model.predict_log_proba(X), classes,
                           learnt_log_prior=getattr(model, "class_log_prior_", None))
    tokens = message_tokens(featurizer, msg)
    explained = explain_matrix(model, rule, featurizer, X, args.top, [tokens])[0]
    if explained is not None and client is not None:  # names of hashes-only messages
        unnamed = [int(n[1:]) for n, _ in explained["tokens"] if n.startswith("#")]
        if unnamed:
            explained = explain_matrix(model, rule, featurizer, X, args.top, [tokens],
                                       _published(client, args.model, unnamed))[0]
    result = {"id": msg.id, "label": decision.labels[0], "model_version": version,
              "log_proba": {str(c): float(v) for c, v in zip(classes, decision.log_proba[0],
                                                              strict=True)},
              "explain": explained}
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
        return 0
    from streamnb_workers.client.transfer import format_prediction

    print(format_prediction(result))
    print(format_explanation(explained) if explained is not None else
          "(no explanation: the model holds fewer than two classes with weight)")
    return 0


# ---------------------------------------------------------------------- tokens
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


def cmd_tokens(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    client, model, featurizer, rule, _ = _online(args, env)
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
    names = _published(client, args.model, sorted({int(b) for b in buckets}))
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


COMMANDS: Mapping[str, Callable[[argparse.Namespace, Mapping[str, str]], int]] = {
    "explain": cmd_explain, "tokens": cmd_tokens,
}

"""``streamnb worker``: run worker process(es) that consume a model's ``:in``, predict
every message and learn the labelled ones; its options are the model's (fixed when it is
created), its featurizer's, its decision rule's and the workers' own. The processes are
run by :mod:`streamnb_workers.cli.supervisor`.

>>> import argparse
>>> sub = argparse.ArgumentParser().add_subparsers(dest="command")
>>> args = add_parser(sub).parse_args(["--model", "mail", "--kind", "lda", "--shards", "2"])
>>> args.model, args.kind, args.shards
(['mail'], 'lda', 2)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from typing import Any

from streamnb.decision_parsing import (
    parse_class_prior,
    parse_half_life,
    parse_loss_matrix,
    parse_rate,
    parse_unsure_band,
)
from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb.features.text import MAX_OSB_WINDOW
from streamnb.models.io import MODEL_KINDS
from streamnb_workers.cli import supervisor
from streamnb_workers.cli.arg_types import (
    challenger_spec,
    class_list,
    finite_float,
    float_list,
    max_bytes,
    memory_size,
    non_negative_float,
    non_negative_int,
    number_in,
    port,
    positive_int,
    shrinkage,
    whole_number_in,
)
from streamnb_workers.cli.options import (
    add_common_options,
    add_model_name,
    model_specs,
    redis_from_args,
)
from streamnb_workers.cli.settings import add_option
from streamnb_workers.defaults import (
    DEFAULT_AUTOLEARN_MIN_CLASS_WEIGHT,
    DEFAULT_AUTOLEARN_PER_BATCH,
    DEFAULT_AUTOLEARN_SCORE,
    DEFAULT_BATCH_SIZE,
    DEFAULT_BLOCK_MS,
    DEFAULT_CLAIM_IDLE_MS,
    DEFAULT_HEALTHZ_GRACE_S,
    DEFAULT_LABEL_CACHE_TTL_S,
    DEFAULT_LEARNT_KEYS_MAX,
    DEFAULT_LOG_KEEP_S,
    DEFAULT_MAX_SOURCES,
    DEFAULT_METRICS_ADDR,
    DEFAULT_METRICS_PORT,
    DEFAULT_ORDER_WAIT_MS,
    DEFAULT_REPLICA_MEMORY,
    DEFAULT_TOKEN_NAMES,
    DEFAULT_TOKEN_NAMES_EVERY,
)
from streamnb_workers.store.keys import MAX_SHARDS
from streamnb_workers.store.training import TRAINING_MODES
from streamnb_workers.wire.codec import DEFAULT_MAX_VALUE, DEFAULT_MAX_WEIGHT

__all__ = ["NAME", "add_parser", "run"]

NAME = "worker"

shard_count = whole_number_in(1, MAX_SHARDS, "shards")


def _parsed(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a decision-option parser so its ValueError becomes an argparse error."""
    def wrapped(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    wrapped.__name__ = fn.__name__
    return wrapped


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb worker`` on the subparsers ``sub``."""
    p = sub.add_parser("worker", help="run worker process(es) that predict and learn",
                       description="Consume streamnb:{NAME}:in, predict every message, learn the labelled ones.")
    add_common_options(p)
    add_model_name(p, many=True)
    add_option(p, "--kind", choices=MODEL_KINDS,
               help="model kind, needed when the model is created (then stored in :config)")
    g = p.add_argument_group("model options (fixed when the model is created)")
    add_option(g, "--alpha", type=finite_float, help="additive (Laplace/Lidstone) smoothing")
    add_option(g, "--binarize", type=finite_float, help="Bernoulli: threshold for a feature to count as present")
    add_option(g, "--var-smoothing", type=finite_float, help="Gaussian NB: variance floor as a share of the largest variance")
    add_option(g, "--shrinkage", type=shrinkage, help="LDA: covariance shrinkage toward the scaled identity, in [0, 1]")
    add_option(g, "--reg-param", type=finite_float, help="QDA: covariance regularisation in [0, 1]")
    add_option(g, "--priors", type=float_list, help="Gaussian/LDA/QDA: fixed class priors, comma separated")
    add_option(g, "--max-categories", type=positive_int,
               help="categorical: categories per feature are 0 .. N-1; a larger value is a "
               "dead letter (bad_category)")
    add_option(g, "--classes", type=class_list, metavar="C1,C2,...",
               help="the model's classes, fixed when it is created: a label outside them is a "
               "dead letter (bad_label); 'any': any label becomes a class; default: spam,ham "
               "for a count model of hashed mail, else any")
    add_option(g, "--half-life", type=finite_float, help="forgetting: weights halve every N learnt messages")
    add_option(g, "--shards", type=shard_count, metavar="K",
               help="split the model into K statistics shards, each a hash tag (a cluster "
               "slot) of its own, summed by every worker (default 1; docs/architecture.md)")
    add_option(g, "--training", choices=TRAINING_MODES,
               help="where the model learns labels and forgets from: 'train', only its "
               "training stream :train, which the trainer's Redis user writes (separate "
               "rights to score and to train); 'in' (default), its :in as sent")
    add_option(g, "--error-weight", type=finite_float,
               help="learn a labelled message whose verdict was wrong with this many times its "
               "weight (default 2; 1: every message alike)")
    f = p.add_argument_group("featurizer options (fixed when the model is created)")
    add_option(f, "--bits", type=positive_int, help="hash buckets = 2**bits for raw/text/tokens input")
    add_option(f, "--dimension", type=positive_int,
               help="dense input: length of the x vectors (needed by gaussian, lda, qda)")
    add_option(f, "--ngrams", action="store_true", help="also hash word bigrams")
    add_option(f, "--osb", type=int, choices=(0, *range(2, MAX_OSB_WINDOW + 1)), metavar="N",
               help="also hash orthogonal sparse bigrams: each word paired with each of the "
               "N-1 words before it, the distance in the token (CRM114 and rspamd: 5; "
               "default 0: off; docs/features.md)")
    add_option(f, "--lowercase", action=argparse.BooleanOptionalAction, help="lower-case words")
    add_option(f, "--min-len", type=positive_int, help="shortest word kept")
    add_option(f, "--max-len", type=positive_int, help="longest word kept as is")
    add_option(f, "--meta", action="store_true", help="append mail meta features (sizes, shares)")
    add_option(f, "--counts", choices=("raw", "binary", "log"), help="how token counts become values")
    d = p.add_argument_group("decision options (stored with the model)")
    add_option(d, "--threshold", type=finite_float,
               help="two classes: predict the positive class when its log-odds exceed this")
    add_option(d, "--unsure-band", type=_parsed(parse_unsure_band), metavar="LO,HI",
               help="two classes: label 'unsure' when P(positive) is in [LO, HI]")
    add_option(d, "--loss-matrix", type=_parsed(parse_loss_matrix), metavar="T:P=L,...",
               help="minimum expected loss; T:P=L is the loss of predicting P when the truth is T")
    add_option(d, "--class-prior", type=_parsed(parse_class_prior), metavar="C=P,...",
               help="override the learnt class priors at decision time")
    add_option(d, "--positive", metavar="LABEL", help="the positive class of a two-class model")
    add_option(d, "--min-class-weight", type=finite_float, metavar="W",
               help="label 'unsure' while a class has learnt less weight than W (hashed mail "
               "default 3; 0: off)")
    add_option(d, "--score", choices=("per_feature", "log_odds"),
               help="the two-class score published in :out (hashed mail default per_feature)")
    add_option(d, "--target-fpr", type=_parsed(parse_rate), metavar="RATE",
               help="two classes: keep the score threshold where the negatives' false-positive "
               "rate over the recent labelled messages is at most RATE (95%% Clopper-Pearson "
               "bound; docs/worker.md, \"Operating point\")")
    add_option(d, "--calibration", choices=("isotonic", "platt"),
               help="two classes: publish a calibrated P(positive) in :out, fitted on the "
               "recent labelled messages' scores")
    add_option(d, "--score-window", type=whole_number_in(100, 1_000_000, "messages"),
               metavar="N", help="labelled messages --target-fpr and --calibration are fitted "
               "on, the latest (default 20000)")
    add_option(d, "--prior-half-life", type=_parsed(parse_half_life), metavar="N",
               help="two classes, with --calibration: move the calibrated P(positive) to "
               "the class mix of the labelled messages, each weighing half as much N "
               "messages later, and label by it without --target-fpr (default off; "
               "docs/worker.md, \"Operating point\")")
    w = p.add_argument_group("worker options")
    add_option(w, "--batch", type=positive_int, default=DEFAULT_BATCH_SIZE, help="entries read per XREADGROUP")
    add_option(w, "--block-ms", type=non_negative_int, default=DEFAULT_BLOCK_MS, help="XREADGROUP BLOCK time")
    add_option(w, "--claim-idle-ms", type=positive_int, default=DEFAULT_CLAIM_IDLE_MS,
               help="claim entries pending longer than this from dead consumers")
    add_option(w, "--label-cache-ttl", type=non_negative_float, default=DEFAULT_LABEL_CACHE_TTL_S,
               metavar="SECONDS", help="keep each message's features this long for a delayed "
               "label (ref); 0: no cache, late labels are dead-lettered")
    add_option(w, "--cache-labelled", action=argparse.BooleanOptionalAction, default=True,
               help="cache messages learnt on arrival too, so a later label can correct them "
               "(--no-cache-labelled: only unlabelled messages, far less Redis memory)")
    add_option(w, "--learnt-keys-max", type=non_negative_int, default=DEFAULT_LEARNT_KEYS_MAX,
               metavar="N", help="learn-once keys kept per model, the oldest dropped beyond N (about 270 "
               "bytes each in Redis); 0: no keys, a message sent twice is learnt twice")
    add_option(w, "--log-keep", type=non_negative_float, default=DEFAULT_LOG_KEEP_S,
               metavar="SECONDS", help="keep this much of the log behind each snapshot: "
               "forget --source NAME --since TIME reaches back as far (each kept delta "
               "costs Redis memory)")
    add_option(w, "--max-sources", type=positive_int, default=DEFAULT_MAX_SOURCES,
               metavar="N", help="sources a model keeps apart at most (each costs one copy of "
               "the statistics in every worker and snapshot); a label from one more is a dead "
               "letter too_many_sources")
    add_option(w, "--autolearn", action="store_true", default=False,
               help="learn unlabelled messages whose verdict is confident, under the source "
               "autolearn (a user's label for the same key replaces it)")
    add_option(w, "--autolearn-score", type=non_negative_float, default=DEFAULT_AUTOLEARN_SCORE,
               metavar="S", help="autolearn a verdict whose score is at least S from 0")
    add_option(w, "--autolearn-min-class-weight", type=non_negative_float,
               default=DEFAULT_AUTOLEARN_MIN_CLASS_WEIGHT, metavar="W",
               help="autolearn only once the model holds at least W of each of its two classes")
    add_option(w, "--autolearn-per-batch", type=positive_int, default=DEFAULT_AUTOLEARN_PER_BATCH,
               metavar="N", help="autolearn at most N messages a batch")
    add_option(w, "--prequential", action=argparse.BooleanOptionalAction, default=True,
               help="predict each message with the labelled messages before it in its batch "
               "(multinomial, categorical and the Gaussian models)")
    add_option(w, "--order-wait-ms", type=non_negative_int, default=DEFAULT_ORDER_WAIT_MS,
               help="before predicting, wait at most this long for other workers' earlier "
               "labelled batches to commit (predictions as with one worker; 0: off)")
    add_option(w, "--pipeline", action=argparse.BooleanOptionalAction, default=True,
               help="while a full batch commits, read, decode and featurize the next one "
               "(same predictions; --no-pipeline: one batch after the other)")
    add_option(w, "--max-bytes", type=max_bytes, default=DEFAULT_MAX_MESSAGE_BYTES,
               help="raw mail read per message: a larger mail is cut at a MIME boundary "
               "(headers kept), then predicted and learnt")
    add_option(w, "--max-weight", type=number_in(0.0, math.inf, "a weight", open_low=True, open_high=True),
               default=DEFAULT_MAX_WEIGHT, metavar="W",
               help="the largest weight a message may carry; a larger one is a dead letter "
               "(bad_weight)")
    add_option(w, "--max-value", type=number_in(0.0, math.inf, "a magnitude", open_low=True, open_high=True),
               default=DEFAULT_MAX_VALUE, metavar="V",
               help="the largest magnitude of a features value or x coordinate; a larger one "
               "is a dead letter (too_large)")
    add_option(w, "--input-trim-s", type=non_negative_float, default=10.0, metavar="SECONDS",
               help="every SECONDS the lease holder trims :in of the entries every consumer "
               "group has acknowledged (0: never)")
    add_option(w, "--out-maxlen", type=non_negative_int, default=1_000_000,
               help=":out keeps about this many predictions (MAXLEN ~; 0: no cap)")
    add_option(w, "--dead-maxlen", type=non_negative_int, default=100_000,
               help=":dead keeps about this many dead letters (MAXLEN ~; 0: no cap)")
    add_option(w, "--explain", type=non_negative_int, metavar="K",
               help="put the K tokens that moved each prediction most, with their weights, "
               "into its output (0: none; costs a second tokenization per message); stored "
               "with the model when it is created, a worker given another K refuses it")
    add_option(w, "--token-names", type=non_negative_int, default=DEFAULT_TOKEN_NAMES, metavar="N",
               help="keep the N most frequent token names and publish them per hash bucket "
               "for 'streamnb tokens' (0: none)")
    add_option(w, "--token-names-every", type=positive_int, default=DEFAULT_TOKEN_NAMES_EVERY,
               metavar="S", help="count the token names of one message in S")
    add_option(w, "--replica-memory", type=memory_size, default=DEFAULT_REPLICA_MEMORY,
               metavar="SIZE", help="the worker process's resident memory (RSS), e.g. "
               "512MiB (the default); the model replicas held take what the rest leaves, the "
               "least recently used dropped and loaded again from their snapshot and log for "
               "their next batch (0: no bound)")
    add_option(w, "--model-metrics", action=argparse.BooleanOptionalAction, default=True,
               help="metrics by model (--no-model-metrics: pooled under model=\"*\", for a "
               "worker serving thousands of per-user models)")
    add_option(w, "--per-user", type=non_negative_float, default=0.0, metavar="SECONDS",
               help="also serve the per-user and per-domain models registered for each "
               "--model, looking for new ones every SECONDS (0: none; docs/worker.md)")
    add_option(w, "--user-min-weight", type=non_negative_float, default=10.0, metavar="W",
               help="a per-user model's statistics count in its verdicts once they weigh W "
               "(give every worker of a model the same)")
    add_option(w, "--challenger", metavar="SPEC", type=challenger_spec,
               help="learn a challenger from the same entries: key=value pairs overriding "
               "the model's config (alpha=0.5, osb=5, error_weight=1); stored with the model, "
               "its verdict goes to :out beside the model's (docs/worker.md)")
    add_option(w, "--processes", type=positive_int, default=1,
               help="run N worker processes under a supervisor that restarts one that dies")
    add_option(w, "--metrics-port", type=port, default=DEFAULT_METRICS_PORT,
               help="Prometheus port (process i of --processes serves port+i; 0: no metrics)")
    add_option(w, "--metrics-addr", default=DEFAULT_METRICS_ADDR, help="address the metrics server binds")
    add_option(w, "--healthz-grace", type=number_in(0.0, math.inf, "seconds", open_low=True),
               default=DEFAULT_HEALTHZ_GRACE_S, metavar="SECONDS",
               help="/healthz on the metrics port fails (503) after this long without a "
               "successful step against Redis")
    add_option(w, "--consumer", metavar="NAME", help="consumer name (default: host-pid)")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Run the workers of every ``--model`` until stopped; the exit code."""
    specs = model_specs(args)
    return supervisor.run_worker_command(args, specs, redis_from_args(args, env), env)

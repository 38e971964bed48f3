"""The ``streamnb`` command's parser: every subcommand and option (each option also from
the environment or a TOML file: :func:`streamnb_workers.cli.settings.add_option`), the
argument types, and errors in one line.

>>> parser = build_parser()
>>> args = parser.parse_args(["status", "--model", "mail", "--json"])
>>> args.command, args.model, args.json
('status', 'mail', True)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from streamnb._version import __version__
from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb.models.io import MODEL_KINDS
from streamnb_workers.cli import inspect as inspect_commands
from streamnb_workers.cli import pipe, tail
from streamnb_workers.cli.arg_types import (
    class_list,
    finite_float,
    float_list,
    max_bytes,
    non_negative_float,
    non_negative_int,
    number_in,
    port,
    positive_int,
    shrinkage,
    whole_number_in,
)
from streamnb_workers.cli.settings import add_option
from streamnb_workers.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BLOCK_MS,
    DEFAULT_CLAIM_IDLE_MS,
    DEFAULT_DEMO_MESSAGES,
    DEFAULT_HEALTHZ_GRACE_S,
    DEFAULT_LABEL_CACHE_TTL_S,
    DEFAULT_LEARNT_KEYS_MAX,
    DEFAULT_METRICS_ADDR,
    DEFAULT_METRICS_PORT,
    DEFAULT_ORDER_WAIT_MS,
    DEFAULT_PREDICT_TIMEOUT_S,
    DEFAULT_PRODUCE_CHUNK,
    DEFAULT_STATUS_LAST,
    DEFAULT_TOKEN_NAMES,
    DEFAULT_TOKEN_NAMES_EVERY,
)
from streamnb_workers.exit_codes import EXIT_USAGE
from streamnb_workers.milter import command as milter
from streamnb_workers.store.keys import MAX_SHARDS

__all__ = ["DECISION_OPTIONS", "FEATURIZER_OPTIONS", "MODEL_OPTIONS", "OneLineParser",
           "build_parser", "subparsers"]

PROG = "streamnb"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit 2), no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _parsed(fn: Callable[[str], Any]) -> Callable[[str], Any]:
    """Wrap a decision-option parser so its ValueError becomes an argparse error."""
    def wrapped(text: str) -> Any:
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    wrapped.__name__ = fn.__name__
    return wrapped


# ---------------------------------------------------------------------- options
def _add_common(p: argparse.ArgumentParser, redis_required: bool = True) -> None:
    add_option(p, "--redis", metavar="URL",
               help="Redis URL: redis://[user:password@]host:port/db or rediss://... for TLS"
                    + ("" if redis_required else "; none: the embedded default"))
    add_option(p, "--redis-password-file", metavar="FILE",
               help="read the Redis password from FILE (else the URL's, else STREAMNB_REDIS_PASSWORD)")
    add_option(p, "--tls-ca-file", metavar="FILE", help="CA certificate to verify a rediss:// server")
    add_option(p, "--tls-cert-file", metavar="FILE",
               help="client certificate, for servers with tls-auth-clients yes (with --tls-key-file)")
    add_option(p, "--tls-key-file", metavar="FILE", help="private key of --tls-cert-file")
    add_option(p, "--cluster", action="store_true", default=False,
               help="talk to a Redis Cluster (every model's keys share one hash slot)")
    p.add_argument("--config", metavar="FILE", default=None,
                   help="TOML file with defaults for any option (env STREAMNB_CONFIG)")
    add_option(p, "--log-level", choices=LOG_LEVELS, type=str.upper, default="INFO",
               help="log verbosity")


def _add_model_name(p: argparse.ArgumentParser, many: bool = False) -> None:
    if many:
        add_option(p, "--model", metavar="NAME", action="append", default=[],
                   help="model name (repeat for several models; keys streamnb:{NAME}:*)")
    else:
        add_option(p, "--model", metavar="NAME", help="model name (keys streamnb:{NAME}:*)")


#: Model options: flag dest -> (model parameter name, kinds that take it).
MODEL_OPTIONS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "alpha": ("alpha", ("multinomial", "bernoulli", "categorical")),
    "binarize": ("binarize", ("bernoulli",)),
    "var_smoothing": ("var_smoothing", ("gaussian",)),
    "shrinkage": ("shrinkage", ("lda",)),
    "reg_param": ("reg_param", ("qda",)),
    "priors": ("priors", ("gaussian", "lda", "qda")),
    "max_categories": ("max_categories", ("categorical",)),
}
#: Featurizer options: flag dest -> featurizer config key.
FEATURIZER_OPTIONS: Mapping[str, str] = {
    "bits": "bits", "ngrams": "ngrams", "lowercase": "lowercase", "min_len": "min_len",
    "max_len": "max_len", "meta": "meta", "counts": "counts",
}
#: Decision options: flag dest -> DecisionRule option.
DECISION_OPTIONS: Mapping[str, str] = {
    "threshold": "threshold", "unsure_band": "unsure_band", "loss_matrix": "loss_matrix",
    "class_prior": "class_prior", "positive": "positive",
    "min_class_weight": "min_class_weight", "score": "score",
}


shard_count = whole_number_in(1, MAX_SHARDS, "shards")


def _add_worker_options(p: argparse.ArgumentParser) -> None:
    from streamnb.decision import parse_class_prior, parse_loss_matrix, parse_unsure_band

    _add_model_name(p, many=True)
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
               "dead letter (bad_label); default: any label becomes a class")
    add_option(g, "--half-life", type=finite_float, help="forgetting: weights halve every N learnt messages")
    add_option(g, "--shards", type=shard_count, metavar="K",
               help="split the model into K statistics shards, each a hash tag (a cluster "
               "slot) of its own, summed by every worker (default 1; docs/architecture.md)")
    add_option(g, "--error-weight", type=finite_float,
               help="learn a labelled message whose verdict was wrong with this many times its "
               "weight (default 2; 1: every message alike)")
    f = p.add_argument_group("featurizer options (fixed when the model is created)")
    add_option(f, "--bits", type=positive_int, help="hash buckets = 2**bits for raw/text/tokens input")
    add_option(f, "--dimension", type=positive_int,
               help="dense input: length of the x vectors (needed by gaussian, lda, qda)")
    add_option(f, "--ngrams", action="store_true", help="also hash word bigrams")
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
    add_option(w, "--input-trim-s", type=non_negative_float, default=10.0, metavar="SECONDS",
               help="every SECONDS the lease holder trims :in of the entries every consumer "
               "group has acknowledged (0: never)")
    add_option(w, "--out-maxlen", type=non_negative_int, default=1_000_000,
               help=":out keeps about this many predictions (MAXLEN ~; 0: no cap)")
    add_option(w, "--dead-maxlen", type=non_negative_int, default=100_000,
               help=":dead keeps about this many dead letters (MAXLEN ~; 0: no cap)")
    add_option(w, "--explain", type=non_negative_int, default=0, metavar="K",
               help="put the K tokens that moved each prediction most, with their weights, "
               "into its output (0: none; costs a second tokenization per message)")
    add_option(w, "--token-names", type=non_negative_int, default=DEFAULT_TOKEN_NAMES, metavar="N",
               help="keep the N most frequent token names and publish them per hash bucket "
               "for 'streamnb tokens' (0: none)")
    add_option(w, "--token-names-every", type=positive_int, default=DEFAULT_TOKEN_NAMES_EVERY,
               metavar="S", help="count the token names of one message in S")
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


def build_parser() -> OneLineParser:
    """The full ``streamnb`` parser (subcommands worker, produce, predict, status, export,
    import, demo)."""
    parser = OneLineParser(prog=PROG, description="Online generative classification on Redis streams.")
    parser.add_argument("--version", action="version", version=f"streamnb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("worker", help="run worker process(es) that predict and learn",
                       description="Consume streamnb:{NAME}:in, predict every message, learn the labelled ones.")
    _add_common(p)
    _add_worker_options(p)

    p = sub.add_parser("produce", help="send mail files, maildirs, mbox files or JSON lines",
                       description="Send messages to streamnb:{NAME}:in; prints the count sent.")
    _add_common(p)
    _add_model_name(p)
    label = p.add_mutually_exclusive_group()
    add_option(label, "--label", help="label every message sent with L")
    add_option(label, "--index", metavar="TSV",
               help="labels (and times) from an index.tsv: path, label, unix_time")
    add_option(p, "--chunk", type=positive_int, default=DEFAULT_PRODUCE_CHUNK, help="XADDs per round trip")
    add_option(p, "--max-bytes", type=max_bytes, default=DEFAULT_MAX_MESSAGE_BYTES,
               help="a mail over this size is cut (headers kept, at a MIME boundary) before "
               "it is sent, as a worker would cut it")
    add_option(p, "--allow-new", action="store_true",
               help="send to a model no worker has served yet (else that is an error naming "
               "the models that exist)")
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help=".eml file, maildir, mbox, directory or .jsonl file")

    p = sub.add_parser("forget", help="unlearn mail files, maildirs, mbox files or JSON lines",
                       description="Unlearn each message the model learnt (by the key produce "
                                   "gives it); prints what was sent and what was not learnt.")
    _add_common(p)
    _add_model_name(p)
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help=".eml file, maildir, mbox, directory, .jsonl file, or - (stdin)")

    p = sub.add_parser("predict", help="predict a message, stdin (-) or many (online or offline)",
                       description="Send FILE unlabelled and print its prediction (FILE -: a mail "
                                   "on stdin, exit code by verdict; a directory or mbox: one line "
                                   "per message), or predict offline with --snapshot.")
    _add_common(p, redis_required=False)
    _add_model_name(p)
    add_option(p, "--snapshot", metavar="MODEL_FILE",
               help="predict offline from a file written by 'streamnb export'")
    add_option(p, "--max-bytes", type=max_bytes, default=DEFAULT_MAX_MESSAGE_BYTES,
               help="a mail over this size is cut (headers kept, at a MIME boundary) before "
               "it is sent")
    add_option(p, "--timeout", type=finite_float, default=DEFAULT_PREDICT_TIMEOUT_S,
               help="seconds to wait for the prediction")
    add_option(p, "--json", action="store_true", default=False, help="print the prediction as JSON")
    pipe.add_options(p)
    p.add_argument("file", metavar="FILE",
                   help="an .eml file (or a .json record); - for a mail on stdin; a directory, "
                        "maildir or mbox to judge every message in it")

    p = sub.add_parser("status", help="show a model's counts, version, lag and workers",
                       description="Kind, classes, learnt counts, version, stream length, lag, "
                                   "pending, dead letters and live workers of a model.")
    _add_common(p)
    _add_model_name(p)
    add_option(p, "--json", action="store_true", default=False,
               help="print JSON (keys documented in docs/cli.md)")
    add_option(p, "--last", type=non_negative_int, default=DEFAULT_STATUS_LAST, metavar="N",
               help="accuracy and throughput over the last N outputs of :out")

    p = sub.add_parser("export", help="write a model's statistics to a file",
                       description="Write the model (config + statistics) to FILE; "
                                   "streamnb.models.load(FILE) reads it back.")
    _add_common(p)
    _add_model_name(p)
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="file to write")

    p = sub.add_parser("import", help="load the statistics of an exported file into a model",
                       description="Load the statistics in FILE into model NAME (creating its "
                                   "config from the file if it has none); a model that holds "
                                   "statistics already needs --add or --replace.")
    _add_common(p)
    _add_model_name(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--add", dest="import_mode", action="store_const", const="add",
                      help="add the file's statistics to those the model holds")
    mode.add_argument("--replace", dest="import_mode", action="store_const", const="replace",
                      help="swap the model's statistics for the file's (and drop its learnt keys)")
    p.add_argument("file", metavar="FILE", help="a file written by 'streamnb export'")

    p = sub.add_parser("demo", help="replay real mail through two workers and show the result",
                       description="Replay a sample of the SpamAssassin public corpus through two "
                                   "workers on an embedded Redis (or --redis) and report accuracy.")
    _add_common(p, redis_required=False)
    add_option(p, "--messages", type=positive_int, default=DEFAULT_DEMO_MESSAGES,
               help="messages to replay (at most the sample's size)")
    add_option(p, "--model", metavar="NAME", default="demo", help="model name used by the demo")
    add_option(p, "--metrics-port", type=port, default=0,
               help="first metrics port of the two demo workers (0: pick free ports)")
    add_option(p, "--embedded", choices=("auto", "redis-server", "fakeredis"), default="auto",
               help="without --redis: a private redis-server if one is on PATH (auto), or force one")
    add_option(p, "--metrics-addr", default=DEFAULT_METRICS_ADDR, help="address the metrics server binds")

    tail.add_parser(sub, _add_common, _add_model_name)

    p = sub.add_parser("milter", help="score mail at SMTP time for Postfix/Sendmail (milter)",
                       description="Serve the milter protocol: each mail goes through the model's "
                                   "workers and gets verdict headers and the policy's action.")
    _add_common(p)
    _add_model_name(p)
    milter.add_options(p)

    inspect_commands.add_parsers(sub, _add_common, _add_model_name)
    return parser


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Subcommand name -> its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}

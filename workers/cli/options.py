"""What the ``streamnb`` commands share: the program's name and its one-line errors, the
common options (Redis, TLS, config file, log level) and the model name, the tables of
model, featurizer and decision options and the model specs they make, and the Redis
settings and the model a command's arguments name.

>>> import argparse
>>> p = argparse.ArgumentParser()
>>> add_common_options(p)
>>> add_model_name(p)
>>> p.parse_args(["--model", "mail", "--cluster"]).cluster
True
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.settings import add_option, redis_settings
from streamnb_workers.defaults import MAIL_CLASSES
from streamnb_workers.exit_codes import EXIT_FAILURE, EXIT_UNREACHABLE, EXIT_USAGE
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.store.keys import check_model_name
from streamnb_workers.store.model_config import ModelSpec, require_model
from streamnb_workers.store.redaction import redact

__all__ = ["STDIN", "DECISION_OPTIONS", "FEATURIZER_OPTIONS", "LOG_LEVELS", "LOUD_COMMANDS",
           "MODEL_OPTIONS", "PROG", "add_common_options", "add_model_name", "fail", "log_level",
           "model_client", "model_name", "model_specs", "redis_error", "redis_from_args"]

PROG = "streamnb"
#: The PATH or FILE that means stdin (``produce -``, ``predict -``, ``explain -``).
STDIN = "-"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: The commands that run on (daemons and the demo) and log at INFO by default; every
#: other command logs only warnings and errors unless ``-v`` or ``--log-level`` says more.
LOUD_COMMANDS = frozenset({"worker", "milter", "spamd", "rspamd", "demo"})


def fail(message: str, code: int = EXIT_USAGE) -> int:
    """Print one redacted error line on stderr; return the exit code."""
    line = " ".join(redact(str(message)).split())
    print(f"{PROG}: error: {line}", file=sys.stderr)
    return code


def redis_error(exc: redis.RedisError) -> tuple[str, int]:
    """(one line, exit code) for a Redis error met at start: refused credentials or ACL and
    a database the server lacks are :data:`EXIT_USAGE`, an unreachable server
    :data:`EXIT_UNREACHABLE`, anything else :data:`EXIT_FAILURE`."""
    text = str(exc)
    if isinstance(exc, redis.AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
        return f"Redis refused the credentials: {text}", EXIT_USAGE
    if isinstance(exc, redis.exceptions.NoPermissionError) or text.startswith("NOPERM"):
        return f"Redis ACL refused a command: {text}", EXIT_USAGE
    if "DB index is out of range" in text or "invalid DB index" in text:
        return f"--redis: that database number does not exist on this Redis server ({text})", EXIT_USAGE
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return f"cannot reach Redis: {text}", EXIT_UNREACHABLE
    return f"Redis error: {text}", EXIT_FAILURE


# ---------------------------------------------------------------------- options
def add_common_options(p: argparse.ArgumentParser, redis_required: bool = True) -> None:
    """The options of every command: Redis and its TLS, ``--config``, ``--log-level``."""
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
    add_option(p, "--log-level", choices=LOG_LEVELS, type=str.upper,
               help="log verbosity (default: INFO for worker, milter and demo, else WARNING)")
    add_option(p, "-v", "--verbose", action="store_true", default=False,
               help="log at INFO (what --log-level INFO does; --log-level wins)")


def log_level(args: argparse.Namespace) -> str:
    """The log level of a command: ``--log-level`` when set, else INFO for ``-v`` and the
    commands of :data:`LOUD_COMMANDS`, else WARNING (a command's stderr stays quiet unless
    something is wrong).

    >>> ns = argparse.Namespace
    >>> log_level(ns(command="status", log_level=None, verbose=False))
    'WARNING'
    >>> log_level(ns(command="status", log_level=None, verbose=True))
    'INFO'
    >>> log_level(ns(command="worker", log_level=None, verbose=False))
    'INFO'
    >>> log_level(ns(command="worker", log_level="ERROR", verbose=True))
    'ERROR'
    """
    if getattr(args, "log_level", None):
        return str(args.log_level)
    if getattr(args, "verbose", False) or args.command in LOUD_COMMANDS:
        return "INFO"
    return "WARNING"


def add_model_name(p: argparse.ArgumentParser, many: bool = False) -> None:
    """``--model NAME`` (``many``: repeated, for several models)."""
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
    "max_len": "max_len", "meta": "meta", "counts": "counts", "osb": "osb",
}
#: Decision options: flag dest -> DecisionRule option.
DECISION_OPTIONS: Mapping[str, str] = {
    "threshold": "threshold", "unsure_band": "unsure_band", "loss_matrix": "loss_matrix",
    "class_prior": "class_prior", "positive": "positive",
    "min_class_weight": "min_class_weight", "score": "score", "target_fpr": "target_fpr",
    "calibration": "calibration", "score_window": "score_window",
    "prior_half_life": "prior_half_life",
}


def model_specs(args: argparse.Namespace) -> list[ModelSpec]:
    """One :class:`streamnb_workers.store.model_config.ModelSpec` per ``--model``, from the model,
    featurizer and decision options that were given (None: as stored)."""
    names = list(dict.fromkeys(args.model or []))
    if not names:
        raise SettingsError("--model NAME is required (or set STREAMNB_MODEL)")
    params: dict[str, Any] = {}
    for dest, (param, kinds) in MODEL_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        if args.kind is not None and args.kind not in kinds:
            flag = "--" + dest.replace("_", "-")
            raise SettingsError(
                f"{flag} does not apply to a {args.kind} model (it applies to {', '.join(kinds)})")
        params[param] = value
    fcfg: dict[str, Any] = {}
    for dest, key in FEATURIZER_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is not None:
            fcfg[key] = value
    if args.dimension is not None:
        if "bits" in fcfg:
            raise SettingsError("--dimension (dense x input) and --bits (hashed input) exclude each other")
        fcfg.update(input="dense", dim=args.dimension)
    decision = {key: getattr(args, dest) for dest, key in DECISION_OPTIONS.items()
                if getattr(args, dest, None) is not None}
    if "unsure_band" in decision:
        decision["unsure_band"] = list(decision["unsure_band"])
    if "threshold" in decision and "loss_matrix" in decision:
        raise SettingsError("give --threshold or --loss-matrix, not both")
    if "target_fpr" in decision and ("threshold" in decision or "loss_matrix" in decision):
        raise SettingsError("give --target-fpr or --threshold/--loss-matrix, not both")
    if "prior_half_life" in decision and "calibration" not in decision:
        raise SettingsError("--prior-half-life moves the calibrated probability: give "
                            "--calibration too")
    if "prior_half_life" in decision and "class_prior" in decision:
        raise SettingsError("give --class-prior or --prior-half-life, not both")
    if ("target_fpr" in decision or "calibration" in decision) and \
            (getattr(args, "shards", None) or 1) > 1:
        raise SettingsError("--target-fpr and --calibration need a model of one shard "
                            "(its scores are learnt in one log's order)")
    specs = []
    for name in names:
        try:
            check_model_name(name)
            specs.append(ModelSpec(name, kind=args.kind, model_params=params or None,
                                   featurizer_config=fcfg or None, decision=decision or None,
                                   half_life=args.half_life, classes=args.classes,
                                   default_classes=list(MAIL_CLASSES),
                                   error_weight=getattr(args, "error_weight", None),
                                   shards=getattr(args, "shards", None),
                                   training=getattr(args, "training", None)))
        except ValueError as exc:
            raise SettingsError(f"--model {name!r}: {exc}") from None
    return specs


# ---------------------------------------------------------------------- Redis and the model
def model_name(args: argparse.Namespace) -> str:
    """The checked ``--model`` of a command that needs one (SettingsError if none)."""
    if not args.model:
        raise SettingsError("--model NAME is required (or set STREAMNB_MODEL)")
    try:
        return check_model_name(args.model)
    except ValueError as exc:
        raise SettingsError(f"--model: {exc}") from None


def redis_from_args(args: argparse.Namespace, env: Mapping[str, str],
                    client_name: str | None = None) -> RedisSettings:
    """Redis settings from the resolved args (password registered for redaction)."""
    return redis_settings(args.redis, password_file=args.redis_password_file,
                          tls_ca_file=args.tls_ca_file, tls_cert_file=args.tls_cert_file,
                          tls_key_file=args.tls_key_file, cluster=args.cluster,
                          client_name=client_name, env=env)


def model_client(args: argparse.Namespace, env: Mapping[str, str],
                 client_name: str | None = None) -> tuple[str, Any]:
    """(model name, Redis client) of a command that works on a model its workers serve:
    Redis answers and holds the model, else one line says which models exist.
    ``client_name``: the connections' name in ``CLIENT LIST``."""
    model = model_name(args)
    client = redis_from_args(args, env, client_name=client_name).make_client()
    client.ping()
    require_model(client, model)
    return model, client

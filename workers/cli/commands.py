"""The ``streamnb`` command's subcommands: worker, produce, forget, predict, status,
export, import, demo (:data:`COMMANDS`), each given the resolved arguments and the environment,
returning the exit code.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from streamnb.exceptions import SettingsError
from streamnb_workers.cli import inspect as inspect_commands
from streamnb_workers.cli.parser import (
    DECISION_OPTIONS,
    FEATURIZER_OPTIONS,
    MODEL_OPTIONS,
    PROG,
)
from streamnb_workers.exit_codes import EXIT_FAILURE, EXIT_USAGE
from streamnb_workers.milter import command as milter
from streamnb_workers.store.model_config import require_model
from streamnb_workers.store.redaction import redact

__all__ = ["COMMANDS", "fail", "model_specs"]


def fail(message: str, code: int = EXIT_USAGE) -> int:
    """Print one redacted error line on stderr; return the exit code."""
    line = " ".join(redact(str(message)).split())
    print(f"{PROG}: error: {line}", file=sys.stderr)
    return code


def _require_model(args: argparse.Namespace) -> str:
    from streamnb_workers.store.keys import check_model_name

    if not args.model:
        raise SettingsError("--model NAME is required (or set STREAMNB_MODEL)")
    try:
        return check_model_name(args.model)
    except ValueError as exc:
        raise SettingsError(f"--model: {exc}") from None


def _redis(args: argparse.Namespace, env: Mapping[str, str], client_name: str | None = None) -> Any:
    """Redis settings from the resolved args (password registered for redaction)."""
    from streamnb_workers.cli.settings import redis_settings

    return redis_settings(args.redis, password_file=args.redis_password_file,
                          tls_ca_file=args.tls_ca_file, tls_cert_file=args.tls_cert_file,
                          tls_key_file=args.tls_key_file, cluster=args.cluster,
                          client_name=client_name, env=env)


def model_specs(args: argparse.Namespace) -> list[Any]:
    """One :class:`streamnb_workers.store.model_config.ModelSpec` per ``--model``, from the model,
    featurizer and decision options that were given (None: as stored)."""
    from streamnb_workers.store.keys import check_model_name
    from streamnb_workers.store.model_config import ModelSpec

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
    specs = []
    for name in names:
        try:
            check_model_name(name)
            specs.append(ModelSpec(name, kind=args.kind, model_params=params or None,
                                   featurizer_config=fcfg or None, decision=decision or None,
                                   half_life=args.half_life, classes=args.classes,
                                   error_weight=getattr(args, "error_weight", None),
                                   shards=getattr(args, "shards", None)))
        except ValueError as exc:
            raise SettingsError(f"--model {name!r}: {exc}") from None
    return specs


def cmd_worker(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.cli import supervisor

    specs = model_specs(args)
    return supervisor.run_worker_command(args, specs, _redis(args, env), env)


def cmd_produce(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.client.produce import ProduceInterrupted, produce
    from streamnb_workers.client.produce_checks import EmptySource
    from streamnb_workers.client.shard_streams import describe_inputs

    model = _require_model(args)
    client = _redis(args, env).make_client()
    client.ping()
    if not args.allow_new:
        require_model(client, model, hint="; --allow-new sends to it before its workers start")
    try:
        report = produce(client, model, list(args.paths), label=args.label, index=args.index,
                         chunk=args.chunk, max_bytes=args.max_bytes)
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
    print(f"sent {report.sent} of {report.total} messages{labelled} to "
          f"{describe_inputs(model, report.shards)}; {report.already_learnt} already learnt, "
          f"not sent{skipped}")
    return EXIT_FAILURE if report.skipped else 0


def cmd_forget(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.cli.forget import forget
    from streamnb_workers.client.shard_streams import describe_inputs

    model = _require_model(args)
    client = _redis(args, env).make_client()
    client.ping()
    require_model(client, model)
    report = forget(client, model, list(args.paths))
    skipped = f", skipped {len(report.skipped)}" if report.skipped else ""
    print(f"forgetting {report.sent} of {report.total} messages (sent to "
          f"{describe_inputs(model, report.shards)}); {len(report.not_learnt)} not learnt, "
          f"nothing to forget{skipped}")
    return EXIT_FAILURE if report.skipped else 0


def cmd_predict(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    import json

    from streamnb_workers.cli import pipe, predict_many
    from streamnb_workers.client import transfer
    from streamnb_workers.client.produce import send_and_wait

    if args.file == pipe.STDIN and not args.snapshot:
        return pipe.cmd_stdin(args, lambda: _redis(args, env))
    if args.passthrough or args.exit_zero:
        raise SettingsError("-p and -e judge a mail on stdin: give FILE - (without --snapshot)")
    if not args.snapshot and pipe.wants_many(args.file):
        model = _require_model(args)
        client = _redis(args, env).make_client()
        client.ping()
        require_model(client, model)
        return predict_many.cmd_many(args, model, client)
    if args.snapshot:
        result = transfer.predict_file(args.snapshot, args.file)
    else:
        model = _require_model(args)
        client = _redis(args, env).make_client()
        client.ping()
        require_model(client, model)
        result = send_and_wait(client, model, args.file, timeout=args.timeout,
                               max_bytes=args.max_bytes)
        if result is None:
            return fail(f"no prediction for {args.file!r} within {args.timeout:g} s: "
                        f"is a worker running for model {model!r}?", EXIT_FAILURE)
    result.setdefault("file", args.file)
    if args.json:
        print(json.dumps(result, sort_keys=True, default=str))
    else:
        print(transfer.format_prediction(result))
    return 0


def cmd_status(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    import json

    from streamnb_workers.cli import status

    model = _require_model(args)
    settings = _redis(args, env)
    client = settings.make_client()
    require_model(client, model)
    info = status.collect(client, model, redis_url=settings.url, last=args.last)
    if args.json:
        print(json.dumps(info, sort_keys=True))
    else:
        print(status.format_text(info))
    return 0 if info["exists"] else EXIT_FAILURE


def cmd_export(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.client import transfer

    model = _require_model(args)
    client = _redis(args, env).make_client()
    summary = transfer.export_model(client, model, args.output)
    print(f"wrote {summary} to {args.output}")
    return 0


def cmd_import(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.client import transfer

    model = _require_model(args)
    client = _redis(args, env).make_client()
    summary = transfer.import_model(client, model, args.file, args.import_mode or "new")
    print(f"model {model!r}: {summary}")
    return 0


def cmd_demo(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.cli import demo

    settings = _redis(args, env) if args.redis else None
    if args.log_level == "INFO":  # the default: keep the demo's output to its report
        logging.getLogger().setLevel(logging.ERROR)
    return demo.run_demo(settings, messages=args.messages, model=args.model,
                         metrics_port=args.metrics_port, metrics_addr=args.metrics_addr,
                         embedded=args.embedded)


def cmd_tail(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    from streamnb_workers.cli import tail

    model = _require_model(args)
    client = _redis(args, env).make_client()
    client.ping()
    require_model(client, model)
    return tail.cmd_tail(args, model, client)


COMMANDS: Mapping[str, Callable[[argparse.Namespace, Mapping[str, str]], int]] = {
    "worker": cmd_worker, "produce": cmd_produce, "forget": cmd_forget, "predict": cmd_predict,
    "status": cmd_status, "export": cmd_export, "import": cmd_import, "demo": cmd_demo,
    "milter": milter.cmd_milter, "tail": cmd_tail,
    **inspect_commands.COMMANDS,
}

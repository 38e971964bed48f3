"""``streamnb predict -``: judge one mail read from stdin, as a filter in a mail pipeline.

The mail goes through the model's workers like any producer's (XADD to
``streamnb:{M}:in``, the prediction from ``streamnb:{M}:out`` within ``--timeout``, by a
:class:`~streamnb_workers.client.verdicts.VerdictClient`). The exit code is bogofilter's: 0 for
the positive class (spam of ham/spam), 1 for any other class, 2 for ``unsure``, 3 for no
verdict (:func:`streamnb_workers.cli.pipe_message.verdict_exit_code`). With ``-p`` the mail is
written to stdout with the milter's headers (``X-Streamnb-Verdict``, ``X-Streamnb-Score``,
``X-Streamnb-Id``) and every byte after its header block as it came; a mail that got no
verdict is written too, with ``X-Streamnb-Verdict: not-scored (REASON)``, so that a
pipeline that delivers what the filter writes loses no mail. ``-e`` makes every verdict
exit 0 (3 still means no verdict), for the delivery agents that take any other code as a
failed filter.

Every failure once the command runs (a bad ``--model``, Redis down, no prediction in
time) is one line on stderr and exit 3, never an exception: bogofilter's convention, and
what a delivery agent can tell from a verdict. Input that is not mail (empty, binary, no
header line: what ``predict FILE`` refuses) is not sent: exit 3, and with ``-p`` it is
written through byte for byte after one ``X-Streamnb-Verdict: not-scored (not-mail)``
line.

``streamnb predict DIR|MBOX`` (:mod:`streamnb_workers.cli.predict_many`) judges many.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from itertools import islice
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.options import PROG, model_name
from streamnb_workers.cli.pipe_message import EXIT_ERROR, PipedMessage, verdict_exit_code
from streamnb_workers.cli.prediction_text import format_prediction
from streamnb_workers.client.produce_checks import not_mail
from streamnb_workers.client.sources import iter_paths
from streamnb_workers.client.verdicts import (
    ERROR,
    UNAVAILABLE,
    NotScored,
    VerdictClient,
    not_scored_headers,
    score_of,
    verdict_headers,
)
from streamnb_workers.protocols.users import ModelChooser, UserNames
from streamnb_workers.store.model_config import require_model
from streamnb_workers.store.redaction import redact
from streamnb_workers.store.user_models import DOMAIN_TEMPLATE, USER_TEMPLATE

__all__ = ["NOT_MAIL", "judge_stdin", "run_on_stdin", "wants_many"]

#: The not-scored reason of input that is not mail (never sent to the workers).
NOT_MAIL = "not-mail"


def wants_many(path: str) -> bool:
    """Whether ``path`` holds several messages: a directory, an mbox, a JSON-lines file of
    several records."""
    p = Path(path)
    if p.is_dir():
        return True
    if not p.is_file():
        return False
    return len(list(islice(iter_paths([p]), 2))) > 1


def _error(message: str, stderr: TextIO) -> None:
    print(f"{PROG}: error: {' '.join(redact(message).split())}", file=stderr)


def _predict(args: argparse.Namespace, settings_of: Any, raw: bytes, sent: list[str]) -> Any:
    """The prediction of ``raw`` (its message id appended to ``sent`` once it is sent), or
    raises NotScored / SettingsError / a Redis error."""
    model = model_name(args)
    timeout = float(args.timeout)
    if not timeout > 0:
        raise SettingsError(f"--timeout must be > 0 seconds, got {args.timeout}")
    # A filter's stderr is the delivery agent's log: the reason a mail was not scored is
    # the one line judge_stdin writes, not the reader's retries as well.
    logging.getLogger("streamnb.verdicts").setLevel(logging.ERROR)
    settings = settings_of()
    model = _check_model(settings, model, min(timeout, 5.0), getattr(args, "user", None),
                         getattr(args, "user_template", USER_TEMPLATE),
                         getattr(args, "domain_template", DOMAIN_TEMPLATE))
    client = VerdictClient(settings, model, send_timeout=min(timeout, 5.0), block_ms=200,
                           id_prefix="pipe-")
    try:
        pending = client.submit(raw)  # fails at once when Redis is down: no reader started
        sent.append(pending.id)
        client.start()
        return pending.result(timeout)
    finally:
        client.close()


def _check_model(settings: Any, model: str, timeout: float, user: str | None = None,
                 user_template: str = USER_TEMPLATE, domain_template: str = DOMAIN_TEMPLATE
                 ) -> str:
    """The model to send to: ``user``'s per-user, else per-domain model where one is
    registered, else ``model`` (workers/protocols/users.py). SettingsError naming the
    models that exist when ``model`` does not (a mail sent to it would wait out
    ``--timeout`` for nothing); NotScored when Redis cannot be reached."""
    client = settings.make_client(socket_timeout=timeout)
    try:
        require_model(client, model)
        if not user:
            return model
        try:
            names = UserNames(model, user_template, domain_template)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        return ModelChooser(model, names).model_for(user, client)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise NotScored(UNAVAILABLE, f"{type(exc).__name__}: {exc}") from None
    finally:
        client.close()


def judge_stdin(args: argparse.Namespace, settings_of: Any, stdin: BinaryIO, stdout: BinaryIO,
                stderr: TextIO) -> int:
    """Judge the mail on ``stdin`` (module docstring); ``settings_of()`` gives the Redis
    settings. Returns the exit code."""
    message = PipedMessage.read(stdin, args.max_bytes)
    try:
        reason = not_mail(message.head)
        if reason is not None:
            _error(f"{args.file}: not scored: stdin: {reason}", stderr)
            if args.passthrough:
                message.write_marked(stdout, not_scored_headers(NOT_MAIL))
            return EXIT_ERROR
        sent: list[str] = []
        headers, prediction, code = None, None, EXIT_ERROR
        try:
            prediction = _predict(args, settings_of, message.scored_bytes(), sent)
            headers = verdict_headers(prediction, args.positive, sent[0])
            code = verdict_exit_code(prediction.get("label"), list(prediction["log_proba"]),
                                     args.positive)
            if code == EXIT_ERROR:
                raise NotScored(ERROR, f"--positive {args.positive!r} is not a class of the model")
        except NotScored as exc:
            _error(f"{args.file}: not scored: {exc}", stderr)
            headers, code = not_scored_headers(exc.reason, sent[0] if sent else None), EXIT_ERROR
        except Exception as exc:  # noqa: BLE001 - the mail must still be written through
            _error(f"{args.file}: not scored: {type(exc).__name__}: {exc}", stderr)
            headers, code = not_scored_headers(ERROR, sent[0] if sent else None), EXIT_ERROR
        if args.passthrough:
            message.write_with_headers(stdout, headers)
        elif prediction is not None and code != EXIT_ERROR:
            result = dict(prediction, file=args.file,
                          score=score_of(prediction, args.positive))
            line = (json.dumps(result, sort_keys=True, default=str) if args.json
                    else format_prediction(result))
            stdout.write(line.encode("utf-8") + b"\n")
            stdout.flush()
    finally:
        message.close()
    return 0 if args.exit_zero and code != EXIT_ERROR else code


def run_on_stdin(args: argparse.Namespace, settings_of: Any) -> int:
    """``predict -`` on the process's stdin and stdout."""
    return judge_stdin(args, settings_of, sys.stdin.buffer, sys.stdout.buffer, sys.stderr)

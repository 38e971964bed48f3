"""The ``streamnb`` command: its parser, built from the command modules
(:data:`COMMANDS`, each in :mod:`streamnb_workers.cli.commands`), and its entry point,
which resolves the options and turns every error into one line and an exit code.

Every option can also come from the environment (``--foo-bar`` -> ``STREAMNB_FOO_BAR``) or a
TOML file (``--config``); see :mod:`streamnb_workers.cli.settings` and docs/configuration.md. Errors in
arguments, configuration or credentials print ONE line on stderr and exit 2; an unreachable
Redis exits 3; see docs/cli.md for every exit code.

>>> parser = build_parser()
>>> parser.parse_args(["worker", "--model", "mail"]).command
'worker'
>>> args = parser.parse_args(["status", "--model", "mail", "--json"])
>>> args.command, args.model, args.json
('status', 'mail', True)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from typing import NoReturn

import redis

from streamnb._version import __version__
from streamnb.exceptions import ConfigConflict, FormatError, SettingsError
from streamnb_workers.cli.commands import (
    demo,
    explain,
    export,
    forget,
    import_,
    milter,
    predict,
    produce,
    promote,
    rspamd,
    spamd,
    status,
    tail,
    tokens,
    tune,
    worker,
)
from streamnb_workers.cli.options import PROG, fail, log_level, redis_error
from streamnb_workers.cli.settings import resolve, setup_logging
from streamnb_workers.exit_codes import EXIT_FAILURE, EXIT_USAGE

__all__ = ["COMMANDS", "OneLineParser", "build_parser", "main", "subparsers"]

#: The subcommands, in the order ``streamnb --help`` lists them.
COMMANDS = (worker, produce, forget, predict, status, export, import_, demo, tail, milter,
            spamd, rspamd, explain, tokens, tune, promote)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (exit 2), no usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> OneLineParser:
    """The full ``streamnb`` parser: every command of :data:`COMMANDS`."""
    parser = OneLineParser(prog=PROG, description="Online generative classification on Redis streams.")
    parser.add_argument("--version", action="version", version=f"streamnb {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Subcommand name -> its parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Entry point of the ``streamnb`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    command = args.command
    parsers = subparsers(parser)
    runs = {c.NAME: c.run for c in COMMANDS}
    try:
        resolve(parsers[command], args, command, env=os.environ if env is None else env,
                all_parsers=parsers)
        setup_logging(log_level(args))
        return runs[command](args, os.environ if env is None else env)
    except (SettingsError, ConfigConflict) as exc:
        return fail(str(exc))
    except ValueError as exc:  # e.g. a model parameter out of range, checked by the model
        return fail(str(exc))
    except FormatError as exc:
        return fail(str(exc))
    except OSError as exc:  # a file named on the command line
        return fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), EXIT_FAILURE)
    except redis.RedisError as exc:
        message, code = redis_error(exc)
        return fail(message, code)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

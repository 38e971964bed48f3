"""``streamnb import``: load the statistics of an exported file into a model
(:func:`streamnb_workers.client.model_files.import_model`; ``--add``, ``--replace``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from streamnb_workers.cli.options import (
    add_common_options,
    add_model_name,
    model_name,
    redis_from_args,
)

__all__ = ["NAME", "add_parser", "run"]

NAME = "import"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb import`` on the subparsers ``sub``."""
    p = sub.add_parser("import", help="load the statistics of an exported file into a model",
                       description="Load the statistics in FILE into model NAME (creating its "
                                   "config from the file if it has none); a model that holds "
                                   "statistics already needs --add or --replace.")
    add_common_options(p)
    add_model_name(p)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--add", dest="import_mode", action="store_const", const="add",
                      help="add the file's statistics to those the model holds")
    mode.add_argument("--replace", dest="import_mode", action="store_const", const="replace",
                      help="swap the model's statistics for the file's (and drop its learnt keys)")
    p.add_argument("file", metavar="FILE", help="a file written by 'streamnb export'")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Import ``args.file`` into the model."""
    # deferred: the replica (to encode the delta) loads only for import
    from streamnb_workers.client.model_files import import_model

    model = model_name(args)
    client = redis_from_args(args, env).make_client()
    summary = import_model(client, model, args.file, args.import_mode or "new")
    print(f"model {model!r}: {summary}")
    return 0

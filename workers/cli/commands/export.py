"""``streamnb export``: write a model (config and statistics) to a file
(:func:`streamnb_workers.client.model_files.export_model`)."""

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

NAME = "export"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb export`` on the subparsers ``sub``."""
    p = sub.add_parser("export", help="write a model's statistics to a file",
                       description="Write the model (config + statistics) to FILE; "
                                   "streamnb.models.load(FILE) reads it back.")
    add_common_options(p)
    add_model_name(p)
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="file to write")
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Write the model to ``args.output``."""
    # deferred: the replica (to load the model) loads only for export
    from streamnb_workers.client.model_files import export_model

    model = model_name(args)
    client = redis_from_args(args, env).make_client()
    summary = export_model(client, model, args.output)
    print(f"wrote {summary} to {args.output}")
    return 0

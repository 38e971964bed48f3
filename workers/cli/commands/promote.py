"""``streamnb promote``: make a model's challenger (``worker --challenger SPEC``) the model,
on every worker: an entry ``{"promote": SPEC}`` on the model's learning stream, which the
commit turns into a log entry every replica applies in log order
(workers/replication/challenger.py)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

import msgpack

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.options import add_common_options, add_model_name, model_client
from streamnb_workers.client.produce_checks import stored_training
from streamnb_workers.replication.challenger import stored_spec
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import read_config
from streamnb_workers.store.training import learning_stream
from streamnb_workers.wire.codec import DATA_FIELD

__all__ = ["NAME", "add_parser", "run"]

NAME = "promote"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb promote`` on the subparsers ``sub``."""
    p = sub.add_parser("promote", help="make the model's challenger the model, on every worker",
                       description="Send the promotion of the challenger the model's workers "
                                   "learn (worker --challenger SPEC): from its place in the "
                                   "stream on, every worker predicts and learns with the "
                                   "challenger's statistics and configuration.")
    add_common_options(p)
    add_model_name(p)
    return p


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Send the promotion; one line says what was sent."""
    model, client = model_client(args, env)
    keys = ModelKeys(model)
    spec = stored_spec(client, keys, None)
    if spec is None:
        raise SettingsError(f"model {model!r} has no challenger (start its workers with "
                            "--challenger SPEC first)")
    config = read_config(client, model)
    if config is not None and config.shards != 1:
        raise SettingsError(f"model {model!r} has {config.shards} shards: no challenger is held")
    stream = learning_stream(keys, stored_training(client, model))
    client.xadd(stream, {DATA_FIELD: msgpack.packb({"promote": spec}, use_bin_type=True)})
    print(f"promoting the challenger {spec!r} of model {model!r} (sent to {stream})")
    return 0

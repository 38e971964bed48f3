"""A model's ``:snapshot`` hash read back (workers/replication/replica.py loads it; the
lease holder writes it: workers/replication/snapshotter.py)."""

from __future__ import annotations

from typing import Any

import msgpack

from streamnb.exceptions import FormatError
from streamnb_workers.replication.source_parts import SourceParts
from streamnb_workers.store.model_config import ModelConfig
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id

__all__ = ["decode_snapshot"]


def decode_snapshot(config: ModelConfig, h: dict[str, Any]) -> tuple[Any, str, SourceParts]:
    """The model, version (the log id it includes) and parts by source of a snapshot
    hash (``h``, keys as text), checked against ``config``; FormatError if unreadable."""
    # deferred: the model classes (streamnb.models, ~0.8 s) load with the first snapshot
    from streamnb.models import loads as load_model

    if "data" not in h or "log_id" not in h:
        raise FormatError(f"snapshot hash lacks {'data' if 'data' not in h else 'log_id'}")
    try:
        version = as_str(h["log_id"])
        parse_id(version)
        if "trimmed" in h:
            parse_id(h["trimmed"])
    except (ValueError, UnicodeDecodeError):
        raise FormatError("snapshot log_id/trimmed is not a stream id") from None
    model = load_model(h["data"])
    if model.kind != config.kind:
        raise FormatError(f"it holds a {model.kind} model, the config says {config.kind}")
    fresh = config.make_model()
    try:
        fresh.stats.check_mergeable(model.stats)
    except FormatError as exc:
        raise FormatError(f"its statistics do not fit the configured model: {exc}") from None
    sources = SourceParts()
    try:
        sources.load(h.get("sources"))
        for part in sources.parts.values():
            fresh.stats.check_mergeable(part)
    except (FormatError, ValueError, KeyError, TypeError, msgpack.UnpackException) as exc:
        raise FormatError(f"its parts by source are unreadable: {exc}") from None
    return model, version, sources

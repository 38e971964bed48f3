"""``streamnb predict DIR|MBOX``: judge many messages in one call, one line each.

Every message under the path (what :func:`streamnb_workers.client.sources.iter_paths` finds: the
files of a directory, the messages of a maildir or an mbox, the records of a JSON-lines
file) is sent unlabelled to ``streamnb:{M}:in`` with pipelined XADDs, then the predictions
are collected from ``streamnb:{M}:out``, and the dead letters of these messages from
``:dead``. The lines come out in input order, as ``bogofilter -B`` and ``-M`` print them:
the message (its file name; for an mbox, its number, 1 for the first), the verdict and the
score (:func:`streamnb_workers.client.verdicts.score_of`), separated by tabs. A message that got
no verdict has ``not-scored (REASON)`` and ``-``; the reasons are the milter's plus
``dead-letter: <reason>`` for a message the workers refused.

At most ``window`` messages are unanswered at a time: a large mbox neither floods ``:in``
nor outruns the ``MAXLEN`` of ``:out``. The wait ends when every message is answered or no
answer came for ``timeout`` seconds.

On a model stored with K shards each message goes to its shard's ``:in`` (by its id,
workers/replication/shards.py) and the ``:out`` and ``:dead`` of every shard are read.

>>> format_line("box#3", {"label": "spam", "log_proba": {"ham": -4.0, "spam": -0.0183}}).split("\\t")
['box#3', 'spam', '3.98']
>>> format_line("a.eml", None, "timeout").split("\\t")
['a.eml', 'not-scored (timeout)', '-']
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from streamnb.exceptions import MalformedMessage, SettingsError
from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb.features.truncate import cut_mail
from streamnb_workers.client.shard_streams import read_after, router_of
from streamnb_workers.client.sources import iter_paths
from streamnb_workers.client.verdicts import NOT_SCORED, TIMEOUT, format_score, score_of
from streamnb_workers.exit_codes import EXIT_FAILURE
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.codec import DATA_FIELD, decode_input
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.replies import as_str, entry_field

__all__ = ["Judged", "format_line", "judge_many", "run_many"]

#: Messages sent and not yet answered, at most.
DEFAULT_WINDOW = 1000
_CHUNK = 200


@dataclass(slots=True)
class Judged:
    """One message's outcome: its name, and its prediction or why it has none."""

    name: str
    prediction: dict[str, Any] | None = None
    failure: str | None = None


def format_line(name: str, prediction: Mapping[str, Any] | None, failure: str | None = None,
                positive: Any = None) -> str:
    """``name<TAB>verdict<TAB>score`` (module docstring)."""
    if prediction is None or prediction.get("label") is None:
        return f"{name}\t{NOT_SCORED} ({failure or 'untrained'})\t-"
    try:
        score = format_score(score_of(prediction, positive))
    except ValueError:
        score = "-"
    return f"{name}\t{prediction['label']}\t{score}"


def _json_line(j: Judged, positive: Any) -> str:
    obj: dict[str, Any] = {"file": j.name}
    if j.prediction is not None and j.prediction.get("label") is not None:
        obj.update(j.prediction)
        try:
            obj["score"] = score_of(j.prediction, positive)
        except ValueError:
            obj["score"] = None
    else:
        obj["not_scored"] = j.failure or "untrained"
    return json.dumps(obj, sort_keys=True, default=str)


def _messages(path: str, max_size: int) -> Iterator[tuple[str, str, bytes | None, str | None]]:
    """(printed name, message id, the encoded input map or None, why it cannot be sent)
    per message."""
    top = Path(path)
    for n, out in enumerate(iter_paths([top])):
        name = out.source
        if top.is_file() and "#" in name:  # the messages of one mbox: their numbers
            name = str(n + 1)
        if out.error is not None:
            yield name, "", None, out.error
            continue
        if "ref" in out.fields:
            yield name, "", None, "a ref record is a label, not a message to judge"
            continue
        out.fields.pop("label", None)
        if out.raw is not None:
            out.raw = cut_mail(out.raw, max_size)  # as produce cuts it
        out.id = out.fields["id"] = f"predict-{uuid.uuid4().hex}"
        data = out.encode()
        try:
            decode_input(data, out.id)
        except MalformedMessage as exc:
            yield name, out.id, None, f"{exc.reason}: {exc.detail}"
            continue
        yield name, out.id, data, None


class _Collector:
    """Reads the ``:out`` and ``:dead`` of each shard (``shards``: their keys) from where
    they were before the first XADD and fills in the outcome of each message sent."""

    def __init__(self, client: Any, shards: list[ModelKeys]) -> None:
        self.client = client
        self.outs = {keys.out for keys in shards}
        #: The shard of each ``:dead`` stream (dead letters name their input entry).
        self.dead_of = {keys.dead: keys.name for keys in shards}
        self.last = {k: self._last_id(k) for keys in shards for k in (keys.out, keys.dead)}
        self.by_id: dict[str, Judged] = {}
        #: (shard name, input entry id) -> message id.
        self.by_entry: dict[tuple[str, str], str] = {}

    def _last_id(self, key: str) -> str:
        last = self.client.xrevrange(key, count=1)
        return as_str(last[0][0]) if last else "0-0"

    def read(self, block_ms: int | None) -> int:
        """One read of every stream; the number of messages answered by it."""
        reply = read_after(self.client, self.last, 1000, block_ms)
        answered = 0
        for stream, entries in reply or []:
            key = as_str(stream)
            for entry_id, fields in entries:
                self.last[key] = as_str(entry_id)
                try:
                    obj = decode_output(entry_field(fields, DATA_FIELD) or b"")
                except MalformedMessage:
                    continue
                if key in self.outs:
                    judged = self.by_id.pop(str(obj.get("id")), None)
                    if judged is not None:
                        judged.prediction = obj
                        if obj.get("label") is None:
                            judged.failure = "untrained"
                        answered += 1
                else:
                    msg_id = self.by_entry.pop((self.dead_of[key], str(obj.get("entry"))), None)
                    judged = self.by_id.pop(msg_id, None) if msg_id is not None else None
                    if judged is not None:
                        judged.failure = f"dead-letter: {obj.get('reason')}"
                        answered += 1
        return answered


def judge_many(client: Any, model: str, path: str, out: TextIO, *, timeout: float,
               positive: Any = None, as_json: bool = False, max_size: int = DEFAULT_MAX_MESSAGE_BYTES,
               window: int = DEFAULT_WINDOW) -> tuple[int, int]:
    """Judge every message under ``path`` (module docstring), writing one line each to
    ``out`` in input order. Returns (messages, of them not scored)."""
    router = router_of(client, model)
    collector = _Collector(client, router.keys)
    unprinted: deque[Judged] = deque()
    n = not_scored = 0

    def flush_ready() -> None:
        nonlocal not_scored
        while unprinted and (unprinted[0].prediction is not None or unprinted[0].failure is not None):
            j = unprinted.popleft()
            not_scored += j.prediction is None or j.prediction.get("label") is None
            out.write((_json_line(j, positive) if as_json
                       else format_line(j.name, j.prediction, j.failure, positive)) + "\n")
        out.flush()

    def wait(until_unanswered: int) -> None:
        """Read until at most ``until_unanswered`` are unanswered or ``timeout`` passes
        without an answer; those still unanswered then time out."""
        idle_since = time.monotonic()
        while len(collector.by_id) > until_unanswered:
            left = timeout - (time.monotonic() - idle_since)
            if left <= 0:
                for judged in collector.by_id.values():
                    judged.failure = TIMEOUT
                collector.by_id.clear()
                collector.by_entry.clear()
                break
            if collector.read(max(1, int(min(left, 1.0) * 1000))):
                idle_since = time.monotonic()
                flush_ready()
        flush_ready()

    batch: list[tuple[Judged, str, bytes]] = []

    def send() -> None:
        pipe = client.pipeline(transaction=False)
        shards = [router.keys_for(msg_id) for _judged, msg_id, _data in batch]
        for (_judged, _msg_id, data), keys in zip(batch, shards, strict=True):
            pipe.xadd(keys.input, {DATA_FIELD: data})
        for (judged, msg_id, _data), keys, entry in zip(batch, shards, pipe.execute(), strict=True):
            collector.by_id[msg_id] = judged
            collector.by_entry[keys.name, as_str(entry)] = msg_id
        batch.clear()
        if len(collector.by_id) >= window:
            wait(window // 2)

    for name, msg_id, data, error in _messages(path, max_size):
        judged = Judged(name)
        unprinted.append(judged)
        n += 1
        if data is None:
            judged.failure = f"error: {error}"
            continue
        batch.append((judged, msg_id, data))
        if len(batch) >= _CHUNK:
            send()
    if batch:
        send()
    wait(0)
    return n, not_scored


def run_many(args: Any, model: str, client: Any) -> int:
    """``predict DIR|MBOX`` on ``client`` (checked: Redis reached, the model exists): exit 0
    when every message got a verdict, else 1."""
    n, not_scored = judge_many(client, model, args.file, sys.stdout, timeout=args.timeout,
                               positive=args.positive, as_json=args.json,
                               max_size=args.max_bytes)
    if n == 0:
        raise SettingsError(f"{args.file!r} holds no message")
    return EXIT_FAILURE if not_scored else 0

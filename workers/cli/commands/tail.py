"""``streamnb tail``: a model's predictions (``:out``) or dead letters (``:dead``), one
readable line per entry, or one JSON object per line.

The last ``--count`` entries are printed oldest first; ``--follow`` then blocks for new ones
(XREAD BLOCK) until Ctrl-C, which exits 0. Reading the last N pages backwards and then
forwards in pages of :data:`PAGE`, so any N costs bounded memory.

A prediction's line: the entry's time (from its stream id, UTC), the stream id, then
``key=value`` fields: the message ``id``, the ``label``, the ``score`` (natural-log odds of
the positive class, as in ``X-Streamnb-Score``), with an operating point the
``threshold`` and the calibrated ``proba`` (docs/worker.md), the ``true`` label and whether it was
``learnt`` for a labelled message, the ``version`` that predicted, the ``worker`` and, from
a worker run with ``--explain K``, the top ``tokens`` with their weights. A
dead letter's: ``reason``, the input ``entry``, the message ``id`` when its payload is a
map that has one, the payload's size and the ``detail``. A value with spaces or quotes is
JSON-quoted.

A model stored with K shards (workers/replication/shards.py) has K ``:out`` (and ``:dead``) streams:
their entries are printed merged in the order of their stream ids (the time each was
added), the last ``--count`` of them all, and with ``--follow`` the new ones of every shard.

>>> out = {"id": "m1", "entry": "5-0", "label": "spam", "log_proba": {"ham": -3.0, "spam": -0.05},
...        "model_version": "4-0", "worker": "w1", "true_label": "spam", "learned": True}
>>> print(format_entry("1700000000000-0", out, dead=False))
2023-11-14T22:13:20.000Z 1700000000000-0 id=m1 label=spam score=2.95 true=spam learnt=yes version=4-0 worker=w1
>>> dead = {"entry": "7-1", "reason": "bad_label", "detail": "label must be a str", "payload": b"\\x81\\xa2id\\xa2m9"}
>>> print(format_entry("1700000000001-0", dead, dead=True))
2023-11-14T22:13:20.001Z 1700000000001-0 reason=bad_label entry=7-1 id=m9 bytes=7 detail="label must be a str"
"""

from __future__ import annotations

import argparse
import base64
import heapq
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from itertools import islice
from typing import Any, TextIO

import msgpack
import redis

from streamnb.exceptions import MalformedMessage
from streamnb_workers.cli.arg_types import non_negative_int
from streamnb_workers.cli.options import add_common_options, add_model_name, model_client
from streamnb_workers.cli.settings import add_option
from streamnb_workers.client.shard_streams import merge_by_id, read_after, shard_keys
from streamnb_workers.client.verdicts import format_score, score_of
from streamnb_workers.store.backoff import Backoff
from streamnb_workers.wire.codec import DATA_FIELD
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.replies import as_str, entry_field
from streamnb_workers.wire.stream_ids import parse_id

__all__ = ["NAME", "add_parser", "entry_json", "format_entry", "last_entries", "run", "tail"]

NAME = "tail"

#: Entries read per XRANGE / XREVRANGE / XREAD.
PAGE = 1000
DEFAULT_COUNT = 10


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Declare ``streamnb tail`` on the subparsers ``sub``."""
    p = sub.add_parser("tail", help="print a model's predictions or dead letters, readable",
                       description="Decode streamnb:{NAME}:out (or :dead) into one line per entry "
                                   "(or JSON lines): the last --count, then, with --follow, new "
                                   "ones as they come.")
    add_common_options(p)
    add_model_name(p)
    add_option(p, "--dead", action="store_true", default=False,
               help="read the dead letters (:dead) instead of the predictions (:out)")
    add_option(p, "--follow", "-f", action="store_true", default=False,
               help="after the last --count entries, wait for new ones (Ctrl-C stops, exit 0)")
    add_option(p, "--count", "-n", type=non_negative_int, default=DEFAULT_COUNT, metavar="N",
               help="print the last N entries first")
    add_option(p, "--json", action="store_true", default=False,
               help="one JSON object per entry (bytes as base64: payload_b64)")
    add_option(p, "--positive", metavar="LABEL",
               help="the class whose log-odds is the score (default: the last in sorted order)")
    return p


# ------------------------------------------------------------------------ formatting
def _time(stream_id: str) -> str:
    ms = int(stream_id.partition("-")[0])
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def _value(v: Any) -> str:
    text = str(v)
    if text and text.isprintable() and not any(c in text for c in " \"'="):
        return text
    return json.dumps(text)


def _payload_id(payload: Any) -> Any:
    """The ``id`` of a dead letter's original map, when it decodes to one."""
    try:
        # msgpack bounds every length by the payload's size (a dead letter's, at most the
        # workers' limit on an entry)
        obj = msgpack.unpackb(bytes(payload), raw=False, strict_map_key=False,
                              unicode_errors="replace")
    except Exception:  # noqa: BLE001 - a dead letter's payload is often not msgpack at all
        return None
    return obj.get("id") if isinstance(obj, dict) else None


def _score_value(obj: Mapping[str, Any], positive: Any) -> float | None:
    """The prediction's score (:func:`~streamnb_workers.client.verdicts.score_of`), None for a
    prediction without two classes to compare."""
    log_proba = obj.get("log_proba")
    if not isinstance(log_proba, Mapping) or len(log_proba) < 2:
        return None
    try:
        return score_of(obj, positive)
    except (ValueError, TypeError, OverflowError):
        return None


def _score(obj: Mapping[str, Any], positive: Any) -> str | None:
    score = _score_value(obj, positive)
    return None if score is None else format_score(score)


def format_entry(stream_id: str, obj: Mapping[str, Any], dead: bool, positive: Any = None) -> str:
    """One readable line of a decoded ``:out`` or ``:dead`` entry (module docstring)."""
    fields: list[tuple[str, Any]] = []
    if dead:
        payload = obj.get("payload")
        fields += [("reason", obj.get("reason")), ("entry", obj.get("entry"))]
        if isinstance(payload, bytes | bytearray):
            msg_id = _payload_id(payload)
            if msg_id is not None:
                fields.append(("id", msg_id))
            fields.append(("bytes", len(payload)))
        fields.append(("detail", obj.get("detail")))
    else:
        fields += [("id", obj.get("id")), ("label", obj.get("label")),
                   ("score", _score(obj, positive))]
        # with an operating point (--target-fpr, --calibration, --prior-half-life)
        fields += [(k, f"{obj[k]:.4g}") for k in ("threshold", "proba", "prior")
                   if isinstance(obj.get(k), int | float)]
        if obj.get("true_label") is not None:
            fields += [("true", obj["true_label"]), ("learnt", "yes" if obj.get("learned") else "no")]
        fields += [("version", obj.get("model_version")), ("worker", obj.get("worker"))]
        explained = obj.get("explain")
        if isinstance(explained, Mapping) and explained.get("tokens"):  # a worker's --explain K
            fields.append(("tokens", " ".join(
                f"{name}={weight:+.2f}" for name, weight in explained["tokens"]
                if isinstance(weight, int | float))))
        if obj.get("meta") is not None:
            fields.append(("meta", json.dumps(obj["meta"], sort_keys=True, default=repr)))
    text = " ".join(f"{k}={_value(v)}" for k, v in fields if v is not None)
    return f"{_time(stream_id)} {stream_id} {text}"


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes | bytearray):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_jsonable(x) for x in v]
    return v


def entry_json(stream_id: str, obj: Mapping[str, Any], dead: bool, positive: Any = None) -> str:
    """One JSON line: the decoded entry, its ``stream_id`` and ``time``; bytes as base64
    (a dead letter's ``payload`` as ``payload_b64``); a prediction's ``score``."""
    out: dict[str, Any] = {"stream_id": stream_id, "time": _time(stream_id)}
    for k, v in obj.items():
        if k == "payload" and isinstance(v, bytes | bytearray):
            out["payload_b64"] = _jsonable(v)
        else:
            out[str(k)] = _jsonable(v)
    if not dead:
        out["score"] = _jsonable(_score_value(obj, positive))
    return json.dumps(out, sort_keys=True)


def render(entry_id: Any, fields: Any, dead: bool, as_json: bool, positive: Any = None) -> str:
    """The line of one stream entry as read from Redis; an entry that does not decode says
    so on its line."""
    stream_id = as_str(entry_id)
    try:
        obj = decode_output(entry_field(fields, DATA_FIELD) or b"")
    except MalformedMessage as exc:
        if as_json:
            return json.dumps({"stream_id": stream_id, "time": _time(stream_id),
                               "error": f"{exc.reason}: {exc.detail}"})
        return f"{_time(stream_id)} {stream_id} undecodable={exc.reason} detail={_value(exc.detail)}"
    return (entry_json if as_json else format_entry)(stream_id, obj, dead, positive)


# --------------------------------------------------------------------------- reading
def last_entries(client: Any, key: str, n: int) -> Iterator[tuple[Any, Any]]:
    """The last ``n`` entries of ``key``, oldest first, read in pages of :data:`PAGE`."""
    if n <= 0:
        return
    if n <= PAGE:
        yield from reversed(client.xrevrange(key, count=n))
        return
    # Find the first of the last n by paging backwards, then read forwards from it.
    first, seen, upper = None, 0, "+"
    while seen < n:
        page = client.xrevrange(key, max=upper, count=min(PAGE, n - seen))
        if not page:
            break
        seen += len(page)
        first = as_str(page[-1][0])
        upper = "(" + first
    if first is None:
        return
    lower = first
    while True:
        page = client.xrange(key, min=lower, count=PAGE)
        yield from page
        if len(page) < PAGE:
            return
        lower = "(" + as_str(page[-1][0])


def _newest_first(client: Any, key: str, page: int) -> Iterator[tuple[str, Any]]:
    """``(key, id)`` of every entry of ``key``, newest first, read in pages of ``page``."""
    upper = "+"
    while True:
        entries = client.xrevrange(key, max=upper, count=page)
        yield from ((key, entry_id) for entry_id, _ in entries)
        if len(entries) < page:
            return
        upper = "(" + as_str(entries[-1][0])


def _oldest_first(client: Any, key: str, first: str) -> Iterator[tuple[str, Any, Any]]:
    """``(key, id, fields)`` of the entries of ``key`` from ``first`` on, in pages."""
    lower = first
    while True:
        entries = client.xrange(key, min=lower, count=PAGE)
        yield from ((key, entry_id, fields) for entry_id, fields in entries)
        if len(entries) < PAGE:
            return
        lower = "(" + as_str(entries[-1][0])


def last_of_streams(client: Any, keys: Sequence[str], n: int) -> Iterator[tuple[str, Any, Any]]:
    """The last ``n`` entries of the streams ``keys`` together, oldest first, as ``(key,
    id, fields)``, merged by id: the streams' ids are read backwards to the n-th newest of
    them all, then the entries forwards from there; pages of :data:`PAGE` at most."""
    if len(keys) == 1:
        for entry_id, fields in last_entries(client, keys[0], n):
            yield keys[0], entry_id, fields
        return
    first: dict[str, str] = {}  # per stream, the oldest of its entries among the last n
    newest = heapq.merge(*(_newest_first(client, key, min(n, PAGE)) for key in keys),
                         key=lambda entry: parse_id(entry[1]), reverse=True)
    for key, entry_id in islice(newest, max(n, 0)):
        first[key] = as_str(entry_id)
    forwards = [_oldest_first(client, key, first[key]) for key in keys if key in first]
    yield from heapq.merge(*forwards, key=lambda entry: parse_id(entry[1]))


def _follow(client: Any, last: dict[str, str], emit: Any, stderr: TextIO) -> None:
    """Print new entries of the streams ``last`` (key -> last id printed) until
    interrupted, those read together in id order; reconnect with backoff."""
    backoff = Backoff(base=0.1, cap=5.0)
    failing = False
    what = ", ".join(last)
    while True:
        try:
            reply = read_after(client, last, PAGE, 1000)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if not failing:
                print(f"streamnb tail: reading {what} failed ({exc}); retrying", file=stderr)
                failing = True
            time.sleep(backoff.next_delay())
            continue
        if failing:
            print(f"streamnb tail: reading {what} again", file=stderr)
            failing = False
        backoff.reset()
        for stream, entries in reply:
            if entries:
                last[as_str(stream)] = as_str(entries[-1][0])
        for entry_id, fields in merge_by_id(entries for _stream, entries in reply):
            emit(entry_id, fields)


def tail(client: Any, keys: Sequence[str], *, dead: bool, count: int, follow: bool,
         as_json: bool, out: TextIO, positive: Any = None, stderr: TextIO | None = None) -> None:
    """Print the last ``count`` entries of the streams ``keys`` (one, or a sharded model's
    K, merged), then (``follow``) new ones."""
    def emit(entry_id: Any, fields: Any) -> None:
        out.write(render(entry_id, fields, dead, as_json, positive) + "\n")
        out.flush()

    # Following starts after each stream's newest entry when none of it is printed, else
    # after its last printed: nothing is missed nor printed twice.
    last = {}
    for key in keys:
        newest = client.xrevrange(key, count=1) if follow else []
        last[key] = as_str(newest[0][0]) if newest else "0-0"
    for stream, entry_id, fields in last_of_streams(client, keys, count):
        emit(entry_id, fields)
        last[stream] = as_str(entry_id)
    if follow:
        _follow(client, last, emit, stderr or sys.stderr)


def run(args: argparse.Namespace, env: Mapping[str, str]) -> int:
    """Print the model's entries (module docstring): exit 0, also on Ctrl-C and when the
    reader goes away (``| head``)."""
    model, client = model_client(args, env, client_name=f"streamnb-tail-{os.getpid()}")
    streams = [keys.dead if args.dead else keys.out for keys in shard_keys(client, model)]
    try:
        tail(client, streams, dead=args.dead, count=args.count,
             follow=args.follow, as_json=args.json, out=sys.stdout, positive=args.positive)
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # Python would report the pipe again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0

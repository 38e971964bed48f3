"""Where messages come from: mail files, maildirs, mbox files, JSON lines and an index of
labels, each message as an :class:`Outgoing` with its learn-once key (what ``streamnb
produce`` sends and ``streamnb forget`` unlearns; the rules are in workers/client/produce.py);
and the one message of a file that ``predict --snapshot`` and ``explain`` read
(:func:`read_message`).

>>> recs = list(iter_jsonl_lines(['{"text": "hi", "label": "ham"}', '', '{oops'], "f.jsonl"))
>>> recs[0].id, recs[0].fields["label"], recs[1].source, recs[1].error[:14]
('f.jsonl:1', 'ham', 'f.jsonl:3', 'not valid JSON')
"""

from __future__ import annotations

import csv
import json
import mailbox
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from streamnb.exceptions import MalformedMessage, SettingsError
from streamnb.features.payload import PAYLOAD_KINDS
from streamnb_workers.wire.codec import decode_input, encode_input
from streamnb_workers.wire.learn_keys import message_key

__all__ = ["IndexEntry", "Outgoing", "count_messages", "is_mbox", "iter_jsonl_lines",
           "iter_paths", "read_index", "read_message"]

_JSONL_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(slots=True)
class Outgoing:
    """One message to send: its id, and either raw mail bytes or a wire-format record."""

    id: str
    raw: bytes | None = None
    fields: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    #: Why this record cannot be sent (a bad JSON line), else None.
    error: str | None = None

    def encode(self, label: str | None = None, ts: float | None = None) -> bytes:
        """The msgpack map for the ``data`` field (index/flag label only if none is set),
        with the message's learn-once ``key`` (:meth:`key`)."""
        obj = dict(self.fields)
        if self.raw is not None:
            obj["raw"] = self.raw
        obj.setdefault("id", self.id)  # where it came from, for whoever reads :out
        key = self.key()
        if key is not None:
            obj["key"] = key
        if label is not None and obj.get("label") is None and "ref" not in obj:
            obj["label"] = label
        if ts is not None and obj.get("ts") is None:
            obj["ts"] = ts
        return msgpack.packb(obj, use_bin_type=True)


    def key(self) -> str | None:
        """The learn-once key the worker computes for this message (None: a record with
        no payload, or one the worker will refuse)."""
        if self.raw is not None:
            return message_key(self.raw, "raw", self.fields.get("key"))
        given = self.fields.get("key")
        if isinstance(given, str) and given:
            return given
        present = [k for k in PAYLOAD_KINDS if self.fields.get(k) is not None]
        if len(present) != 1:
            return None
        kind = present[0]
        try:  # the payload as the worker decodes it: what its key is made of
            wire = decode_input(msgpack.packb({kind: self.fields[kind]}, use_bin_type=True), "0-0")
        except (MalformedMessage, TypeError, ValueError):
            return None
        return message_key(wire.payload, kind)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    path: str
    label: str
    ts: float | None


# ---------------------------------------------------------------------------- index
def read_index(path: str | os.PathLike[str], flag: str = "--index") -> list[IndexEntry]:
    """Read an index TSV (header ``path label unix_time``; unix_time may be missing);
    ``flag``: the option that gave it, named in errors."""
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t"))
    except OSError as exc:
        raise SettingsError(f"{flag} {str(p)!r} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"{flag} {str(p)!r} is not UTF-8 text") from None
    if not rows or [c.strip().lower() for c in rows[0][:2]] != ["path", "label"]:
        raise SettingsError(
            f"{flag} {str(p)!r} must start with a header 'path<TAB>label[<TAB>unix_time]'")
    has_ts = len(rows[0]) > 2 and rows[0][2].strip().lower() == "unix_time"
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if not row or not any(row):
            continue
        if len(row) < 2 or not row[0] or not row[1]:
            raise SettingsError(f"{flag} {str(p)!r} line {n}: expected path<TAB>label, got {row!r}")
        ts = None
        if has_ts and len(row) > 2 and row[2].strip():
            try:
                ts = float(row[2])
            except ValueError:
                raise SettingsError(
                    f"{flag} {str(p)!r} line {n}: unix_time must be a number, got {row[2]!r}"
                ) from None
        out.append(IndexEntry(row[0], row[1], ts))
    return out


# -------------------------------------------------------------------------- sources
def _is_maildir(p: Path) -> bool:
    return (p / "cur").is_dir() or (p / "new").is_dir()


def is_mbox(data: bytes) -> bool:
    """An mbox holds several messages, each after a ``From `` line; a single message that
    starts with a ``From `` line (as the SpamAssassin corpus files do) is one mail."""
    return data.startswith(b"From ") and b"\nFrom " in data


def iter_jsonl_lines(lines: Iterable[str], name: str) -> Iterator[Outgoing]:
    """Records of a JSON-lines file; a bad line comes out with ``error`` set."""
    for n, line in enumerate(lines, start=1):
        line = line.strip()
        if not line:
            continue
        src = f"{name}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            yield Outgoing(id=src, source=src, error=f"not valid JSON ({exc.msg})")
            continue
        if not isinstance(obj, dict):
            yield Outgoing(id=src, source=src,
                           error=f"expected a JSON object, got {type(obj).__name__}")
            continue
        msg_id = obj.get("id")
        yield Outgoing(id=str(msg_id) if msg_id is not None else f"{name}:{n}",
                       fields=obj, source=f"{name}:{n}")


def _mbox_messages(p: Path, name: str) -> Iterator[Outgoing]:
    box = mailbox.mbox(str(p), create=False)
    try:
        for i, key in enumerate(box.iterkeys()):
            yield Outgoing(id=f"{name}#{i}", raw=box.get_bytes(key), source=f"{name}#{i}")
    finally:
        box.close()


def _maildir_messages(p: Path, name: str) -> Iterator[Outgoing]:
    for sub in ("cur", "new"):
        d = p / sub
        if d.is_dir():
            for f in sorted(d.iterdir()):
                if f.is_file() and not f.name.startswith("."):
                    rel = f"{name}/{sub}/{f.name}"
                    yield Outgoing(id=rel, raw=f.read_bytes(), source=rel)


def _file_messages(p: Path, name: str) -> Iterator[Outgoing]:
    if p.suffix.lower() in _JSONL_SUFFIXES:
        with p.open(encoding="utf-8") as f:
            yield from iter_jsonl_lines(f, name)
    else:
        data = p.read_bytes()
        if is_mbox(data):
            yield from _mbox_messages(p, name)
        else:
            yield Outgoing(id=name, raw=data, source=name)


def iter_paths(paths: Iterable[str | os.PathLike[str]], base: Path | None = None) -> Iterator[Outgoing]:
    """Every message under ``paths`` (see the module docstring); ids relative to ``base``
    when given (the index's directory), else to each PATH's parent."""
    for raw_path in paths:
        p = Path(raw_path)
        if not p.exists():
            raise SettingsError(f"{str(p)!r} does not exist")

        def rel(q: Path, root: Path = p) -> str:
            anchor = base if base is not None else root.parent
            try:
                return q.resolve().relative_to(anchor.resolve()).as_posix()
            except ValueError:
                return q.as_posix()

        if p.is_dir():
            if _is_maildir(p):
                yield from _maildir_messages(p, rel(p))
                continue
            for dirpath, dirnames, filenames in os.walk(p):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                d = Path(dirpath)
                if d != p and _is_maildir(d):
                    dirnames[:] = []
                    yield from _maildir_messages(d, rel(d))
                    continue
                for fn in sorted(filenames):
                    if not fn.startswith("."):
                        yield from _file_messages(d / fn, rel(d / fn))
        else:
            yield from _file_messages(p, rel(p))



def count_messages(paths: Iterable[str | os.PathLike[str]], base: Path | None = None) -> int:
    """How many messages :func:`iter_paths` yields (the files are read, nothing kept)."""
    return sum(1 for _ in iter_paths(paths, base))


def read_message(path: str | os.PathLike[str]) -> Any:
    """An input message from a file: a .json record (wire keys) or raw mail bytes."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise SettingsError(f"{str(p)!r} cannot be read: {exc.strerror}") from None
    if p.suffix.lower() == ".json":
        try:
            obj = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SettingsError(f"{str(p)!r} is not a JSON record: {exc}") from None
        if not isinstance(obj, dict):
            raise SettingsError(f"{str(p)!r} must hold a JSON object with one payload key")
        packed = msgpack.packb({k: v for k, v in obj.items() if k != "label"}, use_bin_type=True)
    else:
        packed = encode_input("raw", data, id=p.name)
    return decode_input(packed, p.name)

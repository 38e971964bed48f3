"""``streamnb produce``: send mail files, maildirs, mbox files and JSON-lines records.

What each PATH is, decided in this order:

- a directory with ``cur/`` or ``new/`` inside: a **maildir** (messages of cur/ and new/);
- any other directory: walked recursively in sorted order, each file handled as below
  (hidden files are skipped);
- a file named ``*.jsonl`` / ``*.ndjson``: **JSON lines**, one wire-format record per line
  (``{"text": "...", "label": "spam"}``, ``{"x": [0.1, 2.0]}``, ``{"ref": "m1", "label":
  "ham"}``, a ``raw`` mail as a string); each is validated before it is sent;
- a file that starts with a ``From `` line and has more of them: an **mbox**, one message
  per entry (a single message with a leading ``From `` line is one mail);
- any other file: one RFC 822 message (``.eml``), sent as ``raw`` bytes.

Labels: ``--label L`` labels every message (refused at once if the model declares its
classes and L is not one of them; a record or index label outside them is skipped); ``--index index.tsv`` (columns ``path``,
``label``, ``unix_time``; the SpamAssassin corpus format) labels the files it lists (paths
relative to the index's directory) and gives their ``ts``. With ``--index`` and no PATH, every
file of the index is sent, in index order. Message ids are the file's path relative to the
index or to the PATH given (``mbox#3`` for the 4th message of an mbox, ``file:12`` for line
12 of a JSON-lines file, unless the record has its own ``id``).

Mail (every source but JSON lines) must look like mail: a file that is empty, holds NUL
bytes in its header block or does not start with a header line (or an mbox ``From `` line)
is skipped with the reason. A mail over ``max_bytes`` (``--max-bytes``, 1 MiB) is cut
before it is sent, as a worker would cut it (:func:`streamnb.features.truncate.cut_mail`:
headers kept, at a MIME boundary), so no entry is much larger than the limit. A directory
that holds no file is an error (nothing is sent).

Entries are sent with pipelined XADDs in chunks (``--chunk``). A progress line is drawn on
stderr only when stderr is a terminal.

>>> recs = list(iter_jsonl_lines(['{"text": "hi", "label": "ham"}', '', '{oops'], "f.jsonl"))
>>> recs[0].id, recs[0].fields["label"], recs[1].source, recs[1].error[:14]
('f.jsonl:1', 'ham', 'f.jsonl:3', 'not valid JSON')
"""

from __future__ import annotations

import csv
import json
import mailbox
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import msgpack

from streamnb.constants import DATA_FIELD, DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_PRODUCE_CHUNK
from streamnb.exceptions import MalformedMessage, SettingsError
from streamnb.features.truncate import cut_mail
from streamnb_workers.codec import decode_input
from streamnb_workers.keys import ModelKeys
from streamnb_workers.produce_checks import (
    check_class,
    check_not_empty,
    declared_classes,
    not_mail,
)
from streamnb_workers.replies import as_str, entry_field

__all__ = [
    "IndexEntry",
    "Outgoing",
    "ProduceReport",
    "iter_jsonl_lines",
    "iter_paths",
    "produce",
    "read_index",
]

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
        """The msgpack map for the ``data`` field (index/flag label only if none is set)."""
        obj = dict(self.fields)
        if self.raw is not None:
            obj["raw"] = self.raw
        obj.setdefault("id", self.id)
        if label is not None and obj.get("label") is None and "ref" not in obj:
            obj["label"] = label
        if ts is not None and obj.get("ts") is None:
            obj["ts"] = ts
        return msgpack.packb(obj, use_bin_type=True)


@dataclass(frozen=True, slots=True)
class IndexEntry:
    path: str
    label: str
    ts: float | None


@dataclass(slots=True)
class ProduceReport:
    sent: int = 0
    skipped: int = 0
    labelled: int = 0
    problems: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- index
def read_index(path: str | os.PathLike[str]) -> list[IndexEntry]:
    """Read an index TSV (header ``path label unix_time``; unix_time may be missing)."""
    p = Path(path)
    try:
        with p.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t"))
    except OSError as exc:
        raise SettingsError(f"--index {str(p)!r} cannot be read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"--index {str(p)!r} is not UTF-8 text") from None
    if not rows or [c.strip().lower() for c in rows[0][:2]] != ["path", "label"]:
        raise SettingsError(
            f"--index {str(p)!r} must start with a header 'path<TAB>label[<TAB>unix_time]'")
    has_ts = len(rows[0]) > 2 and rows[0][2].strip().lower() == "unix_time"
    out = []
    for n, row in enumerate(rows[1:], start=2):
        if not row or not any(row):
            continue
        if len(row) < 2 or not row[0] or not row[1]:
            raise SettingsError(f"--index {str(p)!r} line {n}: expected path<TAB>label, got {row!r}")
        ts = None
        if has_ts and len(row) > 2 and row[2].strip():
            try:
                ts = float(row[2])
            except ValueError:
                raise SettingsError(
                    f"--index {str(p)!r} line {n}: unix_time must be a number, got {row[2]!r}"
                ) from None
        out.append(IndexEntry(row[0], row[1], ts))
    return out


# -------------------------------------------------------------------------- sources
def _is_maildir(p: Path) -> bool:
    return (p / "cur").is_dir() or (p / "new").is_dir()


def _is_mbox(data: bytes) -> bool:
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
        if _is_mbox(data):
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


# ---------------------------------------------------------------------------- sending
class Progress:
    """A one-line progress display on a terminal; silent otherwise."""

    def __init__(self, stream: TextIO, total: int | None, enabled: bool | None = None) -> None:
        self.stream = stream
        self.total = total
        self.enabled = stream.isatty() if enabled is None else enabled
        self.start = time.monotonic()
        self._last = 0.0

    def update(self, n: int, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < 0.1:
            return
        self._last = now
        rate = n / max(now - self.start, 1e-9)
        if self.total:
            width = 30
            done = int(width * n / self.total)
            bar = "#" * done + "-" * (width - done)
            text = f"\r[{bar}] {n}/{self.total} {rate:,.0f} msg/s"
        else:
            text = f"\r{n} sent, {rate:,.0f} msg/s"
        self.stream.write(text)
        self.stream.flush()

    def close(self, n: int) -> None:
        if self.enabled:
            self.update(n, force=True)
            self.stream.write("\n")
            self.stream.flush()


def _validate(data: bytes, entry: str) -> Any:
    return decode_input(data, entry)


def produce(
    client: Any,
    model: str,
    paths: list[str],
    *,
    label: str | None = None,
    index: str | None = None,
    chunk: int = DEFAULT_PRODUCE_CHUNK,
    progress: bool | None = None,
    stderr: TextIO | None = None,
    max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> ProduceReport:
    """Send messages to ``streamnb:{model}:in``; returns what was sent and skipped.

    A message that fails validation (bad JSON line, bad record) is skipped with a warning
    on stderr; everything else is sent.
    """
    if label is not None and index is not None:
        raise SettingsError("give --label or --index, not both")
    if chunk < 1:
        raise SettingsError(f"--chunk must be >= 1, got {chunk}")
    stderr = stderr if stderr is not None else sys.stderr
    keys = ModelKeys(model)
    classes = declared_classes(client, model)
    if classes is not None and label is not None and label not in classes:
        raise SettingsError(f"--label {label!r} is not one of model {model!r}'s classes: "
                            f"{', '.join(classes)}")
    by_path: dict[str, IndexEntry] = {}
    base: Path | None = None
    total: int | None = None
    if index is not None:
        entries = read_index(index)
        base = Path(index).parent
        by_path = {Path(e.path).as_posix(): e for e in entries}
        if not paths:
            paths = [str(base / e.path) for e in entries]
            total = len(paths)
    if not paths:
        raise SettingsError("nothing to send: give one or more PATHs (or --index index.tsv)")
    for p in paths:
        check_not_empty(Path(p))

    report = ProduceReport()
    bar = Progress(stderr, total, progress)
    pipe = client.pipeline(transaction=False)
    pending = 0

    def flush() -> None:
        nonlocal pending
        if pending:
            pipe.execute()
            report.sent += pending
            pending = 0
            bar.update(report.sent)

    try:
        for out in iter_paths(paths, base):
            entry = by_path.get(out.id)
            msg_label = label if entry is None else entry.label
            try:
                if out.error is not None:
                    raise ValueError(out.error)
                if out.raw is not None:
                    reason = not_mail(out.raw)
                    if reason is not None:
                        raise ValueError(reason)
                    out.raw = cut_mail(out.raw, max_bytes)
                data = out.encode(label=msg_label, ts=entry.ts if entry else None)
                check_class(_validate(data, out.id).label, classes)
            except (MalformedMessage, TypeError, ValueError) as exc:
                report.skipped += 1
                report.problems.append(f"{out.source}: {exc}")
                print(f"streamnb produce: skipped {out.source}: {exc}", file=stderr)
                continue
            if msg_label is not None or out.fields.get("label") is not None:
                report.labelled += 1
            pipe.xadd(keys.input, {DATA_FIELD: data})
            pending += 1
            if pending >= chunk:
                flush()
        flush()
    finally:
        bar.close(report.sent)
    return report


# ---------------------------------------------------------------------------- predict
def send_and_wait(client: Any, model: str, path: str, timeout: float = 30.0,
                  max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
    """Send one file unlabelled and wait for its prediction in ``:out``; None on timeout.

    The message gets a fresh id; predictions are looked for after the input entry's id
    (a prediction is always written after its input).
    """
    import uuid

    from streamnb_workers.codec import decode_output

    keys = ModelKeys(model)
    outs = list(iter_paths([path]))
    if len(outs) != 1:
        raise SettingsError(f"predict needs one message, {path!r} holds {len(outs)}")
    out = outs[0]
    if out.error:
        raise SettingsError(f"{out.source}: {out.error}")
    out.fields.pop("label", None)
    if out.raw is not None:
        reason = not_mail(out.raw)
        if reason is not None:
            raise SettingsError(f"{path!r} is {reason}")
        out.raw = cut_mail(out.raw, max_bytes)
    out.id = f"predict-{uuid.uuid4().hex}"
    out.fields["id"] = out.id
    data = out.encode()
    _validate(data, out.id)
    entry = client.xadd(keys.input, {DATA_FIELD: data})
    last = as_str(entry)
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        block = max(1, int(min(left, 1.0) * 1000))
        reply = client.xread({keys.out: last}, count=100, block=block)
        for _stream, entries in reply or []:
            for entry_id, fields in entries:
                last = as_str(entry_id)
                raw = entry_field(fields, DATA_FIELD)
                try:
                    result = decode_output(raw)
                except MalformedMessage:
                    continue
                if result.get("id") == out.id:
                    return result
    return None

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
- any other file: one RFC 822 message (``.eml``), sent as ``raw`` bytes;
- ``-`` (alone): one mail read from stdin (:func:`produce_stdin`), for Sieve, procmail and
  MTA pipes.

Labels: ``--label L`` labels every message (refused at once if the model declares its
classes and L is not one of them; a record or index label outside them is skipped); ``--index index.tsv`` (columns ``path``,
``label``, ``unix_time``; the SpamAssassin corpus format) labels the files it lists (paths
relative to the index's directory) and gives their ``ts``. With ``--index`` and no PATH, every
file of the index is sent, in index order. Message ids are the file's path relative to the
index or to the PATH given (``mbox#3`` for the 4th message of an mbox, ``file:12`` for line
12 of a JSON-lines file, unless the record has its own ``id``); each message also carries
its learn-once ``key`` (workers/wire/learn_keys.py: the record's own ``key``, the mail's
Message-ID, else a hash), which the worker learns at most once.

Before each chunk is sent, the keys of its labelled messages are looked up in the model's
learnt keys: a message already learnt with its label is not sent again (counted in
``ProduceReport.already_learnt``), so running ``produce`` again after an interruption
sends only what was not learnt, and the worker's own check makes the rest learnt once. A
message whose key was learnt with another label is sent: the worker relearns it (a
correction; counted in ``ProduceReport.relearnt`` by the old and the new label).

Mail (every source but JSON lines) must look like mail: a file that is empty, holds NUL
bytes in its header block or does not start with a header line (or an mbox ``From `` line)
is skipped with the reason. A mail over ``max_bytes`` (``--max-bytes``, 1 MiB) is cut
before it is sent, as a worker would cut it (:func:`streamnb.features.truncate.cut_mail`:
headers kept, at a MIME boundary), so no entry is much larger than the limit. A directory
that holds no file is an error (nothing is sent).

A model stored with K shards (``streamnb worker --shards K``) gets each message in the
``:in`` of its shard (workers/replication/shards.py: by the record's ``ref``, else its ``id``), and the
learnt keys looked up are that shard's.

Entries are sent with pipelined XADDs in chunks (``--chunk``). A progress line is drawn on
stderr only when stderr is a terminal. Reading the PATHs is workers/client/sources.py.
"""

from __future__ import annotations

import io
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from streamnb.exceptions import MalformedMessage, SettingsError
from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb.features.truncate import cut_mail
from streamnb_workers.client.produce_checks import (
    NotMail,
    check_class,
    check_not_empty,
    declared_classes,
    not_mail,
    stored_training,
)
from streamnb_workers.client.shard_streams import router_of
from streamnb_workers.client.sources import (
    IndexEntry,
    Outgoing,
    count_messages,
    iter_paths,
    read_index,
)
from streamnb_workers.defaults import DEFAULT_PRODUCE_CHUNK
from streamnb_workers.store.keys import ModelKeys, source_epochs_key
from streamnb_workers.store.training import learning_stream
from streamnb_workers.wire.codec import DATA_FIELD, decode_input
from streamnb_workers.wire.learn_keys import decode_record, known_keys, record_teacher
from streamnb_workers.wire.learn_sources import AUTOLEARN, is_stale
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.replies import as_str, entry_field

__all__ = ["ProduceInterrupted", "ProduceReport", "check_paths", "produce", "produce_stdin",
           "send_and_wait"]


@dataclass(slots=True)
class ProduceReport:
    """What ``produce`` did: messages sent (of ``total`` found), labelled among them,
    skipped as invalid, labelled messages not sent because their key was learnt with
    their label, and those sent to be relearnt (their key learnt with another label)."""

    sent: int = 0
    skipped: int = 0
    labelled: int = 0
    problems: list[str] = field(default_factory=list)
    already_learnt: int = 0
    total: int = 0
    #: The model's statistics shards (the ``:in`` streams sent to).
    shards: int = 1
    #: (label learnt before, label sent) -> messages sent to be relearnt so.
    relearnt: dict[tuple[Any, Any], int] = field(default_factory=dict)

    @property
    def relearnt_summary(self) -> str:
        """``N relearnt (spam -> ham)``, or ``N relearnt (2 spam -> ham, 1 ham -> spam)``;
        "" when none was."""
        if not self.relearnt:
            return ""
        total = sum(self.relearnt.values())
        pairs = [f"{old} -> {new}" for old, new in self.relearnt]
        if len(pairs) > 1:
            pairs = [f"{n} {p}" for p, n in zip(pairs, self.relearnt.values(), strict=True)]
        return f"{total} relearnt ({', '.join(pairs)})"


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


class ProduceInterrupted(Exception):
    """``produce`` stopped part way (an error or Ctrl-C): ``report`` says what was sent;
    the cause is chained."""

    def __init__(self, report: ProduceReport) -> None:
        super().__init__(f"sent {report.sent} of {report.total}")
        self.report = report


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
    messages: list[Outgoing] | None = None,
    source: str | None = None,
) -> ProduceReport:
    """Send messages to ``streamnb:{model}:in`` (a sharded model: each to its shard's;
    labelled ones to ``:train`` for a model stored with ``training: train``); returns what was sent, skipped and found already learnt.

    A message that fails validation (bad JSON line, bad record) is skipped with a warning
    on stderr; a labelled message whose key the model has learnt is not sent; everything
    else is sent. An error or Ctrl-C part way raises :class:`ProduceInterrupted` (what
    was sent until then) from it. ``messages`` (instead of ``paths``): the messages
    themselves, as :func:`produce_stdin` gives the one read from stdin. ``source``: the
    source the labels teach under, for the messages that do not name their own.
    """
    if label is not None and index is not None:
        raise SettingsError("give --label or --index, not both")
    if chunk < 1:
        raise SettingsError(f"--chunk must be >= 1, got {chunk}")
    stderr = stderr if stderr is not None else sys.stderr
    router = router_of(client, model)
    k = len(router.keys)
    classes = declared_classes(client, model)
    training = stored_training(client, model)
    if classes is not None and label is not None and label not in classes:
        raise SettingsError(f"--label {label!r} is not one of model {model!r}'s classes: "
                            f"{', '.join(classes)}")
    by_path: dict[str, IndexEntry] = {}
    base: Path | None = None
    if index is not None:
        entries = read_index(index)
        base = Path(index).parent
        by_path = {Path(e.path).as_posix(): e for e in entries}
        if not paths:
            paths = [str(base / e.path) for e in entries]
    if messages is None:
        check_paths(paths)
    report = ProduceReport(shards=k)
    bar = Progress(stderr, None, progress)
    # (data, key if labelled, label, the keys of the shard it goes to)
    batch: list[tuple[bytes, str | None, Any, ModelKeys]] = []

    def flush() -> None:
        if not batch:
            return
        known = learnt_in_shards(client, [(keys, key) for _, key, _, keys in batch
                                          if key is not None])
        pipe = client.pipeline(transaction=False)
        n = n_labelled = 0
        for data, key, msg_label, keys in batch:
            labelled = msg_label is not None
            if key is not None and (keys.name, key) in known:
                old, taught_by = known[keys.name, key]
                if old == msg_label and type(old) is type(msg_label) and taught_by != AUTOLEARN:
                    report.already_learnt += 1
                    continue
                pair = (old, msg_label)
                report.relearnt[pair] = report.relearnt.get(pair, 0) + 1
            pipe.xadd(learning_stream(keys, training) if labelled else keys.input,
                      {DATA_FIELD: data})
            n += 1
            n_labelled += labelled
        if n:
            pipe.execute()
        report.sent += n
        report.labelled += n_labelled
        batch.clear()
        bar.update(report.sent + report.already_learnt + report.skipped)

    try:
        report.total = bar.total = (count_messages(paths, base) if messages is None
                                    else len(messages))
        for out in iter_paths(paths, base) if messages is None else messages:
            entry = by_path.get(out.id)
            msg_label = label if entry is None else entry.label
            try:
                if out.error is not None:
                    raise ValueError(out.error)
                if out.raw is not None:
                    reason = not_mail(out.raw)
                    if reason is not None:
                        raise ValueError(reason)
                    if len(out.raw) > max_bytes:  # keyed as the whole mail, then cut
                        out.fields.setdefault("key", out.key())
                        out.raw = cut_mail(out.raw, max_bytes)
                if source is not None:
                    out.fields.setdefault("source", source)
                data = out.encode(label=msg_label, ts=entry.ts if entry else None)
                msg = decode_input(data, out.id)
                check_class(msg.label, classes)
            except (MalformedMessage, TypeError, ValueError) as exc:
                report.skipped += 1
                report.problems.append(f"{out.source}: {exc}")
                print(f"streamnb produce: skipped {out.source}: {exc}", file=stderr)
                continue
            labelled = msg.label is not None
            shard = router.keys_for(msg.ref if msg.ref is not None else msg.id)
            batch.append((data, msg.key if labelled else None, msg.label, shard))
            if len(batch) >= chunk:
                flush()
        flush()
    except (Exception, KeyboardInterrupt) as exc:
        raise ProduceInterrupted(report) from exc
    finally:
        bar.close(report.sent)
    return report


def check_paths(paths: list[str]) -> None:
    """SettingsError unless there are ``paths``, each exists and no directory is empty
    (:class:`EmptySource`)."""
    if not paths:
        raise SettingsError("nothing to send: give one or more PATHs (or --index index.tsv)")
    for p in paths:
        check_not_empty(Path(p))
    missing = next((p for p in paths if not Path(p).exists()), None)
    if missing is not None:
        raise SettingsError(f"{missing!r} does not exist")


def produce_stdin(client: Any, model: str, raw: bytes, *, label: str | None = None,
                  max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                  source: str | None = None, id_prefix: str = "stdin") -> ProduceReport:
    """Send the one mail ``raw`` read from stdin (``streamnb produce -``), as :func:`produce`
    sends a mail file: not sent when its key was learnt, cut over ``max_bytes``. Its id is
    ``stdin:`` (``id_prefix:``: ``spamd:`` for a TELL) and its learn-once key, so that the
    same mail goes to the same shard each time. :class:`NotMail` when ``raw`` is not mail (or is refused as a record); a Redis
    error part way raises :class:`ProduceInterrupted` from it."""
    out = Outgoing(id="-", raw=raw, source="-")
    reason = not_mail(raw)
    if reason is not None:
        raise NotMail(reason)
    out.id = f"{id_prefix}:{out.key()}"
    quiet = io.StringIO()  # the one reason a mail is skipped is the caller's line
    report = produce(client, model, [], label=label, stderr=quiet, progress=False,
                     max_bytes=max_bytes, messages=[out], source=source)
    if report.skipped:
        raise NotMail(report.problems[0].removeprefix("-: "))
    return report


def learnt_in_shards(client: Any, wanted: list[tuple[ModelKeys, str]]
                     ) -> dict[tuple[str, str], Any]:
    """Which of the learn-once keys ``wanted`` (the shard's keys, the key) the shard has
    learnt, as ``(shard name, key)`` -> (the label learnt, the source that taught it): one
    look-up per shard of its keys (and of the epochs of their sources: a key a forgotten source
    taught is not learnt any more)."""
    by_shard: dict[ModelKeys, list[str]] = {}
    for keys, key in wanted:
        by_shard.setdefault(keys, []).append(key)
    known: dict[tuple[str, str], Any] = {}
    for keys, learn_keys in by_shard.items():
        found = {k: r for k, r in known_keys(client, keys.learnt_keys, learn_keys).items()
                 if r is not None}
        teachers = {k: record_teacher(r) for k, r in found.items()}
        named = sorted({t[0] for t in teachers.values()})
        epochs = dict(zip(named, client.hmget(source_epochs_key(keys), named), strict=True)) \
            if named else {}
        epochs = {s: int(as_str(v)) for s, v in epochs.items() if v is not None}
        known.update(((keys.name, key), (decode_record(record)[0], teachers[key][0]))
                     for key, record in found.items() if not is_stale(teachers[key], epochs))
    return known


# ---------------------------------------------------------------------------- predict
def send_and_wait(client: Any, model: str, path: str, timeout: float = 30.0,
                  max_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> dict[str, Any] | None:
    """Send one file unlabelled and wait for its prediction in ``:out``; None on timeout.

    The message gets a fresh id (and goes to its shard's ``:in`` on a sharded model, its
    prediction to that shard's ``:out``); predictions are looked for after the last one
    there before it was sent (not after the input's entry id: ids of two streams are not
    ordered within a millisecond, so a prediction may have a lower one).
    """
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
    keys = router_of(client, model).keys_for(out.id)
    before = client.xrevrange(keys.out, count=1)
    last = as_str(before[0][0]) if before else "0-0"
    client.xadd(keys.input, {DATA_FIELD: data})
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

"""Unlearn messages (``streamnb forget``): mail files, maildirs, mbox files, JSON lines
or a mail on stdin, each by the learn-once key ``produce`` gives it
(workers/wire/learn_keys.py).

A message whose key the model has learnt is sent as a forget (``forget: true``, its key
and its payload: the worker subtracts its row with the label and weight recorded for the
key, once); one whose key is not learnt (never, forgotten already, or dropped beyond
``learnt_keys_max``) is reported and not sent: forgetting it would change nothing.

On a model stored with K shards (workers/replication/shards.py) the key is looked up in every shard's
learnt keys, and the forget goes to the ``:in`` of the shard that learnt it (of each, if
the same message was learnt by several under different ids): to its ``:train`` for a
model stored with ``training: train`` (workers/store/training.py).

A class learnt by mistake is removed whole (:func:`forget_class`, ``streamnb forget
--class LABEL``): one entry ``{"forget_class": LABEL}`` on the ``:in`` (or ``:train``) of
every shard, whose commit logs the removal for every replica and releases the class's
learn-once keys (docs/worker.md, "Removing a class"). Refused (one line, exit 2): a class
the model does not hold, a declared class (``--classes``), and without ``force`` a class
that holds weight.

What a source taught is taken out whole (:func:`forget_source`, ``streamnb forget
--source NAME``): a ``forget`` entry written straight to every shard's ``:log`` and the
source's next epoch in ``{M}:epochs``, by a user that may write the log (the admin); a
user that may not (the trainer, the producer: deploy/redis/users.acl) sends it instead as
an entry ``{"forget_source": NAME}`` where it sends labels (:func:`send_forget_source`),
and the workers' commit writes both.
"""

from __future__ import annotations

import mailbox
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO, TextIO

import msgpack
import redis

from streamnb.exceptions import MalformedMessage, SettingsError
from streamnb_workers.client.produce_checks import declared_classes, stored_training
from streamnb_workers.client.shard_streams import shard_keys
from streamnb_workers.client.sources import Outgoing, is_mbox, iter_paths
from streamnb_workers.replication.log_entries import encode_forget_source
from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.keys import ModelKeys, source_epochs_key
from streamnb_workers.store.training import learning_stream
from streamnb_workers.wire.codec import DATA_FIELD, decode_input
from streamnb_workers.wire.learn_keys import known_keys
from streamnb_workers.wire.learn_sources import check_source
from streamnb_workers.wire.replies import as_str

__all__ = ["ClassRemoval", "ForgetReport", "forget", "forget_class", "forget_source", "iter_sources",
           "send_forget_source", "source_epochs"]


@dataclass(slots=True)
class ForgetReport:
    """Messages found, forgets sent, messages whose key is not learnt, and ones refused."""

    total: int = 0
    sent: int = 0
    not_learnt: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: The model's statistics shards (the ``:in`` streams sent to).
    shards: int = 1


def _stdin_messages(stream: BinaryIO) -> Iterator[Outgoing]:
    data = stream.read()
    if is_mbox(data):
        with tempfile.NamedTemporaryFile(suffix=".mbox") as tmp:
            tmp.write(data)
            tmp.flush()
            box = mailbox.mbox(tmp.name, create=False)
            try:
                for i, key in enumerate(box.iterkeys()):
                    yield Outgoing(id=f"-#{i}", raw=box.get_bytes(key), source=f"-#{i}")
            finally:
                box.close()
    else:
        yield Outgoing(id="-", raw=data, source="-")


def iter_sources(paths: list[str], stdin: BinaryIO | None = None) -> Iterator[Outgoing]:
    """The messages of ``paths`` as ``produce`` reads them; ``-`` is a mail (or an mbox)
    on stdin."""
    for p in paths:
        if p == "-":
            yield from _stdin_messages(stdin if stdin is not None else sys.stdin.buffer)
        else:
            yield from iter_paths([p])


def _forget_data(out: Outgoing, key: str) -> bytes:
    """The forget entry of ``out``: its payload and key, no label."""
    obj: dict[str, Any] = {k: v for k, v in out.fields.items() if k not in ("label", "weight")}
    if out.raw is not None:
        obj["raw"] = out.raw
    obj.update(forget=True, key=key, id=obj.get("id", out.id))
    return msgpack.packb(obj, use_bin_type=True)


def learnt_where(client: Any, shards: list[ModelKeys],
                 keys: list[str]) -> dict[str, list[ModelKeys]]:
    """The shards (of ``shards``) that have learnt each of the learn-once ``keys``."""
    where: dict[str, list[ModelKeys]] = {}
    for shard in shards:
        known = known_keys(client, shard.learnt_keys, keys)
        for key in keys:
            if known.get(key) is not None:
                where.setdefault(key, []).append(shard)
    return where


def forget(client: Any, model: str, paths: list[str], *, stdin: BinaryIO | None = None,
           stderr: TextIO | None = None, chunk: int = 200) -> ForgetReport:
    """Send a forget for every message of ``paths`` whose key ``model`` has learnt."""
    if not paths:
        raise SettingsError("nothing to forget: give one or more FILE, DIR, MBOX or -")
    stderr = stderr if stderr is not None else sys.stderr
    shards = shard_keys(client, model)
    training = stored_training(client, model)
    report = ForgetReport(shards=len(shards))
    batch: list[tuple[Outgoing, str]] = []

    def flush() -> None:
        learnt_by = learnt_where(client, shards, [key for _, key in batch])
        pipe = client.pipeline(transaction=False)
        n = 0
        for out, key in batch:
            if not learnt_by.get(key):
                report.not_learnt.append(out.source)
                print(f"streamnb forget: {out.source}: not learnt (key {key}): nothing to "
                      "forget", file=stderr)
                continue
            for keys in learnt_by[key]:
                pipe.xadd(learning_stream(keys, training), {DATA_FIELD: _forget_data(out, key)})
            n += 1
        if n:
            pipe.execute()
        report.sent += n
        batch.clear()

    for out in iter_sources(paths, stdin):
        report.total += 1
        key = None if out.error else out.key()
        if key is not None:
            try:
                decode_input(_forget_data(out, key), out.id)
            except MalformedMessage as exc:
                key, out.error = None, str(exc)
        if key is None:
            report.skipped.append(out.source)
            print(f"streamnb forget: skipped {out.source}: {out.error or 'no payload'}",
                  file=stderr)
            continue
        batch.append((out, key))
        if len(batch) >= chunk:
            flush()
    if batch:
        flush()
    return report


def forget_source(client: Any, model: str, source: str) -> list[str]:
    """Take out everything ``source`` taught ``model`` (each of its shards): a ``forget``
    entry in each shard's ``:log``, which every worker applies in log order, and the
    source's next epoch in ``{M}:epochs``, in one transaction per shard. Returns the log
    entry ids. What the source taught after this is kept."""
    check_source(source)
    entries = []
    for keys in shard_keys(client, model):
        with client.pipeline(transaction=True) as pipe:
            pipe.hincrby(source_epochs_key(keys), source, 1)
            pipe.xadd(keys.log, {DATA_FIELD: encode_forget_source(source)})
            entries.append(as_str(pipe.execute()[1]))
    return entries


def send_forget_source(client: Any, model: str, source: str) -> list[str]:
    """Send the forget of ``source`` as an entry ``{"forget_source": NAME}`` to every
    shard's ``:in`` (``:train`` for a model stored with ``training: train``): what a user
    that may not write the log (the trainer) does. The workers' commit of that entry
    logs the forget and counts the epoch up, in stream order. Returns the entry ids."""
    check_source(source)
    shards = shard_keys(client, model)
    training = stored_training(client, model)
    pipe = client.pipeline(transaction=False)
    for keys in shards:
        pipe.xadd(learning_stream(keys, training),
                  {DATA_FIELD: msgpack.packb({"forget_source": source}, use_bin_type=True)})
    return [as_str(i) for i in pipe.execute()]


def source_epochs(client: Any, keys: ModelKeys, sources: list[str]) -> dict[str, int]:
    """The current epoch of each of ``sources`` in the shard ``keys`` (0: never forgotten)."""
    if not sources:
        return {}
    values = client.hmget(source_epochs_key(keys), sources)
    return {s: int(as_str(v)) for s, v in zip(sources, values, strict=True) if v is not None}


@dataclass(slots=True)
class ClassRemoval:
    """A class removal sent: the class (as the model holds it), the weight it held (None:
    not read, left to the workers), and the model's statistics shards (the ``:in``
    streams sent to)."""

    label: Any
    weight: float | None
    shards: int = 1


def forget_class(client: Any, model: str, label: str, *, force: bool = False) -> ClassRemoval:
    """Send the removal of class ``label`` (matched by its text, so ``3`` names an int
    class 3) to every shard of ``model``; SettingsError (one line) if the class is not
    the model's, is declared, or holds weight without ``force``. A user that may not read
    the model (the trainer) sends it unchecked but for the declared classes: the workers
    then refuse a class that holds weight without ``force`` (a dead letter
    ``class_holds_weight``) and remove nothing for a class the model does not hold."""
    if client.hmget(ModelKeys(model).config, ["kind"])[0] is None:
        raise SettingsError(f"model {model!r} has no config in Redis (no worker has served it)")
    declared = declared_classes(client, model)
    if declared is not None and label in declared:
        raise SettingsError(
            f"{label!r} is a declared class of model {model!r} ({', '.join(declared)}): "
            "it is not removed; forget the messages learnt under it instead")
    try:
        current, _ = load_model(client, model)
    except redis.exceptions.NoPermissionError:
        current = None  # (checked by the workers)
    cls: Any = label
    weight = None
    if current is not None:
        labels = current.stats["classes"].labels
        found = [c for c in labels if str(c) == label]
        if not found:
            shown = ", ".join(map(str, labels)) or "none yet"
            raise SettingsError(f"{label!r} is not a class of model {model!r} (classes: {shown})")
        cls = found[0]
        weight = float(current.stats["classes"].counts[labels.index(cls)])
        if weight > 0 and not force:
            raise SettingsError(f"class {label!r} of model {model!r} holds weight {weight:g}: "
                                "add --force to remove it with everything learnt under it")
    shards = shard_keys(client, model)
    training = stored_training(client, model)
    entry = msgpack.packb({"forget_class": cls, "force": bool(force)}, use_bin_type=True)
    pipe = client.pipeline(transaction=False)
    for keys in shards:
        pipe.xadd(learning_stream(keys, training), {DATA_FIELD: entry})
    pipe.execute()
    return ClassRemoval(cls, weight, len(shards))

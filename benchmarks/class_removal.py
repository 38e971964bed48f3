"""redis-server's time in the commit script that removes a class (``streamnb forget
--class``, docs/worker.md "Removing a class"): the script scans ``{M}:keys`` with
``HSCAN`` for the records of the class, deletes them, and appends the drop entry, while
Redis serves nothing else. A private redis-server; ``{M}:keys`` and ``{M}:keyorder``
filled with ``--keys`` records of 36-character keys (a typical Message-ID), of which
``--typos`` hold the removed class and the rest spam or ham; the script's own time read
from ``INFO commandstats``. Then the same for the script of ``streamnb forget --source
NAME --since TIME`` (workers/store/scripts/forget_since.lua), which scans the same keys:
half of them NAME's, half of those learnt since TIME (released), the rest rewritten.

    python -m benchmarks.class_removal [--keys 250000,1000000] [--typos 100]
"""

from __future__ import annotations

import argparse
import sys

from benchmarks._common import RedisServer, command_stats, format_table
from streamnb_workers.replication.replica import encode_class_drop
from streamnb_workers.store.commit import CommitRequest, commit_batch
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.wire.learn_keys import encode_record, record_prefix

K = ModelKeys("bench")


def fill(client, n: int, typos: int) -> None:
    """``n`` learnt keys, ``typos`` of them under ``Spam``, in pipelines of 10,000."""
    for start in range(0, n, 10_000):
        pipe = client.pipeline(transaction=False)
        chunk = range(start, min(n, start + 10_000))
        labels = ["Spam" if i < typos else ("spam", "ham")[i % 2] for i in chunk]
        pipe.hset(K.learnt_keys, mapping={f"{i:012d}@mail.example.org.xyz": encode_record(
            lab, 1.0) for i, lab in zip(chunk, labels, strict=True)})
        pipe.zadd(K.key_order, {f"{i:012d}@mail.example.org.xyz": i for i in chunk})
        pipe.execute()


def removal_seconds(n: int, typos: int) -> tuple[float, int]:
    """The script's seconds inside Redis, and the keys left."""
    with RedisServer() as server:
        client = server.client()
        fill(client, n, typos)
        client.xgroup_create(K.input, GROUP, id="0", mkstream=True)
        eid = client.xadd(K.input, {"data": b"x"}).decode()
        client.xreadgroup(GROUP, "w1", {K.input: ">"})
        client.config_resetstat()
        req = CommitRequest(ids=[eid], key_store=(K.learnt_keys, K.key_order),
                            class_drops=[(encode_class_drop("Spam"), record_prefix("Spam"))])
        assert commit_batch(client, K, "w1", req).ok
        stats = command_stats(client)
        seconds = sum(s for name, (_, s) in stats.items() if name in ("evalsha", "eval"))
        return seconds, int(client.hlen(K.learnt_keys))


def since_seconds(n: int) -> tuple[float, int]:
    """The ``forget --since`` script's seconds inside Redis, and the keys it released."""
    import numpy as np

    from streamnb_workers.client.forget_since import forget_source_since
    from streamnb_workers.replication.replica import encode_delta
    from streamnb_workers.store.model_config import ModelSpec, ensure_config

    with RedisServer() as server:
        client = server.client()
        fill(client, n, 0)
        for start in range(0, n, 10_000):
            pipe = client.pipeline(transaction=False)
            chunk = [i for i in range(start, min(n, start + 10_000)) if i % 2]
            pipe.hset(K.learnt_keys, mapping={f"{i:012d}@mail.example.org.xyz": encode_record(
                "spam", 1.0, ("imap", 0)) for i in chunk})
            pipe.zadd(K.key_order, {f"{i:012d}@mail.example.org.xyz": 1000 + 4000 * (i % 4 == 1)
                                    for i in chunk})
            pipe.execute()
        model = ensure_config(client, ModelSpec(K.name, kind="multinomial",
                                                featurizer_config={"bits": 4})).make_model()
        stats = model.batch_stats(np.ones((1, 16)), ["spam"])
        client.xadd(K.log, {"data": encode_delta(None, None, 1, "w", "b", 0,
                                                 [(("imap", 0), stats, None)])}, id="5000-0")
        client.config_resetstat()
        (done,) = forget_source_since(client, K.name, "imap", 3000)
        stats = command_stats(client)
        seconds = sum(s for name, (_, s) in stats.items() if name in ("evalsha", "eval"))
        return seconds, done.released


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", default="250000,1000000", help="learnt keys, comma-separated")
    p.add_argument("--typos", type=int, default=100, help="keys under the class removed")
    args = p.parse_args(argv)
    rows = []
    for n in (int(v) for v in args.keys.split(",")):
        seconds, left = removal_seconds(n, args.typos)
        assert left == n - args.typos
        rows.append([f"{n:,}", args.typos, f"{seconds * 1000:.0f}", f"{seconds / n * 1e9:.0f}"])
    print(format_table(["learnt keys", "of the class", "script ms", "ns a key"], rows))
    rows = []
    for n in (int(v) for v in args.keys.split(",")):
        seconds, released = since_seconds(n)
        assert released == n // 4
        rows.append([f"{n:,}", f"{released:,}", f"{seconds * 1000:.0f}", f"{seconds / n * 1e9:.0f}"])
    print("\nforget --source NAME --since TIME")
    print(format_table(["learnt keys", "released", "script ms", "ns a key"], rows))
    print(f"\n    python -m benchmarks.class_removal --keys {args.keys} --typos {args.typos}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

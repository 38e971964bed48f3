"""redis-server's time in the commit script that removes a class (``streamnb forget
--class``, docs/worker.md "Removing a class"): the script scans ``{M}:keys`` with
``HSCAN`` for the records of the class, deletes them, and appends the drop entry, while
Redis serves nothing else. A private redis-server; ``{M}:keys`` and ``{M}:keyorder``
filled with ``--keys`` records of 36-character keys (a typical Message-ID), of which
``--typos`` hold the removed class and the rest spam or ham; the script's own time read
from ``INFO commandstats``.

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
    print(f"\n    python -m benchmarks.class_removal --keys {args.keys} --typos {args.typos}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

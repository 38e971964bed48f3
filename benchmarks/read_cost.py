"""What a worker's read of new entries costs redis-server, by the number of models it
serves (their streams empty: an idle worker's read): a plain ``XREADGROUP`` over every
stream, and the announced read ordered predictions use (workers/worker/intake.py
``read_announced``: read.lua and the ``XREADGROUP`` in one ``MULTI`` for up to
``ANNOUNCED_AT_ONCE`` models, a plain read announced after it beyond), from ``INFO
cpu`` (microseconds of redis-server's main thread per read) and the client's wall time.

    python -m benchmarks.read_cost [--models 1,8,9,100,1000] [--reads 50]
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks._common import RedisServer, format_table, print_header


def _cpu_s(client) -> float:
    """redis-server's CPU seconds so far (``INFO cpu``: user + system, main thread's)."""
    info = client.info("cpu")
    return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])


def measure(n_models: int, reads: int) -> dict[str, float]:
    from streamnb_workers.replication.ordering import InflightBoard
    from streamnb_workers.store.keys import GROUP, ModelKeys
    from streamnb_workers.worker import intake

    with RedisServer() as server:
        r = server.client()
        models = [ModelKeys(f"m{i}") for i in range(n_models)]
        for keys in models:
            r.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
        intake.READ_SCRIPT.load(r)
        boards = [(keys, InflightBoard(r, keys, "w")) for keys in models]
        ways = {"plain XREADGROUP": lambda: intake.read_new(r, "w", [k.input for k in models],
                                                              100, 0),
                "announced read": lambda: intake.read_announced(r, r, "w", boards, 100, 0)}
        row: dict[str, float] = {"models": n_models}
        for name, read in ways.items():
            read()
            cpu0 = _cpu_s(r)
            t0 = time.perf_counter()
            for _ in range(reads):
                read()
            wall = (time.perf_counter() - t0) / reads
            row[f"{name}: server us"] = 1e6 * (_cpu_s(r) - cpu0) / reads
            row[f"{name}: wall ms"] = 1e3 * wall
        return row


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="1,8,9,100,1000")
    ap.add_argument("--reads", type=int, default=50)
    args = ap.parse_args(argv)
    print_header("a worker's read of new entries, by models served", "benchmarks.read_cost", argv)
    rows = [measure(int(n), args.reads) for n in args.models.split(",")]
    headers = list(rows[0])
    print(format_table(headers, [[row[h] for h in headers] for row in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

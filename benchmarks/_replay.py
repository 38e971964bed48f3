"""The corpus replayed through the daemon: labelled raw mail pre-filled in index order on a
private redis-server, worker processes until every message is predicted (or
dead-lettered), then what ``:out`` holds. The accuracy, peers and digest benchmarks score
the same replay.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from benchmarks._common import Corpus, RedisServer
from benchmarks.end_to_end import default_spec, encode_messages, keys, prefill, wait_for, workers


@dataclass
class DaemonReplay:
    #: The decoded output of each message, by message id (``m<index>``).
    outputs: dict[str, dict[str, Any]]
    dead: int
    #: Seconds from the workers' start to the last prediction.
    seconds: float
    #: The model as the workers left it (snapshot + log), when asked for.
    model: Any = None

    def in_corpus_order(self, n: int) -> list[dict[str, Any]]:
        """The output of each of the ``n`` messages in index order ({} where none)."""
        return [self.outputs.get(f"m{i}", {}) for i in range(n)]


def replay_through_daemon(corpus: Corpus, n_workers: int = 2, kind: str = "multinomial",
                          options: dict[str, Any] | None = None, timeout: float = 900.0,
                          name: str = "replay", load_model: bool = False,
                          decision: dict[str, Any] | None = None) -> DaemonReplay:
    """Replay ``corpus`` as labelled raw mail through ``n_workers`` workers of a model
    made with only ``kind`` (the daemon's defaults for the rest; ``decision``: decision
    options besides) and worker ``options``."""
    from streamnb_workers.replication.shards import load_model as load
    from streamnb_workers.wire.outputs import decode_output

    messages = encode_messages(corpus, "raw", labelled=True)
    k = keys(name)
    with RedisServer() as server:
        client = server.client()
        prefill(client, name, messages)
        t0 = time.perf_counter()
        spec = default_spec(name, kind) | ({"decision": decision} if decision else {})
        with workers(server.url, spec, n_workers, options) as procs:
            if not wait_for(client, k["out"], len(messages), timeout, procs, k["dead"]):
                raise RuntimeError(f"the workers did not process the corpus in {timeout}s")
            seconds = time.perf_counter() - t0
        outputs = {}
        for _, fields in client.xrange(k["out"]):
            out = decode_output(fields[b"data"])
            outputs[out["id"]] = out
        return DaemonReplay(outputs, int(client.xlen(k["dead"])), seconds,
                            load(client, name)[0] if load_model else None)

"""One reader of every model's verdicts (workers/protocols/verdict_reader.py) on a real
redis-server, with a worker serving the models: each mail gets its own model's
prediction, the same one the worker wrote, and one reader thread is left reading."""

from __future__ import annotations

import threading
import time

import msgpack
import pytest

from streamnb_workers.client.verdicts import VerdictClient
from streamnb_workers.protocols.verdict_reader import SharedVerdictReader
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.store.keys import ModelKeys
from tests.helpers.milter import mail
from tests.helpers.workers import fast_options, url_worker

pytestmark = pytest.mark.redis

MODELS = [f"v{i}" for i in range(5)]


def spec(name):
    from streamnb_workers.store.model_config import ModelSpec

    return ModelSpec(name, kind="multinomial", featurizer_config={"bits": 10})


def test_one_reader_hands_each_model_its_verdicts(server):
    w = url_worker(server.url, [spec(m) for m in MODELS], fast_options("w"))
    w.start()
    stop = threading.Event()
    thread = threading.Thread(target=lambda: [w.step(20) for _ in iter(stop.is_set, True)],
                              daemon=True)
    thread.start()
    settings = RedisSettings(server.url)
    reader = SharedVerdictReader(settings, block_ms=200)
    clients = {m: reader.add(VerdictClient(settings, m, id_prefix=f"{m}-")) for m in MODELS}
    try:
        got = {}
        for round_ in range(2):  # the second round: every model already read
            for i, m in enumerate(MODELS):
                msg_id, out = clients[m].predict(mail("spam" if i % 2 else "ham", i + 10 * round_),
                                                 timeout=30.0)
                assert out["id"] == msg_id and msg_id.startswith(f"{m}-")
                got.setdefault(m, []).append(out)
        client = settings.make_client()
        for m in MODELS:  # what the worker wrote to that model's :out, handed over once
            written = [msgpack.unpackb(f[b"data"], raw=False)
                       for _, f in client.xrange(ModelKeys(m).out)]
            assert [o["id"] for o in got[m]] == [o["id"] for o in written]
            assert all(clients[m].in_flight == 0 for m in MODELS)
        deadline = time.monotonic() + 5.0
        while reader.readers > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reader.readers == 1  # the older readers stopped after their reads
    finally:
        reader.close()
        for c in clients.values():
            c.close()
        stop.set()
        thread.join(10)
        w.shutdown()
    assert reader.readers == 0

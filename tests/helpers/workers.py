"""Helpers shared by the worker tests: messages, offline reference models, worker runners."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from streamnb.features import Featurizer
from streamnb.models import make_model
from streamnb_workers.cli.launch import blas_env
from streamnb_workers.store.connection import RedisSettings, UrlConnector
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.codec import decode_input
from streamnb_workers.wire.replies import as_str
from streamnb_workers.wire.stream_ids import parse_id
from streamnb_workers.worker import Worker, WorkerOptions

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

VOCAB = {
    "spam": ["cheap", "meds", "winner", "prize", "viagra", "offer", "click", "free"],
    "ham": ["meeting", "notes", "lunch", "project", "report", "agenda", "review", "team"],
    "news": ["market", "election", "weather", "sports", "score", "policy", "stocks", "rain"],
}
COMMON = ["hello", "today", "please", "thanks", "again", "about"]
#: The keys of the model most worker tests serve ("mail").
MAIL_KEYS = ModelKeys("mail")


def token_messages(n: int, classes: tuple[str, ...] = ("spam", "ham", "news"), seed: int = 0,
                   labelled_share: float = 1.0) -> list[dict[str, Any]]:
    """``n`` token messages drawn from per-class vocabularies (some unlabelled); each has
    its own learn-once key, as two draws may give the same tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c = classes[int(rng.integers(len(classes)))]
        words = list(rng.choice(VOCAB[c], size=int(rng.integers(2, 7)))) + \
            list(rng.choice(COMMON, size=int(rng.integers(0, 3))))
        m: dict[str, Any] = {"id": f"m{i}", "key": f"s{seed}-m{i}",
                             "tokens": [str(w) for w in words]}
        if rng.random() < labelled_share:
            m["label"] = c
        out.append(m)
    return out


def vector_messages(n: int, d: int = 3, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c = ["a", "b", "c"][int(rng.integers(3))]
        mu = {"a": 0.0, "b": 2.0, "c": -1.5}[c]
        x = (rng.normal(mu, 1.0 + 0.3 * (c == "b"), size=d) * 1e3 + 5e3).tolist()
        out.append({"id": f"v{i}", "x": x, "label": c})
    return out


def produce(client: Any, name: str, messages: list[dict[str, Any]]) -> list[str]:
    pipe = client.pipeline(transaction=False)
    for m in messages:
        pipe.xadd(f"streamnb:{{{name}}}:in", {"data": msgpack.packb(m, use_bin_type=True)})
    return [v.decode() for v in pipe.execute()]


def offline_model(kind: str, params: dict, featurizer_config: dict,
                  messages: list[dict[str, Any]]) -> Any:
    """One offline partial_fit over the labelled messages (the reference)."""
    f = Featurizer.from_config(featurizer_config)
    lab = [m for m in messages if m.get("label") is not None and "ref" not in m]
    rows = [f.featurize(decode_input(msgpack.packb(m), "0-0").as_payload()) for m in lab]
    return make_model(kind, **params).partial_fit(f.stack(rows), [m["label"] for m in lab])


def per_class(model: Any) -> dict[str, dict[Any, np.ndarray]]:
    """Every statistic part as label -> flat array, comparable across class orders."""
    out: dict[str, dict[Any, np.ndarray]] = {}
    for name, part in model.stats.parts.items():
        labels = part.labels
        if hasattr(part, "counts"):
            arrs = [np.atleast_1d(part.counts[i]) for i in range(len(labels))]
        elif hasattr(part, "toarray"):
            a = part.toarray()
            arrs = [a[i] for i in range(len(labels))]
        else:
            arrs = [np.concatenate([[part.n[i]], part.mean[i].ravel(), part.m2[i].ravel()])
                    for i in range(len(labels))]
        out[name] = dict(zip(labels, arrs, strict=True))
    return out


def assert_same_stats(a: Any, b: Any, rtol: float = 0.0, atol: float = 0.0) -> None:
    pa, pb = per_class(a), per_class(b)
    assert set(pa) == set(pb)
    for part in pa:
        assert set(pa[part]) == set(pb[part]), part
        for lab in pa[part]:
            if rtol == 0 and atol == 0:
                np.testing.assert_array_equal(pa[part][lab], pb[part][lab], err_msg=f"{part}/{lab}")
            else:
                np.testing.assert_allclose(pa[part][lab], pb[part][lab], rtol=rtol, atol=atol,
                                           err_msg=f"{part}/{lab}")


#: The featurizer and model parameters of the small count model most worker tests use.
FCFG = {"bits": 10, "counts": "raw"}
PARAMS = {"n_features": 1024}


def count_spec(name: str = "mail", **kw: Any) -> ModelSpec:
    """The small count model; unless asked, without the error weight and the "unsure"
    verdicts of a cold model, so its statistics are those of an offline ``partial_fit``
    of every labelled message and its labels the argmax (the mail defaults have tests of
    their own: tests/workers/worker/test_error_weight.py)."""
    kw.setdefault("error_weight", 1.0)
    kw.setdefault("decision", {"min_class_weight": None})
    return ModelSpec(name, kind="multinomial", featurizer_config=dict(FCFG), **kw)


#: For workers whose predictions a test compares with one worker's: a wait for another
#: worker's earlier batch that a loaded host never gives up, and no claim of a live
#: worker's batch (either, by design, predicts a batch out of order).
IN_ORDER = {"order_wait_ms": 60_000, "claim_idle_ms": 60_000}


def fast_options(consumer: str, **kw: Any) -> WorkerOptions:
    base = dict(consumer=consumer, batch=50, block_ms=50, claim_idle_ms=1000, heartbeat_s=0.5,
                lease_ms=2000, snapshot_every=10**9, snapshot_interval_s=10**6,
                backoff_base_s=0.05, backoff_cap_s=0.5, stale_s=5.0)
    base.update(kw)
    return WorkerOptions(**base)


def url_worker(url: str, specs: list[ModelSpec], options: WorkerOptions, metrics: Any = None,
               cluster: bool = False) -> Worker:
    from prometheus_client import CollectorRegistry

    from streamnb_workers.observe.metrics import Metrics

    return Worker(UrlConnector(RedisSettings(url, cluster=cluster)), specs, options,
                  metrics or Metrics(CollectorRegistry()))


def run_in_threads(workers: list[Worker], timeout: float = 60.0) -> None:
    errors: list[BaseException] = []

    def go(w: Worker) -> None:
        try:
            w.run_until_idle(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def spawn_worker(url: str, spec: ModelSpec, options: dict[str, Any], log_path: Path | None = None,
                 ) -> subprocess.Popen:
    """A worker in its own process (``python -m streamnb_workers.worker``)."""
    spec_json = json.dumps({k: v for k, v in spec.__dict__.items()})
    env = blas_env({**os.environ, "PYTHONPATH": str(ROOT)})
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen([PYTHON, "-m", "streamnb_workers.worker", "--redis", url, "--spec", spec_json,
                             "--options", json.dumps(options)], cwd=ROOT, env=env,
                            stdout=out, stderr=subprocess.STDOUT)


def all_done(client: Any, n_inputs: int, keys: ModelKeys = MAIL_KEYS) -> bool:
    """Every one of ``n_inputs`` entries of ``keys.input`` delivered and acknowledged, none
    pending.

    Read in one MULTI/EXEC: read one after the other, the pending count could be taken
    just before a worker reads the last batch and the delivery mark just after, and a
    batch still to be committed would pass for done. (The entries added, not the stream's length: the lease holder trims ``:in`` of what
    is acknowledged.)"""
    pipe = client.pipeline(transaction=True)
    pipe.xinfo_stream(keys.input)
    pipe.xpending(keys.input, GROUP)
    pipe.xinfo_groups(keys.input)
    info, pending, groups = pipe.execute()
    g = next((g for g in groups if as_str(g["name"]) == GROUP), None)
    return (int(info["entries-added"]) >= n_inputs and int(pending["pending"]) == 0
            and g is not None and int(info["entries-added"]) > 0
            and parse_id(g["last-delivered-id"]) >= parse_id(info["last-generated-id"]))


def learnt_model(client: Any, name: str) -> tuple[Any, str]:
    from streamnb_workers.replication.shards import load_model

    return load_model(client, name)


def cached(client: Any, name: str, msg_id: str) -> Any:
    """The delayed-label cache entry of ``msg_id`` (a ``CachedMessage``, None if absent),
    looked up as a worker does (workers/store/label_cache.py)."""
    import time

    from streamnb_workers.store.label_cache import fetch_cached

    return fetch_cached(client, ModelKeys(name), [msg_id], int(time.time() * 1000))[msg_id]


def cached_learnt(client: Any, name: str, msg_id: str) -> Any:
    """The label a cached message was learnt with (None: not learnt, or not cached)."""
    c = cached(client, name, msg_id)
    return None if c is None else c.learnt

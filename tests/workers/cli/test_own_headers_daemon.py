"""A delivered mail is the mail it was, through a real redis-server and worker process: the
copy ``streamnb predict -p`` writes (X-Streamnb-Verdict, -Score, -Id added), and the same
in other spellings, get the ``log_proba`` of the original from ``predict`` and from the
worker's ``:out``; ``explain`` shows no ``x-streamnb`` token; learning a delivered copy of
a learnt mail is ``already_learnt``. The model learnt its spam as delivered copies, so a
header of ours that were a feature would be a strong spam token."""

from __future__ import annotations

import json
import os
import subprocess

import msgpack
import pytest

from streamnb_workers.cli.demo import load_sample
from streamnb_workers.cli.launch import blas_env
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.milter import WORKER_OPTIONS, stop, wait_for
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.workers import PYTHON, ROOT, all_done, spawn_worker

pytestmark = pytest.mark.redis

TRAIN = 200
SPEC = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 18})
KEYS = ModelKeys("mail")
#: What a mail delivered earlier carries (as the milter or ``predict -p`` wrote it).
OURS = b"X-Streamnb-Verdict: spam\nX-Streamnb-Score: 7.50\nX-Streamnb-Id: pipe-0\n"


def with_ours(mail: bytes, fields: bytes = OURS) -> bytes:
    eol = b"\r\n" if mail.split(b"\n", 1)[0].endswith(b"\r") else b"\n"
    return fields.replace(b"\n", eol) + mail


def streamnb(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
    return subprocess.run([PYTHON, "-m", "streamnb_workers", *args], input=stdin, cwd=ROOT,
                          env=env, capture_output=True, timeout=60)


def outputs(client) -> dict[str, dict]:
    return {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in client.xrange(KEYS.out))}


def send(client, messages: list[dict]) -> None:
    pipe = client.pipeline(transaction=False)
    for m in messages:
        pipe.xadd(KEYS.input, {"data": msgpack.packb(m, use_bin_type=True)})
    pipe.execute()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A redis-server and a worker process; model "mail" learnt the sample's first mails,
    its spam as delivered copies. Yields (url, client, held-out sample, inputs sent)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    sample = load_sample()
    log = tmp_path_factory.mktemp("own") / "worker.log"
    with RedisServer() as server:
        client = server.client()
        proc = spawn_worker(server.url, SPEC, dict(WORKER_OPTIONS, consumer="w-own"), log)
        try:
            wait_for(lambda: client.hlen(KEYS.workers) > 0 or proc.poll() is not None, 60,
                     "the worker")
            assert proc.poll() is None, log.read_text()
            send(client, [{"id": f"train-{i}", "label": m.label,
                           "raw": with_ours(m.raw) if m.label == "spam" else m.raw}
                          for i, m in enumerate(sample[:TRAIN])])
            sent = [TRAIN]
            wait_for(lambda: all_done(client, sent[0]), 120, "the model to learn")
            yield server.url, client, sample[TRAIN:], sent
        finally:
            stop(proc)


def picked(held_out) -> list:
    return ([m for m in held_out if m.label == "ham"][:2]
            + [m for m in held_out if m.label == "spam"][:2])


def copies(url: str, mail: bytes) -> list[bytes]:
    """Delivered copies of ``mail``: what ``predict -p`` writes, and ours in other spellings."""
    p = streamnb("predict", "--redis", url, "--model", "mail", "-p", "-", stdin=mail)
    assert p.returncode in (0, 1, 2) and b"X-Streamnb-Verdict" in p.stdout, p.stderr
    odd = b"x-STREAMNB-score:\n\t-0.48\nX-Streamnb-Id: milter-9\n"
    return [p.stdout, with_ours(mail, odd), with_ours(p.stdout, odd)]


def test_predict_gives_a_delivered_copy_the_log_proba_of_its_mail(served, tmp_path):
    url, _, held_out, _ = served
    for n, m in enumerate(picked(held_out)):
        files = []
        for i, raw in enumerate([m.raw, *copies(url, m.raw)]):
            f = tmp_path / f"m{n}-{i}.eml"
            f.write_bytes(raw)
            files.append(f)
        got = []
        for f in files:
            p = streamnb("predict", "--redis", url, "--model", "mail", "--json", str(f))
            assert p.returncode == 0, p.stderr
            got.append(json.loads(p.stdout)["log_proba"])
        assert all(g == got[0] for g in got), (m.label, got)


def test_the_worker_gives_a_delivered_copy_the_log_proba_of_its_mail(served):
    url, client, held_out, sent = served
    messages = []
    for n, m in enumerate(picked(held_out)):
        messages.append({"id": f"orig-{n}", "raw": m.raw})
        messages += [{"id": f"copy-{n}-{i}", "raw": c} for i, c in enumerate(copies(url, m.raw))]
    send(client, messages)
    sent[0] += len(messages)
    wait_for(lambda: all_done(client, sent[0]), 60, "the predictions")
    out = outputs(client)
    for n in range(len(picked(held_out))):
        want = out[f"orig-{n}"]["log_proba"]
        assert [out[f"copy-{n}-{i}"]["log_proba"] for i in range(3)] == [want] * 3


def test_explain_shows_no_token_of_ours(served, tmp_path):
    url, _, held_out, _ = served
    m = next(m for m in held_out if m.label == "spam")
    totals = []
    for i, raw in enumerate([m.raw, *copies(url, m.raw)]):
        f = tmp_path / f"e{i}.eml"
        f.write_bytes(raw)
        p = streamnb("explain", "--redis", url, "--model", "mail", "--json", "--top", "500",
                     str(f))
        assert p.returncode == 0, p.stderr
        e = json.loads(p.stdout)["explain"]
        names = [name for name, _ in e["tokens"]]
        assert names and not [n for n in names if "streamnb" in n.lower()]
        totals.append((e["bias"], sorted(e["tokens"]), e["other"]))
    assert all(t == totals[0] for t in totals)


def test_a_delivered_copy_of_a_learnt_mail_is_already_learnt(served):
    url, client, held_out, sent = served
    mail = (b"From: ann@example.org\nSubject: no message id here\n\n"
            b"cheap meds, a winner, a prize for you\n")
    send(client, [{"id": "learn-orig", "raw": mail, "label": "spam"}])
    send(client, [{"id": f"learn-copy-{i}", "raw": c, "label": "spam"}
                  for i, c in enumerate(copies(url, mail))])
    sent[0] += 4
    wait_for(lambda: all_done(client, sent[0]), 60, "the labelled copies")
    out = outputs(client)
    assert out["learn-orig"]["learned"]
    for i in range(3):
        assert not out[f"learn-copy-{i}"]["learned"]
        assert out[f"learn-copy-{i}"]["reason"] == "already_learnt"

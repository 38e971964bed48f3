"""Class sets that cannot break, against a real redis-server: the model the README makes
(``streamnb worker --model mail --kind multinomial``) declares spam and ham, so a mistyped
label is refused by ``produce`` and a dead letter in the worker, never a third class; on a
model that takes any label (``--classes any``), a class whose weight is back to 0 takes no
part in verdicts nor scores, identical on every replica."""

from __future__ import annotations

import math

import numpy as np
import pytest

from streamnb_workers.cli.main import build_parser, main, subparsers
from streamnb_workers.cli.options import model_specs
from streamnb_workers.cli.settings import resolve
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import read_config
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import (
    assert_same_stats,
    fast_options,
    produce,
    run_in_threads,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis
K = ModelKeys("mail")


def cli_spec(*flags: str):
    """The model spec ``streamnb worker --model mail --kind multinomial FLAGS`` serves."""
    parser = build_parser()
    subs = subparsers(parser)
    args = parser.parse_args(["worker", "--model", "mail", "--kind", "multinomial",
                              "--bits", "10", *flags])
    (spec,) = model_specs(resolve(subs["worker"], args, "worker", env={}, all_parsers=subs))
    return spec


def outputs(r) -> dict[str, dict]:
    return {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in r.xrange(K.out))}


def probes() -> list[dict]:
    return [{"id": f"p{i}", "tokens": t} for i, t in enumerate(
        [["cheap", "meds", "winner"], ["meeting", "notes"], ["free", "offer", "hello", "team"]])]


def test_the_readme_model_declares_spam_and_ham_and_a_typo_is_no_class(redis_server, tmp_path,
                                                                       capsys):
    r = redis_server.client()
    w = url_worker(redis_server.url, [cli_spec()], fast_options("w1"))
    produce(r, "mail", token_messages(40, classes=("spam", "ham"), seed=1))
    w.run_until_idle()
    assert read_config(r, "mail").classes == ["spam", "ham"]
    mail = tmp_path / "a.eml"
    mail.write_bytes(b"Subject: cheap meds\n\ncheap meds winner\n")
    assert main(["produce", "--redis", redis_server.url, "--model", "mail", "--label", "Spam",
                 str(mail)]) == 2
    assert "'Spam' is not one of model 'mail''s classes: spam, ham" in capsys.readouterr().err
    produce(r, "mail", [{"id": "typo", "tokens": ["cheap", "meds"], "label": "Spam"}, *probes()])
    w.run_until_idle()
    (dead,) = [decode_output(f[b"data"]) for _, f in r.xrange(K.dead)]
    assert dead["reason"] == "bad_label"
    assert sorted(w.models["mail"].replica.model.classes_.tolist()) == ["ham", "spam"]
    out = outputs(r)
    assert [out[f"p{i}"]["label"] for i in range(3)] != ["unsure"] * 3
    assert all(abs(out[f"p{i}"]["score"]) < 5 for i in range(3))  # per feature, not log-odds


def test_a_forgotten_class_takes_no_part_on_every_replica(redis_server):
    """``--classes any``: a typo label is learnt as a class, then forgotten; the class
    stays known at weight 0, and verdicts and scores are those of the spam/ham model."""
    r = redis_server.client()
    spec = cli_spec("--classes", "any")
    ws = [url_worker(redis_server.url, [spec], fast_options(f"w{i}")) for i in range(2)]
    train = token_messages(60, classes=("spam", "ham"), seed=2)
    produce(r, "mail", train)
    run_in_threads(ws)
    assert read_config(r, "mail").classes is None
    produce(r, "mail", [{**p, "id": f"before-{p['id']}"} for p in probes()])
    run_in_threads(ws)
    typo = {"id": "typo", "key": "typo-key", "tokens": ["cheap", "meds"], "label": "Spam"}
    produce(r, "mail", [typo])
    run_in_threads(ws)
    produce(r, "mail", [{**p, "id": f"three-{p['id']}"} for p in probes()])
    run_in_threads(ws)
    produce(r, "mail", [{"forget": True, "key": "typo-key", "tokens": typo["tokens"]}])
    run_in_threads(ws)
    produce(r, "mail", [{**p, "id": f"after-{p['id']}"} for p in probes()])
    run_in_threads(ws)
    out = outputs(r)
    for w in ws:
        w.models["mail"].replica.catch_up()
    a, b = (w.models["mail"].replica.model for w in ws)
    assert_same_stats(a, b)
    assert dict(zip(a.classes_.tolist(), a.class_count_.tolist(), strict=True))["Spam"] == 0.0
    for i in range(3):
        before, three, after = (out[f"{t}-p{i}"] for t in ("before", "three", "after"))
        # with "Spam" at weight 1 (< min_class_weight 3) every verdict is unsure
        assert three["label"] == "unsure"
        assert after["label"] == before["label"] in ("spam", "ham")
        assert after["log_proba"]["Spam"] == -math.inf
        assert set(before["log_proba"]) == {"spam", "ham"}
        # the score stays per feature: the spam/ham model's, as before the typo
        assert after["score"] == pytest.approx(before["score"], rel=1e-9, abs=1e-12)
        assert abs(after["score"]) < 5
        assert np.isclose(math.exp(after["log_proba"]["spam"]) + math.exp(after["log_proba"]["ham"]), 1.0)

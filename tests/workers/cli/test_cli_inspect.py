"""streamnb explain and streamnb tokens against a real redis-server and worker."""

from __future__ import annotations

import io
import json
import sys

import numpy as np
import pytest

from streamnb.features import Featurizer
from streamnb_workers.cli.main import main
from streamnb_workers.replication.shards import load_model
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.worker.housekeeping import housekeeping
from tests.helpers.workers import fast_options, produce, token_messages, url_worker

pytestmark = pytest.mark.redis

BITS = 16


@pytest.fixture
def served(redis_server):
    """A two-class model learnt by a worker that published its token names."""
    r = redis_server.client()
    produce(r, "mail", token_messages(200, classes=("spam", "ham"), seed=11))
    spec = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": BITS})
    w = url_worker(redis_server.url, [spec], fast_options("w1", token_names=100, token_names_every=1))
    w.run_until_idle()
    w.models["mail"].timers.names.due_at_once()
    housekeeping(w.models["mail"], ["mail"])
    w.shutdown()
    return redis_server.url, r


def _run(capsys, argv, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = main(argv, env={})
    out = capsys.readouterr()
    return code, out.out, out.err


def test_explain_a_file_prints_weights_that_add_up(served, capsys, tmp_path):
    url, r = served
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"tokens": ["cheap", "meds", "hello", "meeting"]}))
    code, out, _ = _run(capsys, ["explain", "--redis", url, "--model", "mail", "--json",
                                 "--top", "3", str(path)])
    assert code == 0
    res = json.loads(out)
    e = res["explain"]
    assert e["classes"] == ["ham", "spam"] and len(e["tokens"]) == 3
    assert {n for n, _ in e["tokens"]} <= {"cheap", "meds", "hello", "meeting"}
    model, _ = load_model(r, "mail")
    X = Featurizer(bits=BITS).transform_payloads([("tokens", ["cheap", "meds", "hello", "meeting"])])
    total = e["bias"] + sum(w for _, w in e["tokens"]) + e["other"]
    assert total == pytest.approx(float(model.decision_function(X)[0]), abs=1e-9)
    assert res["label"] == ("spam" if total >= 0 else "ham")
    code, text, _ = _run(capsys, ["explain", "--redis", url, "--model", "mail", str(path)])
    assert code == 0 and "log-odds spam vs ham" in text and "(bias)" in text


def test_explain_reads_a_mail_on_stdin(served, capsys, monkeypatch):
    url, _ = served
    mail = b"From: a@example.com\nSubject: cheap meds\n\ncheap meds winner prize\n"
    code, out, _ = _run(capsys, ["explain", "--redis", url, "--model", "mail", "--json", "-"],
                        stdin=mail, monkeypatch=monkeypatch)
    assert code == 0
    res = json.loads(out)
    assert res["label"] == "spam"
    names = [n for n, _ in res["explain"]["tokens"]]
    assert {"cheap", "meds", "winner", "prize"} & set(names)


def test_explain_from_an_exported_snapshot(served, capsys, tmp_path):
    url, _ = served
    model_file = tmp_path / "mail.snb"
    assert _run(capsys, ["export", "--redis", url, "--model", "mail", "-o", str(model_file)])[0] == 0
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"tokens": ["team", "lunch"]}))
    code, out, _ = _run(capsys, ["explain", "--snapshot", str(model_file), "--json", str(path)])
    assert code == 0
    assert json.loads(out)["label"] == "ham"


def test_tokens_prints_counts_and_weights_of_given_tokens(served, capsys):
    url, r = served
    code, out, _ = _run(capsys, ["tokens", "--redis", url, "--model", "mail", "--json",
                                 "cheap", "meeting", "neverseen"])
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["token"] for row in rows] == ["cheap", "meeting", "neverseen"]
    model, _ = load_model(r, "mail")
    f = Featurizer(bits=BITS)
    for row in rows:
        b = f.hasher.bucket(row["token"])
        assert row["bucket"] == b
        counts = model.feature_count_[:, b]
        assert [row["counts"]["ham"], row["counts"]["spam"]] == counts.tolist()
        assert row["weight"] == pytest.approx(float(model.log_odds_weights([b])[0]), abs=1e-12)
    assert rows[0]["weight"] > 0 > rows[1]["weight"]  # cheap is spammy, meeting hammy
    assert rows[0]["names"] == ["cheap"] and rows[2]["counts"] == {"ham": 0.0, "spam": 0.0}


def test_tokens_top_names_buckets_by_the_published_names(served, capsys):
    url, r = served
    code, out, _ = _run(capsys, ["tokens", "--redis", url, "--model", "mail", "--top", "6"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split("\t")[:4] == ["token", "ham", "spam", "weight(spam:ham)"]
    rows = [line.split("\t") for line in lines[1:]]
    assert len(rows) == 6
    weights = [abs(float(row[3])) for row in rows]
    assert weights == sorted(weights, reverse=True)
    vocab = {"cheap", "meds", "winner", "prize", "viagra", "offer", "click", "free", "meeting",
             "notes", "lunch", "project", "report", "agenda", "review", "team"}
    assert {row[0] for row in rows} <= vocab  # names, not #bucket
    model, _ = load_model(r, "mail")
    seen = np.flatnonzero(model.feature_count_.sum(axis=0) >= 3)
    best = np.max(np.abs(model.log_odds_weights(seen)))
    assert weights[0] == pytest.approx(best, abs=1e-4)


@pytest.mark.parametrize("argv, needle", [
    (["tokens", "--model", "mail", "--classes", "ham"], "--classes takes NEG,POS"),
    (["tokens", "--model", "mail", "--classes", "ham,nope"], "no classes ['nope']"),
    (["tokens", "--model", "other"], "has no config"),
    (["explain", "--model", "mail", "/nonexistent/m.eml"], "cannot be read"),
])
def test_bad_arguments_are_one_line_and_exit_2(served, capsys, argv, needle):
    url, _ = served
    code, out, err = _run(capsys, [argv[0], "--redis", url, *argv[1:]])
    assert code == 2, err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_offline_top_tokens_rank_bernoulli_by_true_weight():
    """predict --snapshot's top tokens: for BernoulliNB by logit differences, not by the log
    ratio of the presence probabilities (which would put 'rare' first here)."""
    from streamnb.models import BernoulliNB
    from streamnb_workers.client.offline_predict import top_tokens
    from streamnb_workers.wire.codec import decode_input, encode_input

    f = Featurizer(bits=12)
    # 'often': in 9 of 10 spam, 5 of 10 ham; 'rare': in 2 of 10 spam, 1 of 10 ham
    spam = [["often", "rare"]] * 2 + [["often"]] * 7 + [["x"]]
    ham = [["often", "rare"]] + [["often"]] * 4 + [["y"]] * 5
    X = f.transform_payloads([("tokens", t) for t in spam + ham])
    model = BernoulliNB(alpha=1e-10).fit(X, ["spam"] * 10 + ["ham"] * 10)
    msg = decode_input(encode_input("tokens", ["often", "rare"]), "1-0")
    ranked = top_tokens(model, f, msg, "spam", k=5)
    assert [name for name, _ in ranked] == ["often", "rare"]
    assert ranked[0][1] == pytest.approx(np.log(9), abs=1e-6)


def test_milter_headers_carry_an_explanation():
    from streamnb_workers.client.verdicts import TOKENS_HEADER, verdict_headers

    pred = {"label": "spam", "log_proba": {"spam": -0.1, "ham": -2.4},
            "explain": {"classes": ["ham", "spam"], "bias": 0.1, "other": 0.2,
                        "tokens": [["cheap", 1.5], ["meeting", -0.4]]}}
    headers = dict(verdict_headers(pred, positive="spam"))
    assert headers[TOKENS_HEADER] == "cheap=+1.50 meeting=-0.40"


def test_worker_user_of_the_shipped_acl_publishes_names_and_runs_both_commands(capsys, tmp_path):
    """Under deploy/redis/users.acl, the worker user publishes {M}:tokens and can run
    'explain' and 'tokens'; Redis's ACL LOG records no refusal."""
    from tests.helpers.redis_server import REDIS_SERVER, RedisServer
    from tests.helpers.workers import ROOT

    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    class AdminRedis(RedisServer):
        def client(self, **kw):
            return super().client(username="streamnb-admin",
                                  password="streamnb-admin-dev-CHANGE-ME", **kw)

    user, password = "streamnb-worker", "streamnb-worker-dev-CHANGE-ME"
    with AdminRedis(extra=["--aclfile", str(ROOT / "deploy" / "redis" / "users.acl")]) as srv:
        admin = srv.client()
        url = f"redis://{user}:{password}@127.0.0.1:{srv.port}/0"
        produce(admin, "mail", token_messages(60, classes=("spam", "ham"), seed=12))
        spec = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": BITS})
        w = url_worker(url, [spec], fast_options("w1", token_names=100, token_names_every=1))
        w.run_until_idle()
        w.models["mail"].timers.names.due_at_once()
        housekeeping(w.models["mail"], ["mail"])
        w.shutdown()
        assert admin.hlen("streamnb:{mail}:tokens") > 0
        path = tmp_path / "m.json"
        path.write_text(json.dumps({"tokens": ["cheap", "team"]}))
        assert _run(capsys, ["explain", "--redis", url, "--model", "mail", str(path)])[0] == 0
        code, out, _ = _run(capsys, ["tokens", "--redis", url, "--model", "mail", "--top", "3"])
        assert code == 0 and len(out.splitlines()) == 4
        assert admin.execute_command("ACL", "LOG") == []

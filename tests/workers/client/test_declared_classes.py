"""Declared classes against a real redis-server: ``--classes`` fixes a new model's classes
in its stored config; a label outside them is a ``bad_label`` dead letter, and ``produce
--label`` refuses it up front. A model made without them takes any label, as before."""

from __future__ import annotations

import msgpack
import pytest

from streamnb.exceptions import ConfigConflict
from streamnb_workers.cli.main import main
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config, read_config
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import count_spec, fast_options, produce, token_messages, url_worker

pytestmark = pytest.mark.redis
K = ModelKeys("mail")


def _dead(r):
    return [decode_output(f[b"data"]) for _, f in r.xrange(K.dead)]


def test_a_label_outside_the_declared_classes_is_a_dead_letter(redis_server):
    r = redis_server.client()
    good = token_messages(30, classes=("spam", "ham"), seed=1)
    produce(r, "mail", good[:10])
    produce(r, "mail", [{"id": "typo", "tokens": ["cheap"], "label": "Spam"},
                        {"id": "int", "tokens": ["cheap"], "label": 1},
                        {"id": "u1", "tokens": ["lunch", "notes"]}])
    produce(r, "mail", [{"ref": "u1", "label": "SPAM"}, {"ref": "u1", "label": "ham"}])
    produce(r, "mail", good[10:])
    w = url_worker(redis_server.url, [count_spec(classes=["spam", "ham"])], fast_options("w1"))
    w.run_until_idle()
    assert read_config(r, "mail").classes == ["spam", "ham"]
    dead = _dead(r)
    assert [d["reason"] for d in dead] == ["bad_label"] * 3
    assert "'Spam' is not one of this model's classes: spam, ham" in dead[0]["detail"]
    assert msgpack.unpackb(dead[0]["payload"])["id"] == "typo"
    model = w.models["mail"].replica.model
    assert sorted(model.classes_.tolist()) == ["ham", "spam"]
    n_labelled = sum(1 for m in good if "label" in m)
    assert model.class_count_.sum() == n_labelled + 1  # (+ the delayed "ham" of u1)
    assert r.xlen(K.out) == 31 and r.xpending(K.input, GROUP)["pending"] == 0


def test_classes_are_fixed_with_the_model_and_absent_means_any_label(redis_server):
    r = redis_server.client()
    ensure_config(r, count_spec())  # made without: any label is a class, as before
    assert read_config(r, "mail").classes is None
    with pytest.raises(ConfigConflict, match="classes: stored None, given"):
        ensure_config(r, count_spec(classes=["spam", "ham"]))
    produce(r, "mail", [{"tokens": ["a"], "label": "Spam"}, {"tokens": ["b"], "label": "x"}])
    w = url_worker(redis_server.url, [ModelSpec("mail")], fast_options("w1"))
    w.run_until_idle()
    assert r.xlen(K.dead) == 0
    assert sorted(w.models["mail"].replica.model.classes_.tolist()) == ["Spam", "x"]
    ensure_config(r, count_spec("other", classes=["a", "b"]))
    with pytest.raises(ConfigConflict, match=r"classes: stored \['a', 'b'\], given \['b', 'a'\]"):
        ensure_config(r, ModelSpec("other", classes=["b", "a"]))


def test_produce_refuses_a_label_outside_the_classes_up_front(redis_server, tmp_path, capsys):
    r = redis_server.client()
    ensure_config(r, count_spec(classes=["spam", "ham"]))
    mail = tmp_path / "a.eml"
    mail.write_bytes(b"Subject: hi\n\nhello\n")
    url = redis_server.url
    assert main(["produce", "--redis", url, "--model", "mail", "--label", "Spam", str(mail)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("streamnb: error: --label 'Spam' is not one of model 'mail''s classes: "
                   "spam, ham")
    assert not r.exists(K.input) or r.xlen(K.input) == 0
    records = tmp_path / "r.jsonl"
    records.write_text('{"text": "a", "label": "ham"}\n{"text": "b", "label": "hma"}\n')
    assert main(["produce", "--redis", url, "--model", "mail", str(records)]) == 1
    out, err = capsys.readouterr()
    assert "r.jsonl:2" in err and "'hma' is not one of the model's classes" in err
    assert r.xlen(K.input) == 1
    assert main(["produce", "--redis", url, "--model", "mail", "--label", "spam", str(mail)]) == 0


def test_classes_from_the_command_line_a_config_file_and_their_errors(capsys, tmp_path):
    from streamnb_workers.cli.main import build_parser, subparsers
    from streamnb_workers.cli.options import model_specs
    from streamnb_workers.cli.settings import resolve

    def specs(argv):
        parser = build_parser()
        args = parser.parse_args(argv)
        subs = subparsers(parser)
        return model_specs(resolve(subs["worker"], args, "worker", env={}, all_parsers=subs))

    assert specs(["worker", "--model", "m", "--kind", "multinomial",
                  "--classes", "spam,ham"])[0].classes == ["spam", "ham"]
    toml = tmp_path / "streamnb.toml"
    toml.write_text('[worker]\nclasses = "spam,ham,unsure"\n')
    assert specs(["worker", "--model", "m", "--config", str(toml)])[0].classes == [
        "spam", "ham", "unsure"]
    assert specs(["worker", "--model", "m"])[0].classes is None
    for bad in ("spam,spam", "spam,,ham"):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(["worker", "--model", "m", "--classes", bad])
        assert exc.value.code == 2
        assert "distinct, non-empty class labels" in capsys.readouterr().err

"""The featurizer's ``osb`` option through the stored config: the command line sets it,
the config keeps it, and every worker featurizes with it (two workers, real redis-server)."""

from __future__ import annotations

import numpy as np
import pytest

from streamnb.exceptions import ConfigConflict
from streamnb_workers.store.model_config import ModelSpec, ensure_config, read_config, resolve_spec
from tests.helpers.workers import (
    VOCAB,
    assert_same_stats,
    fast_options,
    learnt_model,
    offline_model,
    produce,
    run_in_threads,
    url_worker,
)

OSB_FCFG = {"bits": 12, "counts": "raw", "osb": 5}
PARAMS = {"n_features": 4096}


def _spec(featurizer_config=None, **kw):
    return ModelSpec("mail", kind="multinomial", featurizer_config=featurizer_config,
                     model_params=dict(PARAMS), error_weight=1.0,
                     decision={"min_class_weight": None}, **kw)


def _text_messages(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c = ("spam", "ham")[int(rng.integers(2))]
        words = rng.choice(VOCAB[c] + VOCAB["news"], size=int(rng.integers(3, 9)))
        out.append({"id": f"t{i}", "key": f"t{i}", "text": " ".join(map(str, words)), "label": c})
    return out


def test_the_command_line_sets_osb_in_the_featurizer_config():
    from streamnb_workers.cli.main import build_parser, subparsers
    from streamnb_workers.cli.options import model_specs
    from streamnb_workers.cli.settings import resolve

    parser = build_parser()
    args = parser.parse_args(["worker", "--model", "mail", "--kind", "multinomial", "--osb", "5"])
    subs = subparsers(parser)
    (spec,) = model_specs(resolve(subs["worker"], args, "worker", env={}, all_parsers=subs))
    assert spec.featurizer_config == {"osb": 5}
    assert resolve_spec(spec).featurizer["osb"] == 5
    assert "osb" not in resolve_spec(ModelSpec("mail", kind="multinomial")).featurizer
    with pytest.raises(SystemExit):
        parser.parse_args(["worker", "--model", "mail", "--osb", "9"])


@pytest.mark.redis
def test_osb_is_stored_read_back_and_checked(redis_server):
    r = redis_server.client()
    created = ensure_config(r, _spec(dict(OSB_FCFG)))
    assert created.featurizer["osb"] == 5
    stored = read_config(r, "mail")
    assert stored.featurizer == created.featurizer
    assert stored.make_featurizer().config == created.make_featurizer().config
    assert ensure_config(r, ModelSpec("mail")).featurizer["osb"] == 5  # as stored
    with pytest.raises(ConfigConflict, match="featurizer.osb: stored 5, given 3"):
        ensure_config(r, ModelSpec("mail", featurizer_config={**OSB_FCFG, "osb": 3}))


@pytest.mark.redis
def test_two_workers_featurize_with_the_stored_osb_and_agree(redis_server):
    r = redis_server.client()
    msgs = _text_messages(200, seed=3)
    produce(r, "mail", msgs)
    # the model is made with osb (as the first worker would, before the second starts);
    # the second worker gives no featurizer option
    ensure_config(r, _spec(dict(OSB_FCFG)))
    first = url_worker(redis_server.url, [_spec(dict(OSB_FCFG))], fast_options("w0", batch=20))
    second = url_worker(redis_server.url, [ModelSpec("mail")], fast_options("w1", batch=20))
    run_in_threads([first, second])
    ref = offline_model("multinomial", PARAMS, OSB_FCFG, msgs)
    for w in (first, second):
        assert w.models["mail"].featurizer.config["osb"] == 5
        assert_same_stats(w.models["mail"].replica.model, ref)
    assert_same_stats(learnt_model(r, "mail")[0], ref)
    plain = offline_model("multinomial", PARAMS, {**OSB_FCFG, "osb": 0}, msgs)
    assert plain.stats.parts["features"].totals.sum() < ref.stats.parts["features"].totals.sum()

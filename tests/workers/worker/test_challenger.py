"""A challenger learnt from the same entries as the model (``--challenger SPEC``,
workers/replication/challenger.py): two workers on a real redis-server, its statistics
equal to an independent model of its configuration, both verdicts in ``:out`` and the
paired counts in the metrics."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamnb.exceptions import ConfigConflict
from streamnb_workers.observe.metrics import Metrics
from streamnb_workers.replication.challenger import challenger_key, parse_spec, stored_spec
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from tests.helpers.workers import (
    IN_ORDER,
    VOCAB,
    assert_same_stats,
    fast_options,
    offline_model,
    produce,
    run_in_threads,
    url_worker,
)

FCFG = {"bits": 12, "counts": "raw"}
PARAMS = {"n_features": 4096, "alpha": 0.1}


def _spec(name, error_weight=1.0, **params):
    return ModelSpec(name, kind="multinomial", featurizer_config=dict(FCFG),
                     model_params={**PARAMS, **params}, error_weight=error_weight,
                     decision={"min_class_weight": None})


def _solo_spec(name, fcfg, error_weight):
    """A model of the challenger's configuration (alpha 1, featurizer ``fcfg``) served alone."""
    return ModelSpec(name, kind="multinomial", featurizer_config=dict(fcfg),
                     model_params={**PARAMS, "alpha": 1.0}, error_weight=error_weight,
                     decision={"min_class_weight": None})


def _messages(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        c = ("spam", "ham")[int(rng.integers(2))]
        other = "ham" if c == "spam" else "spam"
        # some words of the other class, so verdicts go wrong and error weights matter
        words = list(rng.choice(VOCAB[c] + VOCAB["news"], size=int(rng.integers(3, 8))))
        words += list(rng.choice(VOCAB[other], size=int(rng.integers(0, 4))))
        out.append({"id": f"t{i}", "key": f"t{i}", "text": " ".join(map(str, words)),
                    "label": c if rng.random() < 0.8 else None})
    return out


def _outputs(r, name):
    return [msgpack.unpackb(f[b"data"], raw=False)
            for _, f in r.xrange(f"streamnb:{{{name}}}:out")]


def test_spec_syntax():
    assert parse_spec("alpha=1,osb=5") == {"alpha": 1, "osb": 5}
    for bad in ("alpha", "alpha=", "=1", "alpha=1,alpha=2"):
        with pytest.raises(ValueError):
            parse_spec(bad)


@pytest.mark.redis
def test_the_spec_is_stored_once(redis_server):
    r = redis_server.client()
    keys = ModelKeys("once")
    assert stored_spec(r, keys, None) is None
    assert stored_spec(r, keys, "alpha=1") == "alpha=1"
    assert stored_spec(r, keys, None) == "alpha=1"
    with pytest.raises(ConfigConflict, match="alpha=1"):
        stored_spec(r, keys, "alpha=2")
    r.delete(challenger_key(keys))


@pytest.mark.redis
@pytest.mark.parametrize("spec, fcfg", [("alpha=1,osb=5", {**FCFG, "osb": 5}),
                                        ("alpha=1", FCFG)])
def test_two_workers_learn_a_challenger_equal_to_an_independent_model(redis_server, spec, fcfg):
    """Champion with error weight 2; the challenger with its own alpha (and OSB), error
    weight 2 as well: its statistics equal those of a model of its configuration served
    alone on the same entries, its own error weights included."""
    r = redis_server.client()
    name, solo = f"champ{len(spec)}", f"solo{len(spec)}"
    msgs = _messages(300, seed=len(spec))
    produce(r, name, msgs)
    produce(r, solo, msgs)
    regs = [Metrics(CollectorRegistry()) for _ in range(2)]
    opts = dict(batch=20, challenger=spec, **IN_ORDER)
    workers = [url_worker(redis_server.url, [_spec(name, error_weight=2.0)],
                          fast_options(f"w{i}", **opts), metrics=regs[i]) for i in range(2)]
    run_in_threads(workers)
    alone = url_worker(redis_server.url, [_solo_spec(solo, fcfg, 2.0)],
                       fast_options("s0", batch=20))
    run_in_threads([alone])
    ref = alone.models[solo].replica.model
    for w in workers:
        rt = w.models[name]
        rt.tail()
        ch = rt.replica.challenger
        assert ch is not None and ch.spec == spec
        assert_same_stats(ch.model, ref)
    a, b = (w.models[name].replica for w in workers)
    assert_same_stats(a.model, b.model)
    # the champion is not the challenger: error weight 2 and alpha 0.1, without OSB
    assert ch.model.alpha == 1.0 and a.model.alpha == 0.1
    # :out: both verdicts, the challenger's equal to the solo model's, message by message
    outs, solo_outs = _outputs(r, name), {o["id"]: o for o in _outputs(r, solo)}
    assert len(outs) == len(msgs)
    for o in outs:
        s = solo_outs[o["id"]]
        if s["label"] is None:  # (before the first class is known: no verdict)
            assert "challenger" not in o
            continue
        assert o["challenger"]["label"] == s["label"]
        assert o["challenger"]["log_proba"] == pytest.approx(s["log_proba"], rel=1e-12)
    # metrics: the paired counts add up to the labelled messages, over both workers
    paired = {k: 0.0 for k in ("both", "champion", "challenger", "neither")}
    for reg, w in zip(regs, workers, strict=True):
        for k in paired:
            paired[k] += reg.challenger_paired.labels(model=name, worker=w.options.consumer,
                                                      right=k)._value.get()
    # (every labelled message predicted once a class was known)
    labelled = [o for o in outs if "true_label" in o and o["label"] is not None]
    assert 0 < sum(paired.values()) == len(labelled)
    champ_right = sum(o["label"] == o["true_label"] for o in outs if "true_label" in o)
    assert paired["both"] + paired["champion"] == champ_right
    r.delete(challenger_key(ModelKeys(name)))


@pytest.mark.redis
def test_a_challenger_without_error_weight_equals_an_offline_fit(redis_server):
    r = redis_server.client()
    msgs = _messages(200, seed=7)
    produce(r, "plain", msgs)
    w = url_worker(redis_server.url, [_spec("plain", error_weight=2.0)],
                   fast_options("p0", batch=15, challenger="error_weight=1,osb=3"))
    run_in_threads([w])
    ch = w.models["plain"].replica.challenger
    labelled = [m for m in msgs if m["label"] is not None]
    assert_same_stats(ch.model, offline_model("multinomial", PARAMS, {**FCFG, "osb": 3},
                                              labelled))
    r.delete(challenger_key(ModelKeys("plain")))


def test_the_command_line_takes_a_spec_and_refuses_a_malformed_one(capsys):
    from streamnb_workers.cli.main import build_parser

    parser = build_parser()
    args = parser.parse_args(["worker", "--model", "mail", "--challenger", "alpha=1,osb=5"])
    assert args.challenger == "alpha=1,osb=5"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["worker", "--model", "mail", "--challenger", "alpha"])
    assert exc.value.code == 2
    assert "expected key=value pairs" in capsys.readouterr().err


def test_a_spec_the_model_does_not_take_is_a_config_conflict():
    from streamnb_workers.replication.challenger import Challenger
    from streamnb_workers.store.model_config import resolve_spec

    cfg = resolve_spec(_spec("m"))
    with pytest.raises(ConfigConflict, match="neither a model parameter"):
        Challenger(cfg, "beta=1")
    with pytest.raises(ConfigConflict, match="alpha"):
        Challenger(cfg, "alpha=-1")


@pytest.mark.redis
def test_the_snapshot_holds_the_challenger(redis_server):
    """A worker that starts from a snapshot holds the challenger the others hold."""
    from streamnb_workers.replication.challenger import Challenger
    from streamnb_workers.replication.replica import Replica

    r = redis_server.client()
    msgs = _messages(120, seed=11)
    produce(r, "snap", msgs)
    w = url_worker(redis_server.url, [_spec("snap", error_weight=2.0)],
                   fast_options("n0", batch=25, challenger="alpha=0.5,osb=4"))
    run_in_threads([w])
    rt = w.models["snap"]
    assert rt.snapshotter.hold_lease() and rt.snapshotter.write(rt.replica)
    assert r.hexists(ModelKeys("snap").snapshot, "challenger")
    late = Replica(r, ModelKeys("snap"), rt.config)
    late.challenger = Challenger(rt.config, "alpha=0.5,osb=4")
    late.load()
    assert late.snapshot_version == rt.replica.version
    assert_same_stats(late.challenger.model, rt.replica.challenger.model)
    assert late.challenger.model.stats.parts["features"].totals.sum() > 0
    r.delete(challenger_key(ModelKeys("snap")))


@pytest.mark.redis
@pytest.mark.parametrize("n_workers", [1, 2])
def test_promote_makes_the_challenger_the_model_on_every_worker(redis_server, capsys,
                                                                 n_workers):
    """Workers learn a model and its challenger (alpha=1, OSB); ``streamnb promote``
    goes through the log: every replica then holds the same model, the challenger's, with
    its config stored, and it goes on learning as a model of that configuration served
    alone on every entry would."""
    from streamnb_workers.cli.main import main
    from streamnb_workers.store.model_config import read_config

    r = redis_server.client()
    name, solo, spec = "promo", "promosolo", "alpha=1,osb=5"
    msgs = _messages(240, seed=5)
    first, second = msgs[:120], msgs[120:]
    produce(r, name, first)
    produce(r, solo, msgs)
    workers = [url_worker(redis_server.url, [_spec(name, error_weight=2.0)],
                          fast_options(f"q{i}", batch=15, challenger=spec, **IN_ORDER))
               for i in range(n_workers)]
    run_in_threads(workers)
    assert main(["promote", "--model", name, "--redis", redis_server.url], env={}) == 0
    assert "promoting the challenger 'alpha=1,osb=5'" in capsys.readouterr().out
    produce(r, name, second)
    run_in_threads(workers)
    alone = url_worker(redis_server.url, [_solo_spec(solo, {**FCFG, "osb": 5}, 2.0)],
                       fast_options("qs", batch=15))
    run_in_threads([alone])
    ref = alone.models[solo].replica.model
    for w in workers:
        rt = w.models[name]
        rt.tail()
        assert rt.replica.challenger is None
        assert rt.config.featurizer["osb"] == 5 and rt.featurizer.config["osb"] == 5
        assert_same_stats(rt.replica.model, ref)
    a, b = workers[0].models[name].replica, workers[-1].models[name].replica
    assert a.version == b.version
    assert_same_stats(a.model, b.model)
    stored = read_config(r, name)
    assert stored.featurizer["osb"] == 5 and stored.model_params["alpha"] == 1.0
    assert r.get(challenger_key(ModelKeys(name))) is None
    # after the promotion, the verdicts are the promoted model's: those of the solo model
    # (the messages read in the promotion's batch still have the model's verdict, and the
    # challenger's in their challenger map)
    outs, solo_outs = _outputs(r, name), {o["id"]: o for o in _outputs(r, solo)}
    later = [o for o in outs if o["id"] in {m["id"] for m in second}]
    assert len(later) == len(second)
    assert sum("challenger" in o for o in later) <= 15
    bad = [(o, solo_outs[o["id"]]) for o in later
           if o.get("challenger", o)["label"] != solo_outs[o["id"]]["label"]]
    assert not bad, bad[:2]


def test_a_promotion_that_names_another_challenger_changes_nothing():
    from streamnb_workers.replication.challenger import Challenger, promoted
    from streamnb_workers.store.model_config import resolve_spec

    ch = Challenger(resolve_spec(_spec("m")), "alpha=1")
    assert promoted(ch, "alpha=1", "m", "1-0")
    assert not promoted(ch, "alpha=2", "m", "1-0")
    assert not promoted(None, "alpha=1", "m", "1-0")


@pytest.mark.redis
def test_promote_without_a_challenger_is_refused(redis_server, capsys):
    from streamnb_workers.cli.main import main
    from streamnb_workers.store.model_config import ensure_config

    r = redis_server.client()
    ensure_config(r, _spec("nochallenger"))
    assert main(["promote", "--model", "nochallenger", "--redis", redis_server.url], env={}) == 2
    assert "has no challenger" in capsys.readouterr().err
    assert r.xlen(ModelKeys("nochallenger").input) == 0


def _everything(seed: int) -> list[dict]:
    """Messages, then what else a model learns: delayed labels (in another batch and in
    the same one), corrections, forgets and keys relearnt under another label."""
    msgs = _messages(260, seed=seed)
    early, late = msgs[:100], msgs[100:200]
    truth = {m["id"]: ("spam" if "spam" in m["text"] else "ham") for m in msgs}
    flip = {"spam": "ham", "ham": "spam"}
    stream = list(early)
    stream += [{"ref": m["id"], "label": truth[m["id"]]} for m in early if m["label"] is None]
    for m in late:  # a delayed label right behind its message
        stream.append(m)
        if m["label"] is None:
            stream.append({"ref": m["id"], "label": flip[truth[m["id"]]]})
    labelled = [m for m in early if m["label"] is not None]
    stream += [{"ref": m["id"], "label": flip[m["label"]]} for m in labelled[:10]]  # corrected
    stream += [{"forget": True, "key": m["key"], "text": m["text"]} for m in labelled[10:15]]
    stream += [{"id": f"re{m['id']}", "key": m["key"], "text": m["text"],
                "label": flip[m["label"]]} for m in labelled[15:20]]  # relearnt
    stream += [{"ref": m["id"], "label": flip[m["label"]]} for m in labelled[20:23]
               ] + msgs[200:]  # corrected again below, after more traffic
    stream += [{"ref": m["id"], "label": m["label"]} for m in labelled[20:23]]
    return [{k: v for k, v in m.items() if v is not None} for m in stream]


@pytest.mark.redis
@pytest.mark.parametrize("spec, fcfg, error_weight", [
    ("alpha=1,osb=5", {**FCFG, "osb": 5}, 2.0), ("alpha=1,error_weight=1", FCFG, 1.0)])
def test_the_challenger_learns_what_a_model_of_its_config_learns_alone(
        redis_server, spec, fcfg, error_weight):
    """Delayed labels, corrections, forgets and relearnt keys teach the challenger what
    they teach a model of its configuration served alone, with the weights it learnt
    each message with (one worker: the equality is exact)."""
    r = redis_server.client()
    name, solo = f"all{len(spec)}", f"allsolo{len(spec)}"
    stream = _everything(seed=len(spec))
    produce(r, name, stream)
    produce(r, solo, stream)
    w = url_worker(redis_server.url, [_spec(name, error_weight=2.0)],
                   fast_options("e0", batch=15, challenger=spec))
    run_in_threads([w])
    alone = url_worker(redis_server.url, [_solo_spec(solo, fcfg, error_weight)],
                       fast_options("e1", batch=15))
    run_in_threads([alone])
    assert r.xlen(ModelKeys(name).dead) == r.xlen(ModelKeys(solo).dead) == 0
    ref = alone.models[solo].replica
    rt = w.models[name]
    rt.tail()
    assert rt.replica.learnt == ref.learnt
    assert_same_stats(rt.replica.challenger.model, ref.model)
    # and the same again from the log alone
    from streamnb_workers.replication.challenger import Challenger
    from streamnb_workers.replication.replica import Replica

    again = Replica(r, ModelKeys(name), rt.config)
    again.challenger = Challenger(rt.config, spec)
    again.load()
    assert_same_stats(again.challenger.model, ref.model)
    r.delete(challenger_key(ModelKeys(name)))


@pytest.mark.redis
@pytest.mark.parametrize("spec, fcfg, error_weight", [
    ("alpha=1,osb=5", {**FCFG, "osb": 5}, 2.0), ("alpha=1,error_weight=1", FCFG, 1.0)])
def test_the_challenger_forgets_a_source_as_a_model_of_its_config_does(
        redis_server, spec, fcfg, error_weight):
    """Two sources teach the model and its challenger (labels, delayed labels,
    corrections); ``forget --source`` takes one out of both: the challenger is then what a
    model of its configuration served alone holds after the same forget, and so is the
    model it becomes when promoted, after the same forget again."""
    from streamnb_workers.cli.main import main
    from streamnb_workers.client.forget import forget_source

    r = redis_server.client()
    name, solo = f"src{len(spec)}", f"srcsolo{len(spec)}"
    msgs = _everything(seed=3 + len(spec))
    taught = [{**m, "source": ("imap", "bulk")[i % 2]} if "label" in m else m
              for i, m in enumerate(msgs)]
    first, second = taught[:250], taught[250:]
    solo_spec = _solo_spec(solo, fcfg, error_weight)
    w = url_worker(redis_server.url, [_spec(name, error_weight=2.0)],
                   fast_options("f0", batch=15, challenger=spec))
    alone = url_worker(redis_server.url, [solo_spec], fast_options("f1", batch=15))
    for part in (first, second):
        produce(r, name, part)
        produce(r, solo, part)
        run_in_threads([w])
        run_in_threads([alone])
        forget_source(r, name, "imap")
        forget_source(r, solo, "imap")
        w.models[name].tail()
        alone.models[solo].tail()
        ch, ref = w.models[name].replica.challenger, alone.models[solo].replica
        assert ch.sources.epochs == ref.sources.epochs == w.models[name].replica.sources.epochs
        assert set(ch.sources.parts) == set(ref.sources.parts) >= {"bulk"}
        assert_same_stats(ch.model, ref.model)
    # from a snapshot: the challenger's parts come back with it
    rt = w.models[name]
    from streamnb_workers.replication.challenger import Challenger
    from streamnb_workers.replication.replica import Replica

    assert rt.snapshotter.hold_lease() and rt.snapshotter.write(rt.replica)
    late = Replica(r, ModelKeys(name), rt.config)
    late.challenger = Challenger(rt.config, spec)
    late.load()
    assert set(late.challenger.sources.parts) == set(ref.sources.parts)
    assert_same_stats(late.challenger.model, ref.model)
    # promoted, it keeps its parts: a forget of bulk leaves what the solo model keeps
    assert main(["promote", "--model", name, "--redis", redis_server.url], env={}) == 0
    run_in_threads([w])
    forget_source(r, name, "bulk")
    forget_source(r, solo, "bulk")
    w.models[name].tail()
    alone.models[solo].tail()
    assert w.models[name].replica.challenger is None
    assert_same_stats(w.models[name].replica.model, alone.models[solo].replica.model)


@pytest.mark.redis
@pytest.mark.parametrize("seed", [13, 16])
def test_two_workers_learn_delayed_labels_and_forgets_as_one_does(redis_server, seed):
    """A batch of delayed labels or forgets alone (no message to predict) waits for the
    earlier labelled batches of other workers too: what it resolves against (their cache
    entries, learn-once records) is there, so two workers learn what one does, the
    challenger's statistics included."""
    r = redis_server.client()
    stream = _everything(seed=seed)
    runs = {}
    for n in (1, 2):
        name = f"both{seed}x{n}"
        produce(r, name, stream)
        ws = [url_worker(redis_server.url, [_spec(name, error_weight=2.0)],
                         fast_options(f"{name}w{i}", batch=15, challenger="alpha=1,osb=5",
                                      **IN_ORDER)) for i in range(n)]
        run_in_threads(ws)
        rt = ws[-1].models[name]
        rt.tail()
        runs[n] = rt.replica
        r.delete(challenger_key(ModelKeys(name)))
    assert runs[1].learnt == runs[2].learnt
    assert_same_stats(runs[2].model, runs[1].model)
    assert_same_stats(runs[2].challenger.model, runs[1].challenger.model)

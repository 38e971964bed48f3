"""Prequential predictions within a batch: row i is predicted by the model plus the labelled
rows before it, exactly as a one-row-at-a-time loop would, and the model is left unchanged."""

from __future__ import annotations

import zlib
from typing import Any

import msgpack
import numpy as np
import pytest
import scipy.sparse as sp

from streamnb.exceptions import NotFittedError
from streamnb.features import Featurizer
from streamnb.models import make_model
from streamnb.models import prequential as prequential_module
from streamnb.models.prequential import generic_prequential
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import resolve_spec
from streamnb_workers.wire.codec import decode_input
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.c_steps import c_or_reference
from tests.helpers.workers import count_spec, fast_options, produce, token_messages, url_worker

# ---------------------------------------------------------------------- reference loop


@pytest.fixture(params=["C", "numpy"])
def jll_path(request, monkeypatch):
    """MultinomialNB's prequential sums by the C loop (streamnb._kernels, when built)
    or by numpy (its reference)."""
    return c_or_reference(request, monkeypatch, prequential_module, "MULTINOMIAL_JLL")


def reference_loop(model: Any, X: Any, y: list, w: np.ndarray | None) -> tuple[list, list]:
    """Row i: a fresh model from the prior statistics, fitted on the labelled rows < i,
    predicts row i. Returns (classes per row or None, log posteriors per row or None)."""
    classes, lps = [], []
    for i in range(X.shape[0]):
        fresh = type(model).from_stats(model.stats, **model.get_params())
        rows = [k for k in range(i) if y[k] is not None]
        if rows:
            fresh.partial_fit(X[rows], [y[k] for k in rows],
                              sample_weight=None if w is None else w[rows])
        try:
            lps.append(fresh.predict_log_proba(X[i:i + 1])[0])
            classes.append(fresh.classes_.tolist())
        except NotFittedError:
            lps.append(None)
            classes.append(None)
    return classes, lps


def fingerprint(model: Any) -> bytes:
    """The encoded statistics (an empty model: empty bytes, after checking it is empty;
    CategoryCounts cannot encode an empty statistic)."""
    if not model.stats["classes"].labels:
        assert model.stats.is_empty()
        return b""
    return model.stats.to_bytes()


def assert_matches_loop(model: Any, X: Any, y: list, w: np.ndarray | None,
                        fallback: bool = False) -> Any:
    before = fingerprint(model)
    pred = generic_prequential(model, X, y, w) if fallback else \
        model.predict_log_proba_prequential(X, y, w)
    assert fingerprint(model) == before  # the model did not learn the batch
    ref_classes, ref_lp = reference_loop(model, X, y, w)
    assert pred.log_proba.shape == (X.shape[0], len(pred.classes))
    for i, (cls, lp) in enumerate(zip(ref_classes, ref_lp, strict=True)):
        if cls is None:
            assert pred.n_known[i] == 0 and np.isnan(pred.log_proba[i]).all()
            continue
        # the classes known at row i: the model's (sorted), then the batch's new ones in
        # order of first appearance; the loop's model has them sorted: aligned by label
        known = pred.classes[: pred.n_known[i]]
        assert sorted(known) == cls, i
        col = [known.index(c) for c in cls]
        np.testing.assert_allclose(pred.log_proba[i, col], lp, rtol=1e-12, atol=1e-9,
                                   err_msg=f"row {i}")
        assert np.isneginf(pred.log_proba[i, len(cls):]).all()
        # the learnt log priors of row i's model (class weight shares)
        rows = [k for k in range(i) if y[k] is not None]
        weights = np.ones(X.shape[0]) if w is None else w
        total = sum(model.stats["classes"].as_dict().get(c, 0.0) for c in cls) + weights[rows].sum()
        for j, c in zip(col, cls, strict=True):
            n_c = model.stats["classes"].as_dict().get(c, 0.0) + sum(
                weights[k] for k in rows if y[k] == c)
            expect = np.log(n_c / total) if n_c > 0 else -np.inf
            assert pred.log_prior[i, j] == pytest.approx(expect, rel=1e-12, abs=1e-12)
    return pred


# ---------------------------------------------------------------------- data


def labels_with_new_class(rng: np.random.Generator, n: int, prior: list, new: list) -> list:
    """Labels from ``prior`` classes, ``new`` classes appearing mid-batch, ~30% unlabelled."""
    y: list = []
    for i in range(n):
        pool = prior + (new if i >= n // 3 else [])
        if not pool or rng.random() < 0.3:
            y.append(None)
        else:
            y.append(pool[int(rng.integers(len(pool)))])
    return y


def count_data(rng: np.random.Generator, n: int, d: int, classes: int = 3) -> tuple[np.ndarray, list]:
    y = [int(rng.integers(classes)) for _ in range(n)]
    X = rng.poisson(0.4, size=(n, d)).astype(np.float64)
    for i, c in enumerate(y):
        X[i, c * 3:(c * 3) + 3] += rng.poisson(1.5, size=3)
    return X, y


def gaussian_data(rng: np.random.Generator, n: int, d: int, labels: list) -> np.ndarray:
    centres = {lab: rng.normal(0, 3, size=d) for lab in {"a", "b", "c", "d", None}}
    return np.vstack([rng.normal(centres[lab], 1.0 + 0.5 * rng.random(d)) for lab in labels])


KINDS = {
    "multinomial": [{"alpha": 0.1, "smoothing_m": "seen"}, {"alpha": 1.0, "smoothing_m": "columns"},
                    {"alpha": 0.5, "smoothing_m": "seen", "n_features": 40}],
    "bernoulli": [{"alpha": 1.0}, {"alpha": 0.1, "smoothing_m": "seen"}],
    "categorical": [{"alpha": 1.0}],
    "gaussian": [{}],
    # without regularisation, a class with fewer samples than features has a singular
    # covariance and the jittered factor amplifies rounding beyond 1e-9
    "lda": [{"shrinkage": 0.2}],
    "qda": [{"reg_param": 0.1}],
    "hybrid": [{"n_meta": 2, "alpha": 0.2, "smoothing_m": "seen"}],
}
CASES = [(kind, params) for kind, plist in KINDS.items() for params in plist]


def make_batch(kind: str, params: dict, seed: int, with_prior: bool, weighted: bool):
    """(model, X, y, w): a model with or without prior statistics, a batch with a class
    appearing mid-batch, unlabelled rows and (optionally) weights."""
    rng = np.random.default_rng(seed)
    n_prior, n = 30, 36
    prior_labels = ["a", "b"] if with_prior else []
    y = labels_with_new_class(rng, n, prior_labels, ["c", "d"] if with_prior else ["a", "c"])
    w = rng.uniform(0.3, 2.5, size=n) if weighted else None
    model = make_model(kind, **params)
    if kind in ("multinomial", "bernoulli", "categorical", "hybrid"):
        d = 40
        Xp, yp = count_data(rng, n_prior, d)
        X, _ = count_data(rng, n, d)
        if kind == "hybrid":  # two Gaussian meta columns at the end
            Xp[:, -2:] = rng.normal(size=(n_prior, 2))
            X[:, -2:] = rng.normal(size=(n, 2))
            Xp[:, -2:] += np.array([[ord(str(c)) % 3] for c in yp])
        if kind == "multinomial":
            X[5, 30:] = 0.0
            X[5, 39] = 3.0  # a column nobody has seen before
        prior_y = [["a", "b"][c % 2] for c in yp]
        if kind in ("multinomial", "bernoulli", "hybrid"):
            Xp, X = sp.csr_matrix(Xp), sp.csr_matrix(X)
    else:
        prior_y = [["a", "b"][int(rng.integers(2))] for _ in range(n_prior)]
        Xp = gaussian_data(rng, n_prior, 3, prior_y)
        X = gaussian_data(rng, n, 3, y)
    if with_prior:
        model.partial_fit(Xp, prior_y, sample_weight=rng.uniform(0.5, 2, n_prior) if weighted else None)
    return model, X, y, w


@pytest.mark.parametrize(("kind", "params"), CASES, ids=[f"{k}-{i}" for k, i in
                                                          [(k, j) for k, pl in KINDS.items()
                                                           for j in range(len(pl))]])
@pytest.mark.parametrize("with_prior", [True, False])
@pytest.mark.parametrize("weighted", [False, True])
def test_prequential_equals_one_row_at_a_time(kind, params, with_prior, weighted):
    model, X, y, w = make_batch(kind, params, seed=zlib.crc32(f"{kind}{params}{with_prior}{weighted}".encode()),
                                with_prior=with_prior, weighted=weighted)
    pred = assert_matches_loop(model, X, y, w)
    if not with_prior:  # rows before the first label have no prediction
        first = next(i for i, lab in enumerate(y) if lab is not None)
        assert not pred.predicted[: first + 1].any() and pred.predicted[first + 1:].all()


@pytest.mark.parametrize("params", KINDS["multinomial"])
@pytest.mark.parametrize("with_prior", [True, False])
def test_multinomial_numpy_form_equals_one_row_at_a_time(params, with_prior, monkeypatch):
    """The numpy form (the reference for the C loop, which the test above runs when built)."""
    monkeypatch.setattr(prequential_module, "MULTINOMIAL_JLL", None)
    model, X, y, w = make_batch("multinomial", params, seed=zlib.crc32(f"{params}{with_prior}".encode()),
                                with_prior=with_prior, weighted=True)
    assert_matches_loop(model, X, y, w)


@pytest.mark.parametrize("smoothing_m", ["seen", "columns"])
def test_multinomial_fast_path_equals_the_generic_fallback(smoothing_m, jll_path):
    model, X, y, w = make_batch("multinomial", {"alpha": 0.3, "smoothing_m": smoothing_m},
                                seed=7, with_prior=True, weighted=True)
    fast = model.predict_log_proba_prequential(X, y, w)
    slow = assert_matches_loop(model, X, y, w, fallback=True)
    assert fast.classes == slow.classes
    np.testing.assert_array_equal(fast.n_known, slow.n_known)
    np.testing.assert_allclose(fast.log_proba, slow.log_proba, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("kind", ["multinomial", "gaussian"])
def test_a_batch_without_labels_is_predicted_by_the_model_alone(kind):
    params = {"alpha": 0.1, "smoothing_m": "seen"} if kind == "multinomial" else {}
    model, X, y, w = make_batch(kind, params, seed=2, with_prior=True, weighted=False)
    y = [None] * (X.shape[0] - 1) + ["z"]  # a label on the last row teaches no row
    pred = model.predict_log_proba_prequential(X, y)
    assert pred.classes == [*model.classes_.tolist(), "z"]
    np.testing.assert_array_equal(pred.log_proba[:, :2], model.predict_log_proba(X))
    assert np.isneginf(pred.log_proba[:, 2]).all() and (pred.n_known == 2).all()
    empty = make_model(kind, **params)
    none = empty.predict_log_proba_prequential(X, [None] * X.shape[0])
    assert none.classes == [] and not none.predicted.any()


def test_int_labels_dense_input_and_zero_weights(jll_path):
    rng = np.random.default_rng(3)
    X, yy = count_data(rng, 25, 12)
    model = make_model("multinomial", alpha=0.2, smoothing_m="seen").partial_fit(X[:5], yy[:5])
    y: list = [c if i % 4 else None for i, c in enumerate(yy[5:])]
    w = rng.uniform(0.0, 2.0, size=20)
    w[[2, 3]] = 0.0
    assert_matches_loop(model, X[5:], y, w)


def test_hashed_width_model_sees_only_batch_columns(jll_path):
    """A 2**20-wide model: the vectorised path allocates nothing of that width per row."""
    rng = np.random.default_rng(5)
    d = 2 ** 20
    model = make_model("multinomial", alpha=0.1, smoothing_m="seen", n_features=d)
    cols = rng.choice(d, size=60, replace=False)
    rows = np.repeat(np.arange(20), 6)
    X = sp.csr_matrix((rng.integers(1, 4, size=120).astype(float), (rows, rng.choice(cols, 120))),
                      shape=(20, d))
    y = ["spam" if i % 3 else "ham" for i in range(20)]
    y[7] = None
    assert_matches_loop(model, X, y, None)


@pytest.mark.skipif(prequential_module.MULTINOMIAL_JLL is None,
                    reason="streamnb._kernels is not built")
@pytest.mark.parametrize("seed", range(40))
def test_the_c_loop_equals_numpy(seed, monkeypatch):
    """streamnb._kernels.multinomial_jll against the numpy form (the reference) on
    random batches: either smoothing width, 0-3 prior classes, classes new in the batch,
    zero weights, explicit zeros, empty rows, columns the model has never seen, a model
    without statistics (no columns yet, width unset) and batches with one row."""
    rng = np.random.default_rng(seed)
    d = int(rng.integers(5, 60))
    seen = bool(rng.integers(2))
    width = None if rng.random() < 0.3 else d
    model = make_model("multinomial", alpha=float(rng.uniform(0.05, 2.0)),
                       smoothing_m="seen" if seen else "columns", n_features=width)
    prior = ["a", "b", "c"][: int(rng.integers(0, 4))]
    if prior:
        Xp = sp.random(25, d, density=0.2, random_state=rng, format="csr")
        Xp.data = np.ceil(Xp.data * 4)
        model.partial_fit(Xp, [prior[i % len(prior)] for i in range(25)])
    n = int(rng.integers(1, 50))
    X = sp.random(n, d, density=float(rng.uniform(0.02, 0.5)), random_state=rng, format="csr")
    X.data = np.floor(X.data * 4)                        # some explicit zeros
    y = [None if rng.random() < 0.3 else ["a", "b", "c", "d"][int(rng.integers(4))]
         for _ in range(n)]
    w = rng.uniform(0.0, 3.0, size=n)
    w[rng.random(n) < 0.15] = 0.0
    got = model.predict_log_proba_prequential(X, y, w)
    # the plan's columns (found once for the batch) and a plan for other weights: the same bits
    plan = model.prequential_plan(X, y)
    assert plan.columns is not None
    for p in (model.prequential_plan(X, y, w), plan.for_weights()):
        planned = model.predict_log_proba_prequential(X, y, w, plan=p)
        assert planned.log_proba.tobytes() == got.log_proba.tobytes()
    monkeypatch.setattr(prequential_module, "MULTINOMIAL_JLL", None)
    want = model.predict_log_proba_prequential(X, y, w)
    assert got.classes == want.classes
    np.testing.assert_array_equal(got.n_known, want.n_known)
    np.testing.assert_array_equal(np.isnan(got.log_proba), np.isnan(want.log_proba))
    np.testing.assert_allclose(got.log_proba, want.log_proba, rtol=1e-12, atol=1e-10)
    if got.unseen_share is not None or want.unseen_share is not None:
        np.testing.assert_array_equal(got.unseen_share, want.unseen_share)


@pytest.mark.parametrize("smoothing_m", ["seen", "columns"])
@pytest.mark.parametrize("with_prior", [True, False])
def test_the_unseen_share_is_what_the_worker_computes_from_the_model(smoothing_m, with_prior,
                                                                     jll_path):
    """The share of each row's features the model has no count for, found by the
    prediction, equals the model's own ``unseen_share``, which the worker reads for the
    out-of-vocabulary metric and drift detector when the prediction did not find it."""
    rng = np.random.default_rng(13)
    X = sp.random(30, 40, density=0.3, random_state=rng, format="csr")
    X.data = np.floor(X.data * 3)
    X.eliminate_zeros()                                  # as the featurizer stacks rows
    model = make_model("multinomial", alpha=0.3, smoothing_m=smoothing_m, n_features=40)
    if with_prior:  # the model has seen the first 25 columns only
        Xp = np.ceil(sp.random(20, 40, density=0.5, random_state=rng).toarray())
        Xp[:, 25:] = 0.0
        model.partial_fit(sp.csr_matrix(Xp), ["a", "b"] * 10)
    y = [None if i % 3 else ["a", "b", "c"][i % 2] for i in range(30)]
    pred = model.predict_log_proba_prequential(X, y, rng.uniform(0.5, 2, 30))
    want = model.unseen_share(X)
    assert 0 < want.mean() < 1 if with_prior else (want[np.diff(X.indptr) > 0] == 1).all()
    np.testing.assert_allclose(pred.unseen_share, want, rtol=1e-12, atol=1e-15)


@pytest.mark.skipif(prequential_module.MULTINOMIAL_JLL is None,
                    reason="streamnb._kernels is not built")
def test_the_c_loop_refuses_inconsistent_arrays():
    """Arrays that do not fit each other raise instead of reading out of bounds."""
    jll = prequential_module.MULTINOMIAL_JLL
    indptr, indices = np.array([0, 2, 3], np.int32), np.array([0, 4, 1], np.int32)
    data, codes, w = np.ones(3), np.array([0, -1]), np.ones(2)
    counts, totals, out, unseen = np.ones((1, 5)), np.ones(2), np.empty((2, 2)), np.empty(2, np.int64)
    counts[0, 4] = 0.0
    args = [indptr, indices, data, codes, w, counts, 1, 5, totals, 1.0, True, 5, 5, out, unseen]
    jll(*args)
    assert np.isfinite(out).all() and unseen.tolist() == [1, 0]  # column 4: no count
    for at, bad, match in [(0, np.array([0, 2, 4], np.int32), "indptr must run from 0 to nnz"),
                           (0, np.array([0, 3, 3, 3], np.int32), "sizes do not fit"),
                           (3, np.array([0, 2]), "class code 2 is not in"),
                           (1, np.array([0, -4, 1], np.int32), r"column -4 is not in \[0, 2\*\*32 - 1\)"),
                           (5, np.ones((1, 4)), "sizes do not fit"),
                           (9, 0.0, "alpha > 0"),
                           (2, np.ones(3, np.float32), "take 4- or 8-byte items"),
                           (14, np.empty(3, np.int64), "unseen n")]:
        with pytest.raises((ValueError, TypeError), match=match):
            jll(*args[:at], bad, *args[at + 1:])
    with pytest.raises(TypeError, match="takes 15 or 17 arguments"):
        jll(*args[:-1])
    # the batch's columns given (rank of each nonzero, the sorted columns): the same bits
    first = out.copy()
    jll(*args, np.array([0, 2, 1], np.int32), np.array([0, 1, 4], np.int64))
    assert out.tobytes() == first.tobytes()
    for rank, cols, match in [(np.array([0, 3, 1], np.int32), np.array([0, 1, 4]), "rank is not in"),
                              (np.array([0, 2], np.int32), np.array([0, 1, 4]), "rank takes nnz"),
                              (np.array([0, 2, 1], np.int32), np.array([0, 1, -4]), "column -4")]:
        with pytest.raises(ValueError, match=match):
            jll(*args, rank, cols)


def test_bad_input_raises_and_changes_nothing():
    model, X, y, w = make_batch("multinomial", {"alpha": 0.1, "smoothing_m": "seen"}, seed=1,
                                with_prior=True, weighted=False)
    before = model.stats.to_bytes()
    with pytest.raises(ValueError, match="y has 3 labels, but X has 36 samples"):
        model.predict_log_proba_prequential(X, y[:3])
    with pytest.raises(ValueError, match="mixed types|labels of mixed"):
        model.predict_log_proba_prequential(X, [1] + [None] * 35)
    with pytest.raises(ValueError, match="features, but MultinomialNB is expecting 40 features"):
        model.predict_log_proba_prequential(X[:, :10], y)
    with pytest.raises(ValueError, match="sample_weight must be >= 0"):
        model.predict_log_proba_prequential(X, y, -np.ones(36))
    assert model.stats.to_bytes() == before


# ---------------------------------------------------------------------- through the daemon


def _one_at_a_time(r: Any, name: str, kind: str, params: dict, fconf: dict, msgs: list) -> int:
    """Check every prediction in :out against the library predicting each message with
    everything learnt before it, then learning it; returns the number of checked messages."""
    outs = {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in r.xrange(ModelKeys(name).out))}
    assert len(outs) == len(msgs)
    f = Featurizer.from_config(fconf)
    model = make_model(kind, **params)
    n_checked = 0
    for m in msgs:
        X = f.stack([f.featurize(decode_input(msgpack.packb(m), "0-0").as_payload())])
        out = outs[m["id"]]
        try:
            lp = model.predict_log_proba(X)[0]
        except NotFittedError:
            assert out["label"] is None and out["log_proba"] == {}
        else:
            expect = dict(zip(model.classes_.tolist(), lp.tolist(), strict=True))
            assert out["log_proba"] == pytest.approx(expect, rel=1e-9, abs=1e-9), m["id"]
            assert out["label"] == max(expect, key=expect.get)
            n_checked += 1
        if m.get("label") is not None:
            model.partial_fit(X, [m["label"]])
    return n_checked


@pytest.mark.redis
def test_worker_gaussian_predictions_equal_the_one_message_at_a_time_loop(redis_server):
    """The generic path through the daemon (GaussianNB on dense vectors, batch 40)."""
    from streamnb_workers.store.model_config import ModelSpec
    from tests.helpers.workers import vector_messages

    r = redis_server.client()
    msgs = vector_messages(120, d=3, seed=4)
    for i in range(0, 120, 3):
        msgs[i].pop("label")
    produce(r, "vec", msgs)
    fconf = {"input": "dense", "dim": 3}
    spec = ModelSpec("vec", kind="gaussian", featurizer_config=fconf)
    url_worker(redis_server.url, [spec], fast_options("g1", batch=40)).run_until_idle()
    params = resolve_spec(ModelSpec("vec", kind="gaussian", featurizer_config=fconf)).model_params
    assert _one_at_a_time(r, "vec", "gaussian", params, fconf, msgs) >= 110


@pytest.mark.redis
def test_worker_predictions_equal_the_one_message_at_a_time_loop(redis_server):
    """One worker, batches of 100: every prediction in :out is the library's, predicting
    each message with everything learnt before it (as a one-at-a-time loop)."""
    r = redis_server.client()
    msgs = token_messages(260, seed=11, labelled_share=0.7)
    produce(r, "mail", msgs)
    w = url_worker(redis_server.url, [count_spec()], fast_options("w1", batch=100))
    w.run_until_idle()
    params = resolve_spec(count_spec()).model_params
    assert _one_at_a_time(r, "mail", "multinomial", params, {"bits": 10, "counts": "raw"},
                          msgs) >= len(msgs) - 2


def test_the_worker_skips_the_costly_exact_method_for_bernoulli(monkeypatch):
    """BernoulliNB's exact in-batch method copies its 2**20-wide table per batch: the worker
    predicts its batches whole instead (prequential applies where it is cheap)."""
    import fakeredis

    from streamnb.models import BernoulliNB, MultinomialNB
    from streamnb_workers.store.connection import ClientConnector
    from streamnb_workers.store.model_config import ModelSpec
    from streamnb_workers.worker import Worker

    assert MultinomialNB.cheap_prequential and not BernoulliNB.cheap_prequential

    def refuse(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the per-batch copy of a Bernoulli table must not run")

    monkeypatch.setattr(BernoulliNB, "predict_log_proba_prequential", refuse)
    r = fakeredis.FakeRedis()
    w = Worker(ClientConnector(r), [ModelSpec("b", kind="bernoulli", featurizer_config={"bits": 8})],
               fast_options("w1"))
    rows = [("cheap meds", "spam"), ("meeting notes", "ham"), ("cheap pills", None)] * 3
    for i, (text, label) in enumerate(rows):  # repeated texts: a learn-once key each
        r.xadd(ModelKeys("b").input,
               {"data": msgpack.packb({"text": text, "label": label, "key": f"k{i}"})})
    w.run_until_idle()
    outs = [decode_output(d[b"data"]) for _, d in r.xrange(ModelKeys("b").out)]
    assert len(outs) == 9 and w.models["b"].replica.learnt == 6


def test_non_canonical_csr_with_empty_rows_equals_one_row_at_a_time(jll_path):
    """Duplicate entries (summed), explicit zeros, unsorted indices and empty rows (first,
    middle and last) give what the canonical matrix gives; the caller's X is untouched."""
    rng = np.random.default_rng(9)
    d = 30
    Xp, yp = count_data(rng, 20, d)
    model = make_model("multinomial", alpha=0.2, smoothing_m="seen").partial_fit(
        sp.csr_matrix(Xp), [["a", "b"][c % 2] for c in yp])
    n = 12
    indptr, indices, data = [0], [], []
    for i in range(n):
        if i not in (0, 5, n - 1):
            cols = rng.integers(0, d, size=6)            # repeats: duplicate entries
            indices += cols[::-1].tolist()               # unsorted within the row
            data += rng.integers(0, 3, size=6).tolist()  # some explicit zeros
        indptr.append(len(indices))
    X = sp.csr_matrix((np.array(data, float), np.array(indices), np.array(indptr)), shape=(n, d))
    assert not X.has_canonical_format
    raw = (X.data.copy(), X.indices.copy(), X.indptr.copy())
    y = ["a", "c", None, "b", "a", "c", None, "a", "b", "c", "a", "b"]
    pred = model.predict_log_proba_prequential(X, y)
    assert all(np.array_equal(a, b) for a, b in zip(raw, (X.data, X.indices, X.indptr), strict=True))
    canonical = sp.csr_matrix(X.toarray())
    expect = model.predict_log_proba_prequential(canonical, y)
    np.testing.assert_allclose(pred.log_proba, expect.log_proba, rtol=1e-12, atol=1e-12)
    assert_matches_loop(model, canonical, y, None)


@pytest.mark.parametrize("smoothing_m", ["seen", "columns"])
def test_a_plan_made_before_the_model_changed_gives_the_same_predictions(smoothing_m, jll_path):
    """What a worker does: plan the batch, apply other workers' deltas, then predict. Equal
    to predicting without the plan after the same change, bit for bit, also when the
    change brings a class the plan did not know (the plan is then made again)."""
    from streamnb.models.multinomial import MultinomialNB

    rng = np.random.default_rng(11)
    d = 64

    def batch(n: int, labels: list) -> tuple[sp.csr_matrix, list, np.ndarray]:
        X = sp.random(n, d, density=0.15, random_state=rng, format="csr")
        X.data = np.ceil(X.data * 3)
        return X, [labels[i] if rng.random() < 0.7 else None for i in rng.integers(0, len(labels), n)], \
            rng.uniform(0.5, 2.0, n)

    changes = [(["ham", "spam"], "same classes"), (["ham", "spam", "eggs"], "a class new to the plan"),
               (["bacon"], "a class not in the batch")]
    for labels, _why in changes:
        model = MultinomialNB(alpha=0.3, n_features=d, smoothing_m=smoothing_m)
        X0, y0, _ = batch(40, ["ham", "spam"])
        model.partial_fit(X0, [lab or "ham" for lab in y0])
        X, y, w = batch(30, ["ham", "spam", "eggs"])
        plan = model.prequential_plan(X, y, w)
        Xc, yc, _ = batch(20, labels)
        model.partial_fit(Xc, [lab or labels[0] for lab in yc])  # another worker's delta
        got = model.predict_log_proba_prequential(X, y, w, plan=plan)
        want = model.predict_log_proba_prequential(X, y, w)
        assert got.classes == want.classes
        np.testing.assert_array_equal(got.log_proba, want.log_proba)
        np.testing.assert_array_equal(got.n_known, want.n_known)


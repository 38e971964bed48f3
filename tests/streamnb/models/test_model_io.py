"""make_model, dumps/loads and save/load: exact round trips, clear refusals."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_digits

from streamnb.encoding import dumps as pack
from streamnb.encoding import loads as unpack
from streamnb.exceptions import FormatError
from streamnb.models.bernoulli import BernoulliNB
from streamnb.models.categorical import CategoricalNB
from streamnb.models.io import MODEL_FORMAT_VERSION, dumps, load, loads, make_model, save
from streamnb.models.multinomial import MultinomialNB


@pytest.fixture(scope="module")
def digits():
    return load_digits(return_X_y=True)


MODELS = [
    ("multinomial", {"alpha": 0.5, "smoothing_m": "seen"}),
    ("bernoulli", {"alpha": 2.0, "binarize": 3.0, "n_features": 64}),
    ("categorical", {"alpha": 0.3}),
]


@pytest.mark.parametrize("kind, params", MODELS)
def test_round_trip_is_exact_and_keeps_learning(kind, params, digits, tmp_path):
    X, y = digits
    model = make_model(kind, **params).fit(X[:1000], y[:1000])
    clone = loads(dumps(model))
    assert type(clone) is type(model) and clone.get_params() == model.get_params()
    assert np.array_equal(clone.predict_log_proba(X), model.predict_log_proba(X))
    path = tmp_path / f"{kind}.snb"
    save(model, path)
    from_file = load(path)
    assert np.array_equal(from_file.predict_log_proba(X), model.predict_log_proba(X))
    # a loaded model continues exactly like the original
    model.partial_fit(X[1000:], y[1000:])
    from_file.partial_fit(X[1000:], y[1000:])
    assert np.array_equal(from_file.predict_log_proba(X), model.predict_log_proba(X))


def test_hashed_model_file_holds_only_seen_columns():
    rng = np.random.default_rng(0)
    cols = rng.integers(0, 2**20, size=500)
    X = sp.csr_matrix((np.ones(500), (np.arange(500) % 50, cols)), shape=(50, 2**20))
    model = MultinomialNB(n_features=2**20, smoothing_m="seen").fit(X, rng.choice(["ham", "spam"], 50))
    data = dumps(model)
    # one int64 column index + one float64 per class for each seen column, not 2 x 2**20 x 8 bytes
    assert len(data) < (8 + 2 * 8) * np.unique(cols).size + 2000
    clone = loads(data)
    assert clone.n_features_in_ == 2**20
    assert np.array_equal(clone.predict_log_proba(X), model.predict_log_proba(X))


def test_make_model_refuses_unknown_kind_and_parameter():
    with pytest.raises(ValueError, match=r"unknown model kind 'naive'.*'bernoulli'.*'multinomial'"):
        make_model("naive")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['beta'\].*\['alpha', 'n_features', 'smoothing_m', 'fit_prior', 'class_prior'\]"):
        make_model("multinomial", beta=1.0)
    assert isinstance(make_model("categorical"), CategoricalNB)
    assert isinstance(make_model("bernoulli", binarize=None), BernoulliNB)


def envelope(model) -> dict:
    return unpack(dumps(model))


def test_loads_refuses_newer_versions_and_corruption(digits):
    X, y = digits
    model = MultinomialNB().fit(X[:100], y[:100])
    good = envelope(model)
    newer = dict(good, v=MODEL_FORMAT_VERSION + 1)
    with pytest.raises(FormatError, match=f"model format version {MODEL_FORMAT_VERSION + 1} is not"):
        loads(pack(newer))
    stats_newer = dict(good, stats=dict(good["stats"], v=99))
    with pytest.raises(FormatError, match="bundle format version 99 is not 1"):
        loads(pack(stats_newer))
    bad = [
        dumps(model)[:-10],
        b"\x80\x04\x95pickle",
        pack(dict(good, type="bundle")),
        pack(dict(good, kind="svm")),
        pack(dict(good, params={"beta": 1})),
        pack(dict(good, params={"alpha": -1.0})),
        pack(dict(good, params=[1, 2])),
        pack(dict(good, kind="categorical", params={})),  # statistics of another kind
        pack(dict(good, stats={"type": "bundle", "v": 1, "parts": {"classes": good["stats"]["parts"]["classes"]}})),
    ]
    for payload in bad:
        with pytest.raises(FormatError):
            loads(payload)


def test_dumps_refuses_non_models():
    with pytest.raises(ValueError, match="expected a streamnb model"):
        dumps(object())  # type: ignore[arg-type]


def test_an_empty_model_of_every_kind_round_trips() -> None:
    """A model that has learnt nothing yet (a fresh daemon snapshot) encodes and decodes."""
    from streamnb.models import MODEL_KINDS, dumps, loads, model_class

    for kind in MODEL_KINDS:
        cls = model_class(kind)
        back = loads(dumps(cls()))
        assert type(back) is cls and back.stats.is_empty(), kind


def test_msgpack_encoding_from_several_threads_at_once_is_packb_s():
    """streamnb.encoding.dumps keeps one msgpack Packer per thread (the embedded demo runs
    workers as threads): threads packing at once each get msgpack.packb's bytes, also
    after a value that cannot be packed."""
    import threading

    import msgpack

    objects = [{"id": f"m{i}", "lp": {"ham": -0.5 * i, "spam": -1.0 / (i + 1)},
                "row": bytes(range(i % 256)) * 40, "n": list(range(i % 50))} for i in range(300)]
    expected = [msgpack.packb(o, use_bin_type=True) for o in objects]
    failures: list[str] = []
    start = threading.Barrier(4)

    def work(offset: int) -> None:
        start.wait()
        for _ in range(20):
            for i in range(len(objects)):
                j = (i + offset) % len(objects)
                if i % 97 == 0:
                    with pytest.raises(TypeError):
                        pack({"bad": object()})
                if pack(objects[j]) != expected[j]:
                    failures.append(f"object {j} in thread {offset}")

    threads = [threading.Thread(target=work, args=(k * 71,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []


def test_a_large_object_lets_the_thread_s_packer_go():
    """The kept Packer's buffer grows to the largest object it packed: after one beyond
    PACKER_KEEP_BYTES (a snapshot) the next call starts a fresh Packer."""
    import msgpack

    from streamnb import encoding

    pack({"small": 1})
    kept = encoding._PACKERS.pack
    pack({"small": 2})
    assert encoding._PACKERS.pack is kept
    big = {"blob": b"x" * (encoding.PACKER_KEEP_BYTES + 1)}
    assert pack(big) == msgpack.packb(big, use_bin_type=True)
    assert not hasattr(encoding._PACKERS, "pack")
    assert pack({"small": 3}) == msgpack.packb({"small": 3}) and encoding._PACKERS.pack is not kept

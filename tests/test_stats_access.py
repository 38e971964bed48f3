"""The daemon's direct reads of a model's statistics (workers/stats_access.py), against
numbers worked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from streamnb.exceptions import FormatError
from streamnb.features import Row
from streamnb.models.io import make_model
from streamnb_workers.stats_access import (
    check_delta,
    learnt_classes,
    learnt_log_prior,
    unseen_share,
)


def _fitted(n_features: int = 16):
    model = make_model("multinomial", n_features=n_features)
    X = sp.csr_matrix((np.ones(3), np.array([1, 2, 3]), np.array([0, 2, 3])), shape=(2, 16))
    model.partial_fit(X, ["a", "b"], sample_weight=np.array([1.0, 3.0]))  # seen columns: 1, 2, 3
    return model


def test_unseen_share_per_message_by_hand():
    model = _fitted()

    def row(cols: list[int]) -> Row:
        idx = np.array(cols, dtype=np.int32)
        return Row(indices=idx, values=np.ones(idx.size))

    rows = [row([1, 5]), row([]), row([2, 3]), row([7, 8, 9, 1])]
    # unseen/total by hand: 1/2, none, 0/2, 3/4
    np.testing.assert_allclose(unseen_share(model, rows), [0.5, 0.0, 0.0, 0.75])
    assert unseen_share(model, []).shape == (0,)
    # before anything is learnt every feature is unseen
    np.testing.assert_allclose(unseen_share(make_model("multinomial", n_features=16), rows),
                               [1.0, 0.0, 1.0, 1.0])


def test_unseen_share_of_dense_input_is_zero():
    model = make_model("gaussian")
    model.partial_fit(np.array([[0.0, 1.0], [1.0, 0.5]]), ["a", "b"])
    rows = [Row(values=np.array([0.2, 0.3]))] * 3
    np.testing.assert_array_equal(unseen_share(model, rows), np.zeros(3))


def test_learnt_log_prior_and_classes_by_hand():
    model = _fitted()
    assert learnt_classes(model) == ["a", "b"]
    np.testing.assert_allclose(learnt_log_prior(model, 2), [math.log(0.25), math.log(0.75)],
                               rtol=1e-15)
    empty = make_model("multinomial", n_features=16)
    assert learnt_classes(empty) == []
    assert learnt_log_prior(empty, 0).shape == (0,)
    assert np.isnan(learnt_log_prior(empty, 3)).all()


def test_check_delta_takes_a_fitting_delta_and_refuses_the_others():
    model = _fitted()
    good = model.batch_stats(np.eye(16)[:2], ["a", "c"])
    check_delta(model.stats, good)
    with pytest.raises(FormatError, match="statistics bundle"):
        check_delta(model.stats, {"classes": 1})
    other = make_model("multinomial", n_features=8).batch_stats(np.eye(8)[:1], ["a"])
    with pytest.raises(FormatError, match="n_features"):
        check_delta(model.stats, other)
    gaussian = make_model("gaussian").batch_stats(np.array([[1.0, 2.0]]), ["a"])
    with pytest.raises(FormatError, match="parts"):
        check_delta(model.stats, gaussian)
    bad = model.batch_stats(np.eye(16)[:1], ["a"])
    counts = bad.parts["classes"].counts
    counts[0] = np.nan
    with pytest.raises(FormatError, match="NaN or infinity"):
        check_delta(model.stats, bad)

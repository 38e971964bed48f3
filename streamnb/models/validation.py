"""Input checks of the models, with scikit-learn's errors and messages, without scikit-learn.

What :func:`sklearn.utils.validation.validate_data` and ``check_classification_targets``
do for a classifier, reduced to what the models need: X becomes a float64 ndarray or CSR
matrix of the fitted width, y a list of ``str`` or ``int`` labels, the sample weights a
float64 vector. The messages are scikit-learn's, so that its estimator checks (and
people who know its errors) recognise them.

>>> check_X([[1, 2], [3, 4]], "MultinomialNB").dtype
dtype('float64')
>>> check_X([[1, 2]], "MultinomialNB", n_features=3)
Traceback (most recent call last):
ValueError: X has 2 features, but MultinomialNB is expecting 3 features as input.
>>> check_labels([0.0, 1.0, 1.0], "GaussianNB")
[0, 1, 1]
>>> check_labels([0.5, 1.0], "GaussianNB")
Traceback (most recent call last):
ValueError: Unknown label type: continuous. GaussianNB learns classes (str or int labels), not a continuous target.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamnb import exceptions
from streamnb.stats.base import Label, normalize_labels

__all__ = ["check_X", "check_labels", "check_sample_weight"]


def __getattr__(name: str) -> Any:
    # DataConversionWarning moved to streamnb.exceptions (scikit-learn's class where it is
    # installed, looked up when first asked for); the old name still finds it.
    if name == "DataConversionWarning":
        return exceptions.DataConversionWarning
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_X(X: Any, name: str, *, accept_sparse: bool = False,
            n_features: int | None = None) -> Any:
    """X as a float64 2-d ndarray (or CSR matrix when ``accept_sparse``), finite, with at
    least one sample and one feature, and ``n_features`` columns when that is given."""
    if sp.issparse(X):
        if not accept_sparse:
            raise ValueError(f"{name} needs dense input, got a sparse matrix: "
                             "use X.toarray() to convert it")
        X = sp.csr_matrix(X, dtype=np.float64)
        values = X.data
    else:
        if getattr(X, "dtype", None) is not None and np.dtype(X.dtype).kind == "c" or \
                _has_complex(X):
            raise ValueError("Complex data not supported")
        try:
            X = np.asarray(X, dtype=np.float64)
        except TypeError as exc:  # e.g. a dict among the values
            raise TypeError(f"X must hold numbers: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"X must be a numeric 2-d array: {exc}") from None
        if X.ndim != 2:
            raise ValueError(
                f"Expected 2D array, got {X.ndim}D array instead (shape {X.shape}). Reshape "
                "your data either using array.reshape(-1, 1) if your data has a single "
                "feature or array.reshape(1, -1) if it contains a single sample."
            )
        values = X
    if X.shape[0] == 0:
        raise ValueError(f"Found array with 0 sample(s) (shape={X.shape}) while a minimum of 1 "
                         "is required: an empty batch.")
    if X.shape[1] == 0:
        raise ValueError(f"Found array with 0 feature(s) (shape={X.shape}) while a minimum of 1 "
                         "is required.")
    if not np.isfinite(values).all():
        raise ValueError(f"Input X contains NaN or infinity; {name} needs finite values.")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, but {name} is expecting {n_features} "
                         "features as input.")
    return X


def _has_complex(X: Any) -> bool:
    """A list (of lists) holding a complex number (np.asarray would take its real part)."""
    if isinstance(X, (list, tuple)) and X:
        first = X[0]
        row = first if isinstance(first, (list, tuple, np.ndarray)) else X
        return any(isinstance(v, complex) or np.iscomplexobj(v) for v in row)
    return False


def check_nonnegative(values: np.ndarray, name: str) -> None:
    """The message of scikit-learn's ``check_non_negative``."""
    if values.size and values.min() < 0:
        raise ValueError(f"Negative values in data passed to {name} (input X): it expects "
                         f"non-negative feature values (counts), got a minimum of {values.min()}")


def check_labels(y: Any, name: str) -> list[Label]:
    """Class labels as a list of ``str`` or ``int``: numbers that are whole (``1.0``)
    become ints, other numbers are a continuous target (ValueError, as scikit-learn's
    "Unknown label type"); a column vector is flattened, with a
    :data:`streamnb.exceptions.DataConversionWarning` (scikit-learn's class where it is
    installed, as its ``check_supervised_y_2d`` asks)."""
    if y is None:
        raise ValueError(f"{name} requires y to be passed, but the target y is None.")
    if isinstance(y, list) and (not y or type(y[0]) in (str, int)):
        return normalize_labels(y)  # the daemon's case: plain labels, nothing to convert
    arr = np.asarray(y, dtype=object) if not isinstance(y, np.ndarray) else y
    if arr.ndim == 2 and arr.shape[1] == 1:
        warnings.warn("A column-vector y was passed when a 1d array was expected. Please "
                      "change the shape of y to (n_samples, ), for example using ravel().",
                      exceptions.DataConversionWarning, stacklevel=3)
        arr = arr.ravel()
    if arr.ndim != 1:
        raise ValueError(f"y should be a 1d array of class labels, got an array of shape "
                         f"{arr.shape}")
    if arr.dtype.kind == "f":
        if not np.isfinite(arr).all():
            raise ValueError("Input y contains NaN or infinity.")
        if (arr != np.round(arr)).any():
            raise ValueError(f"Unknown label type: continuous. {name} learns classes (str or "
                             "int labels), not a continuous target.")
        return arr.astype(np.int64).tolist()
    if arr.dtype.kind in "iu":
        return arr.astype(np.int64).tolist()
    if arr.dtype.kind == "b":
        return arr.astype(np.int64).tolist()
    if arr.dtype.kind in "US":
        return [str(v) for v in arr.tolist()]
    out = []
    for v in arr.tolist():
        if isinstance(v, float):
            if v != v:
                raise ValueError("Input y contains NaN.")
            if v != round(v):
                raise ValueError(f"Unknown label type: continuous. {name} learns classes (str "
                                 "or int labels), not a continuous target.")
            v = int(v)
        out.append(v)
    try:
        return normalize_labels(out)
    except ValueError as exc:
        raise ValueError(f"Unknown label type: {exc}") from None


def check_sample_weight(sample_weight: Any, n_samples: int) -> np.ndarray:
    """Weights as a float64 vector of ``n_samples`` finite values >= 0 (ones if None)."""
    if sample_weight is None:
        return np.ones(n_samples, dtype=np.float64)
    try:
        w = np.asarray(sample_weight, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError("sample_weight must be numeric") from None
    if w.ndim == 0:
        w = np.full(n_samples, float(w))
    if w.shape != (n_samples,):
        raise ValueError(f"sample_weight.shape == {w.shape}, expected {(n_samples,)}!")
    if not np.isfinite(w).all():
        raise ValueError("sample_weight contains NaN or infinity")
    if (w < 0).any():
        raise ValueError("sample_weight must be >= 0")
    return w

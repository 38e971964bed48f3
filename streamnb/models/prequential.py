"""Prequential (test-then-train) predictions within a batch, without learning the batch.

Row ``i`` of a batch is predicted by the model **plus the labelled rows before i** of the
same batch: exactly what predicting and learning the batch one row at a time would give,
while the model itself is left unchanged (a worker's replica must only change by applying
the committed log). Unlabelled rows (label ``None``) are predicted and contribute nothing.

Two algorithms:

* :func:`multinomial_prequential`: vectorised and exact for :class:`MultinomialNB`. For
  row i and class c, ``jll_c(i) = log pi_c(i) + sum_j x_ij [log(F_cj(i) + alpha) -
  log(T_c(i) + alpha m(i))]`` where ``F(i)``, ``T(i)``, the class weights and the
  smoothing width ``m(i)`` include the labelled rows before i. The model's counts are read
  once per column of the batch, straight from its statistics (its derived scoring table
  is neither used nor refreshed). With the optional C module
  ``streamnb._kernels`` (:data:`MULTINOMIAL_JLL`), one loop over the rows in order
  with the batch's columns in a hash table, O(nnz x classes); without it, numpy: the
  in-batch prefix sums over the CSR nonzeros sorted by (column, row), O(nnz x classes)
  after one sort, no Python loop over rows or features (the reference for the C loop).
* :func:`generic_prequential`: any model. A scratch copy of the statistics learns the
  labelled rows one at a time; the rows up to and including each labelled row are
  predicted in one call before it is learnt. It copies the model's statistics once per
  batch (O(classes x features) for the count models).

Classes first labelled inside the batch come after the model's classes, in order of
first appearance, so the classes known at row i are always a prefix of ``classes``.

>>> import numpy as np
>>> from streamnb.models import MultinomialNB
>>> model = MultinomialNB().partial_fit(np.array([[3, 0], [0, 3]]), ["spam", "ham"])
>>> X = np.array([[0, 2], [0, 2], [0, 2]])
>>> pred = model.predict_log_proba_prequential(X, ["spam", None, None])
>>> pred.classes, pred.n_known.tolist()
(['ham', 'spam'], [2, 2, 2])
>>> before = model.predict_log_proba(X[:1])[0]
>>> bool(np.allclose(pred.log_proba[0], before)), bool(pred.log_proba[1, 1] > before[1])
(True, True)
>>> model.stats["classes"].counts.tolist()   # the model did not learn the batch
[1.0, 1.0]
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import scipy.sparse as sp

from streamnb._cmodules import optional_c_module
from streamnb.arrays import nonzero_columns, sort_with_order
from streamnb.models.logspace import log_normalize
from streamnb.stats.base import Label
from streamnb.stats.feature_counts import BatchColumns, batch_columns

# The functions below take the model as ``Any`` (a GenerativeClassifier; a MultinomialNB
# for the multinomial ones): the models import this module, and it imports none of them.

__all__ = ["MULTINOMIAL_JLL", "MultinomialPlan", "PrequentialPrediction", "SortedNonzeros",
           "generic_prequential", "multinomial_plan", "multinomial_prequential"]

#: ``streamnb._kernels.multinomial_jll`` (the C loop of
#: :func:`multinomial_prequential`), or None: not built, or ``STREAMNB_PURE_PYTHON`` set;
#: then numpy does the same (tests set it to None to compare both).
MULTINOMIAL_JLL = getattr(optional_c_module("streamnb._kernels"), "multinomial_jll", None)


@dataclass(frozen=True)
class PrequentialPrediction:
    """Log posteriors of a batch predicted row by row (see the module docstring).

    ``log_proba[i, c]`` is ``-inf`` for a class not known yet at row i and NaN on a row
    predicted before any class existed (``n_known[i] == 0``: no prediction).
    ``log_prior[i]`` holds the learnt log class priors (class weight shares) of row i's
    model, in the same columns. ``unseen_share[i]``: the share of row i's features the
    model had no count for before the batch (0 for an empty row), where the prediction
    found it on the way (MultinomialNB with labels in the batch), else None.
    """

    classes: list[Label]
    log_proba: np.ndarray
    n_known: np.ndarray
    log_prior: np.ndarray
    unseen_share: np.ndarray | None = None

    @property
    def predicted(self) -> np.ndarray:
        """Rows that got a prediction (some class was known)."""
        return self.n_known > 0


# ---------------------------------------------------------------------- shared helpers
def _labelled_batch(
    model: Any, n: int, y: Any, sample_weight: Any
) -> tuple[list[Label], np.ndarray, np.ndarray, np.ndarray]:
    """Validate labels and weights; return (classes after the batch, class code per row
    (-1: unlabelled), weights, number of classes known before each row)."""
    y = list(y)
    if len(y) != n:
        raise ValueError(f"y has {len(y)} labels, but X has {n} samples")
    w = model._validate_weight(sample_weight, n)
    rows = [i for i, lab in enumerate(y) if lab is not None]
    labels = model._validate_y([y[i] for i in rows], len(rows))
    classes = list(model.stats["classes"].labels)  # type: ignore[attr-defined]
    index = {c: k for k, c in enumerate(classes)}
    k0 = len(classes)
    row_codes, new_at = [], []  # (O(batch) label bookkeeping; features are never looped over)
    for i, lab in zip(rows, labels, strict=True):
        k = index.get(lab)
        if k is None:  # a new class, known from the next row on
            k = index[lab] = len(classes)
            classes.append(lab)
            new_at.append(i)
        row_codes.append(k)
    codes = np.full(n, -1, dtype=np.int64)
    codes[rows] = row_codes
    n_known = np.full(n, k0, dtype=np.int64)
    if new_at:  # the classes new at rows before i
        n_known += np.searchsorted(np.array(new_at), np.arange(n), side="left")
    return classes, codes, w, n_known


def _exclusive_row_prefix(base: np.ndarray, per_row: np.ndarray) -> np.ndarray:
    """``out[i] = base + sum_{k<i} per_row[k]`` (summed in row order), shape (n, K)."""
    out = np.empty_like(per_row)
    out[0] = base
    if per_row.shape[0] > 1:
        out[1:] = base + np.cumsum(per_row[:-1], axis=0)
    return out


def _class_weights(model: Any, codes: np.ndarray, w: np.ndarray,
                   n_classes: int) -> np.ndarray:
    """Class weights ``N_c(i)`` before each row, shape (n, n_classes)."""
    counts = np.asarray(model.stats["classes"].counts, dtype=np.float64)  # type: ignore[attr-defined]
    base = np.zeros(n_classes)
    base[: counts.size] = counts
    per_row = np.zeros((codes.size, n_classes))
    lab = np.flatnonzero(codes >= 0)
    per_row[lab, codes[lab]] = w[lab]
    return _exclusive_row_prefix(base, per_row)


def _log_class_prior_rows(N: np.ndarray, n_known: np.ndarray) -> np.ndarray:
    """Row-wise ``log(N_c / N)`` over the known classes (uniform when they weigh nothing);
    ``-inf`` for zero-weight and not-yet-known classes (as ``log_class_prior``)."""
    known = np.arange(N.shape[1])[None, :] < n_known[:, None]
    Nk = np.where(known, N, 0.0)
    total = Nk.sum(axis=1)
    out = np.full(N.shape, -np.inf)
    pos = Nk > 0
    safe_total = np.where(total > 0, total, 1.0)
    out[pos] = np.log(Nk[pos]) - np.log(np.broadcast_to(safe_total[:, None], N.shape)[pos])
    empty = (total <= 0) & (n_known > 0)
    if empty.any():
        uniform = -np.log(n_known[empty].astype(np.float64))
        out[empty] = np.where(known[empty], uniform[:, None], -np.inf)
    return out


def _batch_priors(model: Any, n: int, y: Any, sample_weight: Any,
                  ) -> tuple[list[Label], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_labelled_batch`, plus the row-wise log class priors given by the class
    weights before each row."""
    classes, codes, w, n_known = _labelled_batch(model, n, y, sample_weight)
    N = _class_weights(model, codes, w, len(classes))
    return classes, codes, w, n_known, _log_class_prior_rows(N, n_known)


def _nothing_learnt_before_a_row(codes: np.ndarray) -> bool:
    """True when no row has a labelled row before it: the model alone predicts them all."""
    return not (codes[:-1] >= 0).any()


def _model_only(model: Any, X: Any, classes: list[Label],
                n_known: np.ndarray, log_prior: np.ndarray) -> PrequentialPrediction:
    """Every row predicted by the model as it is (nothing learnt before any row)."""
    lp = np.full((X.shape[0], len(classes)), np.nan)
    k0 = int(n_known[0])
    if k0:
        lp[:, :k0] = model.predict_log_proba(X)
        lp[:, k0:] = -np.inf
    return PrequentialPrediction(classes, lp, n_known, log_prior)


def _finish(classes: list[Label], jll: np.ndarray, n_known: np.ndarray,
            log_prior: np.ndarray, unseen_share: np.ndarray | None = None) -> PrequentialPrediction:
    """Normalise the joint log-likelihoods of the predicted rows (NaN for the others)."""
    lp = np.full(jll.shape, np.nan)
    rows = np.flatnonzero(n_known > 0)
    if rows.size and jll.shape[1]:
        lp[rows] = log_normalize(jll[rows])
    return PrequentialPrediction(classes, lp, n_known, log_prior, unseen_share)


# ---------------------------------------------------------------------- multinomial
def _canonical_csr(model: Any, X: Any) -> sp.csr_matrix:
    """Validated X as float64 CSR without duplicate entries (explicit zeros do no harm:
    they add nothing and count nothing). X itself is never modified."""
    X = sp.csr_matrix(model._validate_X(X, predicting=True), dtype=np.float64)
    if not X.has_canonical_format:  # an O(nnz) check; a copy only when needed
        X = X.copy()
        X.sum_duplicates()
    return X


@dataclass(frozen=True)
class SortedNonzeros:
    """A batch's nonzeros sorted by (column, row), for the numpy form of
    :func:`multinomial_prequential`: each column's segment, what the labelled rows add
    before each nonzero (per class of ``classes``, the classes it was made with), the row
    sums."""

    classes: list[Label]
    c: np.ndarray
    r: np.ndarray
    v: np.ndarray
    col_of: np.ndarray
    ucols: np.ndarray
    first_add: np.ndarray
    learnt_before: np.ndarray
    prefix: np.ndarray
    row_sums: np.ndarray


@dataclass(frozen=True)
class MultinomialPlan:
    """What :func:`multinomial_prequential` computes from the batch alone: the validated
    CSR and, for the numpy form only (no C loop, :data:`MULTINOMIAL_JLL`), its
    :class:`SortedNonzeros`, used only while the model has the classes they were made
    with (the counts may have changed: they are read at prediction time). A worker makes
    it while it waits for other workers' batches."""

    X: sp.csr_matrix
    nonzeros: SortedNonzeros | None
    #: With the C loop: X's distinct columns (for its class sums too: the model's
    #: ``batch_stats(..., columns=)``), else None.
    columns: BatchColumns | None = None

    def for_weights(self) -> MultinomialPlan:
        """This plan for the same rows learnt with other weights: without the sorted
        nonzeros (their prefix sums hold the weights)."""
        return replace(self, nonzeros=None)


def multinomial_plan(model: Any, X: Any, y: Any,
                     sample_weight: Any = None) -> MultinomialPlan:
    """The batch-only part of :func:`multinomial_prequential` (see :class:`MultinomialPlan`).
    With the C loop the labels are read once, at prediction time."""
    X = _canonical_csr(model, X)
    if MULTINOMIAL_JLL is not None:
        return MultinomialPlan(X, None, batch_columns(X))
    classes, codes, w, _ = _labelled_batch(model, X.shape[0], y, sample_weight)
    return MultinomialPlan(X, _sorted_nonzeros(X, classes, codes, w))


def _sorted_nonzeros(X: sp.csr_matrix, classes: list[Label], codes: np.ndarray,
                     w: np.ndarray) -> SortedNonzeros:
    n, width = X.shape
    K = len(classes)
    rw = np.where(codes >= 0, w, 0.0)                    # weight each row is learnt with

    # Nonzeros sorted by (column, row): one sort (a column's rows stay in order), then
    # each nonzero's column segment.
    row_of = np.repeat(np.arange(n), np.diff(X.indptr))
    c, order = sort_with_order(X.indices, width)
    r, v = row_of[order], X.data[order]
    new_col = np.empty(c.size, dtype=bool)
    new_col[:1] = True
    np.not_equal(c[1:], c[:-1], out=new_col[1:])
    starts = np.flatnonzero(new_col)
    seg_len = np.diff(np.append(starts, c.size))
    col_of = np.repeat(np.arange(starts.size), seg_len)  # each nonzero's column position
    ucols = c[starts]

    # What each nonzero adds to its column's count when its row is learnt; whether an
    # earlier row of the batch added to the column (exactly: the first adding position of
    # each column, not a float sum that may carry rounding).
    add_w = rw[r] * v
    adding = add_w > 0
    everywhere = np.arange(c.size)
    first_add = np.minimum.reduceat(np.where(adding, everywhere, c.size), starts)
    learnt_before = everywhere > first_add[col_of]

    # Per class and nonzero, what the earlier labelled rows of the batch added to the
    # column (per-column exclusive prefix sums in row order).
    added = np.where(codes[r] == np.arange(K)[:, None], add_w, 0.0)  # (K, nonzeros)
    prefix = np.zeros_like(added)
    np.cumsum(added[:, :-1], axis=1, out=prefix[:, 1:])
    prefix -= np.take(prefix[:, starts], col_of, axis=1)
    np.maximum(prefix, 0.0, out=prefix)
    prefix *= learnt_before                              # exactly 0 where nothing was added
    row_sums = np.bincount(row_of, weights=X.data, minlength=n)
    return SortedNonzeros(list(classes), c, r, v, col_of, ucols, first_add, learnt_before,
                          prefix, row_sums)


def multinomial_prequential(model: Any, X: Any, y: Any, sample_weight: Any = None,
                            plan: MultinomialPlan | None = None) -> PrequentialPrediction:
    """Exact prequential log posteriors of a MultinomialNB (see the module docstring).

    ``plan``: :func:`multinomial_plan` of the same ``X``, ``y`` and weights, made earlier;
    used if the model still has the classes it was made with (else made again)."""
    X = plan.X if plan is not None else _canonical_csr(model, X)
    classes, codes, w, n_known, log_prior = _batch_priors(model, X.shape[0], y, sample_weight)
    if _nothing_learnt_before_a_row(codes):  # e.g. a batch without labels
        return _model_only(model, X, classes, n_known, log_prior)
    cc, fc = model._parts()
    alpha, seen_mode = model.alpha, model.smoothing_m == "seen"
    base_T = np.zeros(len(classes))
    base_T[: len(cc.labels)] = fc.totals
    if MULTINOMIAL_JLL is not None and not fc.is_sparse:
        jll = np.empty((X.shape[0], len(classes)))
        unseen = np.empty(X.shape[0], dtype=np.int64)
        # (contiguous float64 and index arrays: _canonical_csr, _validate_weight, and a
        # model's dense counts are made C-ordered)
        columns = plan.columns if plan is not None else None
        MULTINOMIAL_JLL(X.indptr, X.indices, X.data, codes, w, fc.values, fc.values.shape[0],
                        fc.n_features, base_T, alpha, seen_mode, fc.n_seen,
                        max(fc.n_features, X.shape[1]), jll, unseen,
                        *((columns.rank, columns.cols) if columns is not None and columns.fits(X) else ()))
    else:
        nonzeros = plan.nonzeros if plan is not None else None
        if nonzeros is None or nonzeros.classes != classes:
            nonzeros = _sorted_nonzeros(X, classes, codes, w)
        jll, unseen = _numpy_jll(X.shape, fc, nonzeros, codes, w, base_T, alpha, seen_mode)
    with np.errstate(invalid="ignore"):
        jll += model._prior_rows(log_prior, classes, n_known)
    sizes = np.diff(X.indptr)
    share = np.divide(unseen, sizes, out=np.zeros(sizes.size), where=sizes > 0)
    return _finish(classes, jll, n_known, log_prior, share)


def _numpy_jll(shape: tuple[int, int], fc: Any, nz: SortedNonzeros, codes: np.ndarray,
               w: np.ndarray, base_T: np.ndarray, alpha: float,
               seen_mode: bool) -> tuple[np.ndarray, np.ndarray]:
    """The joint log-likelihoods without the class prior, and each row's nonzeros in a
    column the model has no count for, in numpy (the reference for :data:`MULTINOMIAL_JLL`):
    ``fc`` the model's feature counts, ``base_T`` their class totals (0 for the classes new
    in the batch)."""
    n, width = shape
    K = base_T.size
    k0 = len(fc.labels)
    labelled = codes >= 0
    c, r, v, col_of, ucols = nz.c, nz.r, nz.v, nz.col_of, nz.ucols
    first_add, learnt_before = nz.first_add, nz.learnt_before

    # The model's counts of the batch's columns (read once per column; zero for classes
    # new in the batch), and which of the columns count at each nonzero.
    F_cols = np.zeros((K, ucols.size))
    inside = ucols < fc.n_features
    if k0:
        F_cols[:k0, inside] = fc.column_counts(ucols[inside])
    model_seen = nonzero_columns(F_cols)
    unseen = np.bincount(r, weights=~model_seen[col_of], minlength=n).astype(np.int64)
    if seen_mode:  # a column counts once the model or an earlier row of the batch has it
        vc = np.where(model_seen[col_of] | learnt_before, v, 0.0)
    else:
        vc = v

    # Per class and nonzero: log(F_cj(i) + alpha), F_cj(i) the model's count plus what
    # the earlier labelled rows of the batch added to the column (the prefix sums); per
    # row and class, the sum of x_ij times that.
    F = np.take(F_cols, col_of, axis=1)
    F += nz.prefix
    F += alpha
    np.log(F, out=F)
    F *= vc
    S1 = np.empty((n, K))
    for k in range(K):                                   # classes, not features
        S1[:, k] = np.bincount(r, weights=F[k], minlength=n)
    S0 = np.bincount(r, weights=vc, minlength=n)         # sum_j x_ij over the counted columns

    # per-class totals T_c(i) and smoothing width m(i) before each row
    per_row = np.zeros((n, K))
    per_row[labelled, codes[labelled]] = nz.row_sums[labelled] * w[labelled]
    T = _exclusive_row_prefix(base_T, per_row)
    if seen_mode:  # a column new to the model counts from the row after its first adder
        new = (first_add < c.size) & ~model_seen
        new_before = np.zeros(n, dtype=np.int64)
        np.cumsum(np.bincount(r[first_add[new]], minlength=n)[:-1], out=new_before[1:])
        m = fc.n_seen + new_before
    else:
        m = np.full(n, max(fc.n_features, width))
    den = T + alpha * m[:, None].astype(np.float64)
    log_den = np.log(np.where(den > 0, den, 1.0))
    return S1 - S0[:, None] * log_den, unseen


# ---------------------------------------------------------------------- any model
def generic_prequential(model: Any, X: Any, y: Any,
                        sample_weight: Any = None) -> PrequentialPrediction:
    """Exact prequential log posteriors of any model, through a scratch copy of its
    statistics that learns the labelled rows one at a time (see the module docstring)."""
    model._validate_X(X, predicting=True)
    n = X.shape[0]
    classes, codes, w, n_known, log_prior = _batch_priors(model, n, y, sample_weight)
    K = len(classes)
    if _nothing_learnt_before_a_row(codes):  # e.g. a batch without labels
        return _model_only(model, X, classes, n_known, log_prior)
    jll = np.full((n, K), np.nan)
    if n_known[-1] == 0:  # no class before the last row: nothing to predict
        return _finish(classes, jll, n_known, log_prior)
    scratch = type(model).from_stats(model.stats, **model._params_in_use())
    column = {lab: k for k, lab in enumerate(classes)}
    stops = np.flatnonzero(codes >= 0).tolist()
    if not stops or stops[-1] != n - 1:
        stops.append(n - 1)
    lo = 0
    for stop in stops:
        if n_known[stop] > 0:
            first = max(lo, int(np.searchsorted(n_known, 1)))  # rows with a known class
            if first <= stop:
                known = [column[lab] for lab in scratch.classes_.tolist()]
                part = np.full((stop + 1 - first, K), -np.inf)
                part[:, known] = scratch.predict_joint_log_proba(X[first:stop + 1])
                jll[first:stop + 1] = part
        if codes[stop] >= 0:
            scratch.merge_stats(scratch.batch_stats(X[stop:stop + 1], [classes[codes[stop]]],
                                                    w[stop:stop + 1]))
        lo = stop + 1
    return _finish(classes, jll, n_known, log_prior)

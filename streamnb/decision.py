"""The Bayes decision rule on a batch of log posteriors.

By default a message gets the class of highest posterior (argmax). Options, applied in
this order:

1. ``class_prior``: replace the learnt class priors by operator-chosen ones. The log
   posteriors are reweighted by ``log(new prior) - log(learnt prior)`` and renormalised
   by log-sum-exp (classes the override does not name keep their learnt prior).
2. ``loss_matrix`` (minimum expected loss) **or** ``threshold`` (two classes: predict the
   positive class when ``log P(pos|x) - log P(neg|x) > threshold``).
3. ``unsure_band = (lo, hi)`` (two classes): the label is ``"unsure"`` when the posterior
   of the positive class lies in ``[lo, hi]``. The full ``log_proba`` still goes out.
4. ``min_class_weight``: the label is ``"unsure"`` while the model knows fewer than two
   classes or any class has learnt less weight than this (a cold model's posteriors are
   not worth acting on); :meth:`DecisionRule.decide` is given the class weights.

Given the class weights, a class whose weight is 0 (at most :data:`ZERO_WEIGHT`: one that
was forgotten, or whose label is known but never learnt) takes no part: the rule and the
score see only the classes with weight, the posteriors renormalised over them, the empty
class at ``-inf``. A spam/ham model that met a mistyped third label decides and scores as
the spam/ham model it is.

``score`` says what :meth:`DecisionRule.score` gives a prediction to rank and threshold
by: ``"log_odds"``, ``log P(pos|x) - log P(not pos|x)`` (the positive class against all
the others together, so that its scale does not change with the number of classes), or
``"per_feature"``,
the same divided by the message's number of features (its row's sum of values, at least
1). A multinomial model's log-odds grow with the number of tokens, so long mail lands at
the extremes whatever its content; divided by it, mail of every length ranks alike
(Rennie et al., 2003, on length normalisation). The sign, and so the argmax label, is
the same.

The positive class of a two-class model is ``positive`` if given, else the last class in
sorted order (``"spam"`` of ``{"ham", "spam"}``, ``1`` of ``{0, 1}``). Threshold and band
do nothing while the model knows fewer or more than two classes.

>>> import numpy as np
>>> rule = DecisionRule(threshold=np.log(9.0), unsure_band=(0.4, 0.6))
>>> log_post = np.log([[0.05, 0.95], [0.5, 0.5], [0.2, 0.8]])
>>> d = rule.decide(log_post, ["ham", "spam"])
>>> d.labels, d.unsure.tolist()
(['spam', 'unsure', 'ham'], [False, True, False])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "UNSURE",
    "ZERO_WEIGHT",
    "Decision",
    "DecisionRule",
]

#: The label given to a two-class prediction inside the unsure band.
UNSURE = "unsure"
#: A class weight at most this is 0: the class takes no part in a decision.
ZERO_WEIGHT = 1e-9
#: What :meth:`DecisionRule.score` can give (see the module docstring).
SCORES = ("log_odds", "per_feature")

Label = str | int


def _key(label: Any) -> str:
    """Options are keyed by the label's text, so ``"1"`` on a command line matches ``1``."""
    return str(label)


@dataclass(frozen=True, slots=True)
class Decision:
    """Decisions for a batch: one label per row, the unsure mask, and the log posteriors
    the decision was made from (after any class-prior override)."""

    labels: list[Any]
    unsure: np.ndarray
    log_proba: np.ndarray


@dataclass(frozen=True)
class DecisionRule:
    """Turn log posteriors into labels (see the module docstring for the rules).

    ``loss_matrix[true][predicted]`` is the loss of predicting ``predicted`` when the truth
    is ``true``; missing entries are 0 on the diagonal and 1 elsewhere (0-1 loss).

    >>> import numpy as np
    >>> rule = DecisionRule(loss_matrix={"ham": {"spam": 10.0}})  # a lost ham costs 10
    >>> rule.decide(np.log([[0.8, 0.2], [0.02, 0.98]]), ["ham", "spam"]).labels
    ['ham', 'spam']
    """

    class_prior: Mapping[str, float] | None = None
    loss_matrix: Mapping[str, Mapping[str, float]] | None = None
    threshold: float | None = None
    unsure_band: tuple[float, float] | None = None
    positive: Label | None = None
    min_class_weight: float | None = None
    score: str = "log_odds"
    #: Applied by the daemon from its window of recent labelled scores
    #: (:mod:`streamnb.operating_point`): a score threshold holding the false-positive
    #: rate under ``target_fpr``, a calibrated P(positive), the window's size, and the
    #: half-life (in labelled messages) of the class mix the calibrated P(positive) is
    #: moved to, which decides the label without a target.
    target_fpr: float | None = None
    calibration: str | None = None
    score_window: int | None = None
    prior_half_life: float | None = None

    def __post_init__(self) -> None:
        if self.class_prior is not None:
            prior = {_key(k): float(v) for k, v in dict(self.class_prior).items()}
            bad = {k: v for k, v in prior.items() if not (math.isfinite(v) and v > 0)}
            if bad:
                raise ValueError(f"class priors must be finite numbers > 0, got {bad}")
            object.__setattr__(self, "class_prior", prior)
        if self.loss_matrix is not None:
            lm: dict[str, dict[str, float]] = {}
            for true, row in dict(self.loss_matrix).items():
                if not isinstance(row, Mapping):
                    raise ValueError(
                        f"loss_matrix[{true!r}] must map predicted label -> loss, got {row!r}")
                lm[_key(true)] = {_key(p): float(v) for p, v in row.items()}
                bad = {p: v for p, v in lm[_key(true)].items() if not (math.isfinite(v) and v >= 0)}
                if bad:
                    raise ValueError(f"losses must be finite numbers >= 0, got {bad} for true {true!r}")
            object.__setattr__(self, "loss_matrix", lm)
        if self.threshold is not None:
            t = float(self.threshold)
            if not math.isfinite(t):
                raise ValueError(f"threshold must be a finite log-odds, got {self.threshold}")
            object.__setattr__(self, "threshold", t)
        if self.loss_matrix is not None and self.threshold is not None:
            raise ValueError("give either a loss matrix or a threshold, not both")
        if self.unsure_band is not None:
            try:
                lo, hi = (float(v) for v in self.unsure_band)
            except (TypeError, ValueError):
                raise ValueError(
                    f"unsure_band must be two probabilities (lo, hi), got {self.unsure_band!r}"
                ) from None
            if not 0.0 <= lo <= hi <= 1.0:
                raise ValueError(f"unsure_band must satisfy 0 <= lo <= hi <= 1, got ({lo}, {hi})")
            object.__setattr__(self, "unsure_band", (lo, hi))
        if self.min_class_weight is not None:
            try:
                mw = float(self.min_class_weight)
            except (TypeError, ValueError):
                mw = math.nan
            if not (math.isfinite(mw) and mw >= 0):
                raise ValueError(
                    f"min_class_weight must be a finite number >= 0, got {self.min_class_weight!r}")
            object.__setattr__(self, "min_class_weight", mw)
        if self.score not in SCORES:
            raise ValueError(f"score must be one of {list(SCORES)}, got {self.score!r}")
        self._check_window_options()

    def _check_window_options(self) -> None:
        t = self.target_fpr
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))
                              or not 0.0 < t < 1.0):
            raise ValueError(f"target_fpr must be a rate in (0, 1), got {t!r}")
        if t is not None and (self.threshold is not None or self.loss_matrix is not None):
            raise ValueError("give a target false-positive rate or a threshold/loss matrix, not both")
        if self.calibration not in (None, "isotonic", "platt"):
            raise ValueError(f"calibration must be isotonic or platt, got {self.calibration!r}")
        n = self.score_window
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not
                              100 <= n <= 1_000_000):
            raise ValueError(f"score_window must be a whole number in [100, 1000000], got {n!r}")
        h = self.prior_half_life
        if h is not None and (isinstance(h, bool) or not isinstance(h, (int, float))
                              or not 1.0 <= h <= 1e12):
            raise ValueError(f"prior_half_life must be a number of messages in [1, 1e12], got {h!r}")
        if h is not None and self.calibration is None:
            raise ValueError("prior_half_life moves the calibrated probability: give a calibration")
        if h is not None and self.class_prior is not None:
            raise ValueError("give a class prior or a prior half-life, not both")

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """Options as a msgpack/JSON-friendly map (only those that are set)."""
        out: dict[str, Any] = {}
        if self.class_prior is not None:
            out["class_prior"] = dict(self.class_prior)
        if self.loss_matrix is not None:
            out["loss_matrix"] = {k: dict(v) for k, v in self.loss_matrix.items()}
        if self.threshold is not None:
            out["threshold"] = self.threshold
        if self.unsure_band is not None:
            out["unsure_band"] = list(self.unsure_band)
        if self.positive is not None:
            out["positive"] = self.positive
        if self.min_class_weight is not None:
            out["min_class_weight"] = self.min_class_weight
        if self.score != "log_odds":
            out["score"] = self.score
        for name in ("target_fpr", "calibration", "score_window", "prior_half_life"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> DecisionRule:
        """Inverse of :meth:`to_dict`; unknown keys are an error.

        >>> DecisionRule.from_dict({"threshold": 2.0}).to_dict()
        {'threshold': 2.0}
        """
        d = dict(d or {})
        known = {"class_prior", "loss_matrix", "threshold", "unsure_band", "positive",
                 "min_class_weight", "score", "target_fpr", "calibration", "score_window",
                 "prior_half_life"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown decision options {unknown}; expected some of {sorted(known)}")
        band = d.get("unsure_band")
        return cls(
            class_prior=d.get("class_prior"),
            loss_matrix=d.get("loss_matrix"),
            threshold=d.get("threshold"),
            unsure_band=tuple(band) if band is not None else None,
            positive=d.get("positive"),
            min_class_weight=d.get("min_class_weight"),
            score=d.get("score", "log_odds"),
            target_fpr=d.get("target_fpr"), calibration=d.get("calibration"),
            score_window=d.get("score_window"), prior_half_life=d.get("prior_half_life"),
        )

    @property
    def uses_window(self) -> bool:
        """Whether the daemon keeps a window of labelled scores for this rule."""
        return self.target_fpr is not None or self.calibration is not None

    @property
    def is_default(self) -> bool:
        """True when the rule is plain argmax."""
        return set(self.to_dict()) <= {"positive", "score"}

    # ------------------------------------------------------------------ deciding
    def positive_index(self, classes: Sequence[Label]) -> int:
        """Index of the positive class of a two-class model."""
        keys = [_key(c) for c in classes]
        if self.positive is not None:
            if _key(self.positive) not in keys:
                raise ValueError(f"positive class {self.positive!r} is not one of {list(classes)}")
            return keys.index(_key(self.positive))
        return max(range(len(classes)), key=lambda i: (type(classes[i]).__name__, classes[i]))

    def positive_of(self, classes: Sequence[Label]) -> Label | None:
        """The positive class of a two-class model; None for another number of classes, or
        a ``positive`` the model does not hold.

        >>> DecisionRule().positive_of(["ham", "spam"]), DecisionRule(positive=1).positive_of([0, 2])
        ('spam', None)
        """
        if len(classes) != 2 or (self.positive is not None and
                                 _key(self.positive) not in [_key(c) for c in classes]):
            return None
        return classes[self.positive_index(classes)]

    def adjust(
        self, log_proba: np.ndarray, classes: Sequence[Label],
        learnt_log_prior: np.ndarray | None = None,
    ) -> np.ndarray:
        """Log posteriors with the class-prior override applied (renormalised)."""
        log_proba = np.asarray(log_proba, dtype=np.float64)
        if self.class_prior is None:
            return log_proba
        shift = np.zeros(len(classes), dtype=np.float64)
        for j, c in enumerate(classes):
            new = self.class_prior.get(_key(c))
            if new is None:
                continue
            shift[j] = math.log(new)
            if learnt_log_prior is not None and np.isfinite(learnt_log_prior[j]):
                shift[j] -= learnt_log_prior[j]
        # defer scipy to the rules that use it: checking a verdict (a mail filter started
        # per mail) needs none of it
        from scipy.special import logsumexp

        with np.errstate(invalid="ignore"):
            adjusted = log_proba + shift
            return adjusted - logsumexp(adjusted, axis=1, keepdims=True)

    def decide(
        self, log_proba: Any, classes: Sequence[Label],
        learnt_log_prior: np.ndarray | None = None, class_weight: Any = None,
    ) -> Decision:
        """Decide a batch: ``log_proba`` has shape (n_samples, n_classes), columns in the
        order of ``classes``; ``learnt_log_prior`` (the model's log class priors) is needed
        for an exact class-prior override (without it the override multiplies the
        posteriors by the new priors); ``class_weight`` (n_samples, n_classes), the
        weight each row's model has learnt per class, is what ``min_class_weight`` is
        checked against (not checked without it).

        >>> rule = DecisionRule(min_class_weight=3)
        >>> rule.decide(np.log([[0.1, 0.9], [0.1, 0.9]]), ["ham", "spam"],
        ...             class_weight=[[5.0, 2.0], [5.0, 3.0]]).labels
        ['unsure', 'spam']
        >>> rule.decide(np.log([[1.0]]), ["ham"], class_weight=[[9.0]]).labels
        ['unsure']
        >>> d = rule.decide(np.log([[0.05, 0.85, 0.1]]), ["ham", "Spam", "spam"],
        ...                 class_weight=[[5.0, 0.0, 4.0]])  # "Spam": weight back to 0
        >>> d.labels, np.exp(d.log_proba).round(3).tolist()
        (['spam'], [[0.333, 0.0, 0.667]])
        """
        log_proba = np.asarray(log_proba, dtype=np.float64)
        classes = list(classes)
        if log_proba.ndim != 2 or log_proba.shape[1] != len(classes):
            raise ValueError(
                f"log_proba must have shape (n_samples, {len(classes)}) for classes {classes}, "
                f"got {log_proba.shape}"
            )
        n = log_proba.shape[0]
        if class_weight is not None:
            weight = np.asarray(class_weight, dtype=np.float64).reshape(n, len(classes))
            if n and not (weight > ZERO_WEIGHT).all():
                return self._decide_active(log_proba, classes, learnt_log_prior, weight)
        lp = self.adjust(log_proba, classes, learnt_log_prior)
        unsure = np.zeros(n, dtype=bool)
        if n == 0 or not classes:
            return Decision([], unsure, lp)
        two = len(classes) == 2
        if self.loss_matrix is not None:
            idx = self._min_expected_loss(lp, classes)
        elif self.threshold is not None and two:
            pos = self.positive_index(classes)
            with np.errstate(invalid="ignore"):
                log_odds = lp[:, pos] - lp[:, 1 - pos]
            idx = np.where(log_odds > self.threshold, pos, 1 - pos)
        else:
            idx = np.argmax(lp, axis=1)
        labels = [classes[i] for i in idx.tolist()]
        if self.unsure_band is not None and two:
            pos = self.positive_index(classes)
            p_pos = np.exp(lp[:, pos])
            lo, hi = self.unsure_band
            unsure = (p_pos >= lo) & (p_pos <= hi)
            labels = [UNSURE if u else lab for lab, u in zip(labels, unsure.tolist(), strict=True)]
        if self.min_class_weight is not None and class_weight is not None:
            cold = (weight.min(axis=1) < self.min_class_weight) | (len(classes) < 2)
            if cold.any():
                unsure = unsure | cold
                labels = [UNSURE if c else lab for lab, c in zip(labels, cold.tolist(), strict=True)]
        return Decision(labels, unsure, lp)

    def _decide_active(self, log_proba: np.ndarray, classes: list,
                       learnt_log_prior: np.ndarray | None, weight: np.ndarray) -> Decision:
        """:meth:`decide` for rows where some class has no weight: each group of rows with
        the same classes with weight is decided on those alone (posteriors renormalised
        over them); the others get ``-inf``. A row with no class with weight is unsure."""
        n, k = log_proba.shape
        active = weight > ZERO_WEIGHT
        labels: list[Any] = [UNSURE] * n
        unsure = np.ones(n, dtype=bool)
        lp = np.full((n, k), -np.inf)
        groups: dict[bytes, list[int]] = {}
        for i in range(n):
            groups.setdefault(active[i].tobytes(), []).append(i)
        for rows in groups.values():
            cols = np.flatnonzero(active[rows[0]])
            if cols.size == 0:
                continue
            sub = log_proba[np.ix_(rows, cols)]
            with np.errstate(invalid="ignore"):
                top = sub.max(axis=1, keepdims=True)
                top = np.where(np.isfinite(top), top, 0.0)
                sub = sub - (top + np.log(np.exp(sub - top).sum(axis=1, keepdims=True)))
            d = self.decide(sub, [classes[j] for j in cols.tolist()],
                            None if learnt_log_prior is None
                            else np.asarray(learnt_log_prior)[cols],
                            weight[np.ix_(rows, cols)])
            lp[np.ix_(rows, cols)] = d.log_proba
            unsure[rows] = d.unsure
            for j, i in enumerate(rows):
                labels[i] = d.labels[j]
        return Decision(labels, unsure, lp)

    def score_of(self, log_proba: Any, classes: Sequence[Label], n_values: Any,
                 class_weight: Any = None) -> np.ndarray | None:
        """The score of each row of decided ``log_proba`` (see the module docstring;
        ``n_values``: each row's sum of feature values), None with fewer than two classes
        (or a ``positive`` class not among them). Given ``class_weight`` (as
        :meth:`decide`), the classes counted are those with weight: a row that has not
        two of them scores ``nan`` (None if no row scores).

        >>> rule = DecisionRule(score="per_feature")
        >>> rule.score_of(np.log([[0.2, 0.8], [0.5, 0.5]]), ["ham", "spam"], [2.0, 0.0]).round(4)
        array([0.6931, 0.    ])
        >>> lp = [[np.log(0.2), -np.inf, np.log(0.8)]]  # "Spam" learnt, then forgotten
        >>> rule.score_of(lp, ["ham", "Spam", "spam"], [2.0], [[3.0, 0.0, 4.0]]).round(4)
        array([0.6931])
        >>> lp = np.log([[0.2, 0.05, 0.75]])  # three classes: spam against ham and Spam
        >>> rule.score_of(lp, ["ham", "Spam", "spam"], [2.0]).round(4)
        array([0.5493])
        """
        lp = np.asarray(log_proba, dtype=np.float64)
        if class_weight is not None:
            weight = np.asarray(class_weight, dtype=np.float64).reshape(lp.shape)
            active = weight > ZERO_WEIGHT
            if not active.all():
                out = np.full(lp.shape[0], np.nan)
                for i in range(lp.shape[0]):
                    cols = np.flatnonzero(active[i])
                    s = self.score_of(lp[i:i + 1, cols], [classes[j] for j in cols.tolist()],
                                      np.asarray(n_values, dtype=np.float64).reshape(-1)[i:i + 1])
                    if s is not None:
                        out[i] = s[0]
                return None if np.isnan(out).all() else out
        if len(classes) < 2 or (self.positive is not None and
                                _key(self.positive) not in [_key(c) for c in classes]):
            return None  # (no score for a positive class the model does not hold)
        pos = self.positive_index(classes)
        rest = np.delete(lp, pos, axis=1)
        top = rest.max(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            top = np.where(np.isfinite(top), top, 0.0)
            odds = lp[:, pos] - (top + np.log(np.exp(rest - top[:, None]).sum(axis=1)))
        if self.score == "per_feature":
            odds = odds / np.maximum(np.asarray(n_values, dtype=np.float64), 1.0)
        return odds

    def _min_expected_loss(self, lp: np.ndarray, classes: list) -> np.ndarray:
        """argmin_j sum_i P(i|x) L[i, j], in log space: log E[loss_j] = LSE_i(lp_i + log L_ij)."""
        k = len(classes)
        loss = 1.0 - np.eye(k)
        keys = [_key(c) for c in classes]
        assert self.loss_matrix is not None
        for i, t in enumerate(keys):
            for j, p in enumerate(keys):
                if p in self.loss_matrix.get(t, {}):
                    loss[i, j] = self.loss_matrix[t][p]
        # defer scipy to the rules that use it (as in adjust)
        from scipy.special import logsumexp

        with np.errstate(divide="ignore", invalid="ignore"):
            log_loss = np.log(loss)
            log_expected = logsumexp(lp[:, :, None] + log_loss[None, :, :], axis=1)
        return np.argmin(np.nan_to_num(log_expected, nan=np.inf), axis=1)

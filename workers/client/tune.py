"""What ``streamnb tune`` proposes from a model's labelled history in ``:out``.

Every labelled message a worker judged left in ``:out`` its prequential ``score`` (made
before the message was learnt) and its ``true_label``: the history :func:`read_history`
reads, the last ``last`` entries of the model's ``:out`` streams at most, paged. On it:

- :func:`threshold_for_fpr`: the lowest threshold t on the score such that the k negatives
  (ham) scoring >= t give a one-sided Clopper-Pearson upper bound on the false-positive
  rate at 95% (:func:`streamnb.operating_point.fp_upper_bound`) of at most the target:
  t lies midway between the (k_max + 1)-th highest negative score and the next higher
  score held (``inf`` when none is: nothing is positive), k_max from
  :func:`~streamnb.operating_point.max_false_positives`. This is the worker's
  ``--target-fpr`` rule on exact scores (the worker holds its window in score bins of
  0.005, so its threshold can sit up to a bin away);
- :func:`best_accuracy_threshold`: the threshold with the fewest errors, the one nearest 0
  (the argmax) among ties;
- :func:`figures_at`: ham FPR with its bound, spam recall and accuracy at a threshold,
  and for an unsure band [lo, t) what falls in it.

:func:`propose` turns a goal (``fpr=RATE`` or ``accuracy``) into a ``--target-fpr``, its
threshold and an unsure band, with those figures. Alpha is not proposed from ``:out``: it
holds each message's score, not its tokens, so another alpha's scores cannot be computed
from it; ``tune --replay INDEX`` replays the labelled mail instead
(workers/cli/alpha_replay.py).

>>> h = History.of([-1.0, -0.5, 0.2], [0.1, 0.9], "ham", "spam", 5)
>>> figures_at(h, 0.15).false_positives, figures_at(h, 0.15).caught
(1, 1)
>>> best_accuracy_threshold(h)  # 1 error at -0.2 and at 0.55: the nearer 0
-0.2
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamnb.exceptions import MalformedMessage
from streamnb.operating_point import CONFIDENCE, fp_upper_bound, max_false_positives
from streamnb_workers.client.verdicts import score_of
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.codec import DATA_FIELD
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.replies import as_str, entry_field
from streamnb_workers.wire.stream_ids import parse_id

__all__ = ["DEFAULT_LAST", "MAX_LAST", "PAGE", "Figures", "History", "Proposal",
           "TooLittleHistory", "best_accuracy_threshold", "figures_at", "format_proposal",
           "in_use", "negatives_needed", "parse_goal", "propose", "read_history", "threshold_for_fpr"]

#: Entries read by default, and at most (``--last``).
DEFAULT_LAST = 20_000
MAX_LAST = 1_000_000
#: Entries per XREVRANGE.
PAGE = 1000
#: Without ``--unsure-fpr``, the band's lower edge holds this many times the target.
UNSURE_FACTOR = 10.0


class TooLittleHistory(Exception):
    """The history cannot support the goal (too few labelled messages of a class)."""


def parse_goal(text: str) -> float | None:
    """``fpr=RATE`` -> RATE in (0, 1); ``accuracy`` -> None; ValueError otherwise.

    >>> parse_goal("fpr=0.001"), parse_goal("accuracy")
    (0.001, None)
    """
    if text == "accuracy":
        return None
    name, eq, value = text.partition("=")
    if name != "fpr" or not eq:
        raise ValueError(f"--goal must be fpr=RATE or accuracy, got {text!r}")
    try:
        rate = float(value)
    except ValueError:
        raise ValueError(f"--goal fpr=RATE: RATE must be a number, got {value!r}") from None
    if not 0.0 < rate < 1.0:
        raise ValueError(f"--goal fpr=RATE: RATE must lie in (0, 1), got {value!r}")
    return rate


def negatives_needed(target: float, confidence: float = CONFIDENCE) -> int:
    """The fewest negatives with which no false positive bounds the rate at ``target``.

    >>> negatives_needed(0.001), negatives_needed(0.01)
    (2995, 299)
    """
    return math.ceil(math.log1p(-confidence) / math.log1p(-target))


@dataclass(frozen=True)
class History:
    """The labelled scores read: each class's sorted, the labels, entries read."""

    negative_scores: np.ndarray
    positive_scores: np.ndarray
    negative: str
    positive: str
    read: int

    @classmethod
    def of(cls, negative_scores: Sequence[float], positive_scores: Sequence[float],
           negative: str, positive: str, read: int) -> History:
        return cls(np.sort(np.asarray(negative_scores, dtype=np.float64)),
                   np.sort(np.asarray(positive_scores, dtype=np.float64)), negative, positive, read)

    @property
    def n_negative(self) -> int:
        return int(self.negative_scores.size)

    @property
    def n_positive(self) -> int:
        return int(self.positive_scores.size)


def _labelled(fields: Any, positive: Any) -> tuple[str, float] | None:
    """(true label, score) of one ``:out`` entry; None for one unlabelled, without a
    two-class score or that does not decode."""
    try:
        out = decode_output(entry_field(fields, DATA_FIELD) or b"")
    except MalformedMessage:
        return None
    label, log_proba = out.get("true_label"), out.get("log_proba")
    if label is None or not isinstance(log_proba, dict) or len(log_proba) != 2:
        return None
    try:
        score = score_of(out, positive)
    except (ValueError, TypeError, OverflowError):
        return None
    return (str(label), score) if math.isfinite(score) else None


def _newest(client: Any, key: str, last: int) -> Any:
    """(id, fields) of the newest ``last`` entries of ``key``, newest first, in pages."""
    upper, seen = "+", 0
    while seen < last:
        want = min(PAGE, last - seen)
        page = client.xrevrange(key, max=upper, count=want)
        yield from ((parse_id(entry_id), fields) for entry_id, fields in page)
        seen += len(page)
        if len(page) < want:
            return
        upper = "(" + as_str(page[-1][0])


def read_history(client: Any, keys: Sequence[str], last: int,
                 positive: str | None = None) -> History:
    """The labelled scores among the newest ``last`` entries of the ``:out`` streams
    ``keys`` together (a sharded model's K merged by id). The positive class is
    ``positive``, else the last of the two labels in sorted order (the ``score``'s)."""
    newest = heapq.merge(*(_newest(client, key, last) for key in keys),
                         key=lambda entry: entry[0], reverse=True)
    scores: dict[str, list[float]] = {}
    read = 0
    for _entry_id, fields in newest:
        if read >= last:
            break
        read += 1
        got = _labelled(fields, positive)
        if got is not None:
            scores.setdefault(got[0], []).append(got[1])
    labels = sorted(scores)
    if len(labels) > 2:
        raise TooLittleHistory(f"{len(labels)} labels in the history ({labels}): "
                               "tune is for two-class models")
    if positive is None:
        positive = labels[-1] if labels else "spam"
    others = [lab for lab in labels if lab != positive]
    negative = others[0] if len(others) == 1 else "ham"
    return History.of(scores.get(negative, []), scores.get(positive, []), negative, positive, read)


def in_use(client: Any, model: str) -> dict[str, Any]:
    """The model's ``alpha`` and decision ``target_fpr`` as stored (None where absent or
    unreadable), read with HMGET, which ``streamnb-scorer`` may run on the config."""
    params, decision = client.hmget(ModelKeys(model).config, ["model_params", "decision"])
    got: dict[str, Any] = {}
    for raw, key, name in ((params, "alpha", "alpha"), (decision, "target_fpr", "target_fpr")):
        try:
            value = json.loads(as_str(raw)).get(key) if raw is not None else None
        except (ValueError, AttributeError):
            value = None
        got[name] = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    return got


# ------------------------------------------------------------------------- figures
@dataclass(frozen=True)
class Figures:
    """The verdicts at ``threshold`` (positive when score >= it) on a history, and with an
    unsure band [``band_low``, threshold) what falls in it."""

    threshold: float
    false_positives: int
    fpr: float
    fpr_bound: float
    caught: int
    recall: float
    accuracy: float
    band_low: float | None = None
    unsure_negative: int = 0
    unsure_positive: int = 0


def _at_or_above(sorted_scores: np.ndarray, t: float) -> int:
    return int(sorted_scores.size - np.searchsorted(sorted_scores, t, side="left"))


def figures_at(h: History, threshold: float, band_low: float | None = None) -> Figures:
    """:class:`Figures` of ``h`` at ``threshold`` (and the band [``band_low``, threshold))."""
    fp = _at_or_above(h.negative_scores, threshold)
    caught = _at_or_above(h.positive_scores, threshold)
    n = h.n_negative + h.n_positive
    unsure_neg = unsure_pos = 0
    if band_low is not None:
        unsure_neg = _at_or_above(h.negative_scores, band_low) - fp
        unsure_pos = _at_or_above(h.positive_scores, band_low) - caught
    return Figures(threshold, fp, fp / h.n_negative if h.n_negative else 0.0,
                   fp_upper_bound(fp, h.n_negative), caught,
                   caught / h.n_positive if h.n_positive else 0.0,
                   (h.n_negative - fp + caught) / n if n else 0.0,
                   band_low, unsure_neg, unsure_pos)


def _all_scores(h: History) -> np.ndarray:
    return np.unique(np.concatenate([h.negative_scores, h.positive_scores]))


def threshold_for_fpr(h: History, target: float, confidence: float = CONFIDENCE) -> float:
    """The lowest threshold whose false positives on ``h`` bound the rate at ``target``
    (module docstring); :class:`TooLittleHistory` when no count does."""
    k_max = max_false_positives(h.n_negative, target, confidence)
    if k_max < 0:
        raise TooLittleHistory(
            f"{h.n_negative} labelled {h.negative} in the history: a false-positive rate of "
            f"{target:g} at {confidence:.0%} needs at least {negatives_needed(target, confidence)}")
    below = float(h.negative_scores[h.n_negative - 1 - k_max])  # the (k_max+1)-th highest
    scores = _all_scores(h)
    above = scores[scores > below]
    return float((below + above[0]) / 2) if above.size else math.inf


def best_accuracy_threshold(h: History) -> float:
    """The threshold with the fewest errors on ``h``: midway between two adjacent scores
    (or +-inf), the one nearest 0 among ties."""
    scores = _all_scores(h)
    candidates = np.concatenate([[-math.inf], (scores[:-1] + scores[1:]) / 2, [math.inf]])
    fp = h.n_negative - np.searchsorted(h.negative_scores, candidates, side="left")
    missed = np.searchsorted(h.positive_scores, candidates, side="left")
    errors = fp + missed
    best = np.flatnonzero(errors == errors.min())
    return float(candidates[best[np.argmin(np.abs(candidates[best]))]])


# ------------------------------------------------------------------------ proposal
@dataclass(frozen=True)
class Proposal:
    """A goal's ``--target-fpr``, the figures at its threshold and band, and at the argmax."""

    goal: str
    target_fpr: float
    unsure_fpr: float
    figures: Figures
    argmax: Figures


def _round_up(rate: float) -> float:
    """``rate`` rounded up to two significant digits, under 1."""
    if rate <= 0.0:
        return rate
    scale = 10.0 ** (math.floor(math.log10(rate)) - 1)
    return min(math.ceil(rate / scale - 1e-9) * scale, 0.99)


def propose(h: History, goal: float | None, unsure_fpr: float | None = None) -> Proposal:
    """The proposal for ``goal`` (a target ham FPR, or None for the best accuracy): with
    ``goal=None`` the target is the bound at the most accurate threshold, rounded up to
    two digits; the band's lower edge is :func:`threshold_for_fpr` of ``unsure_fpr``
    (default :data:`UNSURE_FACTOR` times the target, at most 0.5; no band when that rate is
    not above the target or gives no lower edge). :class:`TooLittleHistory` when the
    history holds no labelled message of a class or cannot support the target."""
    if h.n_negative == 0 or h.n_positive == 0:
        raise TooLittleHistory(f"the history read ({h.read} entries) holds {h.n_negative} "
                               f"labelled {h.negative} and {h.n_positive} labelled {h.positive}: "
                               "tune needs both")
    if goal is None:
        best = figures_at(h, best_accuracy_threshold(h))
        target, name = _round_up(best.fpr_bound), "accuracy"
    else:
        target, name = goal, f"fpr={goal:g}"
    threshold = threshold_for_fpr(h, target)
    if unsure_fpr is None:
        unsure_fpr = min(_round_up(target * UNSURE_FACTOR), 0.5)
    low = threshold  # no band unless a looser rate gives a lower edge
    if unsure_fpr > target:
        try:
            low = min(threshold_for_fpr(h, unsure_fpr), threshold)
        except TooLittleHistory:
            pass
    return Proposal(name, target, unsure_fpr, figures_at(h, threshold, low), figures_at(h, 0.0))


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def format_proposal(p: Proposal, h: History, alpha: Any = None,
                    target_in_use: Any = None, replayed: bool = False) -> list[str]:
    """The lines ``streamnb tune`` prints (``alpha``, ``target_in_use``: the model's;
    ``replayed``: alpha is re-evaluated by a replay, whose lines follow)."""
    f, a = p.figures, p.argmax
    lines = [
        f"history: {h.read} entries read, {h.n_negative} labelled {h.negative}, "
        f"{h.n_positive} labelled {h.positive} (prequential scores)",
        f"goal: {p.goal}; in use: "
        + ("the argmax" if target_in_use is None else f"--target-fpr {target_in_use:g}"),
        f"propose: --target-fpr {p.target_fpr:g}",
        f"  threshold on score: {f.threshold:.4g} ({h.positive} when score >= it)",
    ]
    for name, g in (("at the proposal", f), ("at the argmax (score >= 0)", a)):
        lines.append(
            f"  {name}: {h.negative} FPR {_pct(g.fpr)} ({g.false_positives} of {h.n_negative}; "
            f"95% upper bound {_pct(g.fpr_bound)}), {h.positive} recall {_pct(g.recall)} "
            f"({g.caught} of {h.n_positive}), accuracy {_pct(g.accuracy)}")
    if f.band_low is not None and f.band_low < f.threshold:
        n = h.n_negative + h.n_positive
        share = (f.unsure_negative + f.unsure_positive) / n
        lines += [f"propose: unsure band on score [{f.band_low:.4g}, {f.threshold:.4g}) "
                  f"(its lower edge holds {h.negative} FPR at {p.unsure_fpr:g})",
                  f"  in the band: {f.unsure_negative} {h.negative}, {f.unsure_positive} "
                  f"{h.positive} ({_pct(share)} of the labelled messages); {h.positive} "
                  f"recall counting the band: {_pct((f.caught + f.unsure_positive) / h.n_positive)}"]
    else:
        lines.append(f"propose: no unsure band ({h.negative} FPR {p.unsure_fpr:g} gives no "
                     "lower edge below the threshold)")
    if not replayed:
        kept = "" if alpha is None else f"keep {alpha:g}; "
        lines.append(f"alpha: {kept}not re-evaluated: :out holds each message's score, not its "
                     "tokens; give the labelled mail with --replay INDEX (docs/cli.md)")
    return lines

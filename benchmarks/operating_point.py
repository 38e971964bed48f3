"""Operating points on the corpus replay: a target false-positive rate, calibrated
probabilities, and a class prior that follows the traffic.

The corpus is replayed in ``index.tsv`` (chronological) order, in this process, one message
at a time, as the daemon does with ordered predictions and its defaults for hashed mail
(multinomial, alpha 0.1, the per-feature score, "unsure" while a class has learnt less
than weight 3, error weight 2): each message is judged, then learnt with its label. The
window of labelled scores is the daemon's (``streamnb.operating_point.ScoreWindow``, fitted
every 100 labelled messages, size ``--score-window``, 20,000): tests/workers/worker/test_operating_point.py
checks that the daemon's thresholds and probabilities are those of this window, one
message at a time.

Measured on the later part of the replay (after ``--tune``, 60%):

- calibration: the expected calibration error (ten equal-width bins) of P(spam) from the
  isotonic and the Platt map, and of the model's own posterior, with a reliability plot
  (``--plot``, PNG);
- verdicts at the argmax and at ``--target-fpr`` 0.001 and 0.01: accuracy, ham FPR (with
  its 95% Clopper-Pearson upper bound), spam recall, and the share of messages judged while
  the window supported the target;
- the same on a prior-shift replay (``--seed``): the corpus's first two thirds with a
  quarter of their spam (6% spam), then its last third (3% spam in 2002) with the
  spam held back mixed in and its ham thinned to as many as the spam (50% spam);
- on both, each decision again with the window's isotonic P(spam) moved to a prior that
  follows the traffic (Saerens et al., 2002; the daemon's ``--prior-half-life``): the spam
  share of the labelled messages with each half-life of ``--prior-half-life`` (default
  200), with half-life 1e12 (the mix of every label: the calibrated argmax, no prior
  followed) as a control, and with Saerens et al.'s EM prior over the calibrated P(spam)
  of the last ``--prior-em`` messages, their labels unused (this replay only); without a
  target the verdict is spam when the moved P(spam) is above 1/2. Per decision: the
  verdicts it changes from the same target's with the learnt prior, the ECE of its
  P(spam) and the median prior in use.

With ``--daemon`` the corpus also goes through 2 worker processes with ``--target-fpr 0.01
--calibration isotonic``, and again with ``--calibration isotonic --prior-half-life 200``,
whose verdicts, thresholds, probabilities and priors are compared with this process's.

    python -m benchmarks.operating_point [--tune 0.6] [--limit N] [--score-window N]
        [--prior-half-life N ...] [--prior-em N] [--seed S] [--daemon]
        [--plot docs/figures/reliability.png]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks._common import DEFAULT_CORPUS, corpus_or_synthetic, format_table, print_header
from benchmarks.quality_slices import featurized
from streamnb.calibration import adjust_to_prior, em_prior, expected_calibration_error, reliability
from streamnb.decision import UNSURE
from streamnb.operating_point import DEFAULT_WINDOW, ScoreWindow, fp_upper_bound

SPAM, HAM = "spam", "ham"
MIN_WEIGHT, ERROR_WEIGHT, ALPHA = 3.0, 2.0, 0.1


@dataclass(frozen=True)
class Setting:
    """One way of deciding (see the module docstring): ``prior_half_life`` is the daemon's
    followed prior (``--prior-half-life``); ``prior_em`` N, instead, Saerens et al.'s EM
    prior over the calibrated P(spam) of the last N messages, labels unused (this replay
    only)."""

    name: str
    target_fpr: float | None = None
    calibration: str | None = None
    prior_half_life: float | None = None
    prior_em: int | None = None


@dataclass
class Replay:
    """Per message: the verdict (True spam, False not, None no verdict), the score, the
    calibrated P(spam) (moved to the followed prior, with one) and the model's own (NaN:
    none), whether the window supported the target, the threshold and the followed prior
    (NaN: none)."""

    verdicts: list[bool | None]
    scores: list[float]
    probas: list[float]
    posteriors: list[float]
    supported: list[bool]
    thresholds: list[float | None]
    priors: list[float]


def replay(X: Any, labels: Sequence[str], s: Setting, size: int = DEFAULT_WINDOW) -> Replay:
    """Judge then learn every message in order (see the module docstring); ``size``: the
    score window's."""
    from streamnb.models import make_model

    model = make_model("multinomial", alpha=ALPHA, n_features=X.shape[1], smoothing_m="seen")
    window = ScoreWindow(size, "per_feature", s.target_fpr, s.calibration,
                         prior_half_life=s.prior_half_life)
    n_values = np.maximum(np.asarray(X.sum(axis=1)).ravel(), 1.0)
    recent: deque[float] = deque(maxlen=s.prior_em or 1)
    weight: dict[str, float] = {}
    out = Replay([], [], [], [], [], [], [])
    for i, label in enumerate(labels):
        verdict, score, proba, post, supported = None, math.nan, math.nan, math.nan, False
        threshold, prior = None, math.nan
        if len(weight) == 2:
            lp = model.predict_log_proba(X[i])[0]
            classes = list(model.classes_)
            odds = float(lp[classes.index(SPAM)] - lp[classes.index(HAM)])
            score = odds / n_values[i]
            post = 1.0 / (1.0 + math.exp(-odds)) if odds > -700 else 0.0
            decided = UNSURE if min(weight.values()) < MIN_WEIGHT else SPAM if odds > 0 else HAM
            j = window.judge([score], [decided], [label], SPAM, HAM)
            point = window.point
            supported, threshold = point.supported, j.thresholds[0]
            if j.probas[0] is not None:
                proba = j.probas[0]
            if j.priors[0] is not None:
                prior = j.priors[0]
            if s.prior_em and j.probas[0] is not None:
                decided, proba, prior = em_judged(j.labels[0], proba, recent, point)
            else:
                decided = j.labels[0]
            verdict = decided == SPAM
            window.add([c for c in j.codes if c is not None])
        elif weight:
            verdict = False if MIN_WEIGHT > 0 else SPAM in weight
        # the daemon's error weight: a wrong verdict; unsure is wrong on a spam only
        wrong = verdict is not None and verdict != (label == SPAM) and len(weight | {label: 0}) == 2
        w = ERROR_WEIGHT if wrong else 1.0
        model.partial_fit(X[i], np.array([label]), sample_weight=np.array([w]))
        weight[label] = weight.get(label, 0.0) + w
        for lst, v in zip((out.verdicts, out.scores, out.probas, out.posteriors, out.supported,
                           out.thresholds, out.priors),
                          (verdict, score, proba, post, supported, threshold, prior), strict=True):
            lst.append(v)
    return out


def em_judged(label: Any, proba: float, recent: deque[float], point: Any,
              ) -> tuple[Any, float, float]:
    """(label, moved P(spam), prior) of a message by the EM prior over ``recent`` (the
    calibrated P(spam) of the messages before it; this one's is added after)."""
    prior = math.nan
    if point.n_negative and point.n_positive and recent:
        fitted = (point.n_positive + 1.0) / (point.n_positive + point.n_negative + 2.0)
        prior = em_prior(list(recent), fitted)
        prior = min(max(prior, 1e-3), 1 - 1e-3)
        moved = adjust_to_prior(proba, fitted, prior)
        if label != UNSURE and point.threshold is None:
            label = SPAM if moved > 0.5 else HAM
        recent.append(proba)
        return label, moved, prior
    recent.append(proba)
    return label, proba, prior


def verdict_cells(r: Replay, labels: Sequence[str], start: int, target: bool = True,
                  ) -> list[str]:
    """accuracy, ham FPR (its 95% bound), spam recall, supported share from ``start`` on."""
    truth = [lab == SPAM for lab in labels[start:]]
    v = r.verdicts[start:]
    n_ham = sum(not t for t in truth)
    n_spam = len(truth) - n_ham
    fp = sum(1 for x, t in zip(v, truth, strict=True) if not t and x is not False)
    fn = sum(1 for x, t in zip(v, truth, strict=True) if t and x is not True)
    return [f"{1 - (fp + fn) / len(truth):.2%}",
            f"{fp / n_ham:.3%} ({fp}/{n_ham}) <= {fp_upper_bound(fp, n_ham):.3%}",
            f"{1 - fn / n_spam:.2%}", f"{np.mean(r.supported[start:]):.0%}" if target else "-"]


def decisions(half_lives: Sequence[float], em: int) -> list[Setting]:
    """The decisions measured: the argmax and the targets with the learnt prior, then each
    with an isotonic P(spam) moved to a followed prior (each half-life; the mix of every
    label, half-life 1e12, as a control; the EM prior over the last ``em`` messages)."""
    out = [Setting("argmax"), Setting("--target-fpr 0.01", 0.01),
           Setting("--target-fpr 0.001", 0.001)]
    follow = [(f"--prior-half-life {h:g}", h, None) for h in half_lives]
    follow += [("--prior-half-life 1e12 (every label's mix)", 1e12, None),
               (f"EM prior, last {em} unlabelled", None, em)]
    for target in (None, 0.001):
        for name, h, n in follow:
            head = "argmax" if target is None else f"--target-fpr {target:g}"
            out.append(Setting(f"{head}, isotonic, {name}", target, "isotonic", h, n))
    return out


def verdict_table(X: Any, labels: Sequence[str], start: int, settings: Sequence[Setting],
                  size: int) -> tuple[str, Replay]:
    """Each decision's figures from message ``start`` on, the verdicts it changes from the
    same target with the learnt prior, and the ECE of its P(spam); and the argmax's replay."""
    head = ["decision", "accuracy", "ham FPR (n) <= 95% bound", "spam recall", "supported",
            "changed", "ECE", "prior (median)"]
    rows, base, argmax = [], {}, None
    truth = np.array([lab == SPAM for lab in labels[start:]], dtype=float)
    for s in settings:
        r = replay(X, labels, s, size)
        argmax = argmax or r
        if s.calibration is None:
            base[s.target_fpr] = r.verdicts
            changed = "-"
        else:
            changed = str(sum(1 for x, y in zip(r.verdicts[start:], base[s.target_fpr][start:],
                                                strict=True) if x != y))
        p = np.array(r.probas[start:])
        ece = f"{expected_calibration_error(p, truth):.4f}" if s.calibration else "-"
        prior = np.array(r.priors[start:])
        prior = f"{np.nanmedian(prior):.3f}" if np.isfinite(prior).any() else "-"
        rows.append([s.name, *verdict_cells(r, labels, start, s.target_fpr is not None),
                     changed, ece, prior])
    assert argmax is not None
    return format_table(head, rows), argmax


def middle(p: np.ndarray) -> str:
    """How many probabilities lie strictly between 0.1 and 0.9."""
    return str(int(np.sum((p > 0.1) & (p < 0.9))))


def prior_shift(labels: Sequence[str], seed: int, keep: float = 0.25) -> tuple[list[int], int]:
    """The prior-shift replay (its indices, and where its shifted part starts): the first
    two thirds in order with a random ``keep`` of their spam; then the last third in order
    with the spam held back mixed in at random places (each in its own order) and the
    ham thinned at random to as many as the spam (50% spam)."""
    cut = 2 * len(labels) // 3
    rng = np.random.default_rng(seed)
    early_spam = [i for i in range(cut) if labels[i] == SPAM]
    kept = set(rng.choice(early_spam, size=int(round(keep * len(early_spam))),
                          replace=False).tolist())
    early = [i for i in range(cut) if labels[i] != SPAM or i in kept]
    held = [i for i in early_spam if i not in kept]
    tail_spam = [i for i in range(cut, len(labels)) if labels[i] == SPAM]
    tail_ham = [i for i in range(cut, len(labels)) if labels[i] != SPAM]
    n_spam = len(held) + len(tail_spam)
    ham = set(rng.choice(tail_ham, size=min(n_spam, len(tail_ham)), replace=False).tolist())
    tail = [i for i in range(cut, len(labels)) if labels[i] == SPAM or i in ham]
    slots = set(rng.choice(len(tail) + len(held), size=len(held), replace=False).tolist())
    it_tail, it_held = iter(tail), iter(held)
    late = [next(it_held) if j in slots else next(it_tail) for j in range(len(tail) + len(held))]
    return early + late, len(early)


def plot(path: str, curves: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
         title: str) -> None:
    import matplotlib  # deferred: only --plot draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: with matplotlib

    fig, (ax, bars) = plt.subplots(2, 1, figsize=(5.5, 6.5), dpi=100, sharex=True,
                                   gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", linewidth=1, label="perfectly calibrated")
    width = 0.1 / (len(curves) + 1)
    for k, ((name, (mean_p, share, n)), marker) in enumerate(zip(curves.items(), "osx^",
                                                                 strict=False)):
        held = n > 0
        line, = ax.plot(mean_p[held], share[held], marker=marker, label=name)
        bars.bar(np.arange(len(n)) / len(n) + (k + 1) * width, n, width=width,
                 color=line.get_color(), log=True)
    ax.set_ylabel("share of spam")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="upper left")
    bars.set_xlabel("predicted P(spam): mean of each tenth above, its messages below")
    bars.set_ylabel("messages")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--tune", type=float, default=0.6, help="share of the replay before the later part")
    ap.add_argument("--seed", type=int, default=0, help="the ham thinned in the prior-shift replay")
    ap.add_argument("--prior-half-life", type=float, nargs="+", default=[200.0], metavar="N",
                    help="the followed priors' half-lives, in labelled messages")
    ap.add_argument("--prior-em", type=int, default=200, metavar="N",
                    help="the messages the EM prior is estimated on")
    ap.add_argument("--score-window", type=int, default=DEFAULT_WINDOW, metavar="N")
    ap.add_argument("--daemon", action="store_true",
                    help="also replay through 2 worker processes with --target-fpr 0.01 "
                    "--calibration isotonic, and with --calibration isotonic "
                    "--prior-half-life 200, and compare them with this process's replay")
    ap.add_argument("--plot", default=None, metavar="PNG", help="write the reliability plot here")
    a = ap.parse_args(argv)
    if not 0.0 < a.tune < 1.0:
        ap.error(f"--tune must lie between 0 and 1, got {a.tune}")
    print_header("operating points", "benchmarks.operating_point", argv)
    corpus = corpus_or_synthetic(a.corpus, a.limit)
    t0 = time.perf_counter()
    X, labels = featurized(corpus)
    cut = int(round(a.tune * len(labels)))
    print(f"{len(labels)} messages ({labels.count(SPAM)} spam), featurized in "
          f"{time.perf_counter() - t0:.1f}s; the later part: {cut + 1}..{len(labels)}")

    # ---- calibration
    truth = np.array([lab == SPAM for lab in labels[cut:]], dtype=float)
    curves, rows = {}, []
    for kind in ("isotonic", "platt"):
        r = replay(X, labels, Setting(kind, calibration=kind), a.score_window)
        p = np.array(r.probas[cut:])
        if kind == "isotonic":
            post = np.array(r.posteriors[cut:])
            rows.append(["model posterior (no calibration)",
                         f"{expected_calibration_error(post, truth):.4f}",
                         f"{np.mean((post - truth) ** 2):.4f}", middle(post)])
            curves["model posterior"] = reliability(post, truth)
        rows.append([f"{kind}", f"{expected_calibration_error(p, truth):.4f}",
                     f"{np.mean((p - truth) ** 2):.4f}", middle(p)])
        curves[kind] = reliability(p, truth)
    print(f"\nexpected calibration error of P(spam), ten bins, messages {cut + 1}..{len(labels)}:")
    print(format_table(["P(spam) from", "ECE", "Brier", "0.1 < P < 0.9"], rows))
    if a.plot:
        plot(a.plot, curves, f"reliability, SpamAssassin 2002 replay, messages {cut + 1}-{len(labels)}")
        print(f"reliability plot written to {a.plot}")

    # ---- verdicts on the replay and on the prior-shift replay, the prior kept and followed
    settings = decisions(a.prior_half_life, a.prior_em)
    print(f"\nverdicts, messages {cut + 1}..{len(labels)} of the replay:")
    print(verdict_table(X, labels, cut, settings, a.score_window)[0])
    order, start = prior_shift(labels, a.seed)
    Xs, ls = X[order], [labels[i] for i in order]
    print(f"\nprior-shift replay: {start} messages ({ls[:start].count(SPAM)} spam), then "
          f"{len(ls) - start} ({ls[start:].count(SPAM)} spam); verdicts on those {len(ls) - start}:")
    table, r = verdict_table(Xs, ls, start, settings, a.score_window)
    print(table)
    odds = np.abs(np.array(r.scores[start:]) * np.maximum(np.asarray(Xs.sum(axis=1)).ravel(),
                                                         1.0)[start:])
    print(f"the model's log-odds on those: median size {np.median(odds):.0f} nats, "
          f"{int(np.sum(odds < 3))} of {len(odds)} within 3 nats of 0")
    if a.daemon:
        for s in (Setting("--target-fpr 0.01 --calibration isotonic", 0.01, "isotonic"),
                  Setting("--calibration isotonic --prior-half-life 200", None, "isotonic",
                          200.0)):
            compare_with_daemon(corpus, X, labels, a.score_window, s)
    return 0


def compare_with_daemon(corpus: Any, X: Any, labels: Sequence[str], size: int,
                        setting: Setting) -> None:
    """The corpus through 2 worker processes deciding as ``setting``: how many of their
    verdicts, thresholds, probabilities and priors are this process's."""
    from benchmarks._replay import replay_through_daemon

    mine = replay(X, labels, setting, size)
    decision = {k: v for k, v in (("target_fpr", setting.target_fpr),
                                  ("calibration", setting.calibration),
                                  ("prior_half_life", setting.prior_half_life)) if v is not None}
    t0 = time.perf_counter()
    outs = replay_through_daemon(corpus, 2, decision={**decision, "score_window": size}
                                 ).in_corpus_order(len(labels))
    same = {"verdict": 0, "threshold": 0, "proba": 0, "prior": 0}
    for i, o in enumerate(outs):
        label = o.get("label")
        verdict = None if label is None else label == SPAM
        same["verdict"] += verdict == mine.verdicts[i]
        scored = "score" in o
        same["threshold"] += (not scored and math.isnan(mine.scores[i])) or \
            (scored and o.get("threshold") == mine.thresholds[i])
        same["proba"] += (not scored and math.isnan(mine.probas[i])) or \
            (scored and o.get("proba") == mine.probas[i])
        same["prior"] += ("prior" not in o and math.isnan(mine.priors[i])) or \
            o.get("prior") == mine.priors[i]
    gaps = {}
    for key, ours in (("score", mine.scores), ("threshold", mine.thresholds), ("proba", mine.probas)):
        pairs = [(o[key], x) for o, x in zip(outs, ours, strict=True) if key in o and x is not None
                 and math.isfinite(o[key]) and math.isfinite(x)]
        gaps[key] = max((abs(d - x) for d, x in pairs), default=0.0)
    print(f"\ndaemon, 2 workers, {setting.name} ({time.perf_counter() - t0:.0f}s): of "
          f"{len(labels)} messages, " + ", ".join(f"{v} {k}s" for k, v in same.items()) +
          " equal to this process's; largest differences: "
          + ", ".join(f"{k} {v:.3g}" for k, v in gaps.items()))


if __name__ == "__main__":
    sys.exit(main())

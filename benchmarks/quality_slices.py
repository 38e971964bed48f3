"""Default choices for mail measured on time slices: tune on earlier mail, check on later.

The corpus is replayed once per variant in ``index.tsv`` order, in this process, one
message at a time (judged, then learnt with its label), as the daemon does with ordered
predictions. The TREC measures (benchmarks/_trec.py) are reported separately for the
messages of the tuning slice (the first ``--tune`` share of the corpus) and of the check
slice (the rest, judged by the model that has learnt everything before it). A default is
chosen on the tuning slice alone; the check slice says whether it holds on later mail.

A variant sets:

- ``alpha``: the smoothing of the multinomial model;
- ``score``: ``log_odds`` (log P(spam|x) - log P(ham|x)) or ``per_feature`` (the same
  divided by the message's number of features, its row's sum of values);
- ``min_weight``: the verdict is "unsure" (not spam) while a class has less total weight
  than this (or only one class is known);
- ``error_weight``: the weight with which a message the model judged wrongly is learnt
  (1: every message learnt alike);
- ``osb``: the featurizer's orthogonal sparse bigrams window (0: off; CRM114 and rspamd:
  5), the tokens of the mail;
- ``combining``: ``nb`` (the multinomial posterior) or ``chi2``: Robinson's token
  probabilities combined by Fisher's chi-square test, as SpamBayes and bogofilter do
  (:mod:`streamnb.models.combining`), on the same model's statistics; the score is the
  indicator in [0, 1] and the verdict is spam above ``cutoff`` (0.5; SpamBayes: 0.9);
- ``learn``: ``all`` (every labelled message), ``errors`` (DSPAM's train-on-error: only
  the messages judged wrongly, unsure or not judged) or ``mature:N`` (DSPAM's
  train-until-mature: every message until N are learnt, then only errors).

``--only TEXT[,TEXT...]`` replays only the variants whose name holds one of them (the
tokens and distinct buckets per message of each featurizer used are printed).

    python -m benchmarks.quality_slices [--tune 0.6] [--limit N] [--only TEXT]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks._common import DEFAULT_CORPUS, corpus_or_synthetic, format_table, print_header
from benchmarks._trec import Measures, measure

SPAM, HAM = "spam", "ham"


@dataclass(frozen=True)
class Variant:
    """One set of choices (see the module docstring)."""

    name: str
    alpha: float = 0.1
    score: str = "log_odds"
    min_weight: float = 0.0
    error_weight: float = 1.0
    unsure_is_error: bool = False
    #: Whether "wrong" is the model's most probable class (not the published verdict).
    model_error: bool = False
    osb: int = 0
    combining: str = "nb"
    cutoff: float = 0.5
    learn: str = "all"


#: The variants measured: today's defaults, each change alone, and their combinations.
VARIANTS = (
    Variant("old defaults"),
    Variant("score per feature", score="per_feature"),
    Variant("unsure below weight 3", min_weight=3.0),
    Variant("error weight 2", error_weight=2.0),
    Variant("error weight 3", error_weight=3.0),
    Variant("per feature + unsure 3", score="per_feature", min_weight=3.0),
    Variant("per feature + unsure 3 + error 2", score="per_feature", min_weight=3.0,
            error_weight=2.0),
    Variant("per feature + unsure 10 + error 2", score="per_feature", min_weight=10.0,
            error_weight=2.0),
    Variant("per feature + unsure 3 + error 3", score="per_feature", min_weight=3.0,
            error_weight=3.0),
    Variant("per sqrt + unsure 3 + error 2", score="per_sqrt", min_weight=3.0,
            error_weight=2.0),
    Variant("per feature + unsure 3 (an error) + error 2", score="per_feature", min_weight=3.0,
            error_weight=2.0, unsure_is_error=True),
    Variant("per feature + unsure 3 + model error 2", score="per_feature", min_weight=3.0,
            error_weight=2.0, model_error=True),
    Variant("per feature + error 2", score="per_feature", error_weight=2.0),
    Variant("... + error 2, alpha 0.05", alpha=0.05, score="per_feature", min_weight=3.0,
            error_weight=2.0),
    Variant("... + error 2, alpha 0.2", alpha=0.2, score="per_feature", min_weight=3.0,
            error_weight=2.0),
    Variant("defaults + OSB 5", score="per_feature", min_weight=3.0, error_weight=2.0, osb=5),
    Variant("defaults + OSB 3", score="per_feature", min_weight=3.0, error_weight=2.0, osb=3),
    Variant("defaults + OSB 5, alpha 0.03", alpha=0.03, score="per_feature", min_weight=3.0,
            error_weight=2.0, osb=5),
    Variant("defaults + OSB 5, alpha 0.3", alpha=0.3, score="per_feature", min_weight=3.0,
            error_weight=2.0, osb=5),
    Variant("defaults + OSB 5, alpha 1", alpha=1.0, score="per_feature", min_weight=3.0,
            error_weight=2.0, osb=5),
    Variant("defaults, chi2 combining", min_weight=3.0, error_weight=2.0, combining="chi2"),
    Variant("defaults, train on error", score="per_feature", min_weight=3.0, error_weight=2.0,
            learn="errors"),
    Variant("defaults, train until mature (500)", score="per_feature", min_weight=3.0,
            error_weight=2.0, learn="mature:500"),
    Variant("defaults, train until mature (1000)", score="per_feature", min_weight=3.0,
            error_weight=2.0, learn="mature:1000"),
    Variant("defaults, chi2 combining, spam above 0.9", min_weight=3.0, error_weight=2.0,
            combining="chi2", cutoff=0.9),
    Variant("defaults + OSB 5, chi2 combining", min_weight=3.0, error_weight=2.0, osb=5,
            combining="chi2"),
)


def featurized(corpus: Any, osb: int = 0) -> tuple[Any, list[str]]:
    """The corpus's rows with the daemon's default featurizer (with ``osb``, that option)
    (CSR) and its labels."""
    from streamnb.features import Payload
    from streamnb_workers.store.model_config import ModelSpec, resolve_spec

    featurizer = resolve_spec(ModelSpec("slices", kind="multinomial", featurizer_config={
        "osb": osb} if osb else None)).make_featurizer()
    rows = featurizer.featurize_batch([Payload("raw", raw) for raw in corpus.raws])
    X = featurizer.stack(rows).tocsr()
    X.n_tokens = float(np.mean([r.n_tokens for r in rows]))  # (tokens per message, printed)
    return X, list(corpus.labels)


def replay(X: Any, labels: Sequence[str], v: Variant) -> tuple[list[float], list[bool | None]]:
    """(scores, verdicts) of one variant over every message, in order. As the daemon: no
    verdict before the first class; "unsure" counts as not spam and, on a spam, as an
    error; a message judged before any class was known is no error."""
    from streamnb.models import make_model
    from streamnb.models.combining import chi2_indicators

    model = make_model("multinomial", alpha=v.alpha, n_features=X.shape[1], smoothing_m="seen")
    scores: list[float] = []
    verdicts: list[bool | None] = []
    n_values = np.asarray(X.sum(axis=1)).ravel()
    weight: dict[str, float] = {}
    for i, label in enumerate(labels):
        x = X[i]
        score, verdict, argmax_spam, unsure = 0.0, None, None, False
        if len(weight) == 2:
            lp = model.predict_log_proba(x)[0]
            classes = list(model.classes_)
            odds = float(lp[classes.index(SPAM)] - lp[classes.index(HAM)])
            verdict = argmax_spam = odds > 0
            score = odds
            if v.combining == "chi2":
                score = float(chi2_indicators(model, x, SPAM)[0])
                verdict = argmax_spam = score > v.cutoff
            elif v.score == "per_feature":
                score = odds / max(n_values[i], 1.0)
            elif v.score == "per_sqrt":
                score = odds / np.sqrt(max(n_values[i], 1.0))
            unsure = min(weight.values()) < v.min_weight
        elif weight:  # one class known: that class, or unsure
            verdict = argmax_spam = SPAM in weight
            unsure = v.min_weight > 0
        if unsure:
            verdict = False
        scores.append(score)
        verdicts.append(verdict)
        if v.model_error:
            wrong = argmax_spam is not None and argmax_spam != (label == SPAM)
        elif unsure:  # an error on a spam, once both classes are in play
            wrong = v.unsure_is_error or (label == SPAM and len(set(weight) | {label}) == 2)
        else:
            wrong = verdict is not None and verdict != (label == SPAM)
        w = v.error_weight if wrong else 1.0
        judged = verdict is not None and not unsure
        if judged and not wrong and v.learn != "all" and (
                v.learn == "errors" or i >= int(v.learn.partition(":")[2])):
            continue  # train-on-error, or a mature model: only what it misjudged
        model.partial_fit(x, np.array([label]), sample_weight=np.array([w]))
        weight[label] = weight.get(label, 0.0) + w
    return scores, verdicts


def slice_measures(scores: Sequence[float], verdicts: Sequence[bool | None],
                   labels: Sequence[str], start: int, stop: int) -> Measures:
    return measure(scores[start:stop], verdicts[start:stop],
                   [lab == SPAM for lab in labels[start:stop]])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--tune", type=float, default=0.6, help="share of the corpus tuned on")
    ap.add_argument("--only", default="", help="replay only the variants whose name holds one of these (comma separated)")
    a = ap.parse_args(argv)
    if not 0.0 < a.tune < 1.0:
        ap.error(f"--tune must lie between 0 and 1, got {a.tune}")
    print_header("default choices on time slices", "benchmarks.quality_slices", argv)
    corpus = corpus_or_synthetic(a.corpus, a.limit)
    wanted = [w for w in a.only.split(",") if w] or [""]
    variants = [v for v in VARIANTS if any(w in v.name for w in wanted)]
    matrices = {}
    for osb in sorted({v.osb for v in variants}):
        t0 = time.perf_counter()
        matrices[osb], labels = featurized(corpus, osb)
        print(f"osb {osb}: {len(labels)} messages, featurized in {time.perf_counter() - t0:.1f}s, "
              f"{matrices[osb].n_tokens:.1f} tokens and {matrices[osb].nnz / len(labels):.1f} "
              f"distinct buckets per message")
    cut = int(round(a.tune * len(labels)))
    print(f"tune on 1..{cut}, check on {cut + 1}..{len(labels)}")
    table = []
    for v in variants:
        scores, verdicts = replay(matrices[v.osb], labels, v)
        cells = [v.name]
        for start, stop in ((0, cut), (cut, len(labels)), (0, len(labels))):
            m = slice_measures(scores, verdicts, labels, start, stop)
            cells += [f"{m.roca_pct:.3f}", f"{m.lam_pct:.2f}", f"{m.accuracy:.2%}",
                      f"{m.ham_fpr:.2%}"]
        table.append(cells)
    head = ["variant"] + [f"{s} {k}" for s in ("tune", "check", "all")
                          for k in ("1-ROCA%", "lam%", "acc", "hamFPR")]
    print(format_table(head, table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

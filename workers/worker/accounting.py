"""What a batch's commit is counted and scored as once it landed: the commit, the
messages predicted, learnt, already learnt, relearnt, forgotten, unlearned and corrected, its dead
letters, and the prequential and delayed scores the observer is given. Called with the
settled commit's own values (workers/worker/committing.py ``Committed``), where the
worker commits or settles it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from streamnb_workers.worker.committing import Committed, settle
from streamnb_workers.worker.labels import delayed_matrix
from streamnb_workers.worker.runtime import ModelRuntime

__all__ = ["account", "settle_and_tail"]


def account(rt: ModelRuntime, committed: Committed | None) -> None:
    """Count and score ``committed`` (None: nothing was committed, nothing to count)."""
    if committed is None:
        return
    m, series, content = rt.metrics, rt.series, committed.built.content
    series(m.commits).inc()
    series(m.messages_predicted).inc(len(content.outputs))
    # one inc per class and batch (not per message): the same totals
    for lab, n in Counter(map(str, content.learnt_labels)).items():
        series(m.messages_learned, **{"class": lab}).inc(n)
    if content.n_autolearnt:
        series(m.messages_autolearnt).inc(content.n_autolearnt)
    if content.n_duplicates:
        series(m.messages_already_learnt).inc(content.n_duplicates)
    if content.relearnt_was:  # corrections too: a contribution moved from a class
        series(m.messages_relearnt).inc(len(content.relearnt_was))
        series(m.corrections).inc(len(content.relearnt_was))
        for lab, n in Counter(map(str, content.relearnt_was)).items():
            series(m.messages_unlearned, **{"class": lab}).inc(n)
    for lab, n in Counter(map(str, content.forgotten_labels)).items():
        series(m.messages_forgotten, **{"class": lab}).inc(n)
    res = content.resolution
    for lab, n in Counter(map(str, res.unlearned)).items():
        series(m.messages_unlearned, **{"class": lab}).inc(n)
    if res.corrections:
        series(m.corrections).inc(res.corrections)
    for d in content.dead:
        series(m.dead_letters, reason=d.reason).inc()
    with rt.stage("score"):
        if content.scored:  # test-then-train, counted once: only what this commit learnt
            # (rows of one batch's matrix, of one length: np.array stacks them in C)
            rt.observe(rt.observer.score_labelled, committed.batch.classes,
                       np.array([lp for lp, _ in content.scored], dtype=np.float64),
                       [y for _, y in content.scored])
        if res.delayed:
            classes, mat, truth, delays = delayed_matrix(res.delayed)
            if truth:
                rt.observe(rt.observer.score_delayed, classes, mat, truth, delays)


def settle_and_tail(rt: ModelRuntime) -> None:
    """Read the reply of the model's commit on the wire, account for it, then apply the
    log."""
    account(rt, settle(rt)[1])
    rt.tail()

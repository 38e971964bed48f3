"""``streamnb tune --replay INDEX``: each candidate alpha replayed through the daemon.

``:out`` holds each message's score, not its tokens, so another alpha's scores cannot be
computed from a model's history. Given the labelled mail itself (an index, in date
order, as ``produce --index`` reads it), tune replays it through one worker on an
embedded Redis (a private ``redis-server``, or fakeredis: :mod:`streamnb_workers.store.embedded`),
once per candidate alpha, each as a model of the stored configuration with only alpha
changed (:func:`~streamnb_workers.replication.challenger.challenger_config`), one stream
and one shard, ``training: in``: every message judged, then learnt, as the daemon does,
error weights included. Each candidate's ``:out`` is then a history (:func:`read_history`)
scored as ``tune`` scores a model's: (1-ROCA)% of the prequential scores, and the figures
at the goal's threshold (:func:`~streamnb_workers.client.tune.propose`).

:func:`best_alpha` picks, for ``--goal fpr=RATE``, the most spam recall at the threshold
that holds RATE; for ``--goal accuracy``, the most accurate threshold's accuracy; ties go
to the lower (1-ROCA)%, then to the alpha in use.

>>> one_minus_roca(History.of([0.1, 0.2], [0.3, 0.4], "ham", "spam", 4))
0.0
>>> one_minus_roca(History.of([0.1, 0.3], [0.2, 0.4], "ham", "spam", 4))
25.0
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

from streamnb.exceptions import SettingsError
from streamnb_workers.client.sources import IndexEntry, Outgoing, read_index
from streamnb_workers.client.tune import History, Proposal, TooLittleHistory, propose, read_history
from streamnb_workers.replication.challenger import challenger_config
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelConfig, ModelSpec
from streamnb_workers.wire.codec import DATA_FIELD

__all__ = ["ALPHAS", "MAX_ALPHAS", "AlphaFigures", "best_alpha", "format_alphas",
           "one_minus_roca", "read_replay", "replay_alphas"]

#: The candidates replayed by default (with the alpha in use).
ALPHAS = (0.01, 0.03, 0.1, 0.3, 1.0)
#: At most this many candidates (``--alphas``): each is a replay of the whole index.
MAX_ALPHAS = 10


@dataclass(frozen=True)
class AlphaFigures:
    """One candidate's replay: its alpha, history, (1-ROCA)% and the goal's proposal (None:
    the history cannot support the goal)."""

    alpha: float
    history: History
    roca: float
    proposal: Proposal | None

    @property
    def merit(self) -> float:
        """The goal's figure: spam recall at the target's threshold, or the accuracy at
        the most accurate threshold (-1: no proposal)."""
        if self.proposal is None:
            return -1.0
        f = self.proposal.figures
        return f.recall if self.proposal.goal.startswith("fpr=") else f.accuracy


def one_minus_roca(h: History) -> float:
    """100 x (1 - the area under the ROC curve) of the history's scores, ties counted
    half (the Mann-Whitney statistic)."""
    n_neg, n_pos = h.n_negative, h.n_positive
    if not n_neg or not n_pos:
        return float("nan")
    ranks = rankdata(np.concatenate([h.negative_scores, h.positive_scores]))
    auc = (ranks[n_neg:].sum() - n_pos * (n_pos + 1) / 2) / (n_neg * n_pos)
    return float(100.0 * (1.0 - auc))


def read_replay(index: str | Path) -> list[tuple[IndexEntry, bytes]]:
    """The index's entries, in its order, with their raw mail (paths relative to the
    index's directory, as ``produce --index`` reads them); SettingsError names a file
    that cannot be read."""
    base = Path(index).parent
    out = []
    for entry in read_index(index, "--replay"):
        try:
            out.append((entry, (base / entry.path).read_bytes()))
        except OSError as exc:
            raise SettingsError(f"--replay {str(index)!r}: {entry.path!r} cannot be read: "
                                f"{exc.strerror}") from None
    if not out:
        raise SettingsError(f"--replay {str(index)!r} lists no message")
    return out


def replay_alphas(config: ModelConfig, messages: Sequence[tuple[IndexEntry, bytes]],
                  alphas: Sequence[float], goal: float | None, embedded: str = "auto",
                  timeout: float = 600.0) -> list[AlphaFigures]:
    """Replay ``messages`` (index entries, in order, with their raw mail) through one
    worker once per alpha of ``alphas`` (module docstring); the figures of each."""
    # deferred: the worker, its metrics and the embedded Redis load only for a replay
    from prometheus_client import CollectorRegistry

    from streamnb_workers.observe.metrics import Metrics  # deferred, as above
    from streamnb_workers.store.embedded import start_embedded  # deferred, as above
    from streamnb_workers.worker import Worker, WorkerOptions  # deferred, as above

    if "alpha" not in config.model_params:
        raise SettingsError(f"model {config.name!r} ({config.kind}) has no alpha to tune")
    names = [f"tune-alpha-{i}" for i in range(len(alphas))]
    with start_embedded(embedded) as server:
        client = server.make_client()
        for name, alpha in zip(names, alphas, strict=True):
            cfg = dataclasses.replace(challenger_config(config, f"alpha={alpha!r}"), name=name,
                                      shards=1, training="in")
            client.hset(ModelKeys(name).config, mapping=cfg.to_hash())
            pipe = client.pipeline(transaction=False)
            for entry, raw in messages:
                msg = Outgoing(id=entry.path, raw=raw)
                pipe.xadd(ModelKeys(name).input, {DATA_FIELD: msg.encode(entry.label, entry.ts)})
            pipe.execute()
        worker = Worker(server.connector(), [ModelSpec(name) for name in names],
                        WorkerOptions(consumer="tune", batch=100, block_ms=20),
                        Metrics(CollectorRegistry()))
        with _quiet("streamnb", "streamnb_workers"):  # (its drift alarms are not the model's)
            worker.run_until_idle(timeout=timeout)
        out = []
        for name, alpha in zip(names, alphas, strict=True):
            h = read_history(client, [ModelKeys(name).out], len(messages))
            try:
                proposal: Proposal | None = propose(h, goal)
            except TooLittleHistory:
                proposal = None
            out.append(AlphaFigures(float(alpha), h, one_minus_roca(h), proposal))
    return out


@contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """The loggers ``names`` at ERROR meanwhile."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def best_alpha(figures: Sequence[AlphaFigures], in_use: float | None) -> AlphaFigures | None:
    """The candidate with the best goal figure, then the lowest (1-ROCA)%, then the alpha
    in use; None when no candidate supports the goal."""
    usable = [f for f in figures if f.proposal is not None]
    if not usable:
        return None
    return max(usable, key=lambda f: (round(f.merit, 12), -f.roca, f.alpha == in_use))


def format_alphas(figures: Sequence[AlphaFigures], best: AlphaFigures | None,
                  in_use: float | None, index: str | Path) -> list[str]:
    """The lines ``streamnb tune --replay`` prints."""
    if not figures:
        return []
    h = figures[0].history
    goal = next((f.proposal.goal for f in figures if f.proposal is not None), "")
    lines = [f"alpha replay: {len(figures)} candidates, each through the daemon on "
             f"{h.read} messages of {index} ({h.n_negative} {h.negative}, {h.n_positive} "
             f"{h.positive} judged with a score)",
             f"  {'alpha':>7}  {'(1-ROCA)%':>9}  {'at the goal':>22}  {'accuracy':>8}"]
    for f in figures:
        at_goal, acc = "no proposal", ""
        if f.proposal is not None:
            p = f.proposal.figures
            at_goal = (f"{h.positive} recall {100 * p.recall:.2f}%" if goal.startswith("fpr=")
                       else f"threshold {p.threshold:.4g}")
            acc = f"{100 * p.accuracy:.2f}%"
        mark = " (in use)" if f.alpha == in_use else ""
        lines.append(f"  {f.alpha:>7g}  {f.roca:>9.3f}  {at_goal:>22}  {acc:>8}{mark}")
    if best is None:
        lines.append(f"alpha: no candidate's history supports the goal {goal}")
    elif best.alpha == in_use:
        lines.append(f"alpha: keep {best.alpha:g} (best for the goal {goal})")
    else:
        lines.append(f"alpha: propose {best.alpha:g} for the goal {goal}; to adopt it, run a "
                     f"worker with --challenger alpha={best.alpha:g} and `streamnb promote` "
                     "once its figures hold (docs/worker.md)")
    return lines

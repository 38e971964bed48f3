"""River's ``MultinomialNB`` in this process, test-then-train one message at a time on the
same token lists a ``tokens`` payload carries: the in-process reference of benchmark 3's
"one worker on pre-tokenized mail >= 10x River" (issue 52).

Each message is a ``{token: 1}`` dict, the binary token values the daemon learns by
default and benchmark 1 gives River (benchmarks/model_throughput.py), built before the
clock starts; the run predicts (``predict_one``) then learns
(``learn_one``) each message, and stops after ``cap`` seconds: River's cost a message
grows with the vocabulary it has seen, so a capped run is its rate on the first part of
the stream, the part it is fastest on.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

__all__ = ["river_rate", "token_dicts"]

#: The smoothing of benchmark 1 (benchmarks/model_throughput.py).
ALPHA = 1.0


def token_dicts(tokens: Sequence[Sequence[str]]) -> list[dict[str, int]]:
    """Each message's distinct tokens, each with the value 1.

    >>> token_dicts([["a", "b", "a"], []])
    [{'a': 1, 'b': 1}, {}]
    """
    return [dict.fromkeys(t, 1) for t in tokens]


def river_rate(counts: Sequence[dict[str, int]], labels: Sequence[str], cap: float = 10.0) -> float:
    """Messages/s of River's MultinomialNB, predict then learn each message, for at most
    ``cap`` seconds (nan without River).

    >>> river_rate([{"a": 1}, {"b": 2}] * 20, ["x", "y"] * 20, cap=1.0) > 0
    True
    """
    try:
        from river import naive_bayes
    except ImportError:
        return float("nan")
    model = naive_bayes.MultinomialNB(alpha=ALPHA)
    done = 0
    t0 = time.perf_counter()
    for x, y in zip(counts, labels, strict=True):
        model.predict_one(x)
        model.learn_one(x, y)
        done += 1
        if time.perf_counter() - t0 > cap:
            break
    return done / max(time.perf_counter() - t0, 1e-9)

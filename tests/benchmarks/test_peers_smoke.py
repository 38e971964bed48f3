"""Smoke tests of benchmarks.peers on a few dozen messages: every installed filter replays
them and gets sane figures; a filter that is not installed is skipped, not an error."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from benchmarks._common import (  # noqa: E402
    DEFAULT_CORPUS,
    REDIS_SERVER,
    Corpus,
    corpus_or_synthetic,
)


def small_corpus(n: int) -> Corpus:
    """The first messages of the corpus with both classes in them (synthetic mail without
    the corpus)."""
    corpus = corpus_or_synthetic(DEFAULT_CORPUS, 600, n_synthetic=3 * n)
    ham = [i for i, lab in enumerate(corpus.labels) if lab == "ham"][: n - n // 3]
    spam = [i for i, lab in enumerate(corpus.labels) if lab == "spam"][: n // 3]
    keep = sorted(ham + spam)
    return Corpus([corpus.raws[i] for i in keep], [corpus.labels[i] for i in keep])


def check(replay: peers.Replay, corpus: Corpus) -> None:
    assert len(replay.scores) == len(replay.verdicts) == len(corpus)
    assert all(math.isfinite(s) for s in replay.scores)
    m = replay.measures(corpus.labels)
    assert 0 <= m.roca_pct <= 100 and 0 < m.lam_pct < 100
    assert m.no_verdict <= 2  # only messages judged before both classes were learnt
    assert m.accuracy > 0.5


def test_main_prints_every_installed_filter_and_skips_the_rest(monkeypatch, capsys):
    monkeypatch.setitem(peers.PEERS, "bogofilter",
                        peers.Peer("bogofilter", (None,), peers.replay_bogofilter))
    assert peers.main(["--limit", "30", "--peers", "streamnb,bogofilter"]) == 0
    out = capsys.readouterr().out
    assert "bogofilter: not installed, skipped" in out
    assert "streamnb in-process" in out and "(1-ROCA)%" in out and "lam%" in out
    assert "command (from" in out and "python -m benchmarks.peers --limit 30" in out


def test_unknown_filter_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        peers.main(["--peers", "streamnb,spamfilter9000"])
    assert "unknown filters ['spamfilter9000']" in capsys.readouterr().err


@pytest.mark.skipif(peers.BOGOFILTER is None, reason="bogofilter is not installed")
def test_bogofilter_replay():
    corpus = small_corpus(30)
    check(peers.replay_bogofilter(corpus), corpus)


@pytest.mark.skipif(peers.CRM is None, reason="crm114 is not installed")
def test_crm114_replay():
    corpus = small_corpus(30)
    check(peers.replay_crm114(corpus), corpus)


@pytest.mark.skipif(peers.SPAMD is None or peers.SPAMC is None,
                    reason="spamd and spamc are not installed")
def test_spamassassin_replay():
    corpus = small_corpus(6)
    replay = peers.replay_spamassassin(corpus, children=1)
    assert len(replay.scores) == len(corpus) and None not in replay.verdicts
    assert all(math.isfinite(s) for s in replay.scores)


@pytest.mark.redis
@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_daemon_with_one_worker_scores_as_the_in_process_replay():
    """One worker predicts each message with every earlier one learnt, as the in-process
    replay does: the same verdicts and the same spam log-odds from ``:out``."""
    corpus = small_corpus(30)
    daemon = peers.replay_daemon(corpus, n_workers=1, timeout=120)
    local = peers.replay_streamnb(corpus)
    check(daemon, corpus)
    assert daemon.verdicts == local.verdicts
    assert daemon.scores == pytest.approx(local.scores, rel=1e-9, abs=1e-9)


def test_the_row_gives_the_operating_points_fpr_bound_and_recall():
    """2 of 100 ham flagged, 8 of 10 spam caught: FPR 2.00%, bound 6.16% (the Beta(3, 98)
    quantile at 0.95), recall 80.00%."""
    scores = [0.0] * 110
    verdicts = [i < 2 for i in range(100)] + [i < 8 for i in range(10)]
    labels = ["ham"] * 100 + ["spam"] * 10
    replay = peers.Replay("x", scores, verdicts, 1.0, "")
    cells = peers.row(replay, replay.measures(labels))
    got = dict(zip(peers.HEADERS, cells, strict=True))
    assert got["ham FPR"] == "2.00% (2)" and got["FPR bound 95%"] == "6.16%"
    assert got["spam recall"] == "80.00% (8)"


def test_a_bad_target_fpr_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        peers.main(["--peers", "streamnb", "--target-fpr", "0.01,1.5"])
    assert "each must lie in (0, 1)" in capsys.readouterr().err


@pytest.mark.redis
@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_the_daemon_also_runs_at_each_target_fpr(capsys):
    assert peers.main(["--limit", "30", "--peers", "streamnb-daemon", "--workers", "1",
                       "--target-fpr", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "streamnb daemon, 1 workers, argmax" in out
    assert "streamnb daemon, 1 workers, --target-fpr 0.01" in out
    assert "FPR bound 95%" in out and "spam recall" in out

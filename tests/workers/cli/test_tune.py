"""``streamnb tune`` against a real redis-server and a worker: the worker's labelled history
read from ``:out``, then a labelled history of known scores appended, and the proposal
checked against hand-worked numbers; too little history (exit 1) and bad arguments (exit 2).

The known history (``--last 503``): 400 ham at score -1.0, 2 at 0.3 and 1 at 0.8; 50 spam
at 0.5 and 50 at 2.0. With 403 ham, no false positive bounds the FPR at 0.74% (95%,
Clopper-Pearson: 1 - 0.05 ** (1/403)), one at 1.17%, two at 1.56%:

- ``fpr=0.01``: at most 0 ham flagged, so the threshold is above the highest ham (0.8):
  midway to the next score, 2.0, i.e. 1.4; spam recall 50/100;
- ``fpr=0.015``: at most 1 ham flagged: midway between the second highest ham (0.3) and
  the next score (0.5), 0.4; 1 ham flagged, spam recall 100/100;
- ``accuracy``: the fewest errors (1) at 0.4, whose bound 1.17% rounds up to 0.012, which
  holds at 0.4 again;
- the unsure band of ``fpr=0.01`` (lower edge at FPR 0.1): k_max ~ 30, so the edge is
  midway between -1.0 and 0.3, -0.35; in [-0.35, 1.4): 3 ham and 50 spam.
"""

from __future__ import annotations

import pytest

from streamnb.operating_point import fp_upper_bound
from streamnb_workers.cli.main import main
from streamnb_workers.client.tune import History, propose, read_history
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.outputs import encode_output
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.workers import (
    count_spec,
    fast_options,
    produce,
    run_in_threads,
    token_messages,
    url_worker,
)

pytestmark = pytest.mark.redis

K = ModelKeys("mail")
HAM = [-1.0] * 400 + [0.3] * 2 + [0.8]
SPAM = [0.5] * 50 + [2.0] * 50
N_WORKER = 120


@pytest.fixture(scope="module")
def server():
    """A redis-server where a worker judged N_WORKER token messages of model ``mail``, then
    the known history appended to its ``:out``."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as srv:
        client = srv.client()
        produce(client, "mail", token_messages(N_WORKER, classes=("spam", "ham"), seed=3,
                                               labelled_share=0.9))
        run_in_threads([url_worker(srv.url, [count_spec("mail")], fast_options("w1"))])
        assert client.xlen(K.out) == N_WORKER
        pipe = client.pipeline(transaction=False)
        for i, (label, score) in enumerate([("ham", s) for s in HAM] + [("spam", s) for s in SPAM]):
            lp = {"ham": -1.0, "spam": -1.0 + score}  # (the log-odds; the score field rules)
            pipe.xadd(K.out, {"data": encode_output(f"k{i}", f"{i}-1", "spam" if score >= 0 else "ham",
                                                    lp, "1-0", "test", true_label=label,
                                                    learned=True, score=score)})
        pipe.execute()
        yield srv


def tune(server, capsys, *args: str) -> tuple[int, list[str], str]:
    code = main(["tune", "--redis", server.url, "--model", "mail", *args], env={})
    got = capsys.readouterr()
    return code, got.out.splitlines(), got.err


def test_the_hand_worked_bounds():
    assert fp_upper_bound(0, 403) < 0.01 < fp_upper_bound(1, 403) < 0.012 < 0.015 < fp_upper_bound(2, 403)
    assert fp_upper_bound(30, 403) < 0.1


def test_a_target_fpr_gives_the_lowest_threshold_whose_bound_holds(server, capsys):
    code, lines, _ = tune(server, capsys, "--goal", "fpr=0.01", "--last", "503")
    assert code == 0
    assert lines[0] == "history: 503 entries read, 403 labelled ham, 100 labelled spam (prequential scores)"
    assert lines[2] == "propose: --target-fpr 0.01"
    assert lines[3] == "  threshold on score: 1.4 (spam when score >= it)"
    assert lines[4].startswith("  at the proposal: ham FPR 0.00% (0 of 403; 95% upper bound 0.74%), "
                               "spam recall 50.00% (50 of 100), accuracy 90.06%")
    assert lines[5].startswith("  at the argmax (score >= 0): ham FPR 0.74% (3 of 403;")
    assert "spam recall 100.00% (100 of 100)" in lines[5]
    assert lines[6] == ("propose: unsure band on score [-0.35, 1.4) (its lower edge holds ham FPR "
                        "at 0.1)")
    assert lines[7].startswith("  in the band: 3 ham, 50 spam")
    assert lines[-1].startswith("alpha: keep 0.1; not re-evaluated")

    code, lines, _ = tune(server, capsys, "--goal", "fpr=0.015", "--last", "503")
    assert code == 0 and lines[3] == "  threshold on score: 0.4 (spam when score >= it)"
    assert "ham FPR 0.25% (1 of 403; 95% upper bound 1.17%), spam recall 100.00%" in lines[4]


def test_the_accuracy_goal_proposes_the_bound_at_the_most_accurate_threshold(server, capsys):
    code, lines, _ = tune(server, capsys, "--last", "503")
    assert code == 0
    assert lines[1:4] == ["goal: accuracy; in use: the argmax", "propose: --target-fpr 0.012",
                          "  threshold on score: 0.4 (spam when score >= it)"]
    assert "accuracy 99.80%" in lines[4]  # 502 of 503


def test_too_little_history_says_so_and_exits_1(server, capsys):
    code, lines, err = tune(server, capsys, "--goal", "fpr=0.001", "--last", "503")
    assert code == 1 and lines == []
    assert "403 labelled ham in the history" in err and "needs at least 2995" in err
    code, _, err = tune(server, capsys, "--last", "3")  # three spam, no ham
    assert code == 1 and "0 labelled ham and 3 labelled spam" in err


def test_the_workers_own_history(server, capsys):
    """The worker's predictions, read past the appended ones: the figures are those of
    :func:`propose` on the labelled scores in ``:out``."""
    code, lines, err = tune(server, capsys, "--goal", "fpr=0.05", "--last", str(N_WORKER + 503))
    h = read_history(server.client(), [K.out], N_WORKER + 503)
    assert h.read == N_WORKER + 503 and h.n_negative + h.n_positive > 503
    if code == 0:
        p = propose(h, 0.05)
        assert f"threshold on score: {p.figures.threshold:.4g}" in lines[3]
    else:
        assert code == 1 and "no proposal" in err


@pytest.mark.parametrize("args", [["--goal", "fpr=2"], ["--goal", "precision"], ["--last", "0"],
                                  ["--unsure-fpr", "0.001", "--goal", "fpr=0.01"]])
def test_bad_arguments_are_one_line_and_exit_2(server, capsys, args):
    try:
        code = main(["tune", "--redis", server.url, "--model", "mail", *args], env={})
    except SystemExit as exc:  # argparse's (the parser's checks)
        code = exc.code
    assert code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_history_with_one_class_has_no_proposal():
    with pytest.raises(Exception, match="tune needs both"):
        propose(History.of([-1.0], [], "ham", "spam", 1), 0.01)


def test_a_history_where_flagging_everything_is_best_has_no_band():
    """One ham at 0 amid four spam at -2, -1, 1, 2: flagging all is the one threshold with
    a single error, whose bound (1 of 1) is 1: the target 0.99, and the default band's
    rate (10x, at most 0.5) is not above it."""
    h = History.of([0.0], [-2.0, -1.0, 1.0, 2.0], "ham", "spam", 5)
    p = propose(h, None)
    assert p.target_fpr == 0.99 and p.figures.band_low == p.figures.threshold


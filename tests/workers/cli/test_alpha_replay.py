"""``streamnb tune --replay INDEX`` (workers/cli/alpha_replay.py): each candidate alpha's
history is the one a worker of that configuration leaves in ``:out`` on a real
redis-server, message for message; its (1-ROCA)% is scikit-learn's; bad arguments exit 2."""

from __future__ import annotations

from email.message import EmailMessage

import numpy as np
import pytest

from streamnb_workers.cli.alpha_replay import AlphaFigures, best_alpha, one_minus_roca
from streamnb_workers.cli.main import main
from streamnb_workers.client.tune import Figures, History, Proposal, read_history
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config
from tests.helpers.workers import VOCAB, fast_options, produce, run_in_threads, url_worker

pytestmark = pytest.mark.redis

FCFG = {"bits": 12}
N = 160


def _mail(label: str, rng: np.random.Generator) -> bytes:
    other = "ham" if label == "spam" else "spam"
    words = list(rng.choice(VOCAB[label] + VOCAB["news"], size=int(rng.integers(4, 9))))
    words += list(rng.choice(VOCAB[other], size=int(rng.integers(0, 5))))  # some overlap
    m = EmailMessage()
    m["From"] = f"sender{int(rng.integers(1000))}@example.org"
    m["Subject"] = " ".join(map(str, words[:3]))
    m.set_content(" ".join(map(str, words)) + "\n")
    return m.as_bytes()


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """N labelled mails and their index (path, label, unix_time), in date order."""
    d = tmp_path_factory.mktemp("replay")
    rng = np.random.default_rng(4)
    rows = ["path\tlabel\tunix_time"]
    mails = []
    for i in range(N):
        label = ("spam", "ham")[int(rng.random() < 0.6)]
        raw = _mail(label, rng)
        (d / f"m{i:03d}.eml").write_bytes(raw)
        rows.append(f"m{i:03d}.eml\t{label}\t{1.7e9 + i}")
        mails.append((raw, label, i))
    (d / "index.tsv").write_text("\n".join(rows) + "\n")
    return d / "index.tsv", mails


def _served_alone(redis_server, name: str, alpha: float, mails) -> History:
    """The history a worker of the model's configuration at ``alpha`` leaves in ``:out``."""
    r = redis_server.client()
    produce(r, name, [{"id": f"m{i:03d}.eml", "raw": raw, "label": label, "ts": 1.7e9 + i}
                      for raw, label, i in mails])
    w = url_worker(redis_server.url, [ModelSpec(name, kind="multinomial",
                                                featurizer_config=dict(FCFG),
                                                model_params={"alpha": alpha})],
                   fast_options(f"{name}-w", batch=25))
    run_in_threads([w])
    return read_history(r, [ModelKeys(name).out], N)


def test_each_candidate_is_what_a_worker_of_that_alpha_gives(redis_server, index, capsys):
    from sklearn.metrics import roc_auc_score

    path, mails = index
    r = redis_server.client()
    ensure_config(r, ModelSpec("tuned", kind="multinomial", featurizer_config=dict(FCFG),
                               model_params={"alpha": 0.1}))
    code = main(["tune", "--redis", redis_server.url, "--model", "tuned", "--replay", str(path),
                 "--alphas", "0.01,1", "--embedded", "redis-server"], env={})
    out = capsys.readouterr()
    # no history of its own in :out: no operating point (exit 1), but the replay's lines
    assert code == 1 and "no proposal" in out.err
    rows = {float(line.split()[0]): line.split() for line in out.out.splitlines()
            if line.startswith("  ") and line.split()[0][0].isdigit()}
    assert sorted(rows) == [0.01, 0.1, 1.0]  # the candidates and the alpha in use
    assert "(in use)" in " ".join(rows[0.1])
    for alpha in (0.01, 1.0):
        alone = _served_alone(redis_server, f"alone{alpha:g}", alpha, mails)
        assert alone.n_negative + alone.n_positive > N - 5
        truth = np.r_[np.zeros(alone.n_negative), np.ones(alone.n_positive)]
        scores = np.r_[alone.negative_scores, alone.positive_scores]
        want = 100 * (1 - roc_auc_score(truth, scores))
        assert one_minus_roca(alone) == pytest.approx(want, abs=1e-9)
        assert float(rows[alpha][1]) == pytest.approx(want, abs=5e-4)  # (printed to 3 places)
    assert any(line.startswith("alpha: ") for line in out.out.splitlines())


def test_the_best_candidate_by_goal_then_roca_then_in_use():
    h = History.of([0.0], [1.0], "ham", "spam", 2)

    def fig(alpha, accuracy, roca):
        f = Figures(threshold=0.5, false_positives=0, fpr=0.0, fpr_bound=0.1, caught=1,
                    recall=1.0, accuracy=accuracy)
        return AlphaFigures(alpha, h, roca, Proposal("accuracy", 0.1, 0.5, f, f))

    a, b, c = fig(0.01, 0.9, 2.0), fig(0.1, 0.95, 3.0), fig(1.0, 0.95, 1.0)
    assert best_alpha([a, b, c], in_use=0.1).alpha == 1.0  # same accuracy, lower (1-ROCA)%
    assert best_alpha([a, b], in_use=0.1).alpha == 0.1
    assert best_alpha([], in_use=0.1) is None


@pytest.mark.parametrize("args, says", [
    (["--alphas", "0"], "--alphas"),
    (["--alphas", ",".join(["0.1"] * 11)], "--alphas"),
    (["--alphas", "x"], "--alphas"),
    (["--replay", "/nonexistent/index.tsv"], "--replay"),
])
def test_bad_replay_arguments_are_one_line_and_exit_2(redis_server, capsys, args, says):
    r = redis_server.client()
    ensure_config(r, ModelSpec("badargs", kind="multinomial", featurizer_config=dict(FCFG)))
    if "--replay" not in args:
        args = [*args, "--replay", "/nonexistent/index.tsv"]
    try:
        code = main(["tune", "--redis", redis_server.url, "--model", "badargs", *args], env={})
    except SystemExit as exc:  # (argparse's own: a value of the wrong type)
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()[-1:]
    assert code == 2 and len(err) == 1 and says in err[0], err

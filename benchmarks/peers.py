"""Benchmark 7: streamnb against the spam filters operators run, on one chronological replay.

Every filter starts empty and sees the corpus in ``index.tsv`` order: each message is
judged (a verdict at the filter's own threshold and a spamminess score), then learnt
with its true label (the TREC spam track's immediate-feedback filtering task). Per
filter, at its operating point (its own verdicts): accuracy, ham FPR with its one-sided
95% Clopper-Pearson upper bound, spam recall; then the ranking's (1-ROCA)%, lam% and spam
recall at ham FPR <= 0.1% (definitions in :mod:`benchmarks._trec`), and seconds taken.

The filters, each skipped when its program is not installed:

- ``streamnb-daemon``: the corpus pre-filled as labelled raw mail into a private
  redis-server, ``--workers`` worker processes with the daemon's defaults (a model made
  with only ``kind=multinomial``). Verdict: the ``label`` in ``:out``; score: the spam
  log-odds ``log_proba["spam"] - log_proba["ham"]`` of the same output (0 while the
  model knows fewer than two classes), or the output's ``score`` field where it has one.
  Run at the argmax and again at each ``--target-fpr`` (default 0.01 and 0.001: the
  worker's ``--target-fpr``, its decision's ``target_fpr``).
- ``streamnb``: the same model in this process, one message at a time (featurizer,
  model, decision rule and error weight from the config the daemon would store; the
  worker's predict step), scored by the same ``score``.
- ``bogofilter``: ``bogofilter -C -d DIR -TT`` (compiled-in defaults, no config file):
  the score printed to 16 digits, the verdict from the exit code (0 spam; 1 ham and
  2 unsure are not spam); learnt with ``-s``/``-n``.
- ``crm114``: ``classify <osb unique microgroom> (spam.css | ham.css)`` in a block of its
  own; the score is the first ``pR:`` of the status text (> 0 favours spam, the verdict);
  learnt with ``learn <osb unique microgroom>``.
- ``spamassassin``: ``spamd`` on 127.0.0.1 (network tests off: ``-L``, ``dns_available
  no``, ``skip_rbl_checks 1``; ``use_bayes 1``, ``bayes_auto_learn 0``; children run as
  ``debian-spamd`` when started as root), checked with ``spamc``; the verdict is
  ``X-Spam-Status``, the score the sum of the rule scores in ``_TESTSSCORES_`` (full
  precision, where ``score=`` has one decimal); learnt with ``spamc -L spam|ham``.

Configs, databases and logs live in temporary directories removed afterwards. The whole
SpamAssassin 2002 replay takes 12 to 30 minutes on 2 cores (with the host's load), nearly
all of it SpamAssassin's; bogofilter and CRM114 take a minute or two each, streamnb seconds.

    python -m benchmarks.peers [--limit N] [--peers bogofilter,crm114,spamassassin,
        streamnb-daemon,streamnb] [--workers 2] [--sa-children 2] [--target-fpr 0.01,0.001]
"""

from __future__ import annotations

import argparse
import email
import math
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import (
    DEFAULT_CORPUS,
    Corpus,
    corpus_or_synthetic,
    format_table,
    free_port,
    print_header,
)
from benchmarks._trec import RECALL_AT_HAM_FPR, Measures, measure
from streamnb.operating_point import fp_upper_bound

#: One external program call may take this long before the replay gives up.
CALL_TIMEOUT_S = 120.0
SPAM, HAM = "spam", "ham"


@dataclass
class Replay:
    """What one filter said about every message of a replay, in order."""

    name: str
    scores: list[float]
    verdicts: list[bool | None]
    seconds: float
    how: str

    def measures(self, labels: Sequence[str]) -> Measures:
        return measure(self.scores, self.verdicts, [lab == SPAM for lab in labels])


def judge_then_learn(corpus: Corpus, judge: Callable[[bytes], tuple[float, bool | None]],
                    learn: Callable[[bytes, str], None]) -> tuple[list[float], list[bool | None], float]:
    """Judge each message, then learn it with its label; (scores, verdicts, seconds)."""
    scores: list[float] = []
    verdicts: list[bool | None] = []
    t0 = time.perf_counter()
    for raw, label in zip(corpus.raws, corpus.labels, strict=True):
        score, verdict = judge(raw)
        scores.append(score)
        verdicts.append(verdict)
        learn(raw, label)
    return scores, verdicts, time.perf_counter() - t0


def run(args: Sequence[str], raw: bytes, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), input=raw, capture_output=True, cwd=cwd,
                          timeout=CALL_TIMEOUT_S, check=False)


def _learnt(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {proc.returncode}): "
                           f"{proc.stderr.decode(errors='replace').strip()[:500]}")


# ------------------------------------------------------------------ bogofilter
BOGOFILTER = shutil.which("bogofilter")


def bogofilter_judge(proc: subprocess.CompletedProcess) -> tuple[float, bool | None]:
    """(score, verdict) of ``bogofilter -TT``: exit 0 spam, 1 ham, 2 unsure, 3 error (an
    empty word list: no verdict, a neutral score of 0.5).

    >>> bogofilter_judge(subprocess.CompletedProcess([], 2, b"0.5200000000000000\\n"))
    (0.52, False)
    >>> bogofilter_judge(subprocess.CompletedProcess([], 3, b""))
    (0.5, None)
    """
    if proc.returncode not in (0, 1, 2):
        return 0.5, None
    return float(proc.stdout.split()[0]), proc.returncode == 0


def replay_bogofilter(corpus: Corpus) -> Replay:
    base = [BOGOFILTER or "bogofilter", "-C"]
    with tempfile.TemporaryDirectory(prefix="peers-bogofilter-") as d:
        args = [*base, "-d", d]
        scores, verdicts, seconds = judge_then_learn(
            corpus, lambda raw: bogofilter_judge(run([*args, "-TT"], raw)),
            lambda raw, label: _learnt(run([*args, "-s" if label == SPAM else "-n"], raw),
                                       "bogofilter learn"))
    return Replay("bogofilter", scores, verdicts, seconds,
                  "bogofilter -C -d DIR -TT (score; exit 0 = spam), then -s | -n")


# ---------------------------------------------------------------------- crm114
CRM = shutil.which("crm")
CRM_FLAGS = "<osb unique microgroom>"
CRM_CLASSIFY = ("-{ isolate (:s:) ; { classify " + CRM_FLAGS + " ( spam.css | ham.css ) (:s:) } ;"
                " output /:*:s:/ }")
CRM_LEARN = "-{ learn " + CRM_FLAGS + " ( %s.css ) }"
_PR = re.compile(rb"pR:\s*(-?[0-9.]+(?:[eE][-+]?[0-9]+)?)")


def crm_judge(proc: subprocess.CompletedProcess) -> tuple[float, bool | None]:
    """(score, verdict) from CRM114's classify status text: its first ``pR:`` (the log10
    odds of the first class, spam); no status (no class learnt yet): no verdict, 0.

    >>> crm_judge(subprocess.CompletedProcess([], 0,
    ...     b"CLASSIFY fails; success probability: 0.0000  pR: -304.3516\\n"
    ...     b"Best match to file #1 (ham.css) prob: 1.0000  pR: 304.3516\\n"))
    (-304.3516, False)
    >>> crm_judge(subprocess.CompletedProcess([], 2, b""))
    (0.0, None)
    """
    m = _PR.search(proc.stdout)
    if m is None:
        return 0.0, None
    pr = float(m.group(1))
    return pr, pr > 0


def replay_crm114(corpus: Corpus) -> Replay:
    crm = CRM or "crm"
    with tempfile.TemporaryDirectory(prefix="peers-crm114-") as d:
        cwd = Path(d)
        scores, verdicts, seconds = judge_then_learn(
            corpus, lambda raw: crm_judge(run([crm, CRM_CLASSIFY], raw, cwd)),
            lambda raw, label: _learnt(run([crm, CRM_LEARN % label], raw, cwd),
                                       "crm114 learn"))
    return Replay("crm114", scores, verdicts, seconds,
                  f"crm '{CRM_CLASSIFY}' (first pR:), then crm '{CRM_LEARN % 'spam'}' (or ham.css)")


# ---------------------------------------------------------------- spamassassin
SPAMD = shutil.which("spamd") or next(
    (p for p in ("/usr/sbin/spamd", "/usr/local/sbin/spamd") if os.access(p, os.X_OK)), None)
SPAMC = shutil.which("spamc")
SPAMD_USER = "debian-spamd"
SA_CONFIG = """\
use_bayes 1
bayes_auto_learn 0
skip_rbl_checks 1
dns_available no
bayes_path {bayes}/bayes
lock_method flock
add_header all Scores _TESTSSCORES(,)_
"""


def _spamd_user() -> str | None:
    """The user spamd's children run as: root may not run them, so ``debian-spamd``."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SPAMD_USER)
    except KeyError:
        raise RuntimeError(f"spamd will not run its children as root and user "
                           f"{SPAMD_USER!r} does not exist") from None
    return SPAMD_USER


@contextmanager
def spamd(children: int = 2, timeout: float = 60.0) -> Iterator[list[str]]:
    """A private spamd on 127.0.0.1:<free port> (configs and Bayes database in a temp
    dir); yields the ``spamc`` command that talks to it."""
    root = Path(tempfile.mkdtemp(prefix="peers-spamassassin-"))
    proc = None
    try:
        root.chmod(0o755)  # spamd's children (another user) reach the Bayes dir through it
        site, bayes = root / "site", root / "bayes"
        site.mkdir()
        bayes.mkdir()
        for pre in Path("/etc/spamassassin").glob("*.pre"):  # the plugins to load
            shutil.copy(pre, site)
        (site / "local.cf").write_text(SA_CONFIG.format(bayes=bayes))
        user = _spamd_user()
        if user is not None:
            shutil.chown(bayes, user)
        port = free_port()
        cmd = [SPAMD or "spamd", "-x", "-L", "-i", "127.0.0.1", "-A", "127.0.0.1",
               "-p", str(port), "-m", str(children), "--min-children", str(children),
               "--allow-tell", "--siteconfigpath", str(site), "-r", str(root / "spamd.pid"),
               "-s", str(root / "spamd.log")]
        if user is not None:
            cmd += ["-u", user]
        with open(root / "spamd.out", "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        spamc = [SPAMC or "spamc", "-d", "127.0.0.1", "-p", str(port), "-x"]
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"spamd exited ({proc.returncode}): "
                                   f"{(root / 'spamd.out').read_text(errors='replace')[-500:]}")
            if subprocess.run([*spamc, "-K"], capture_output=True, check=False).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"spamd did not answer on port {port} in {timeout}s")
            time.sleep(0.5)
        yield spamc
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def spamassassin_judge(proc: subprocess.CompletedProcess) -> tuple[float, bool | None]:
    """(score, verdict) of a message checked by ``spamc``: the verdict from
    ``X-Spam-Status``, the score the sum of ``X-Spam-Scores`` (each rule's score), or
    ``score=`` of the status when no rule hit.

    >>> spamassassin_judge(subprocess.CompletedProcess([], 0,
    ...     b"X-Spam-Status: No, score=1.2 required=5.0 tests=A,B\\n"
    ...     b"X-Spam-Scores: A=1.05,\\n\\tB=0.149\\n\\nbody\\n"))
    (1.199, False)
    """
    if proc.returncode != 0:
        return 0.0, None
    msg = email.message_from_bytes(proc.stdout.split(b"\n\n", 1)[0] + b"\n\n")
    status, rules = msg.get("X-Spam-Status"), msg.get("X-Spam-Scores")
    if status is None:
        return 0.0, None
    status = " ".join(status.split())
    verdict = status.startswith("Yes")
    parts = [p.strip() for p in "".join((rules or "").split()).split(",") if "=" in p]
    if parts:
        return round(sum(float(p.split("=", 1)[1]) for p in parts), 6), verdict
    m = re.search(r"score=(-?[0-9.]+)", status)
    return (float(m.group(1)) if m else 0.0), verdict


def replay_spamassassin(corpus: Corpus, children: int = 2) -> Replay:
    with spamd(children) as spamc:
        scores, verdicts, seconds = judge_then_learn(
            corpus, lambda raw: spamassassin_judge(run(spamc, raw)),
            lambda raw, label: _learnt(run([*spamc, "-L", label], raw), "spamc -L"))
    return Replay("spamassassin", scores, verdicts, seconds,
                  f"spamd -x -L -m {children} --allow-tell (rules + Bayes, network tests off); "
                  "spamc (X-Spam-Status, sum of rule scores), then spamc -L spam|ham")


# -------------------------------------------------------------------- streamnb
def spam_log_odds(log_proba: dict[Any, float]) -> float:
    """The spam log-odds of an output's ``log_proba``; 0 without both classes.

    >>> spam_log_odds({"ham": -1.5, "spam": -0.25})
    1.25
    >>> spam_log_odds({"ham": 0.0})
    0.0
    """
    if SPAM in log_proba and HAM in log_proba:
        return float(log_proba[SPAM]) - float(log_proba[HAM])
    return 0.0


def output_score(out: dict[str, Any]) -> float:
    """The score of one ``:out`` output to rank by: its ``score`` field where the daemon
    publishes one, else the spam log-odds of its ``log_proba``.

    >>> output_score({"label": "spam", "log_proba": {"ham": -3.0, "spam": -0.05}})
    2.95
    >>> output_score({"score": 0.25, "log_proba": {"ham": -3.0, "spam": -0.05}})
    0.25
    """
    score = out.get("score")
    if isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score):
        return float(score)
    return spam_log_odds(out.get("log_proba", {}))


def _verdict(label: Any) -> bool | None:
    return None if label is None else label == SPAM


def replay_daemon(corpus: Corpus, n_workers: int = 2, timeout: float = 900.0,
                  target_fpr: float | None = None) -> Replay:
    """The corpus as labelled raw mail through ``n_workers`` workers (daemon defaults; with
    ``target_fpr``, the model's decision holds that target: ``worker --target-fpr``)."""
    from benchmarks._replay import replay_through_daemon

    decision = None if target_fpr is None else {"target_fpr": target_fpr}
    suffix = "" if target_fpr is None else "-fpr" + f"{target_fpr:g}".replace(".", "p")
    run = replay_through_daemon(corpus, n_workers, timeout=timeout, decision=decision,
                                name=f"peers-{n_workers}w{suffix}")
    seconds = run.seconds
    got = run.in_corpus_order(len(corpus))
    point = "argmax" if target_fpr is None else f"--target-fpr {target_fpr:g}"
    return Replay(f"streamnb daemon, {n_workers} workers, {point}", [output_score(o) for o in got],
                  [_verdict(o.get("label")) for o in got], seconds,
                  f"{n_workers} x python -m streamnb_workers.worker --spec "
                  "'{\"kind\": \"multinomial\"}'"
                  + ("" if target_fpr is None else f" with decision target_fpr={target_fpr:g}")
                  + " (label; score, else log_proba spam - ham)")


def replay_streamnb(corpus: Corpus) -> Replay:
    """The daemon's default model in this process, judged then learnt one message at a
    time with the worker's own steps (decision rule, score, error weight)."""
    import numpy as np

    from streamnb_workers.store.model_config import ModelSpec, resolve_spec
    from streamnb_workers.wire.codec import encode_input
    from streamnb_workers.worker.batch import decode_entries, featurize, predict

    cfg = resolve_spec(ModelSpec("peers", kind="multinomial"))
    featurizer, model, rule = cfg.make_featurizer(), cfg.make_model(), cfg.make_decision_rule()
    labels = iter(corpus.labels)
    learnt: list[Any] = []  # the message's item and weight, for learning it after judging

    def judge(raw: bytes) -> tuple[float, bool | None]:
        entry = (b"1-0", {b"data": encode_input("raw", raw, label=next(labels))})
        item = featurize(featurizer, decode_entries([entry], None, max_deliveries=1)).items[0]
        verdict = predict(model, rule, featurizer, [item], error_weight=cfg.error_weight).verdicts[0]
        learnt[:] = [item, verdict.weight]
        score = verdict.score if verdict.score is not None else spam_log_odds(verdict.log_proba)
        return score, _verdict(verdict.label)

    def learn(raw: bytes, label: str) -> None:
        item, weight = learnt
        model.partial_fit(featurizer.stack([item.row]), np.array([label]),
                          sample_weight=np.array([weight]))

    scores, verdicts, seconds = judge_then_learn(corpus, judge, learn)
    params = ", ".join(f"{k}={cfg.model_params[k]}" for k in ("alpha", "smoothing_m")
                       if k in cfg.model_params)
    return Replay("streamnb in-process", scores, verdicts, seconds,
                  f"MultinomialNB({params}) on Featurizer(bits={featurizer.bits}, "
                  f"counts={featurizer.counts!r}), decision {cfg.decision}, error weight "
                  f"{cfg.error_weight:g}; the worker's predict, one message at a time")


# ---------------------------------------------------------------------- runner
@dataclass(frozen=True)
class Peer:
    name: str
    programs: tuple[str | None, ...]
    replay: Callable[..., Replay]

    @property
    def installed(self) -> bool:
        return all(p is not None for p in self.programs)


def _redis() -> str | None:
    from benchmarks._common import REDIS_SERVER

    return REDIS_SERVER


PEERS = {
    "streamnb-daemon": Peer("streamnb-daemon", (_redis(),), replay_daemon),
    "streamnb": Peer("streamnb", (), replay_streamnb),
    "bogofilter": Peer("bogofilter", (BOGOFILTER,), replay_bogofilter),
    "crm114": Peer("crm114", (CRM,), replay_crm114),
    "spamassassin": Peer("spamassassin", (SPAMD, SPAMC), replay_spamassassin),
}


def row(replay: Replay, m: Measures) -> list[Any]:
    """A filter's figures at its operating point (its own verdicts): ham FPR with its
    one-sided 95% Clopper-Pearson upper bound, spam recall (1 - FNR), then the ranking's."""
    bound = fp_upper_bound(m.ham_errors, m.n_ham)
    return [replay.name, m.n, f"{m.accuracy:.2%}", f"{m.ham_fpr:.2%} ({m.ham_errors})",
            f"{bound:.2%}", f"{1 - m.spam_fnr:.2%} ({m.n_spam - m.spam_errors})",
            m.no_verdict, f"{m.roca_pct:.3f}", f"{m.lam_pct:.2f}",
            f"{m.recall_at_fpr:.1%}", f"{replay.seconds:.1f}"]


HEADERS = ["filter", "messages", "accuracy", "ham FPR", "FPR bound 95%", "spam recall",
           "no verdict", "(1-ROCA)%", "lam%", f"recall@FPR<={RECALL_AT_HAM_FPR:.1%}", "seconds"]


def print_replays(replays: Sequence[Replay], labels: Sequence[str]) -> list[Measures]:
    """The table of every replay, each filter's configuration, and how the daemon compares."""
    measures = [r.measures(labels) for r in replays]
    print(format_table(HEADERS, [row(r, m) for r, m in zip(replays, measures, strict=True)]))
    for r in replays:
        print(f"  {r.name}: {r.how}")
    daemon = next((m for r, m in zip(replays, measures, strict=True)
                   if r.name.startswith("streamnb daemon")), None)
    peers = [(r.name, m) for r, m in zip(replays, measures, strict=True)
             if not r.name.startswith("streamnb")]
    if daemon is not None and peers:
        best = min(peers, key=lambda p: p[1].roca_pct)
        below = all(daemon.roca_pct < m.roca_pct for _, m in peers)
        print(f"streamnb daemon (1-ROCA)% {daemon.roca_pct:.3f} "
              f"{'below' if below else 'NOT below'} every peer's "
              f"(best peer: {best[0]}, {best[1].roca_pct:.3f})")
    return measures


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="the first N messages only")
    ap.add_argument("--peers", default=",".join(PEERS),
                    help=f"comma-separated filters to run, of {','.join(PEERS)}")
    ap.add_argument("--workers", type=int, default=2, help="daemon worker processes")
    ap.add_argument("--sa-children", type=int, default=2, help="spamd children")
    ap.add_argument("--target-fpr", default="0.01,0.001", metavar="F[,F...]",
                    help="also run streamnb-daemon at these worker --target-fpr values "
                         "('' for the argmax only)")
    args = ap.parse_args(argv)
    try:
        targets = [float(t) for t in args.target_fpr.split(",") if t.strip()]
    except ValueError:
        ap.error(f"--target-fpr: not numbers: {args.target_fpr!r}")
    if any(not 0.0 < t < 1.0 for t in targets):
        ap.error(f"--target-fpr: each must lie in (0, 1), got {args.target_fpr!r}")
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        ap.error(f"unknown filters {unknown}; expected some of {list(PEERS)}")
    print_header("benchmark 7: streamnb and peer filters, one chronological replay, TREC "
                 "measures", "benchmarks.peers", argv)
    corpus = corpus_or_synthetic(args.corpus, args.limit, n_synthetic=500)
    n_spam = sum(1 for lab in corpus.labels if lab == SPAM)
    print(f"replay: {len(corpus)} messages ({len(corpus) - n_spam} ham, {n_spam} spam), each "
          "judged then learnt, every filter starting empty")
    replays = []
    for name in names:
        peer = PEERS[name]
        if not peer.installed:
            print(f"{name}: not installed, skipped")
            continue
        kwargs: dict[str, Any] = {}
        if name == "streamnb-daemon":
            kwargs["n_workers"] = args.workers
        elif name == "spamassassin":
            kwargs["children"] = args.sa_children
        for target in [None, *targets] if name == "streamnb-daemon" else [None]:
            if target is not None:
                kwargs["target_fpr"] = target
            replay = peer.replay(corpus, **kwargs)
            m = replay.measures(corpus.labels)
            print(f"{replay.name}: {replay.seconds:.1f} s, (1-ROCA)% {m.roca_pct:.3f}, "
                  f"lam% {m.lam_pct:.2f}", flush=True)
            replays.append(replay)
    print()
    print_replays(replays, corpus.labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())

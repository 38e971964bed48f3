"""``streamnb produce`` interrupted and run again, ``streamnb forget``: the statistics are
those of one clean run, against a real redis-server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamnb_workers.client.produce import ProduceInterrupted, produce
from streamnb_workers.store.keys import ModelKeys
from tests.helpers.workers import (
    ROOT,
    assert_same_stats,
    count_spec,
    fast_options,
    learnt_model,
    url_worker,
)

pytestmark = pytest.mark.redis

WORDS = {"spam": ["cheap", "meds", "winner", "prize", "offer", "click"],
         "ham": ["meeting", "notes", "lunch", "project", "agenda", "review"]}


def write_mail(folder: Path, n: int) -> Path:
    """``n`` small mails (every 7th without a Message-ID: keyed by a hash of its bytes)
    and an index.tsv labelling them."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = ["path\tlabel"]
    for i in range(n):
        label = "spam" if i % 3 == 0 else "ham"
        words = " ".join(WORDS[label][(i * k) % 6] for k in (1, 2, 5))
        mid = b"" if i % 7 == 0 else b"Message-ID: <%d.test@example.org>\n" % i
        (folder / f"{i:05d}.eml").write_bytes(
            b"From: a@example.org\n" + mid + b"Subject: n%d\n\n%s %d\n" % (i, words.encode(), i))
        rows.append(f"{i:05d}.eml\t{label}")
    (folder / "index.tsv").write_text("\n".join(rows) + "\n")
    return folder / "index.tsv"


def learn(redis_server, model: str) -> object:
    w = url_worker(redis_server.url, [count_spec(model)], fast_options(f"w-{model}"))
    w.run_until_idle()
    return learnt_model(redis_server.client(), model)[0]


def cli(redis_server, *args, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "streamnb_workers", *args, "--redis",
                             redis_server.url], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


class FailingClient:
    """A client whose ``fail_at``-th pipeline execute raises ``exc`` (before sending)."""

    def __init__(self, client, fail_at: int, exc: BaseException) -> None:
        self.client, self.fail_at, self.exc, self.n = client, fail_at, exc, 0

    def __getattr__(self, name):
        return getattr(self.client, name)

    def pipeline(self, *a, **kw):
        pipe = self.client.pipeline(*a, **kw)
        outer, execute = self, pipe.execute

        def guarded():
            outer.n += 1
            if outer.n == outer.fail_at:
                raise outer.exc
            return execute()

        pipe.execute = guarded
        return pipe


@pytest.mark.parametrize("learn_between", [False, True])
def test_interrupted_produce_run_again_learns_as_one_clean_run(redis_server, tmp_path,
                                                               learn_between):
    index = write_mail(tmp_path / "mail", 120)
    r = redis_server.client()
    assert produce(r, "clean", [], index=str(index), chunk=25, progress=False).sent == 120
    clean = learn(redis_server, "clean")

    with pytest.raises(ProduceInterrupted) as info:
        produce(FailingClient(r, 3, KeyboardInterrupt()), "mail", [], index=str(index), chunk=25,
                progress=False)
    assert (info.value.report.sent, info.value.report.total) == (50, 120)
    if learn_between:
        learn(redis_server, "mail")
    again = produce(r, "mail", [], index=str(index), chunk=25, progress=False)
    assert again.already_learnt == (50 if learn_between else 0)
    assert again.sent + again.already_learnt == 120
    assert_same_stats(learn(redis_server, "mail"), clean)

    third = produce(r, "mail", [], index=str(index), chunk=25, progress=False)
    assert (third.sent, third.already_learnt) == (0, 120)
    assert_same_stats(learn(redis_server, "mail"), clean)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_produce_killed_half_way_then_run_again_learns_as_one_clean_run(redis_server, tmp_path,
                                                                       sig):
    """Ctrl-C: exit 130 and 'sent N of M'; kill -9: nothing said. Either way the next run
    leaves the statistics of one clean run, and a third one sends nothing."""
    index = write_mail(tmp_path / "mail", 3000)
    r = redis_server.client()
    produce(r, "clean", [], index=str(index), chunk=500, progress=False)
    clean = learn(redis_server, "clean")

    proc = cli(redis_server, "produce", "--allow-new", "--model", "mail", "--index", str(index), "--chunk", "1")
    deadline = time.monotonic() + 60
    while r.xlen(ModelKeys("mail").input) < 50 and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    sent = r.xlen(ModelKeys("mail").input)
    assert 50 <= sent < 3000
    if sig == signal.SIGINT:
        assert proc.returncode == 130, (out, err)
        assert f"sent {sent} of 3000 messages" in err or f"sent {sent - 1} of 3000 messages" in err
    else:
        assert proc.returncode == -signal.SIGKILL

    proc = cli(redis_server, "produce", "--allow-new", "--model", "mail", "--index", str(index))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.startswith("sent 3000 of 3000 messages (3000 labelled)")
    assert_same_stats(learn(redis_server, "mail"), clean)

    proc = cli(redis_server, "produce", "--allow-new", "--model", "mail", "--index", str(index))
    out, err = proc.communicate(timeout=120)
    assert out.strip() == ("sent 0 of 3000 messages to streamnb:{mail}:in; 3000 already learnt, "
                           "not sent"), (out, err)


def test_produce_that_loses_redis_says_sent_n_of_m_and_exits_1(redis_server, tmp_path):
    import redis

    index = write_mail(tmp_path / "mail", 60)
    r = redis_server.client()
    with pytest.raises(ProduceInterrupted) as info:
        produce(FailingClient(r, 2, redis.ConnectionError("gone")), "mail", [],
                index=str(index), chunk=25, progress=False)
    assert (info.value.report.sent, info.value.report.total) == (25, 60)
    assert isinstance(info.value.__cause__, redis.ConnectionError)


def test_forget_through_the_cli(redis_server, tmp_path):
    index = write_mail(tmp_path / "mail", 40)
    r = redis_server.client()
    produce(r, "mail", [], index=str(index), progress=False)
    learn(redis_server, "mail")
    # the reference: every mail but two
    gone = [tmp_path / "mail" / "00003.eml", tmp_path / "mail" / "00007.eml"]  # 7: no Message-ID
    kept = tmp_path / "kept"
    kept.mkdir()
    lines = index.read_text().splitlines()
    (kept / "index.tsv").write_text("\n".join(
        [lines[0]] + [ln for ln in lines[1:] if ln.split("\t")[0] not in {g.name for g in gone}]))
    for ln in lines[1:]:
        name = ln.split("\t")[0]
        if name not in {g.name for g in gone}:
            (kept / name).write_bytes((tmp_path / "mail" / name).read_bytes())
    produce(r, "clean", [], index=str(kept / "index.tsv"), progress=False)
    clean = learn(redis_server, "clean")

    proc = cli(redis_server, "forget", "--model", "mail", str(gone[0]), "-",
               stdin=subprocess.PIPE)
    out, err = proc.communicate(gone[1].read_text(), timeout=60)
    assert proc.returncode == 0, err
    assert out.strip().startswith("forgetting 2 of 2 messages")
    assert_same_stats(learn(redis_server, "mail"), clean)

    proc = cli(redis_server, "forget", "--model", "mail", str(gone[0]))  # again: a no-op
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "forgetting 0 of 1 messages" in out
    assert "00003.eml: not learnt" in err
    assert_same_stats(learn(redis_server, "mail"), clean)

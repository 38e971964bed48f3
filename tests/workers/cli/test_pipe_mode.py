"""``streamnb predict -`` and ``streamnb predict DIR|MBOX`` against a real redis-server and
worker processes trained on SpamAssassin mail (the shipped sample): exit codes by verdict,
the headers added, every byte after the header block untouched, 100 mbox messages judged
in one call, and the failures (no worker, Redis down, dead letters)."""

from __future__ import annotations

import json
import mailbox
import os
import subprocess
from pathlib import Path

import msgpack
import pytest

from streamnb_workers.cli.demo import load_sample
from streamnb_workers.cli.launch import blas_env
from streamnb_workers.cli.pipe_message import PipedMessage
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config
from tests.helpers.milter import WORKER_OPTIONS, stop, wait_for
from tests.helpers.redis_server import REDIS_SERVER, RedisServer, free_port
from tests.helpers.workers import PYTHON, ROOT, all_done, spawn_worker

pytestmark = pytest.mark.redis

TRAIN = 400
SPEC = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 18})
#: Everything is unsure: P(spam) is always in [0, 1].
UNSURE_SPEC = ModelSpec("doubt", kind="multinomial", featurizer_config={"bits": 12},
                        decision={"unsure_band": [0.0, 1.0]})


def _train(client, name: str, sample) -> None:
    keys = ModelKeys(name)
    pipe = client.pipeline(transaction=False)
    for i, m in enumerate(sample):
        pipe.xadd(keys.input, {"data": msgpack.packb(
            {"id": f"train-{i}", "raw": m.raw, "label": m.label}, use_bin_type=True)})
    pipe.execute()
    wait_for(lambda: all_done(client, len(sample), keys), 120, f"model {name} to learn")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A redis-server with model "mail" (trained on the sample's first 400 mails) and
    model "doubt" (all unsure), each with a worker; yields (url, held-out sample)."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    sample = load_sample()
    logs = tmp_path_factory.mktemp("pipe")
    with RedisServer() as server:
        client = server.client()
        procs = [spawn_worker(server.url, spec, dict(WORKER_OPTIONS, consumer=f"w-{spec.name}"),
                              logs / f"{spec.name}.log") for spec in (SPEC, UNSURE_SPEC)]
        try:
            for spec, proc in zip((SPEC, UNSURE_SPEC), procs, strict=True):
                wait_for(lambda s=spec, p=proc: client.hlen(ModelKeys(s.name).workers) > 0
                         or p.poll() is not None, 60, "the workers")
                assert proc.poll() is None, (logs / f"{spec.name}.log").read_text()
            ensure_config(client, ModelSpec("idle", kind="multinomial"))  # no worker serves it
            _train(client, "mail", sample[:TRAIN])
            _train(client, "doubt", sample[:40])
            yield server.url, sample[TRAIN:]
        finally:
            for p in procs:
                stop(p)


def streamnb(*args: str, stdin: bytes = b"", timeout: float = 60) -> subprocess.CompletedProcess:
    env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
    return subprocess.run([PYTHON, "-m", "streamnb_workers", *args], input=stdin, cwd=ROOT,
                          env=env, capture_output=True, timeout=timeout)


def header_block(mail: bytes) -> tuple[bytes, bytes]:
    """(header block, the rest) of a mail, split at its first blank line."""
    m = PipedMessage.from_bytes(mail)
    return mail[:m.header_end], mail[m.header_end:]


def added_headers(original: bytes, filtered: bytes) -> dict[str, str]:
    """The header lines ``filtered`` has that ``original`` has not."""
    before = set(header_block(original)[0].splitlines())
    return dict(line.decode().split(": ", 1) for line in header_block(filtered)[0].splitlines()
                if line and line not in before)


EXIT_BY_VERDICT = {"spam": 0, "ham": 1, "unsure": 2}


def test_passthrough_adds_the_headers_keeps_the_body_and_exits_by_verdict(served):
    url, held_out = served
    picked = [m for m in held_out if m.label == "spam"][:6] + [m for m in held_out if m.label == "ham"][:6]
    right = 0
    for m in picked:
        proc = streamnb("predict", "--redis", url, "--model", "mail", "-p", "-", stdin=m.raw)
        assert proc.returncode in (0, 1), proc.stderr
        added = added_headers(m.raw, proc.stdout)
        assert set(added) == {"X-Streamnb-Verdict", "X-Streamnb-Score", "X-Streamnb-Id"}, added
        verdict = added["X-Streamnb-Verdict"]
        assert proc.returncode == EXIT_BY_VERDICT[verdict]
        score = float(added["X-Streamnb-Score"])
        assert (score > 0) == (verdict == "spam")  # the score is ln P(spam) - ln P(ham)
        assert added["X-Streamnb-Id"].startswith("pipe-")
        # the header block gained exactly three lines, in the mail's own line ending
        head_in, body_in = header_block(m.raw)
        head_out, body_out = header_block(proc.stdout)
        assert body_out == body_in
        assert proc.stdout.endswith(body_in)
        assert len(head_out.splitlines()) == len(head_in.splitlines()) + 3
        assert head_out.startswith(head_in.rstrip(b"\r\n"))
        right += verdict == m.label
    assert right >= 10, f"{right} of 12 sample mails judged right"


def test_without_p_prints_the_prediction_and_exits_by_verdict(served):
    url, held_out = served
    spam = next(m for m in held_out if m.label == "spam")
    proc = streamnb("predict", "--redis", url, "--model", "mail", "--json", "-", stdin=spam.raw)
    out = json.loads(proc.stdout)
    assert proc.returncode == EXIT_BY_VERDICT[out["label"]]
    assert out["file"] == "-" and out["id"].startswith("pipe-")
    assert (out["score"] > 0) == (out["label"] == "spam")
    # -e: every verdict exits 0, the output is the same
    proc = streamnb("predict", "--redis", url, "--model", "mail", "-e", "-p", "-", stdin=spam.raw)
    assert proc.returncode == 0, proc.stderr
    assert b"X-Streamnb-Verdict: " in proc.stdout


def test_unsure_exits_2(served):
    url, held_out = served
    proc = streamnb("predict", "--redis", url, "--model", "doubt", "-p", "-", stdin=held_out[0].raw)
    assert proc.returncode == 2, proc.stderr
    assert added_headers(held_out[0].raw, proc.stdout)["X-Streamnb-Verdict"] == "unsure"


def test_forged_headers_are_replaced_and_crlf_kept(served):
    url, _ = served
    mail = (b"From: a@example.org\r\nX-Streamnb-Verdict: ham\r\nSubject: cheap meds\r\n"
            b"x-streamnb-score: -99\r\n\t-99\r\n\r\nbody line\r\nX-Streamnb-Verdict: in the body\r\n")
    proc = streamnb("predict", "--redis", url, "--model", "mail", "-p", "-", stdin=mail)
    assert proc.returncode in (0, 1), proc.stderr
    head, body = header_block(proc.stdout)
    assert body == b"body line\r\nX-Streamnb-Verdict: in the body\r\n"
    lines = head.split(b"\r\n")
    assert lines[:2] == [b"From: a@example.org", b"Subject: cheap meds"]
    assert [ln.split(b":")[0] for ln in lines[2:5]] == [b"X-Streamnb-Verdict", b"X-Streamnb-Score",
                                                         b"X-Streamnb-Id"]
    # the forged score and its folded line are gone (the id is random hex: "pipe-99..."
    # may hold the same bytes, so the lines but the id are looked at)
    assert not any(b"-99" in ln for ln in lines if not ln.startswith(b"X-Streamnb-Id:"))
    assert b"\n" not in head.replace(b"\r\n", b"")


def test_no_worker_means_exit_3_and_the_mail_still_written(served):
    url, held_out = served
    m = held_out[0]
    proc = streamnb("predict", "--redis", url, "--model", "idle", "--timeout", "0.5", "-p", "-",
                    stdin=m.raw)
    assert proc.returncode == 3
    added = added_headers(m.raw, proc.stdout)
    assert added["X-Streamnb-Verdict"] == "not-scored (timeout)"
    assert added["X-Streamnb-Id"].startswith("pipe-")  # sent: a later label can still teach it
    assert proc.stdout.endswith(header_block(m.raw)[1])
    assert proc.stderr.decode().count("\n") == 1 and "not scored: timeout" in proc.stderr.decode()
    # -e does not hide a failure
    proc = streamnb("predict", "--redis", url, "--model", "idle", "--timeout", "0.3", "-e", "-",
                    stdin=m.raw)
    assert proc.returncode == 3 and proc.stdout == b""
    # a model that does not exist: at once, naming the models that do
    proc = streamnb("predict", "--redis", url, "--model", "nobody", "-p", "-", stdin=m.raw)
    assert proc.returncode == 3
    assert added_headers(m.raw, proc.stdout) == {"X-Streamnb-Verdict": "not-scored (error)"}
    err = proc.stderr.decode()
    assert err.count("\n") == 1 and "'nobody' does not exist" in err and "mail" in err


def test_redis_down_means_exit_3_at_once(served):
    _, held_out = served
    m = held_out[1]
    url = f"redis://127.0.0.1:{free_port()}/0"
    proc = streamnb("predict", "--redis", url, "--model", "mail", "-p", "-", stdin=m.raw, timeout=20)
    assert proc.returncode == 3
    added = added_headers(m.raw, proc.stdout)
    assert added == {"X-Streamnb-Verdict": "not-scored (redis-unavailable)"}
    assert proc.stderr.decode().count("\n") == 1, proc.stderr  # one line, no reader retries
    # a bad model name is no verdict either, and the mail passes
    proc = streamnb("predict", "--redis", url, "--model", "a b", "-p", "-", stdin=m.raw)
    assert proc.returncode == 3 and proc.stdout.endswith(header_block(m.raw)[1])
    assert "--model" in proc.stderr.decode()


def test_p_needs_stdin():
    proc = streamnb("predict", "--model", "mail", "-p", str(ROOT / "README.md"))
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1 and "FILE -" in proc.stderr.decode()


def test_an_mbox_of_100_mails_is_judged_in_one_call(served, tmp_path):
    url, held_out = served
    box_path = tmp_path / "box.mbox"
    box = mailbox.mbox(str(box_path))
    picked = held_out[:100]
    for m in picked:
        box.add(mailbox.mboxMessage(m.raw))
    box.flush()
    box.close()
    proc = streamnb("predict", "--redis", url, "--model", "mail", str(box_path))
    assert proc.returncode == 0, proc.stderr
    rows = [line.split("\t") for line in proc.stdout.decode().splitlines()]
    assert [r[0] for r in rows] == [str(i) for i in range(1, 101)]
    assert all(r[1] in ("spam", "ham") for r in rows)
    assert all((float(r[2]) > 0) == (r[1] == "spam") for r in rows)
    right = sum(r[1] == m.label for r, m in zip(rows, picked, strict=True))
    assert right >= 85, f"{right} of 100 mbox mails judged right"
    # the same mail alone through the pipe gets the same verdict
    alone = streamnb("predict", "--redis", url, "--model", "mail", "-", stdin=picked[7].raw)
    assert alone.returncode == EXIT_BY_VERDICT[rows[7][1]]


def test_a_directory_with_dead_letters_and_bad_records(served, tmp_path):
    url, held_out = served
    d = tmp_path / "mails"
    d.mkdir()
    for i, m in enumerate(held_out[:5]):
        (d / f"m{i}.eml").write_bytes(m.raw)
    # a dense vector is refused by a count model's worker: a dead letter; a bad JSON line
    # never leaves this side
    (d / "z.jsonl").write_text('{"x": [1.0, 2.0]}\n{oops\n{"text": "cheap meds online"}\n')
    proc = streamnb("predict", "--redis", url, "--model", "mail", "--timeout", "20", str(d))
    assert proc.returncode == 1, proc.stderr  # some were not scored
    rows = [line.split("\t") for line in proc.stdout.decode().splitlines()]
    assert [r[0] for r in rows] == [f"mails/m{i}.eml" for i in range(5)] + \
        ["mails/z.jsonl:1", "mails/z.jsonl:2", "mails/z.jsonl:3"]
    assert all(r[1] in ("spam", "ham") for r in rows[:5])
    assert rows[5][1:] == ["not-scored (dead-letter: incompatible_payload)", "-"]
    assert rows[6][1].startswith("not-scored (error: not valid JSON")
    assert rows[7][1] in ("spam", "ham")
    # --json: one object per message
    proc = streamnb("predict", "--redis", url, "--model", "mail", "--json", str(d / "m0.eml"))
    assert json.loads(proc.stdout)["label"] in ("spam", "ham")
    proc = streamnb("predict", "--redis", url, "--model", "mail", "--json", str(d))
    objs = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert objs[5]["not_scored"] == "dead-letter: incompatible_payload"
    assert objs[0]["file"] == "mails/m0.eml" and "score" in objs[0]


def test_piped_message_spools_large_mail_and_scores_its_head():
    body = b"".join(b"line %d of a long body\n" % i for i in range(400_000))  # ~9.5 MB
    mail = b"From: a@b\nSubject: big\n\n" + body
    m = PipedMessage.from_bytes(mail, max_size=4096)
    try:
        assert m.spool._rolled  # on disk past the in-memory bound
        assert len(m.scored_bytes()) == 4096
        import io

        out = io.BytesIO()
        m.write_with_headers(out, [("X-Streamnb-Verdict", "ham")])
        assert out.getvalue() == b"From: a@b\nSubject: big\nX-Streamnb-Verdict: ham\n\n" + body
    finally:
        m.close()


def test_tail_reads_what_the_worker_wrote(served):
    url, held_out = served
    import redis

    r = redis.Redis.from_url(url)
    keys = ModelKeys("mail")
    r.xadd(keys.input, {"data": msgpack.packb({"id": "vec-1", "x": [1.0, 2.0]})})
    wait_for(lambda: any(b"vec-1" in f[b"data"] for _i, f in r.xrevrange(keys.dead, count=5)),
             30, "the dead letter")
    proc = streamnb("tail", "--redis", url, "--model", "mail", "--dead", "-n", "1")
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.decode()
    assert "reason=incompatible_payload" in line and "id=vec-1" in line
    proc = streamnb("predict", "--redis", url, "--model", "mail", "-", stdin=held_out[2].raw)
    proc = streamnb("tail", "--redis", url, "--model", "mail", "-n", "1", "--json")
    out = json.loads(proc.stdout)
    assert out["id"].startswith("pipe-") and out["label"] in ("spam", "ham")
    assert out["worker"] == "w-mail"


def _postfix_filter_script(tmp_path, predict: str) -> tuple[Path, Path]:
    """docs/operations.md's Postfix content filter script, run against this test's Redis
    (``predict``: what replaces its streamnb command) and a sendmail that records what it
    is given; returns (the script, the directory the fake sendmail writes to)."""
    import re
    import stat

    doc = (ROOT / "docs" / "operations.md").read_text()
    script = re.search(r"```sh\n(#!/bin/sh\n# /usr/local/bin/streamnb-postfix-filter.*?)```", doc,
                       flags=re.S).group(1)
    spool, out = tmp_path / "spool", tmp_path / "sendmail"
    spool.mkdir()
    out.mkdir()
    sendmail = tmp_path / "fake-sendmail"
    sendmail.write_text(f'#!/bin/sh\necho "$@" > {out}/args\ncat > {out}/mail\n')
    for needle, value in (("/opt/streamnb/bin/streamnb predict --config /etc/streamnb/filter.toml",
                           predict),
                          ("/usr/sbin/sendmail", str(sendmail)),
                          ("/var/spool/streamnb-filter", str(spool))):
        assert needle in script, needle
        script = script.replace(needle, value)
    path = tmp_path / "streamnb-postfix-filter"
    path.write_text(script)
    for p in (path, sendmail):
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return path, out


@pytest.mark.parametrize("case", ["scored", "not-scored", "bad-arguments"])
def test_the_documented_postfix_content_filter_script(served, tmp_path, case):
    url, held_out = served
    m = next(x for x in held_out if x.label == "spam")
    predict = {"scored": f"{PYTHON} -m streamnb_workers predict --redis {url} --model mail",
               "not-scored": f"{PYTHON} -m streamnb_workers predict --redis {url} --model idle "
                             "--timeout 0.3",
               "bad-arguments": f"{PYTHON} -m streamnb_workers predict --redis {url} --timeout x"}
    script, out = _postfix_filter_script(tmp_path, predict[case])
    env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
    proc = subprocess.run([str(script), "-f", "a@example.org", "--", "box@example.net"], input=m.raw,
                          cwd=ROOT, env=env, capture_output=True, timeout=60)
    if case == "bad-arguments":
        assert proc.returncode == 75  # Postfix keeps the mail and retries
        assert not (out / "mail").exists()
        return
    assert proc.returncode == 0, proc.stderr
    assert (out / "args").read_text().split() == ["-G", "-i", "-f", "a@example.org", "--",
                                                   "box@example.net"]
    injected = (out / "mail").read_bytes()
    verdict = added_headers(m.raw, injected)["X-Streamnb-Verdict"]
    assert verdict == ("spam" if case == "scored" else "not-scored (timeout)")
    assert injected.endswith(header_block(m.raw)[1])
    assert list((tmp_path / "spool").iterdir()) == []  # its temporary files removed

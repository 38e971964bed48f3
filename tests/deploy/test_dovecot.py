"""deploy/dovecot/ behind a real Dovecot: mails moved over IMAP (Python's imaplib, MOVE and
COPY + EXPUNGE as clients do) into Junk are piped to ``streamnb produce --label spam -``,
out of Junk to ``--label ham``, and into Trash or between other folders to nothing.

The private Dovecot (tests/helpers/dovecot.py) runs the shipped configuration, Sieve scripts
and pipe script, with a recorder in place of streamnb; the end-to-end tests then run what
was recorded through the shipped pipe script and the real ``streamnb produce -`` into a
model on a real redis-server, and check its statistics. Needs root and Debian's dovecot-imapd
and dovecot-sieve; those tests are skipped otherwise. The checks of the pipe script alone
need only ``sh``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import redis

from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ensure_config
from tests.helpers.dovecot import (
    DEPLOY,
    ENV_FILE_LINE,
    MODEL,
    PIPE_DIR,
    PIPE_SCRIPT,
    SIEVE_DIR,
    STREAMNB_LINE,
    Dovecot,
    rewrite,
    unavailable,
)
from tests.helpers.workers import (
    FCFG,
    PARAMS,
    assert_same_stats,
    count_spec,
    fast_options,
    learnt_model,
    offline_model,
    per_class,
    url_worker,
)

LEARN = DEPLOY / PIPE_SCRIPT


def argv(label: str) -> list[str]:
    return ["produce", "--model", MODEL, "--label", label, "-"]


def mail(n: int) -> bytes:
    """A small mail as a client sends it (CRLF line ends)."""
    return (f"From: sender-{n}@example.org\r\nTo: box@streamnb.test\r\n"
            f"Subject: message {n}\r\nMessage-ID: <{n}@streamnb.test>\r\n\r\n"
            f"Body of message {n}.\r\nA second line.\r\n").encode()


@pytest.fixture(scope="module")
def dovecot():
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    with Dovecot() as server:
        yield server


@pytest.fixture
def imap(dovecot):
    """A logged-in client; the recorder starts empty and streamnb succeeds."""
    dovecot.exit_with(None)
    dovecot.forget_calls()
    client = dovecot.imap()
    try:
        yield client
    finally:
        client.logout()


def quoted(mailbox: str) -> str:
    return f'"{mailbox}"'


def put(client, mailbox: str, raw: bytes) -> bytes:
    """APPEND ``raw`` to ``mailbox``, select it and return the new message's UID."""
    typ, data = client.append(quoted(mailbox), None, None, raw)
    assert typ == "OK", data
    uid = re.search(rb"APPENDUID \d+ (\d+)", data[0]).group(1)
    typ, data = client.select(quoted(mailbox))
    assert typ == "OK", data
    return uid


def move(client, uid: bytes, to: str) -> None:
    typ, data = client.uid("MOVE", uid, quoted(to))
    assert typ == "OK", data


def copy_and_expunge(client, uid: bytes, to: str) -> None:
    """How clients without MOVE move: COPY, flag \\Deleted, EXPUNGE."""
    typ, data = client.uid("COPY", uid, quoted(to))
    assert typ == "OK", data
    typ, data = client.uid("STORE", uid, "+FLAGS.SILENT", r"(\Deleted)")
    assert typ == "OK", data
    typ, data = client.expunge()
    assert typ == "OK", data


def contents(client, mailbox: str) -> list[bytes]:
    client.select(quoted(mailbox), readonly=True)
    typ, data = client.uid("SEARCH", None, "ALL")
    out = []
    for uid in data[0].split():
        typ, fetched = client.uid("FETCH", uid, "(BODY.PEEK[])")
        out.append(fetched[0][1])
    return out


# -- into Junk: spam ---------------------------------------------------------------------

def test_move_into_junk_learns_spam_with_the_exact_mail(dovecot, imap):
    uids = [put(imap, "INBOX", mail(n)) for n in (1, 2, 3)]
    dovecot.forget_calls()  # APPEND to INBOX learns nothing
    move(imap, uids[1], "Junk")
    calls = dovecot.calls()
    assert [c.argv for c in calls] == [argv("spam")], dovecot.log()[-3000:]
    assert calls[0].stdin == mail(2)
    assert calls[0].user == "nobody"  # the mail user, not root
    assert mail(2) in contents(imap, "Junk")


def test_copy_and_expunge_into_junk_learns_spam(dovecot, imap):
    uid = put(imap, "INBOX", mail(10))
    copy_and_expunge(imap, uid, "Junk")
    calls = dovecot.calls()
    assert [(c.argv, c.stdin) for c in calls] == [(argv("spam"), mail(10))]


def test_append_into_junk_learns_spam(dovecot, imap):
    put(imap, "Junk", mail(11))
    assert [(c.argv, c.stdin) for c in dovecot.calls()] == [(argv("spam"), mail(11))]


def test_append_to_other_mailboxes_learns_nothing(dovecot, imap):
    for box in ("INBOX", "Archive", "Trash"):
        put(imap, box, mail(12))
    assert dovecot.calls() == []


# -- out of Junk: ham, unless into Trash -------------------------------------------------

@pytest.mark.parametrize("to", ["INBOX", "Archive"])
def test_move_out_of_junk_learns_ham(dovecot, imap, to):
    uid = put(imap, "Junk", mail(20))
    dovecot.forget_calls()
    move(imap, uid, to)
    assert [(c.argv, c.stdin) for c in dovecot.calls()] == [(argv("ham"), mail(20))]


def test_copy_and_expunge_out_of_junk_learns_ham(dovecot, imap):
    uid = put(imap, "Junk", mail(21))
    dovecot.forget_calls()
    copy_and_expunge(imap, uid, "INBOX")
    assert [(c.argv, c.stdin) for c in dovecot.calls()] == [(argv("ham"), mail(21))]


@pytest.mark.parametrize("trash", ["Trash", "Deleted Items"])
@pytest.mark.parametrize("how", [move, copy_and_expunge])
def test_junk_to_trash_learns_nothing(dovecot, imap, trash, how):
    """By name, or by the \\Trash special-use flag of another name."""
    uid = put(imap, "Junk", mail(30))
    dovecot.forget_calls()
    how(imap, uid, trash)
    assert dovecot.calls() == []
    assert mail(30) in contents(imap, trash)


@pytest.mark.parametrize("to", ["Archive", "Trash"])
def test_moves_that_do_not_touch_junk_learn_nothing(dovecot, imap, to):
    uid = put(imap, "INBOX", mail(40))
    move(imap, uid, to)
    assert dovecot.calls() == []


def test_back_and_forth_is_spam_then_ham(dovecot, imap):
    uid = put(imap, "INBOX", mail(50))
    move(imap, uid, "Junk")
    imap.select("Junk")
    typ, data = imap.uid("SEARCH", None, "HEADER", "Message-ID", "<50@streamnb.test>")
    move(imap, data[0].split()[-1], "INBOX")
    assert [(c.argv, c.stdin) for c in dovecot.calls()] == [(argv("spam"), mail(50)),
                                                            (argv("ham"), mail(50))]


def test_a_failed_learn_is_logged_and_the_move_still_done(dovecot, imap):
    dovecot.exit_with(1)
    uid = put(imap, "INBOX", mail(60))
    move(imap, uid, "Junk")
    assert [c.argv for c in dovecot.calls()] == [argv("spam")]
    assert mail(60) in contents(imap, "Junk")
    log = dovecot.log()
    assert "recorder: failing with exit 1" in log  # the program's stderr reaches the log
    assert "Terminated with non-zero exit code 1" in log
    assert "failed to execute to program `streamnb-learn'" in log


def test_the_shipped_sieve_scripts_ran_precompiled(dovecot, imap):
    """sievec's .svbin files were used as they are: the mail user cannot write there."""
    uid = put(imap, "INBOX", mail(70))
    move(imap, uid, "Junk")
    log = dovecot.log()
    assert "learn-spam.svbin successfully loaded" in log
    assert not re.search(r"(Error|Warning): .*svbin", log), log[-3000:]


# -- the pipe script alone ---------------------------------------------------------------

def test_the_pipe_script_is_valid_sh_with_absolute_paths():
    subprocess.run(["sh", "-n", str(LEARN)], check=True)
    text = LEARN.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert LEARN.stat().st_mode & 0o111, "streamnb-learn must be executable"
    assert STREAMNB_LINE in text.splitlines() and ENV_FILE_LINE in text.splitlines()
    assert 'exec "$STREAMNB" produce --model "$STREAMNB_MODEL" --label "$1" -' in text


def _local_copy(tmp_path: Path, exit_code: int, env: str) -> Path:
    """streamnb-learn with a stand-in streamnb that exits ``exit_code``."""
    fake = tmp_path / "streamnb"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path}/argv\n'
                    f"cat > {tmp_path}/stdin\nexit {exit_code}\n")
    fake.chmod(0o755)
    (tmp_path / "learn.env").write_text(env)
    text = rewrite(LEARN.read_text(), STREAMNB_LINE, f"STREAMNB={fake}", 1)
    text = rewrite(text, ENV_FILE_LINE, f"ENV_FILE={tmp_path}/learn.env", 1)
    script = tmp_path / "streamnb-learn"
    script.write_text(text)
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("code", [0, 1, 2])
def test_the_pipe_script_passes_streamnbs_exit_code_through(tmp_path, code):
    script = _local_copy(tmp_path, code, f"STREAMNB_MODEL={MODEL}\n")
    done = subprocess.run([str(script), "ham"], input=mail(80), env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == code
    assert (tmp_path / "argv").read_text().splitlines() == argv("ham")
    assert (tmp_path / "stdin").read_bytes() == mail(80)


@pytest.mark.parametrize("args", [[], ["Spam"], ["unsure"], ["--label"]])
def test_the_pipe_script_refuses_other_labels(tmp_path, args):
    script = _local_copy(tmp_path, 0, f"STREAMNB_MODEL={MODEL}\n")
    done = subprocess.run([str(script), *args], input=b"", capture_output=True)
    assert done.returncode == 2
    assert b"usage: streamnb-learn spam|ham" in done.stderr
    assert not (tmp_path / "argv").exists()


def test_the_pipe_script_needs_a_model(tmp_path):
    script = _local_copy(tmp_path, 0, "STREAMNB_REDIS_URL=redis://127.0.0.1:6379/0\n")
    done = subprocess.run([str(script), "spam"], input=b"", capture_output=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert b"STREAMNB_MODEL is not set" in done.stderr
    assert not (tmp_path / "argv").exists()


def test_the_readme_installs_every_file_where_the_files_say():
    readme = (DEPLOY / "README.md").read_text()
    shipped = sorted(p.name for p in DEPLOY.iterdir() if p.name != "README.md")
    assert shipped == ["90-streamnb-imapsieve.conf", "learn-ham.sieve", "learn-spam.sieve",
                       "learn.env.example", "streamnb-learn"]
    for name in shipped:
        assert f"`{name}`" in readme, name
    conf = (DEPLOY / "90-streamnb-imapsieve.conf").read_text()
    for path in ["/etc/dovecot/conf.d/90-streamnb-imapsieve.conf", SIEVE_DIR, PIPE_DIR,
                 "/etc/streamnb/learn.env", "sievec /etc/dovecot/sieve/learn-spam.sieve",
                 "sievec /etc/dovecot/sieve/learn-ham.sieve"]:
        assert path in readme, path
    for name in ("learn-spam.sieve", "learn-ham.sieve"):
        assert f"file:{SIEVE_DIR}{name}" in conf
        assert f"# {SIEVE_DIR}{name}:" in (DEPLOY / name).read_text()
    assert f"sieve_pipe_bin_dir = {PIPE_DIR}" in conf
    assert f"# {PIPE_DIR}/{PIPE_SCRIPT} spam|ham:" in LEARN.read_text()


# -- end to end: what the pipe was given, learnt through the shipped streamnb-learn ------
#
# Dovecot runs the pipe as the mail user (nobody), who cannot run this checkout's Python:
# the recorder keeps each call (label, the exact bytes), then the shipped streamnb-learn
# runs them as root, its STREAMNB= line pointed at this venv's streamnb and its ENV_FILE=
# at the test's Redis, and a worker learns what it sent.

STREAMNB_BIN = Path(sys.executable).parent / "streamnb"


def _learner(tmp_path: Path, url: str) -> Path:
    """The shipped streamnb-learn with only its two install paths replaced."""
    (tmp_path / "learn.env").write_text(f"STREAMNB_REDIS_URL={url}\nSTREAMNB_MODEL={MODEL}\n")
    text = rewrite(LEARN.read_text(), STREAMNB_LINE, f"STREAMNB={STREAMNB_BIN}", 1)
    text = rewrite(text, ENV_FILE_LINE, f"ENV_FILE={tmp_path}/learn.env", 1)
    script = tmp_path / "streamnb-learn"
    script.write_text(text)
    script.chmod(0o755)
    return script


def replay(dovecot, tmp_path: Path, url: str) -> list[tuple[str, bytes]]:
    """Run every recorded call through the shipped pipe script, a worker learning after
    each (as a running worker would); returns the (label, mail) pairs replayed."""
    script = _learner(tmp_path, url)
    done_calls = []
    for call in dovecot.calls():
        label = call.argv[call.argv.index("--label") + 1]
        done = subprocess.run([str(script), label], input=call.stdin, capture_output=True,
                              env={"PATH": "/usr/bin:/bin"}, timeout=60)
        assert (done.returncode, done.stdout, done.stderr) == (0, b"", b""), done.stderr
        url_worker(url, [count_spec(MODEL)], fast_options("w-imap")).run_until_idle()
        done_calls.append((label, call.stdin))
    dovecot.forget_calls()
    return done_calls


def model_of(url: str):
    return learnt_model(redis.Redis.from_url(url), MODEL)[0]


def offline(pairs: list[tuple[str, bytes]]):
    return offline_model("multinomial", PARAMS, FCFG,
                         [{"raw": raw, "label": label} for label, raw in pairs])


@pytest.fixture
def served_model(redis_server):
    """Model "mail" (the small count model of the worker tests) on a fresh redis-server."""
    if not STREAMNB_BIN.exists():
        pytest.skip(f"no streamnb console script beside {sys.executable}")
    ensure_config(redis_server.client(), count_spec(MODEL))
    return redis_server.url


def test_moves_over_imap_are_learnt_by_the_model(dovecot, imap, served_model, tmp_path):
    """Into Junk: spam; out of Junk (a mail the server filed there, never learnt): ham;
    Junk -> Trash and moves elsewhere: nothing. The model's statistics are those of an
    offline fit of exactly the mails the user moved, with the labels the moves mean."""
    into_junk, out_of_junk, to_trash, elsewhere = mail(90), mail(91), mail(92), mail(93)
    uids = {n: put(imap, "INBOX", m) for n, m in ((90, into_junk), (93, elsewhere))}
    uids.update({n: put(imap, "Junk", m) for n, m in ((91, out_of_junk), (92, to_trash))})
    dovecot.forget_calls()  # delivered, or filed into Junk at delivery: not a user's verdict
    imap.select("INBOX")
    move(imap, uids[90], "Junk")
    move(imap, uids[93], "Archive")
    imap.select("Junk")
    move(imap, uids[91], "INBOX")
    copy_and_expunge(imap, uids[92], "Trash")
    learnt = replay(dovecot, tmp_path, served_model)
    assert learnt == [("spam", into_junk), ("ham", out_of_junk)]
    assert_same_stats(model_of(served_model), offline(learnt))
    # a copy of the same mail moved into Junk again: already learnt (exit 0), learnt once
    uid = put(imap, "INBOX", into_junk)
    dovecot.forget_calls()
    move(imap, uid, "Junk")
    assert replay(dovecot, tmp_path, served_model) == [("spam", into_junk)]
    assert redis.Redis.from_url(served_model).xlen(ModelKeys(MODEL).input) == 2  # not sent
    assert_same_stats(model_of(served_model), offline(learnt))


def test_a_mail_moved_back_out_of_junk_is_relearnt_as_ham(dovecot, imap, served_model, tmp_path):
    m = mail(95)
    uid = put(imap, "INBOX", m)
    dovecot.forget_calls()
    move(imap, uid, "Junk")
    assert replay(dovecot, tmp_path, served_model) == [("spam", m)]
    assert_same_stats(model_of(served_model), offline([("spam", m)]))
    imap.select("Junk")
    typ, data = imap.uid("SEARCH", None, "HEADER", "Message-ID", "<95@streamnb.test>")
    move(imap, data[0].split()[-1], "INBOX")
    assert replay(dovecot, tmp_path, served_model) == [("ham", m)]
    # the spam class may stay, at weight 0
    got, want = per_class(model_of(served_model)), per_class(offline([("ham", m)]))
    assert set(got) == set(want)
    for part, by_label in got.items():
        np.testing.assert_array_equal(by_label["ham"], want[part]["ham"], err_msg=part)
        assert not np.any(by_label.get("spam", 0)), part

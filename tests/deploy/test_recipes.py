"""docs/operations.md's procmail and maildrop recipes and its Postfix content filter, run as
written by a real procmail, maildrop and Postfix against a real redis-server and worker:
each recipe is copied from the document with only its install paths replaced
(``/opt/streamnb/bin/streamnb`` by this venv's ``streamnb``, the settings file by the
test's), and what is delivered is checked: spam in ``.Junk`` with the verdict the model
gave, ham in the inbox, and with no verdict nothing delivered and exit 75 (the MTA
retries); through Postfix, mail sent over SMTP delivered with its verdict headers. Needs
Debian's ``procmail``, ``maildrop`` and (as root) ``postfix``; each part is skipped
without its program."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from email import message_from_bytes
from pathlib import Path
from typing import Any

import pytest
import redis

from benchmarks.postfix_instance import PostfixInstance
from benchmarks.postfix_instance import unavailable as postfix_unavailable
from streamnb_workers.cli.launch import blas_env
from streamnb_workers.store.model_config import ModelSpec, ensure_config
from tests.helpers.milter import K, mail, start_worker, stop, train, training_mails, wait_for
from tests.helpers.redis_server import REDIS_SERVER, RedisServer, free_port
from tests.helpers.relay import Relay
from tests.helpers.workers import ROOT

pytestmark = pytest.mark.redis

PROCMAIL = shutil.which("procmail") or ("/usr/bin/procmail"
                                        if os.path.exists("/usr/bin/procmail") else None)
#: Where docs/operations.md says streamnb and its filter settings are installed.
INSTALLED = "/opt/streamnb/bin/streamnb"
FILTER_TOML = "/etc/streamnb/filter.toml"
#: The venv's console script: the command an install as documented puts in /opt/streamnb/bin.
STREAMNB = Path(sys.executable).parent / "streamnb"


def doc_block(after: str) -> str:
    """The first fenced block of docs/operations.md after the line ``after``."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    start = doc.index(after + "\n")
    return re.search(r"```[a-z]*\n(.*?)```", doc[start:], flags=re.S).group(1)


def test_every_recipe_names_streamnb_by_its_install_path():
    """No recipe relies on a PATH that delivery agents do not have."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    section = doc[doc.index("## Mail filtering in a pipe"):doc.index("## Runbook")]
    blocks = re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S)
    commands = [line for b in blocks for line in b.splitlines()
                if re.search(r"(^|[\s|\"=])(\S*/)?streamnb (predict|produce)", line)]
    assert len(commands) >= 5, commands  # procmail, maildrop, Sieve, Exim, Postfix
    for line in commands:
        assert f"{INSTALLED} " in line, line


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A redis-server with model "mail" learnt from 60 mails and its worker; yields the URL."""
    if PROCMAIL is None:
        pytest.skip("procmail is not installed (Debian package procmail)")
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    if not STREAMNB.exists():
        pytest.skip(f"no streamnb console script beside {sys.executable}")
    logs = tmp_path_factory.mktemp("recipes")
    with RedisServer() as server:
        client = server.client()
        worker = start_worker(server.url, client, logs / "worker.log")
        try:
            train(client, training_mails(60))
            yield server.url
        finally:
            stop(worker)


def mail_home_and_recipe(tmp_path: Path, heading: str, url: str,
                         timeout: float) -> tuple[Path, str]:
    """A mail user's home (an inbox and a Junk maildir) and the recipe under ``heading`` in
    docs/operations.md with its install path and settings file replaced by the test's."""
    home = tmp_path / "home"
    for box in ("Maildir", "Maildir/.Junk"):  # as a mail user has them
        for sub in ("cur", "new", "tmp"):
            (home / box / sub).mkdir(parents=True)
    settings = tmp_path / "filter.toml"
    settings.write_text(f'[predict]\nredis = "{url}"\nmodel = "mail"\ntimeout = {timeout}\n')
    recipe = doc_block(heading)
    for old, new in ((INSTALLED, str(STREAMNB)), (FILTER_TOML, str(settings))):
        assert recipe.count(old) == 1, old
        recipe = recipe.replace(old, new)
    return home, recipe


def run_procmail(tmp_path: Path, url: str, raw: bytes, timeout: float = 10) -> tuple[int, Path]:
    """Deliver ``raw`` with the documented recipe (install paths replaced) as the private
    rcfile's only rules; returns (procmail's exit code, the home directory)."""
    home, recipe = mail_home_and_recipe(tmp_path, "### procmail", url, timeout)
    rcfile = tmp_path / "procmailrc"
    # What a user's ~/.procmailrc gets from procmail itself (which sets HOME from the
    # user's passwd entry): the home, where the inbox is, a log.
    rcfile.write_text(f"HOME={home}\nDEFAULT=$HOME/Maildir/\nLOGFILE={tmp_path}/procmail.log\n"
                      "VERBOSE=on\n\n" + recipe)
    env = blas_env({"HOME": str(home), "LOGNAME": "root", "USER": "root",
                    "PATH": "/usr/bin:/bin"})  # no venv on the PATH: the recipe finds streamnb
    done = subprocess.run([PROCMAIL, "-p", str(rcfile)], input=raw, env=env, cwd=home,
                          capture_output=True, timeout=120)
    return done.returncode, home


def delivered(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((folder / "new").glob("*"))] if folder.exists() else []


# -- the Postfix content filter, in a real Postfix -------------------------------------
#
# master.cf's two services and the filter script are taken from docs/operations.md; the
# private instance (benchmarks/postfix_instance.py) listens on a free port instead of
# port 25 (the smtpd service's name), and runs the pipe as ``nobody`` (there is no user
# "filter" here) with the script in a temporary directory. The script's ``sendmail`` is
# Postfix's own, re-injecting into the private instance (pipe exports MAIL_CONFIG). Its
# streamnb is tests/helpers/relay.py's stand-in: ``nobody`` cannot run this venv's
# Python, so the relay has the test run the real ``streamnb predict`` with the
# arguments, environment and stdin the script gave it.

FILTER_SCRIPT = "/usr/local/bin/streamnb-postfix-filter"
FILTER_SPOOL = "/var/spool/streamnb-filter"


def postfix_recipe() -> tuple[str, str, str]:
    """docs/operations.md's content filter: (master.cf's smtpd lines, its pipe service,
    the script)."""
    master = doc_block("### Postfix content filter (pipe)")
    smtpd, _, service = master.partition("\nstreamnb ")
    doc = (ROOT / "docs" / "operations.md").read_text()
    script = re.search(r"```sh\n(#!/bin/sh\n# " + re.escape(FILTER_SCRIPT) + r".*?)```", doc,
                       flags=re.S).group(1)
    return smtpd + "\n", "streamnb " + service, script


def replaced(text: str, pairs: tuple[tuple[str, str], ...]) -> str:
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def content_filter(served, tmp_path_factory):
    """A private Postfix running the documented content filter; yields (the instance, the
    settings file the filter reads)."""
    if postfix_unavailable() is not None:
        pytest.skip(postfix_unavailable())
    nobody = pwd.getpwnam("nobody")
    with Relay(STREAMNB, user="nobody") as relay:
        settings = relay.dir / "filter.toml"
        settings.write_text(f'[predict]\nredis = "{served}"\nmodel = "mail"\ntimeout = 10\n')
        settings.chmod(0o644)
        spool = relay.dir / "filter-spool"
        spool.mkdir(mode=0o700)
        os.chown(spool, nobody.pw_uid, nobody.pw_gid)
        smtpd, service, script = postfix_recipe()
        script_path = relay.dir / "streamnb-postfix-filter"
        script_path.write_text(replaced(script, (
            (INSTALLED, str(relay.program)), (FILTER_TOML, str(settings)),
            (FILTER_SPOOL, str(spool)))))
        script_path.chmod(0o755)
        smtpd = replaced(smtpd, (("smtp      inet", "127.0.0.1:{port} inet"),))
        service = replaced(service, (("user=filter", "user=nobody"),
                                     (FILTER_SCRIPT, str(script_path))))
        with PostfixInstance(free_port(), None, smtpd=smtpd, services=service) as postfix:
            yield postfix, settings, relay


def wait_delivered(postfix, n: int, timeout: float = 60) -> list[bytes]:
    wait_for(lambda: len(postfix.delivered()) >= n, timeout,
             f"{n} mails delivered: {postfix.log()[-3000:]}")
    return postfix.delivered()


def test_the_postfix_content_filter_scores_mail_sent_over_smtp(content_filter, served):
    postfix, _settings, relay = content_filter
    before = len(postfix.delivered())
    sent = {label: mail(label, seed=910 + i) for i, label in enumerate(("spam", "ham"))}
    for raw in sent.values():
        postfix.send(raw)
    got = wait_delivered(postfix, before + 2)[before:]
    outs = [f[b"data"] for _, f in redis.Redis.from_url(served).xrange(K.out)]
    for label, raw in sent.items():
        [copy] = [g for g in got if message_from_bytes(g)["From"] ==
                  message_from_bytes(raw)["From"]]
        msg = message_from_bytes(copy)
        assert msg["X-Streamnb-Verdict"] == label, postfix.log()[-3000:]
        assert (float(msg["X-Streamnb-Score"]) > 0) == (label == "spam")
        assert any(msg["X-Streamnb-Id"].encode() in o for o in outs)
        assert raw.split(b"\r\n\r\n", 1)[1].replace(b"\r\n", b"\n") in copy  # body as sent
        assert copy.count(b"\nReceived: ") == 2  # smtpd, then pickup after the re-injection
    assert [run.code for run in relay.runs[-2:]] == [0, 0]
    assert relay.runs[-1].argv == ["predict", "--config", str(_settings), "-p", "-e", "-"]


def test_the_postfix_content_filter_delivers_unscored_mail_marked(content_filter):
    """No worker answers (a model nobody serves, a short timeout): exit 3, the mail is
    delivered with its not-scored header (the recipe's default; tempfail is the option)."""
    postfix, settings, _relay = content_filter
    text = settings.read_text()
    url = re.search(r'redis = "(.*)"', text).group(1)
    ensure_config(redis.Redis.from_url(url), ModelSpec("idle", kind="multinomial"))
    settings.write_text(f'[predict]\nredis = "{url}"\nmodel = "idle"\ntimeout = 0.5\n')
    try:
        before = len(postfix.delivered())
        postfix.send(mail("spam", seed=920))
        [copy] = wait_delivered(postfix, before + 1)[before:]
    finally:
        settings.write_text(text)
    assert message_from_bytes(copy)["X-Streamnb-Verdict"] == "not-scored (timeout)"


# -- maildrop ------------------------------------------------------------------------------

MAILDROP = shutil.which("maildrop") or ("/usr/bin/maildrop"
                                        if os.path.exists("/usr/bin/maildrop") else None)


def run_maildrop(tmp_path: Path, url: str, raw: bytes, timeout: float = 10) -> tuple[int, Path]:
    """Deliver ``raw`` with the documented ~/.mailfilter (install paths replaced) as the
    filter file's only rules; returns (maildrop's exit code, the home directory)."""
    home, recipe = mail_home_and_recipe(tmp_path, "### maildrop", url, timeout)
    rcfile = home / ".mailfilter"
    # what maildrop takes from the user's account (run as root, it sets HOME from root's
    # passwd entry): the home, where the inbox is
    rcfile.write_text(f'HOME="{home}"\nDEFAULT="$HOME/Maildir/"\n'
                      f'logfile "{tmp_path}/maildrop.log"\n\n' + recipe)
    rcfile.chmod(0o600)  # maildrop refuses a filter file others can write
    env = blas_env({"HOME": str(home), "LOGNAME": "root", "USER": "root",
                    "PATH": "/usr/bin:/bin"})  # no venv on the PATH: the recipe finds streamnb
    done = subprocess.run([MAILDROP, str(rcfile)], input=raw, env=env, cwd=home,
                          capture_output=True, timeout=120)
    return done.returncode, home


# -- procmail and maildrop: the same checks --------------------------------------------

#: A delivery agent: its binary (None: not installed), its runner, the seeds of its mail.
AGENTS = {"procmail": (PROCMAIL, run_procmail, 900), "maildrop": (MAILDROP, run_maildrop, 940)}


def agent(name: str) -> tuple[Any, int]:
    """The agent's runner and first seed; skipped when it is not installed."""
    binary, run, seed = AGENTS[name]
    if binary is None:
        pytest.skip(f"{name} is not installed (Debian package {name})")
    return run, seed


@pytest.mark.parametrize("name", sorted(AGENTS))
@pytest.mark.parametrize(("label", "folder"), [("spam", ".Junk"), ("ham", "")])
def test_the_recipe_files_by_the_models_verdict(served, tmp_path, name, label, folder):
    run, seed = agent(name)
    raw = mail(label, seed=seed).replace(b"\r\n", b"\n")  # as an MTA hands it over
    code, home = run(tmp_path, served, raw)
    assert code == 0, [p.read_text() for p in tmp_path.glob("*.log")]
    box = home / "Maildir" / folder if folder else home / "Maildir"
    [got] = delivered(box)
    if folder == "":
        assert delivered(home / "Maildir" / ".Junk") == []
    msg = message_from_bytes(got)
    assert msg["X-Streamnb-Verdict"] == label
    assert (float(msg["X-Streamnb-Score"]) > 0) == (label == "spam")
    # it reached the model: its id is the one a worker answered in :out
    outs = [f[b"data"] for _, f in redis.Redis.from_url(served).xrange(K.out)]
    assert any(msg["X-Streamnb-Id"].encode() in o for o in outs)
    assert raw.split(b"\n\n", 1)[1] in got  # the body as it came (procmail may add a newline)


@pytest.mark.parametrize("name", sorted(AGENTS))
def test_the_recipe_defers_a_mail_without_verdict(tmp_path, name):
    """Redis down: predict exits 3; procmail's ``e`` recipe sets EXITCODE=75, maildrop's
    xfilter fails and it exits 75 (EX_TEMPFAIL): the MTA keeps the mail and retries;
    nothing is delivered."""
    run, seed = agent(name)
    if not STREAMNB.exists():
        pytest.skip(f"no streamnb console script beside {sys.executable}")
    code, home = run(tmp_path, f"redis://127.0.0.1:{free_port()}/0", mail("spam", seed + 1),
                     timeout=2)
    assert code == 75, [p.read_text() for p in tmp_path.glob("*.log")]
    assert delivered(home / "Maildir") == [] and delivered(home / "Maildir" / ".Junk") == []

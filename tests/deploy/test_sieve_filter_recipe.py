"""docs/operations.md's Sieve recipe (Dovecot Pigeonhole's ``filter`` of extprograms), run
as written by a real ``dovecot-lda``: the Dovecot settings, the filter program and the
global Sieve script are taken from the document with only their install paths replaced,
and each mail delivered goes through ``streamnb predict -p -e -`` to a worker on a real
redis-server, then into Junk or the inbox by the verdict it got.

dovecot-lda runs as the mail user (``nobody``) as it does for a real delivery, so the filter
program's streamnb is tests/helpers/relay.py's stand-in, which has the test run the real
one. Needs root, Debian's dovecot-core and dovecot-sieve and redis-server; skipped
otherwise."""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
from email import message_from_bytes
from pathlib import Path

import pytest

from tests.deploy.test_recipes import FILTER_TOML, INSTALLED, replaced
from tests.helpers.milter import K, mail, start_worker, stop, train, training_mails
from tests.helpers.redis_server import REDIS_SERVER, RedisServer
from tests.helpers.relay import Relay

pytestmark = pytest.mark.redis

LDA = Path("/usr/lib/dovecot/dovecot-lda")
SIEVEC = shutil.which("sievec")
EXTPROGRAMS = Path("/usr/lib/dovecot/modules/sieve/lib90_sieve_extprograms_plugin.so")
STREAMNB = Path(sys.executable).parent / "streamnb"
#: Where the recipe installs the filter program and the global script.
FILTER_DIR = "/usr/lib/dovecot/sieve-filter"
GLOBAL_SCRIPT = "/etc/dovecot/sieve/streamnb-filter.sieve"
MAIL_USER, MAIL_GROUP = "nobody", "nogroup"

#: What a Debian dovecot.conf holds that the recipe does not set: where mail is, the Junk
#: folder (Debian's 15-mailboxes.conf), the LDA's log.
BASE_CONF = """\
base_dir = {tmp}/run
log_path = {tmp}/lda.log
info_log_path = {tmp}/lda.log
mail_location = maildir:{tmp}/Maildir
namespace inbox {{
  inbox = yes
  separator = /
  mailbox Junk {{
    special_use = \\Junk
  }}
}}
lda_mailbox_autocreate = yes
!include {tmp}/conf.d/*.conf
"""


def unavailable() -> str | None:
    if not LDA.exists() or SIEVEC is None or not EXTPROGRAMS.exists():
        return "dovecot-lda and the extprograms plugin are not installed (dovecot-sieve)"
    if os.geteuid() != 0:
        return "delivering as the mail user needs root"
    if REDIS_SERVER is None:
        return "redis-server is not installed"
    if not STREAMNB.exists():
        return f"no streamnb console script beside {sys.executable}"
    return None


def recipe() -> tuple[str, str, str]:
    """The recipe's Dovecot settings, filter program and global script."""
    section = "### Sieve (Dovecot Pigeonhole, extprograms)"
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    start = doc.index(section + "\n")
    blocks = re.findall(r"```[a-z]*\n(.*?)```", doc[start:doc.index("### Exim")], flags=re.S)
    assert len(blocks) == 3, blocks
    return tuple(blocks)


@pytest.fixture(scope="module")
def lda(tmp_path_factory):
    """A worker learnt from 60 mails, and a function delivering a mail with dovecot-lda
    through the recipe: returns (exit code, the Maildir)."""
    why = unavailable()
    if why is not None:
        pytest.skip(why)
    logs = tmp_path_factory.mktemp("sieve-filter")
    uid, gid = pwd.getpwnam(MAIL_USER).pw_uid, grp.getgrnam(MAIL_GROUP).gr_gid
    with RedisServer() as server, Relay(STREAMNB, user=MAIL_USER) as relay:
        client = server.client()
        worker = start_worker(server.url, client, logs / "worker.log")
        try:
            train(client, training_mails(60))
            tmp = relay.dir / "dovecot"
            for sub in ("conf.d", "sieve", "sieve-filter", "run"):
                (tmp / sub).mkdir(parents=True)
            (tmp / "Maildir").mkdir()
            (tmp / "lda.log").touch()
            for path in (tmp / "Maildir", tmp / "run", tmp / "lda.log"):
                os.chown(path, uid, gid)  # the LDA runs as the mail user
            os.chmod(tmp, 0o755)
            toml = tmp / "filter.toml"
            toml.write_text(f'[predict]\nredis = "{server.url}"\nmodel = "mail"\ntimeout = 10\n')
            settings, program, script = recipe()
            (tmp / "conf.d" / "90-sieve-extprograms.conf").write_text(replaced(settings, (
                (FILTER_DIR, str(tmp / "sieve-filter")),
                (GLOBAL_SCRIPT, str(tmp / "sieve" / "streamnb-filter.sieve")))))
            filter_program = tmp / "sieve-filter" / "streamnb"
            filter_program.write_text(replaced(program, ((INSTALLED, str(relay.program)),
                                                         (FILTER_TOML, str(toml)))))
            filter_program.chmod(0o755)
            conf = tmp / "dovecot.conf"
            conf.write_text(BASE_CONF.format(tmp=tmp))
            (tmp / "sieve" / "streamnb-filter.sieve").write_text(script)
            # as the recipe says: compiled by root, where the mail user cannot write
            done = subprocess.run([SIEVEC, "-c", str(conf), str(tmp / "sieve" /
                                                              "streamnb-filter.sieve")],
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stdout + done.stderr

            def deliver(raw: bytes) -> tuple[int, Path]:
                env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "USER": MAIL_USER}
                run = subprocess.run(
                    ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                     str(LDA), "-c", str(conf), "-f", "sender@example.org"],
                    input=raw, env=env, capture_output=True, timeout=120)
                log = (tmp / "lda.log").read_text() if (tmp / "lda.log").exists() else ""
                assert run.returncode == 0, run.stderr.decode() + log
                return run.returncode, tmp / "Maildir"

            yield deliver, client
        finally:
            stop(worker)


def delivered(folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted((folder / "new").glob("*"))] if folder.exists() else []


@pytest.mark.parametrize(("label", "folder"), [("spam", ".Junk"), ("ham", "")])
def test_the_sieve_filter_recipe_files_by_the_models_verdict(lda, label, folder):
    deliver, client = lda
    raw = mail(label, seed=930).replace(b"\r\n", b"\n")
    _code, maildir = deliver(raw)
    box = maildir / folder if folder else maildir
    got = [m for m in delivered(box) if message_from_bytes(m)["From"] ==
           message_from_bytes(raw)["From"]]
    assert len(got) == 1, [p for p in maildir.rglob("*")]
    msg = message_from_bytes(got[0])
    assert msg["X-Streamnb-Verdict"] == label
    assert (float(msg["X-Streamnb-Score"]) > 0) == (label == "spam")
    outs = [f[b"data"] for _, f in client.xrange(K.out)]
    assert any(msg["X-Streamnb-Id"].encode() in o for o in outs)
    assert raw.split(b"\n\n", 1)[1] in got[0]

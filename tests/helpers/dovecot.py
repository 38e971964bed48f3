"""A private Dovecot for tests: IMAP on 127.0.0.1:<free port>, everything in a temporary
directory, the IMAPSieve retraining of deploy/dovecot/ as shipped, and a recorder in place of
``streamnb`` that keeps each call of the pipe script (its argv and the mail on its stdin), or
a program of the caller's (tests/helpers/relay.py's, which runs the real ``streamnb``).

Nothing is read from /etc/dovecot. The shipped ``90-streamnb-imapsieve.conf`` is included
with only its two install paths rewritten (the Sieve scripts' directory and
``sieve_pipe_bin_dir``); the shipped Sieve scripts are compiled with ``sievec`` into a
directory the mail user cannot write, as on a server; the shipped ``streamnb-learn`` runs
with only its ``STREAMNB=`` and ``ENV_FILE=`` lines rewritten. Mail is read and written as
``nobody`` (Dovecot refuses mail access as root), the login process runs as ``dovenull``
and the internal services as ``dovecot``: the users Debian's dovecot-core creates.

Needs root and Debian's dovecot-imapd and dovecot-sieve: :func:`unavailable` says why not.
"""

from __future__ import annotations

import grp
import imaplib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "dovecot"
CONF_NAME = "90-streamnb-imapsieve.conf"
SIEVE_SCRIPTS = ("learn-spam.sieve", "learn-ham.sieve")
PIPE_SCRIPT = "streamnb-learn"
#: Where the shipped files say they are installed, and what the private instance puts there.
SIEVE_DIR = "/etc/dovecot/sieve/"
PIPE_DIR = "/usr/lib/dovecot/sieve-pipe"
STREAMNB_LINE = "STREAMNB=/opt/streamnb/bin/streamnb"
ENV_FILE_LINE = "ENV_FILE=/etc/streamnb/learn.env"

DOVECOT = shutil.which("dovecot") or ("/usr/sbin/dovecot" if os.path.exists("/usr/sbin/dovecot") else None)
SIEVEC = shutil.which("sievec")
IMAPSIEVE_PLUGIN = Path("/usr/lib/dovecot/modules/sieve/lib90_sieve_imapsieve_plugin.so")
MAIL_USER, MAIL_GROUP = "nobody", "nogroup"
USER, PASSWORD = "box", "box-password"
#: The model name the test's learn.env gives (the recorder sees it in argv).
MODEL = "mail"

DOVECOT_CONF = """\
# A private Dovecot of the tests (tests/helpers/dovecot.py); nothing from /etc/dovecot.
base_dir = {tmp}/run
state_dir = {tmp}/state
instance_name = streamnb-test-{port}
log_path = {tmp}/dovecot.log
info_log_path = {tmp}/dovecot.log
mail_debug = yes
protocols = imap
listen = 127.0.0.1
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
default_internal_user = dovecot
default_login_user = dovenull

passdb {{
  driver = static
  args = password={password}
}}
userdb {{
  driver = static
  args = uid={mail_user} gid={mail_group} home={tmp}/home/%u
}}
mail_location = maildir:{tmp}/mail/%u

namespace inbox {{
  inbox = yes
  separator = /
  mailbox Junk {{
    auto = create
    special_use = \\Junk
  }}
  mailbox Trash {{
    auto = create
    special_use = \\Trash
  }}
  mailbox "Deleted Items" {{
    auto = create
    special_use = \\Trash
  }}
  mailbox Archive {{
    auto = create
    special_use = \\Archive
  }}
}}

service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}

!include {tmp}/conf.d/{conf_name}
"""

#: Stands in for /opt/streamnb/bin/streamnb: one directory per call under {record}.
RECORDER = """\
#!/bin/sh
# The tests' stand-in for streamnb: keeps argv and stdin, exits with {record}/exit (else 0).
d=$(mktemp -d "{record}/call-$(date +%s%N)-XXXXXX") || exit 75
printf '%s\\n' "$@" > "$d/argv"
cat > "$d/stdin"
id -un > "$d/user"
touch "$d/done"
if [ -r "{record}/exit" ]; then
  echo "recorder: failing with exit $(cat "{record}/exit")" >&2
  exit "$(cat "{record}/exit")"
fi
exit 0
"""


def unavailable() -> str | None:
    """Why no private Dovecot can run here (None: it can)."""
    if DOVECOT is None:
        return "Dovecot is not installed (Debian packages dovecot-imapd, dovecot-sieve)"
    if SIEVEC is None or not IMAPSIEVE_PLUGIN.exists():
        return "the imapsieve plugin is not installed (Debian package dovecot-sieve)"
    if not Path("/usr/lib/dovecot/imap").exists():
        return "the IMAP server is not installed (Debian package dovecot-imapd)"
    if os.geteuid() != 0:
        return "a private Dovecot instance needs root"
    for user in ("dovecot", "dovenull", MAIL_USER):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"there is no {user} user"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rewrite(text: str, old: str, new: str, count: int) -> str:
    """``text`` with ``old`` replaced by ``new``; ``old`` must occur exactly ``count`` times
    (so that a change of the shipped file fails here rather than testing something else)."""
    found = text.count(old)
    if found != count:
        raise AssertionError(f"expected {old!r} {count} time(s) in a shipped file, found {found}")
    return text.replace(old, new)


@dataclass(frozen=True)
class Call:
    """One run of streamnb as the pipe script made it: its arguments, the mail on its
    stdin, the user it ran as."""

    argv: list[str]
    stdin: bytes
    user: str


class Dovecot:
    """A private Dovecot, as a context manager: started on entry, stopped and its
    temporary directory removed on exit."""

    def __init__(self, port: int | None = None, streamnb: Path | None = None,
                 learn_env: str | None = None) -> None:
        """``streamnb``: the program the pipe script runs (None: the recorder);
        ``learn_env``: the settings file it reads (None: a Redis nobody listens on)."""
        self.port = port or free_port()
        self.streamnb = streamnb
        self.learn_env = learn_env
        self.tmp: Path | None = None
        self.proc: subprocess.Popen | None = None

    # -- paths --------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.tmp / "dovecot.conf"

    @property
    def record(self) -> Path:
        return self.tmp / "record"

    def log(self) -> str:
        """Dovecot's log and what the master process printed."""
        parts = [p.read_text(errors="replace") for p in (self.tmp / "dovecot.log",
                                                          self.tmp / "master.out") if p.exists()]
        return "\n".join(parts)

    # -- setup --------------------------------------------------------------------------
    def _write(self) -> None:
        tmp = self.tmp
        uid, gid = pwd.getpwnam(MAIL_USER).pw_uid, grp.getgrnam(MAIL_GROUP).gr_gid
        for name in ("run", "state", "conf.d", "sieve", "sieve-pipe"):
            (tmp / name).mkdir(mode=0o755)
        for name in ("mail", "home", "record"):
            (tmp / name).mkdir(mode=0o755)
            os.chown(tmp / name, uid, gid)

        conf = (DEPLOY / CONF_NAME).read_text()
        conf = rewrite(conf, f"file:{SIEVE_DIR}", f"file:{tmp}/sieve/", 2)
        conf = rewrite(conf, f"sieve_pipe_bin_dir = {PIPE_DIR}",
                       f"sieve_pipe_bin_dir = {tmp}/sieve-pipe", 1)
        (tmp / "conf.d" / CONF_NAME).write_text(conf)
        self.conf.write_text(DOVECOT_CONF.format(
            tmp=tmp, port=self.port, password=PASSWORD, mail_user=MAIL_USER,
            mail_group=MAIL_GROUP, conf_name=CONF_NAME))

        # The Sieve scripts, compiled by root in a directory the mail user cannot write (as
        # installed): Dovecot would otherwise compile them at each run and log an error.
        for name in SIEVE_SCRIPTS:
            shutil.copyfile(DEPLOY / name, tmp / "sieve" / name)
            done = subprocess.run([SIEVEC, "-c", str(self.conf), str(tmp / "sieve" / name)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise AssertionError(f"sievec {name} failed: {done.stdout}{done.stderr}")

        learn = (DEPLOY / PIPE_SCRIPT).read_text()
        learn = rewrite(learn, STREAMNB_LINE, f"STREAMNB={self.streamnb or tmp / 'recorder'}", 1)
        learn = rewrite(learn, ENV_FILE_LINE, f"ENV_FILE={tmp}/learn.env", 1)
        (tmp / "sieve-pipe" / PIPE_SCRIPT).write_text(learn)
        (tmp / "sieve-pipe" / PIPE_SCRIPT).chmod(0o755)
        (tmp / "recorder").write_text(RECORDER.format(record=self.record))
        (tmp / "recorder").chmod(0o755)
        (tmp / "learn.env").write_text(self.learn_env or
                                       f"STREAMNB_REDIS_URL=redis://127.0.0.1:1/0\n"
                                       f"STREAMNB_MODEL={MODEL}\n")
        (tmp / "learn.env").chmod(0o644)

    def start(self) -> Dovecot:
        self.tmp = Path(tempfile.mkdtemp(prefix="streamnb-dovecot-"))
        self.tmp.chmod(0o755)  # the mail user and dovenull must reach their parts
        try:
            self._write()
            check = subprocess.run([DOVECOT, "-c", str(self.conf), "-n"], capture_output=True,
                                   text=True)
            if check.returncode != 0:
                raise AssertionError(f"dovecot refuses the config: {check.stderr}")
            with open(self.tmp / "master.out", "wb") as out:
                self.proc = subprocess.Popen([DOVECOT, "-F", "-c", str(self.conf)],
                                             stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 30
            while not self._listening():
                if self.proc.poll() is not None:
                    raise AssertionError(f"dovecot exited {self.proc.returncode}: {self.log()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"dovecot did not listen: {self.log()}")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                return s.recv(100).startswith(b"* OK")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None

    def __enter__(self) -> Dovecot:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- use ----------------------------------------------------------------------------
    def imap(self) -> imaplib.IMAP4:
        """A client logged in as the test user."""
        client = imaplib.IMAP4("127.0.0.1", self.port, timeout=30)
        client.login(USER, PASSWORD)
        return client

    def maildir(self, mailbox: str = "INBOX") -> Path:
        """The Maildir++ folder of ``mailbox`` of the test user (after a first login)."""
        base = self.tmp / "mail" / USER
        return base if mailbox == "INBOX" else base / f".{mailbox}"

    def deliver(self, raw: bytes, mailbox: str = "INBOX") -> Path:
        """Write ``raw`` into ``mailbox``'s ``new/`` as a delivery agent does (not over
        IMAP: no IMAPSieve script runs), owned by the mail user."""
        uid, gid = pwd.getpwnam(MAIL_USER).pw_uid, grp.getgrnam(MAIL_GROUP).gr_gid
        for sub in ("cur", "new", "tmp"):  # Dovecot makes new/ and tmp/ when it needs them
            if not (self.maildir(mailbox) / sub).is_dir():
                (self.maildir(mailbox) / sub).mkdir(mode=0o700)
                os.chown(self.maildir(mailbox) / sub, uid, gid)
        new = self.maildir(mailbox) / "new"
        fd, tmp_name = tempfile.mkstemp(dir=self.maildir(mailbox) / "tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.chown(tmp_name, uid, gid)
        path = new / f"{time.time_ns()}.{Path(tmp_name).name}.streamnb-test"
        os.rename(tmp_name, path)
        return path

    def calls(self) -> list[Call]:
        """The pipe script's runs of streamnb so far, oldest first."""
        out = []
        for d in sorted(self.record.glob("call-*")):
            if (d / "done").exists():
                out.append(Call((d / "argv").read_text().splitlines(),
                                (d / "stdin").read_bytes(), (d / "user").read_text().strip()))
        return out

    def forget_calls(self) -> None:
        for d in self.record.glob("call-*"):
            shutil.rmtree(d)

    def exit_with(self, code: int | None) -> None:
        """Make the stand-in streamnb exit with ``code`` (None: 0)."""
        path = self.record / "exit"
        if code is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(f"{code}\n")

"""A private Postfix instance for tests and benchmarks: its own config directory, loopback, free ports,
mail for ``box@streamnb.test`` delivered to a Maildir of its own, ``smtpd_milters``
pointing at the milter under test.

Postfix runs an instance from another config directory only if the default
``/etc/postfix/main.cf`` lists it in ``alternate_config_directories``: :func:`allow` adds
:data:`CONFIG_DIR` there once (and never removes it). One instance at a time (a lock
file), as root; with no syslog, the log goes to ``maillog_file`` (under /var, as
``maillog_file_prefixes`` wants)."""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import smtplib
import socket
import subprocess
import time
from pathlib import Path

POSTFIX = shutil.which("postfix") or ("/usr/sbin/postfix" if os.path.exists("/usr/sbin/postfix") else None)
POSTCONF = shutil.which("postconf") or "/usr/sbin/postconf"
DEFAULT_MAIN_CF = Path("/etc/postfix/main.cf")
CONFIG_DIR = Path("/var/tmp/streamnb-postfix-test")
LOCK_FILE = Path("/var/tmp/streamnb-postfix-test.lock")
DOMAIN = "streamnb.test"
MAILBOX = f"box@{DOMAIN}"

#: The smtpd service of the instance (``{port}``: its SMTP port).
SMTPD = "127.0.0.1:{port} inet n - n - - smtpd\n"
#: Postfix's own services, as Debian's master.cf has them (no chroot).
MASTER_CF = """\
pickup    unix  n  -  n  60    1  pickup
cleanup   unix  n  -  n  -     0  cleanup
qmgr      unix  n  -  n  300   1  qmgr
rewrite   unix  -  -  n  -     -  trivial-rewrite
bounce    unix  -  -  n  -     0  bounce
defer     unix  -  -  n  -     0  bounce
trace     unix  -  -  n  -     0  bounce
verify    unix  -  -  n  -     1  verify
flush     unix  n  -  n  1000? 0  flush
proxymap  unix  -  -  n  -     -  proxymap
showq     unix  n  -  n  -     -  showq
error     unix  -  -  n  -     -  error
retry     unix  -  -  n  -     -  error
discard   unix  -  -  n  -     -  discard
virtual   unix  -  n  n  -     -  virtual
smtp      unix  -  -  n  -     -  smtp
relay     unix  -  -  n  -     -  smtp
anvil     unix  -  -  n  -     1  anvil
scache    unix  -  -  n  -     1  scache
postlog   unix-dgram n - n -   1  postlogd
"""


def unavailable() -> str | None:
    """Why no private Postfix can run here (None: it can)."""
    if POSTFIX is None:
        return "Postfix is not installed (Debian package postfix)"
    if os.geteuid() != 0:
        return "a private Postfix instance needs root"
    if not DEFAULT_MAIN_CF.exists():
        return f"{DEFAULT_MAIN_CF} is missing (Postfix not configured)"
    try:
        pwd.getpwnam("postfix")
    except KeyError:
        return "there is no postfix user"
    return None


def _postconf(*args: str) -> str:
    return subprocess.run([POSTCONF, *args], check=True, capture_output=True, text=True).stdout.strip()


def allow(config_dir: Path = CONFIG_DIR) -> None:
    """List ``config_dir`` in the default main.cf's alternate_config_directories (once)."""
    current = _postconf("-c", str(DEFAULT_MAIN_CF.parent), "-h", "alternate_config_directories")
    entries = [e for e in current.replace(",", " ").split() if e]
    if str(config_dir) not in entries:
        _postconf("-c", str(DEFAULT_MAIN_CF.parent), "-e",
                  "alternate_config_directories = " + ", ".join([*entries, str(config_dir)]))


class PostfixInstance:
    """Postfix on 127.0.0.1:``smtp_port``, filtering through the milter at ``milter``
    (a Postfix milter address, ``inet:127.0.0.1:PORT``; None: no milter). ``smtpd``
    replaces the smtpd service's master.cf lines (``{port}``: the SMTP port) and
    ``services`` adds master.cf lines of its own (a content filter's ``pipe``). A context
    manager: started on entry, stopped on exit whatever happened."""

    def __init__(self, smtp_port: int, milter: str | None, config_dir: Path = CONFIG_DIR,
                 milter_default_action: str = "accept", smtpd: str = SMTPD,
                 services: str = "") -> None:
        self.port = smtp_port
        self.milter = milter
        self.dir = config_dir
        self.default_action = milter_default_action
        self.smtpd = smtpd
        self.services = services
        self._lock: int | None = None

    @property
    def maildir(self) -> Path:
        return self.dir / "mail" / "box"

    @property
    def log_file(self) -> Path:
        return self.dir / "maillog"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([POSTFIX, "-c", str(self.dir), *args], capture_output=True,
                              text=True, check=check, timeout=60)

    def _write_config(self) -> None:
        postfix = pwd.getpwnam("postfix")
        for sub in ("queue", "data", "mail"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("data", "mail"):
            os.chown(self.dir / sub, postfix.pw_uid, postfix.pw_gid)
        d = self.dir
        (d / "main.cf").write_text(f"""\
compatibility_level = 3.6
queue_directory = {d}/queue
data_directory = {d}/data
maillog_file = {self.log_file}
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
myhostname = {DOMAIN}
mydomain = {DOMAIN}
mydestination =
relay_domains =
alias_maps =
alias_database =
virtual_mailbox_domains = {DOMAIN}
virtual_mailbox_base = {d}/mail
virtual_mailbox_maps = static:box/
virtual_uid_maps = static:{postfix.pw_uid}
virtual_gid_maps = static:{postfix.pw_gid}
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject
smtp_dns_support_level = disabled
smtpd_milters = {self.milter or ""}
milter_default_action = {self.default_action}
biff = no
""")
        (d / "master.cf").write_text(self.smtpd.format(port=self.port) + MASTER_CF
                                     + self.services)

    def start(self, timeout: float = 30.0) -> PostfixInstance:
        LOCK_FILE.touch()
        self._lock = os.open(LOCK_FILE, os.O_RDWR)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            if (self.dir / "main.cf").exists():  # a run that could not stop it
                self._run("abort", check=False)
            shutil.rmtree(self.dir, ignore_errors=True)
            self._write_config()
            allow(self.dir)
            started = self._run("start", check=False)
            if started.returncode != 0:
                raise RuntimeError(f"postfix start exited {started.returncode}: {started.stderr} "
                                   f"{self.log()}")
            deadline = time.monotonic() + timeout
            while not self._accepting():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"Postfix did not listen on {self.port}: {self.log()}")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def _accepting(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        try:
            if (self.dir / "main.cf").exists():
                if self._run("stop", check=False).returncode != 0:
                    self._run("abort", check=False)
        finally:
            if self._lock is not None:
                os.close(self._lock)  # releases the lock
                self._lock = None

    def __enter__(self) -> PostfixInstance:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ mail
    def send(self, raw: bytes, sender: str = "sender@example.org") -> float:
        """Send ``raw`` to the mailbox over a new SMTP connection; the seconds it took (an
        SMTP error raised as smtplib raises it)."""
        start = time.monotonic()
        with self.connect() as smtp:
            smtp.sendmail(sender, [MAILBOX], raw)
        return time.monotonic() - start

    def connect(self) -> smtplib.SMTP:
        """An SMTP connection to the instance (for several mails)."""
        return smtplib.SMTP("127.0.0.1", self.port, timeout=60)

    def delivered(self) -> list[bytes]:
        """The messages in the mailbox, oldest first."""
        new = self.maildir / "new"
        if not new.is_dir():
            return []
        return [p.read_bytes() for p in sorted(new.iterdir(), key=lambda p: p.stat().st_mtime_ns)]

    def held(self) -> int:
        """Messages in the hold queue (quarantined by a milter)."""
        hold = self.dir / "queue" / "hold"
        return sum(1 for _ in hold.iterdir()) if hold.is_dir() else 0

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

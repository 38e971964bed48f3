"""A stand-in for ``/opt/streamnb/bin/streamnb`` that an unprivileged user can run, and
that runs the real ``streamnb`` of this venv, as the test's user, with the same arguments,
environment and stdin, handing back its stdout, stderr and exit code.

Delivery agents run the documented recipes as an unprivileged user (Postfix's ``pipe`` as
``user=``, Dovecot's Sieve ``pipe`` as the mail user), who cannot run this checkout's
Python where it lives under root's home. The stand-in is a ``sh`` script: it writes one
request directory (argv, environment, stdin) into a spool, and waits for the test's
:class:`Relay` thread to run the real command and write the answer. The recipe around it
runs as written; only the program at the install path is this relay."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from streamnb_workers.cli.launch import blas_env

SHIM = """\
#!/bin/sh
# Stand-in for streamnb (tests/helpers/relay.py): the test runs the real one.
d=$(mktemp -d "{spool}/req-XXXXXX") || exit 75
for a in "$@"; do printf '%s\\0' "$a"; done > "$d/argv"
env -0 > "$d/env"
cat > "$d/stdin"
touch "$d/ready"
n=0
while [ ! -e "$d/done" ]; do
  n=$((n + 1))
  [ $n -gt 3000 ] && {{ echo "relay: no answer" >&2; exit 75; }}
  sleep 0.02
done
cat "$d/stdout"
cat "$d/stderr" >&2
code=$(cat "$d/code")
rm -rf "$d"
exit "$code"
"""


@dataclass(frozen=True)
class Run:
    """One run of the real command: its arguments, the bytes on its stdin, its exit code,
    what it wrote on stderr."""

    argv: list[str]
    stdin: bytes
    code: int
    stderr: bytes


class Relay:
    """The stand-in at ``self.program`` (usable by ``user``) and the thread that answers
    it by running ``target``. A context manager; :attr:`runs` lists the runs, oldest first."""

    def __init__(self, target: str | Path, user: str = "nobody") -> None:
        self.target = str(target)
        self.user = pwd.getpwnam(user)
        self.dir = Path(tempfile.mkdtemp(prefix="streamnb-relay-"))
        self.dir.chmod(0o755)
        self.spool = self.dir / "spool"
        self.program = self.dir / "streamnb"
        self.runs: list[Run] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> Relay:
        self.spool.mkdir(mode=0o700)
        os.chown(self.spool, self.user.pw_uid, self.user.pw_gid)
        self.program.write_text(SHIM.format(spool=self.spool))
        self.program.chmod(0o755)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _serve(self) -> None:
        while not self._stop.is_set():
            for ready in sorted(self.spool.glob("req-*/ready")):
                self._answer(ready.parent)
            self._stop.wait(0.01)

    def _answer(self, d: Path) -> None:
        argv = (d / "argv").read_bytes().split(b"\0")[:-1]
        env = dict(item.split("=", 1) for item in
                   (d / "env").read_text(errors="replace").split("\0") if "=" in item)
        args = [a.decode() for a in argv]
        stdin = (d / "stdin").read_bytes()
        try:
            done = subprocess.run([self.target, *args], input=stdin, capture_output=True,
                                  env=blas_env(env), timeout=120)
            code, stdout, stderr = done.returncode, done.stdout, done.stderr
        except (OSError, subprocess.SubprocessError) as exc:  # answered, not left waiting
            code, stdout, stderr = 75, b"", f"relay: {exc}\n".encode()
        self.runs.append(Run(args, stdin, code, stderr))
        for name, data in (("stdout", stdout), ("stderr", stderr),
                           ("code", f"{code}\n".encode())):
            (d / name).write_bytes(data)
        (d / "ready").unlink()
        (d / "done").touch()

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Until no request is waiting for an answer."""
        deadline = time.monotonic() + timeout
        while any(self.spool.glob("req-*/ready")):
            if time.monotonic() > deadline:
                raise AssertionError("the relay did not answer")
            time.sleep(0.02)

"""``streamnb tail --follow`` run in its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from streamnb_workers.cli.launch import blas_env
from tests.helpers.workers import PYTHON, ROOT


@contextmanager
def follow_tail(url: str, model: str, n: int) -> Iterator[list[str]]:
    """``streamnb tail --follow -n N`` in its own process: the lines it prints so far (a
    thread reads them); on leaving, Ctrl-C, which must end it with 0 and nothing on stderr
    (killed if the block failed first)."""
    env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
    proc = subprocess.Popen([PYTHON, "-m", "streamnb_workers", "tail", "--redis", url,
                             "--model", model, "--follow", "-n", str(n)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        yield lines
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0
        assert proc.stderr.read() == ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

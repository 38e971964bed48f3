"""The worker's Prometheus endpoint listens on 127.0.0.1 unless told otherwise.

A real ``streamnb worker`` process is started and the kernel's table of listening sockets
(/proc/net/tcp and tcp6) is read for its metrics port: loopback only by default, every
address with ``--metrics-addr 0.0.0.0`` (what the container image sets).
"""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest

from streamnb_workers.cli.main import build_parser
from streamnb_workers.cli.settings import resolve
from streamnb_workers.defaults import DEFAULT_METRICS_ADDR
from tests.helpers.acl import cli_env, start_worker_cli, stop
from tests.helpers.redis_server import free_port

pytestmark = pytest.mark.redis

PROC_TCP = Path("/proc/net/tcp")
LISTEN = "0A"


def listeners(port: int) -> set[str]:
    """Addresses (IPv4 dotted, IPv6 hex) with a listening TCP socket on ``port``."""
    found: set[str] = set()
    for table in (PROC_TCP, PROC_TCP.with_name("tcp6")):
        if not table.exists():
            continue
        for line in table.read_text().splitlines()[1:]:
            fields = line.split()
            addr, port_hex = fields[1].rsplit(":", 1)
            if int(port_hex, 16) != port or fields[3] != LISTEN:
                continue
            if len(addr) == 8:  # IPv4, little-endian hex
                found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
            else:
                found.add(addr)
    return found


def wait_listening(port: int, proc, log: Path, timeout: float = 60) -> set[str]:
    deadline = time.monotonic() + timeout
    while not (found := listeners(port)):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, f"nothing listens on {port}: {log.read_text()}"
        time.sleep(0.1)
    return found


def test_the_default_metrics_address_is_loopback():
    assert DEFAULT_METRICS_ADDR == "127.0.0.1"
    parser = build_parser()
    args = parser.parse_args(["worker", "--model", "m"])
    sub = next(a for a in parser._actions if a.dest == "command").choices["worker"]
    assert resolve(sub, args, "worker", env={}).metrics_addr == "127.0.0.1"


@pytest.mark.skipif(not PROC_TCP.exists(), reason="needs Linux /proc/net/tcp")
@pytest.mark.parametrize(("flags", "expected"), [([], {"127.0.0.1"}), (["--metrics-addr", "0.0.0.0"],
                                                                        {"0.0.0.0"})])
def test_the_worker_metrics_socket_address(redis_server, tmp_path, flags, expected):
    port = free_port()
    log = tmp_path / "worker.log"
    # start_worker_cli passes --metrics-port 0 first; the last value of a flag wins
    proc = start_worker_cli(redis_server.url, "bind", "bind-1", log, "--metrics-port", str(port),
                            *flags, env=cli_env())
    try:
        assert wait_listening(port, proc, log) == expected
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b"streamnb_" in body
    finally:
        stop([proc])

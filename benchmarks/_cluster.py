"""A private 3-master Redis Cluster of real redis-server processes (free ports, no
persistence, no ACL), for the benchmarks; tests/workers/store/test_cluster.py starts one with the
shipped ACL for the tests.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._common import REDIS_SERVER, free_port, redis_cpu_s

REDIS_CLI = shutil.which("redis-cli")


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too."""
    import socket

    while True:
        p = free_port()
        if p + 10000 > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 10000))
            return p
        except OSError:
            continue


class RedisCluster3:
    """Three masters joined by ``redis-cli --cluster create``, as a context manager."""

    def __init__(self, masters: int = 3) -> None:
        if REDIS_SERVER is None or REDIS_CLI is None:
            raise RuntimeError("redis-server and redis-cli are needed for a cluster")
        self.dir = Path(tempfile.mkdtemp(prefix="streamnb-bench-cluster-"))
        self.ports: list[int] = []
        while len(self.ports) < masters:
            p = _cluster_port()
            if p not in self.ports:
                self.ports.append(p)
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def node(self, port: int) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=30)

    def client(self) -> Any:
        from redis.cluster import RedisCluster

        return RedisCluster(host="127.0.0.1", port=self.ports[0], socket_timeout=30)

    def cpu_s(self) -> float:
        """CPU seconds of every node so far (``INFO cpu``)."""
        return sum(self.node_cpu_s())

    def node_cpu_s(self) -> list[float]:
        """CPU seconds of each node so far (``INFO cpu``), in port order."""
        return [redis_cpu_s(self.node(p)) for p in self.ports]

    def flush(self) -> None:
        for p in self.ports:
            self.node(p).flushall()

    def __enter__(self) -> RedisCluster3:
        for p in self.ports:
            self.procs.append(subprocess.Popen(
                [REDIS_SERVER, "--port", str(p), "--bind", "127.0.0.1", "--dir", str(self.dir),
                 "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{p}.conf",
                 "--save", "", "--appendonly", "no", "--loglevel", "warning"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            deadline = time.monotonic() + 10
            while not self._all_answer():
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster's nodes did not answer")
                time.sleep(0.05)
            proc = subprocess.run([REDIS_CLI, "--cluster", "create",
                                   *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-yes"],
                                  capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {proc.stdout}{proc.stderr}")
            deadline = time.monotonic() + 30
            while not all(self.node(p).cluster("info")["cluster_state"] == "ok"
                          for p in self.ports):
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster did not reach cluster_state:ok")
                time.sleep(0.1)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _all_answer(self) -> bool:
        import redis

        try:
            return all(self.node(p).ping() for p in self.ports)
        except redis.ConnectionError:
            return False

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs = []
        shutil.rmtree(self.dir, ignore_errors=True)

"""``streamnb worker``: one worker in this process, or N supervised worker processes.

With ``--processes 1`` the worker runs here (:func:`run_single`). With ``--processes N``
(:class:`Supervisor`) this process starts N children running the same command with
``--processes 1``, ``--consumer <base>-<i>`` and ``--metrics-port <port>+i``, and:

- restarts a child that dies, after a capped exponential backoff with jitter (reset
  once a child has lived ``STABLE_S`` seconds); the restarted child keeps its consumer name,
  so it re-reads its own pending entries at once;
- does not restart a child that exits with code 2 (bad configuration, refused
  credentials): that would fail again; it stops the others and exits 2;
- forwards the first SIGTERM/SIGINT to every child (warm shutdown: each finishes its batch,
  commits, exits 0) and a second one too (cold: the children exit at once; nothing
  committed is lost and uncommitted messages stay pending for the next worker);
- on Linux, children get SIGTERM if the supervisor itself dies (PR_SET_PDEATHSIG).

>>> child_command(["worker", "--model", "m", "--processes", "3"], 1, "host-1", 9500)[-6:]
['--processes', '1', '--consumer', 'host-1-1', '--metrics-port', '9501']
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis

from streamnb.exceptions import SettingsError
from streamnb_workers.exit_codes import EXIT_FAILURE, EXIT_USAGE
from streamnb_workers.store.backoff import Backoff
from streamnb_workers.store.connection import UrlConnector

log = logging.getLogger("streamnb.supervisor")

__all__ = ["Supervisor", "child_command", "run_single", "run_worker_command", "serve_metrics"]

#: A child that lived this long resets its restart backoff.
STABLE_S = 30.0
#: Seconds between checks of the children.
POLL_S = 0.2


# ------------------------------------------------------------------------ one worker
def serve_metrics(port: int, addr: str, registry: Any = None, health: Any = None) -> Any:
    """Serve Prometheus metrics on ``addr:port`` (0: no server), and ``/healthz`` from
    ``health`` (a :class:`streamnb_workers.observe.health.RedisHealth`; None: always 200). A busy
    port is a SettingsError (one line, exit 2)."""
    if not port:
        return None
    # deferred: prometheus_client loads only when metrics are served
    from streamnb_workers.observe.health import serve_metrics_and_health

    try:
        return serve_metrics_and_health(port, addr, registry, health)
    except OSError as exc:
        raise SettingsError(f"--metrics-port {port} on {addr} cannot be served: {exc.strerror}") from None


def worker_options(args: argparse.Namespace) -> Any:
    """The :class:`~streamnb_workers.worker.WorkerOptions` of ``streamnb worker``'s flags."""
    from streamnb_workers.wire.codec import DEFAULT_LIMITS  # deferred: with the worker
    from streamnb_workers.worker import WorkerOptions  # deferred: the worker loads only to run

    limits = replace(DEFAULT_LIMITS, max_weight=args.max_weight, max_value=args.max_value)
    return WorkerOptions(limits=limits, consumer=args.consumer, batch=args.batch, block_ms=args.block_ms,
                         claim_idle_ms=args.claim_idle_ms, cache_ttl_s=args.label_cache_ttl,
                         prequential=args.prequential, order_wait_ms=args.order_wait_ms,
                         send_ahead=args.pipeline, cache_labelled=args.cache_labelled,
                         input_trim_s=args.input_trim_s, out_maxlen=args.out_maxlen,
                         dead_maxlen=args.dead_maxlen, max_bytes=args.max_bytes,
                         explain=args.explain, token_names=args.token_names,
                         token_names_every=args.token_names_every,
                         challenger=args.challenger,
                         healthz_grace_s=args.healthz_grace,
                         learnt_keys_max=args.learnt_keys_max, max_sources=args.max_sources,
                         trim_margin_ms=int(args.log_keep * 1000),
                         autolearn=args.autolearn, autolearn_score=args.autolearn_score,
                         autolearn_min_class_weight=args.autolearn_min_class_weight,
                         autolearn_per_batch=args.autolearn_per_batch,
                         replica_memory=args.replica_memory,
                         model_metrics=args.model_metrics, per_user_s=args.per_user,
                         user_min_weight=args.user_min_weight)


def _auth_error(exc: BaseException) -> bool:
    text = str(exc)
    return (isinstance(exc, (redis.AuthenticationError, redis.exceptions.NoPermissionError))
            or text.startswith(("WRONGPASS", "NOAUTH", "NOPERM")))


def run_single(args: argparse.Namespace, specs: list[Any], settings: Any) -> int:
    """Run one worker in this process until SIGTERM/SIGINT; returns its exit code.

    The worker is started (config checked or created, group created, replica loaded)
    before serving, so a config conflict, a refused password or an ACL refusal stops it
    at once with one line (exit 2). An unreachable Redis is retried with backoff.
    """
    from streamnb_workers.worker import Worker, tune_gc  # deferred: the worker loads only to run

    options = worker_options(args)
    settings = replace(settings, client_name=options.consumer)
    worker = Worker(UrlConnector(settings), specs, options)
    serve_metrics(args.metrics_port, args.metrics_addr, health=worker.health)
    try:
        worker.start()
    except redis.RedisError as exc:
        if _auth_error(exc):
            raise
        if not isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
            raise
        log.warning("Redis not reachable yet (%s); retrying with backoff", exc)
    except ValueError as exc:
        if type(exc).__name__ == "ConfigConflict":
            raise
        raise SettingsError(str(exc)) from None
    log.info("worker %s on %s; metrics %s", options.consumer, worker.connector.describe(),
             f"on http://{args.metrics_addr}:{args.metrics_port}/metrics" if args.metrics_port else "off")
    tune_gc()
    return worker.run()


# ------------------------------------------------------------------------ N workers
def child_command(argv: Sequence[str], index: int, consumer_base: str, metrics_port: int) -> list[str]:
    """The command line of child ``index``: the parent's, with per-child overrides last
    (argparse keeps the last value of an option)."""
    port = metrics_port + index if metrics_port else 0
    return [sys.executable, "-m", "streamnb_workers.cli.main", *argv, "--processes", "1",
            "--consumer", f"{consumer_base}-{index}", "--metrics-port", str(port)]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class Child:
    index: int
    command: list[str]
    proc: subprocess.Popen | None = None
    started: float = 0.0
    restart_at: float | None = None
    restarts: int = 0
    backoff: Backoff | None = None


class Supervisor:
    """Keeps N worker processes running (see the module docstring)."""

    def __init__(self, commands: list[list[str]], env: Mapping[str, str] | None = None,
                 backoff_base_s: float = 0.5, backoff_cap_s: float = 30.0) -> None:
        self.children = [Child(i, cmd, backoff=Backoff(backoff_base_s, backoff_cap_s))
                         for i, cmd in enumerate(commands)]
        self.env = dict(os.environ if env is None else env)
        self.signals = 0
        self.exit_code = 0

    def _start(self, child: Child) -> None:
        child.proc = subprocess.Popen(
            child.command, env=self.env, start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)  # noqa: PLW1509
        child.started = time.monotonic()
        child.restart_at = None
        log.info("worker process %d started (pid %d)", child.index, child.proc.pid)

    def _forward(self, sig: int) -> None:
        for c in self.children:
            if c.proc is not None and c.proc.poll() is None:
                try:
                    os.kill(c.proc.pid, sig)
                except ProcessLookupError:
                    pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.signals += 1
        if self.signals == 1:
            log.info("signal %d: asking %d worker processes to finish their batch and exit",
                     signum, len(self.children))
        else:
            log.warning("signal %d again: worker processes exit now", signum)
        self._forward(signal.SIGTERM)

    @property
    def stopping(self) -> bool:
        return self.signals > 0

    def pids(self) -> list[int | None]:
        return [c.proc.pid if c.proc is not None and c.proc.poll() is None else None
                for c in self.children]

    def _check(self, child: Child) -> None:
        now = time.monotonic()
        if child.proc is None:
            if child.restart_at is not None and now >= child.restart_at and not self.stopping:
                self._start(child)
            return
        code = child.proc.poll()
        if code is None:
            return
        pid = child.proc.pid
        child.proc = None
        if self.stopping:
            if code != 0:
                self.exit_code = EXIT_FAILURE
            return
        if code == EXIT_USAGE:
            log.error("worker process %d (pid %d) exited with code 2 (configuration or credentials);"
                      " not restarting it; stopping the others", child.index, pid)
            self.exit_code = EXIT_USAGE
            self.signals = max(self.signals, 1)
            self._forward(signal.SIGTERM)
            return
        assert child.backoff is not None
        if now - child.started >= STABLE_S:
            child.backoff.reset()
        delay = child.backoff.next_delay()
        child.restarts += 1
        child.restart_at = now + delay
        how = f"signal {-code}" if code < 0 else f"code {code}"
        log.warning("worker process %d (pid %d) died with %s; restarting in %.2f s (restart %d)",
                    child.index, pid, how, delay, child.restarts)

    def run(self, install_signals: bool = True) -> int:
        """Start the children and supervise them until every one has exited after a signal."""
        if install_signals:
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        for c in self.children:
            self._start(c)
        try:
            while True:
                for c in self.children:
                    self._check(c)
                if self.stopping and all(c.proc is None for c in self.children):
                    break
                time.sleep(POLL_S)
        finally:
            self._forward(signal.SIGTERM)
        log.info("all worker processes stopped")
        return self.exit_code


def run_worker_command(args: argparse.Namespace, specs: list[Any], settings: Any,
                       env: Mapping[str, str]) -> int:
    """``streamnb worker``: run here, or supervise ``--processes`` children."""
    if args.processes <= 1:
        return run_single(args, specs, settings)
    base = args.consumer or f"{socket.gethostname()}-{os.getpid()}"
    argv = list(getattr(args, "argv", None) or sys.argv[1:])
    commands = [child_command(argv, i, base, args.metrics_port) for i in range(args.processes)]
    log.info("supervising %d worker processes (consumers %s-0..%d)", args.processes, base,
             args.processes - 1)
    return Supervisor(commands, env).run()

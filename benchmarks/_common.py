"""Shared benchmark helpers: machine info, timing, the corpus, tables, a private redis-server.

>>> print(format_table(["model", "msg/s"], [["a", 1234.5], ["bb", 7]]))
model  msg/s
-----  -----
a      1,234
bb         7
>>> reproduce_command("benchmarks.latency", ["--rates", "100"])
'python -m benchmarks.latency --rates 100'
"""

from __future__ import annotations

import csv
import os
import platform
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = Path(
    os.environ.get("STREAMNB_CORPUS", ROOT.parent / "shared" / "corpus" / "spamassassin-2002")
)
REDIS_SERVER = shutil.which("redis-server")


# ------------------------------------------------------------------ machine
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _blas() -> str:
    try:
        cfg = np.show_config(mode="dicts")  # numpy >= 2
        blas = cfg["Build Dependencies"]["blas"]
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def _blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "?"
    return ",".join(str(p.get("num_threads")) for p in threadpool_info()
                    if p.get("user_api") == "blas") or "?"


def _version(module: str) -> str:
    try:
        mod = __import__(module)
    except ImportError:
        return "absent"
    return str(getattr(mod, "__version__", "?"))


def machine_info() -> dict[str, str]:
    """CPU, cores, Python, numpy, BLAS, the OPENBLAS_* settings and the compared libraries."""
    env = {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")}
    return {
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "blas": _blas(),
        "blas_threads": _blas_threads(),
        "openblas_env": " ".join(f"{k}={v}" for k, v in sorted(env.items())) or "none",
        "river": _version("river"),
        "sklearn": _version("sklearn"),
        "redis-server": _redis_version(),
    }


def _redis_version() -> str:
    if REDIS_SERVER is None:
        return "absent"
    try:
        out = subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True, timeout=5)
        return next((w[2:] for w in out.stdout.split() if w.startswith("v=")), out.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def load_average() -> str:
    try:
        return " ".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "unknown"


def reproduce_command(module: str, argv: Sequence[str]) -> str:
    """The shell command that runs ``module`` with ``argv`` from the repository root."""
    return " ".join(["python -m", module, *[shlex.quote(a) for a in argv]]).strip()


def print_header(title: str, module: str, argv: Sequence[str]) -> None:
    """Title, machine and reproduce command, printed before a benchmark's figures."""
    info = machine_info()
    print(f"== {title}")
    print(f"machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, "
          f"numpy {info['numpy']} ({info['blas']}, {info['blas_threads']} threads), "
          f"OPENBLAS env: {info['openblas_env']}")
    print(f"compared: river {info['river']}, scikit-learn {info['sklearn']}, "
          f"redis-server {info['redis-server']}")
    env = "" if info["openblas_env"] == "none" else info["openblas_env"] + " "
    print(f"command (from {ROOT}, venv active): {env}{reproduce_command(module, argv)}")
    print(f"load average at start: {load_average()} (shared machine: figures are noisy)")
    sys.stdout.flush()


# ------------------------------------------------------------------- timing
def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``(seconds, result)`` of one call (perf_counter)."""
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def best_ms(fn: Callable[[], Any], repeat: int = 5, calls: int = 20) -> float:
    """Milliseconds per call: the best of ``repeat`` timings of ``calls`` calls."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best * 1e3


def rate(n: float, seconds: float) -> float:
    """Items per second (0 when nothing was timed)."""
    return n / seconds if seconds > 0 else 0.0


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 99)) -> list[float]:
    """Percentiles of ``values`` (nan when empty).

    >>> percentiles([1, 2, 3, 4, 100], (50, 100))
    [3.0, 100.0]
    """
    if not len(values):
        return [float("nan")] * len(qs)
    return [float(v) for v in np.percentile(np.asarray(values, dtype=np.float64), qs)]


# ------------------------------------------------------------------ corpus
@dataclass
class Corpus:
    """Raw messages and labels of the SpamAssassin corpus, in index (chronological) order."""

    raws: list[bytes]
    labels: list[str]

    def __len__(self) -> int:
        return len(self.labels)


def corpus_available(root: Path = DEFAULT_CORPUS) -> bool:
    return (Path(root) / "index.tsv").exists()


def load_corpus(root: Path = DEFAULT_CORPUS, limit: int | None = None) -> Corpus:
    """Read ``index.tsv`` and the message files it lists (the first ``limit`` only)."""
    root = Path(root)
    with open(root / "index.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    if limit is not None:
        rows = rows[:limit]
    return Corpus([(root / r["path"]).read_bytes() for r in rows], [r["label"] for r in rows])


def corpus_or_synthetic(root: Path | str, limit: int | None = None, n_synthetic: int = 2000) -> Corpus:
    """The corpus at ``root`` (first ``limit`` messages), or synthetic mail when it is absent."""
    if corpus_available(Path(root)):
        return load_corpus(Path(root), limit)
    print(f"corpus not found at {root}: using synthetic mail (accuracy figures meaningless)")
    return synthetic_mail(limit or n_synthetic)


def synthetic_mail(n: int, seed: int = 0) -> Corpus:
    """Small fake raw mails (two classes) for smoke runs when the corpus is absent."""
    rng = np.random.default_rng(seed)
    words = {"spam": ["cheap", "meds", "winner", "prize", "offer", "click", "free", "money"],
             "ham": ["meeting", "notes", "lunch", "project", "report", "agenda", "review", "team"]}
    raws, labels = [], []
    for i in range(n):
        label = "spam" if rng.random() < 0.4 else "ham"
        body = " ".join(rng.choice(words[label], size=int(rng.integers(5, 30))))
        subject = " ".join(rng.choice(words[label], size=3))
        raws.append(f"From: a{i}@example.com\nSubject: {subject}\n\n{body}\n".encode())
        labels.append(label)
    return Corpus(raws, labels)


# ------------------------------------------------------------------ tables
def _cell(v: Any) -> str:
    if isinstance(v, float):
        if v != v:  # nan
            return "-"
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}" if abs(v) >= 1 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table; numbers right-aligned, text left-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    numeric = [all(isinstance(r[i], (int, float)) for r in rows) for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    out = [line(list(headers)), "  ".join("-" * w for w in widths)]
    out += [line(r) for r in cells]
    return "\n".join(out)


# ------------------------------------------------------------ redis-server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A private redis-server on 127.0.0.1:<free port> (no persistence), as a context manager.

    Never the server on 6379: benchmarks flush and fill their own.
    """

    def __init__(self, extra: list[str] = ()) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not on PATH")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="streamnb-bench-redis-"))
        self.proc: subprocess.Popen | None = None
        #: More ``--option value`` arguments (``["--replicaof", host, port]``, ...).
        self.extra = list(extra)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kw: Any) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30, **kw)

    def __enter__(self) -> RedisServer:
        import redis

        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning",
             *self.extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                time.sleep(0.05)
        self.__exit__()
        raise RuntimeError(f"redis-server on port {self.port} did not answer")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (Linux /proc), NaN if unknown."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def runqueue_wait_s(pid: int) -> float:
    """Seconds the main thread of a live process has waited, runnable, for a CPU (Linux
    /proc/PID/schedstat, its second field), NaN if unknown."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


def host_cpu_s(stat: str | None = None, tick: int | None = None) -> tuple[float, float, float]:
    """Seconds of all the host's CPUs since boot (Linux /proc/stat, or its text ``stat``
    in clock ticks of ``tick`` per second): (idle, including I/O wait; stolen by the
    hypervisor; everything else), NaNs if unknown.

    A window's idle share is ``(idle1 - idle0) / (total1 - total0)``; a host whose idle
    share is near 0 while the workers run is CPU-bound, whatever the workers wait on.

    >>> host_cpu_s("cpu  100 0 50 800 50 0 0 0 0 0", tick=100)
    (8.5, 0.0, 1.5)
    """
    try:
        text = Path("/proc/stat").read_text() if stat is None else stat
        values = [int(v) for v in text.split("\n", 1)[0].split()[1:]]
        tick = os.sysconf("SC_CLK_TCK") if tick is None else tick
        idle = (values[3] + values[4]) / tick
        steal = (values[7] if len(values) > 7 else 0) / tick
        busy = sum(values[:8]) / tick - idle - steal  # (guest time is in user already)
        return idle, steal, busy
    except (OSError, ValueError, IndexError):
        return float("nan"), float("nan"), float("nan")


def command_stats(client: Any) -> dict[str, tuple[int, float]]:
    """redis-server's ``INFO commandstats`` since its last ``CONFIG RESETSTAT``: command
    (lower case, ``config|resetstat`` for a subcommand) -> (calls, seconds inside it; a
    script's or an ``EXEC``'s time includes the commands it ran)."""
    return {name.removeprefix("cmdstat_"): (int(v["calls"]), v["usec"] / 1e6)
            for name, v in client.info("commandstats").items()}


def redis_cpu_s(client: Any) -> float:
    """redis-server's CPU seconds so far (``INFO cpu``: user + system, the whole process:
    commands, parsing, networking)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc), 0 if unknown."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0

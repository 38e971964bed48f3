"""Instructions per message, counted by valgrind: a figure that a busy shared host does not move.

On the shared VMs of these benchmarks the same code runs up to 1.3x faster or slower from
one run to the next, and a change of a few percent is lost in that. The number of
instructions a process executes per message is not: this script runs a workload twice
under ``valgrind --tool=callgrind`` (with ``--reps 1`` and ``--reps 3`` passes over the
same messages) and prints the difference per message, which leaves out start-up,
imports and loading the corpus, and the first sight of each token (its hashing: the
later passes find every token in the hash table). ``--first-pass`` counts one pass less
none instead, the first sight included. Instructions are not time (a cache miss costs no
instruction), so a change that moves memory rather than work shows only in the timed
benchmarks; for the rest, an A/B of two trees by this script is exact.

Workloads: ``featurize`` (a worker's featurizing, ``Featurizer.featurize_batch`` in
batches of 100, on raw mail, one process; ``featurize-osb`` the same with orthogonal
sparse bigrams, ``osb`` 5, docs/features.md) and ``worker-raw``, ``worker-tokens``,
``worker-hashes`` (one in-process worker against its own redis-server, over a backlog of
that payload; redis-server is another process and is not counted, and the same process
run without the worker, which only encodes the messages and fills the stream, is counted
too and taken off: the figure is the worker's own), and ``bare`` (bare
``email.message_from_bytes`` of each message, the reference of benchmark 3's raw-mail
target). With ``bare`` and ``worker-raw`` both counted, the script prints their ratio: the
target's "raw mail end to end >= 90% of bare parsing" in instructions, not in time.

    python -m benchmarks.instructions [--corpus DIR] [--messages 1000] [--what featurize,worker-raw] [--cache] [--steps]

The counted worker also runs its duties on the clock (the heartbeat, the snapshot lease
and snapshots, the observer's look at the model every 5 s, the token names published,
the claims of idle entries: workers/worker/housekeeping.py), as often as the run's wall
time allows; valgrind slows the worker, not the clock, so a run on a loaded host counts
more of them. Its clean shutdown is their last round: it publishes the token names
counted since the last publish, which in a run of 3 passes are more than in a run of 1
(on ``tokens``, about 400,000 instructions a message of the difference, none of it a
message's own). Where the marker library of ``--steps`` can be built (a C compiler and
valgrind's ``callgrind.h``), callgrind dumps its counts at each duty's start and end and
around the shutdown, and these are taken off the worker's figure and printed on a line
of their own (``duties on the clock``, per message of that run: it depends on the load,
the figure does not); every per-message step stays in the figure. Without the library they stay in
the figure, and the script says so. (``--cache``: cachegrind has no dumps; its figures
hold the duties.)

``--steps`` also prints, for each ``worker-*`` workload, the instructions a message of each
step of a batch (decode, featurize, predict, the commit's content, ...; benchmarks/_steps.py),
counted the same way from callgrind's dumps at each step's start and end.

``--cache`` runs cachegrind instead, which also simulates this VM's L1d and L2 caches and
prints their data misses per message: what instructions do not show (a worker on raw mail
runs about as many instructions per message as bare parsing, yet takes longer: it misses
the L2 several times as often).

A/B against an older commit: ``git worktree add /tmp/before <rev>``, build its C modules
there, and run ``PYTHONPATH=/tmp/before python -m benchmarks.instructions --corpus DIR``
from ``/tmp/before`` (with an editable install, a ``streamnb_workers`` link to ``workers``
in it, so that the daemon is that tree's too). Give the corpus: its default is found next
to the tree (``../shared/corpus``), and where there is none the workload runs on a few
hundred bytes of synthetic mail a message, whose counts say nothing about real mail.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks._common import DEFAULT_CORPUS, corpus_or_synthetic, format_table, print_header
from streamnb_workers.cli.launch import blas_env

WORKLOADS = ("featurize", "featurize-osb", "worker-raw", "worker-tokens", "worker-hashes", "bare")
#: What a ``worker-*`` workload's process does for the producer: encode each message and
#: fill the stream (``producer-raw`` etc.: the same without the worker). Its count is taken
#: off the worker's, so the figure is the worker's own.
PRODUCERS = tuple(w.replace("worker-", "producer-") for w in WORKLOADS if w.startswith("worker-"))
_COLLECTED = re.compile(r"Collected\s*:\s*([\d,]+)")


def collected(valgrind_output: str) -> int:
    """The instruction count of a callgrind run's summary (``Collected : 1,234``).

    >>> collected("==1== Events    : Ir\\n==1== Collected : 7,446,165,616\\n")
    7446165616
    """
    m = _COLLECTED.search(valgrind_output)
    if m is None:
        raise RuntimeError("no 'Collected' line in valgrind's output:\n" + valgrind_output[-2000:])
    return int(m.group(1).replace(",", ""))


def run_workload(what: str, corpus_dir: str, messages: int, reps: int) -> None:
    """The workload itself (in the process valgrind counts): ``reps`` passes over the
    first ``messages`` messages of the corpus."""
    corpus = corpus_or_synthetic(corpus_dir, messages)
    if what == "bare":
        import email

        for _ in range(reps):
            for raw in corpus.raws:
                email.message_from_bytes(raw)
        return
    if what in ("featurize", "featurize-osb"):
        from streamnb.features import Featurizer, Payload

        featurizer = Featurizer(osb=5 if what == "featurize-osb" else 0)
        msgs = [Payload("raw", raw) for i, raw in enumerate(corpus.raws)]
        for _ in range(reps):
            for i in range(0, len(msgs), 100):
                featurizer.featurize_batch(msgs[i:i + 100])
        return
    from prometheus_client import CollectorRegistry

    from benchmarks import end_to_end
    from benchmarks._common import Corpus, RedisServer
    from streamnb_workers.observe.metrics import Metrics
    from streamnb_workers.store.connection import RedisSettings, UrlConnector
    from streamnb_workers.store.model_config import ModelSpec
    from streamnb_workers.worker import Worker, WorkerOptions, tune_gc

    payload = what.removeprefix("worker-").removeprefix("producer-")
    big = Corpus(corpus.raws * reps, corpus.labels * reps)
    tokens = end_to_end.corpus_tokens(corpus) * reps if payload != "raw" else None
    encoded = end_to_end.encode_messages(big, payload, tokens=tokens, pass_size=len(corpus))
    with RedisServer() as server:
        end_to_end.prefill(server.client(), "count", encoded)
        if what.startswith("producer-"):
            return
        worker = Worker(UrlConnector(RedisSettings(server.url)), [ModelSpec("count", kind="multinomial")],
                        WorkerOptions(consumer="count"), Metrics(CollectorRegistry()))
        worker.start()
        tune_gc()
        worker.run_until_idle(timeout=3600)
        worker.shutdown()


_CACHEGRIND = {"instructions": re.compile(r"I\s+refs:\s*([\d,]+)"),
               "L1d misses": re.compile(r"D1\s+misses:\s*([\d,]+)"),
               "L2 misses": re.compile(r"LLd\s+misses:\s*([\d,]+)")}


def cache_counts(valgrind_output: str) -> dict[str, int]:
    """Instructions and simulated data-cache misses from a cachegrind run's summary.

    >>> out = ("==1== I   refs:      4,741\\n==1== D1  misses:   23 ( 16 rd + 7 wr)\\n"
    ...        "==1== LLd misses:  3 ( 2 rd + 1 wr)\\n")
    >>> cache_counts(out)
    {'instructions': 4741, 'L1d misses': 23, 'L2 misses': 3}
    """
    found = {k: rx.search(valgrind_output) for k, rx in _CACHEGRIND.items()}
    missing = [k for k, m in found.items() if m is None]
    if missing:
        raise RuntimeError(f"no {missing[0]!r} in cachegrind's output:\n" + valgrind_output[-2000:])
    return {k: int(m.group(1).replace(",", "")) for k, m in found.items() if m is not None}


#: ``--cache``: this VM's caches (AMD EPYC: 64 KB L1d and 1 MB L2 per core); the last
#: level is added by :func:`cache_sim`.
CACHE_SIM = ["--cache-sim=yes", "--D1=65536,8,64"]
#: The simulated last level's size by default (``--ll-bytes``): the L2 of one core, so
#: what misses it is read from the shared L3 or from memory.
DEFAULT_LL_BYTES = 1 << 20


def cache_sim(ll_bytes: int = DEFAULT_LL_BYTES) -> list[str]:
    """cachegrind's cache options, with a last level of ``ll_bytes`` (16-way, 64-byte lines).

    ``--ll-bytes`` set to the host's L3 (32 MB here), then to half of it, shows what a
    worker misses when another worker shares the L3 with it (the same code, the same
    messages: only the cache it may fill differs).

    >>> cache_sim()[-1], cache_sim(32 << 20)[-1]
    ('--LL=1048576,16,64', '--LL=33554432,16,64')
    """
    return [*CACHE_SIM, f"--LL={int(ll_bytes)},16,64"]


def ll_label(ll_bytes: int) -> str:
    """The name of the last-level misses column: ``L2`` for the default, else its size.

    >>> ll_label(1 << 20), ll_label(16 << 20)
    ('L2 misses', 'last level (16 MiB) misses')
    """
    return "L2 misses" if ll_bytes == DEFAULT_LL_BYTES else f"last level ({ll_bytes / 2**20:g} MiB) misses"


def count_steps(what: str, corpus_dir: str, messages: int, reps: int, marker: str,
                directory: str) -> dict[str, int]:
    """Instructions by step of one run of a worker workload under callgrind, its counts
    dumped at each step's start and end (benchmarks/_steps.py)."""
    from benchmarks._steps import step_totals

    prefix = os.path.join(directory, f"steps.{what}.{reps}")
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={prefix}", sys.executable,
           "-m", "benchmarks.instructions", "--inner", what, "--reps", str(reps),
           "--messages", str(messages), "--corpus", corpus_dir, "--inner-steps", marker]
    done = subprocess.run(cmd, capture_output=True, text=True, env=blas_env(os.environ), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return dict(step_totals(prefix))


def print_steps(what: str, corpus_dir: str, messages: int, low: int, high: int,
                worker_total: float) -> None:
    """The per-step table of ``--steps`` for one worker workload (``worker_total``: its
    instructions a message, whose part outside the steps is printed as the rest)."""
    import tempfile

    from benchmarks._steps import STEPS, WHAT, build_marker

    with tempfile.TemporaryDirectory(prefix="streamnb-steps-") as directory:
        marker = str(build_marker(Path(directory)))
        runs = [count_steps(what, corpus_dir, messages, r, marker, directory) for r in (low, high)]
    names = [n for _, group in STEPS for n in group]
    per = {n: (runs[1].get(n, 0) - runs[0].get(n, 0)) / ((high - low) * messages) for n in names}
    rows = [[n, WHAT[n], f"{v:,.0f}", f"{v / worker_total:.0%}"]
            for n, v in sorted(per.items(), key=lambda kv: -kv[1])]
    rest = worker_total - sum(per.values())
    rows.append(["(the rest)", "reading entries, the loop, the commit on the wire, token names",
                 f"{rest:,.0f}",
                 f"{rest / worker_total:.0%}"])
    print(f"\n{what}, by step (instructions a message; the dumps add a few per batch):")
    print(format_table(["step", "what", "instructions per message", "share"], rows))


def count(what: str, corpus_dir: str, messages: int, reps: int, cache: bool = False,
          ll_bytes: int = DEFAULT_LL_BYTES, duties: str | None = None) -> dict[str, int]:
    """Instructions of one run of the workload under callgrind (with ``cache``: under
    cachegrind, with the simulated L1d and last-level misses, that level ``ll_bytes``).
    With ``duties`` (a directory holding the marker library ``libmarker.so``) and a worker
    workload: the worker's duties on the clock counted apart, as ``duties``, and taken off
    ``instructions``."""
    apart = duties is not None and what.startswith("worker-") and not cache
    prefix = os.path.join(duties, f"duties.{what}.{reps}") if apart else "/dev/null"
    tool = ["--tool=cachegrind", "--cachegrind-out-file=/dev/null", *cache_sim(ll_bytes)] if cache else \
        ["--tool=callgrind", f"--callgrind-out-file={prefix}"]
    cmd = ["valgrind", *tool, sys.executable,
           "-m", "benchmarks.instructions", "--inner", what, "--reps", str(reps),
           "--messages", str(messages), "--corpus", corpus_dir]
    if apart:
        cmd += ["--inner-duties", os.path.join(duties, "libmarker.so")]
    # One BLAS thread, as `streamnb worker` sets (workers/cli/launch.py): the idle threads of
    # OpenBLAS's default pool spin, and their instructions, which vary run to run, counted.
    done = subprocess.run(cmd, capture_output=True, text=True, env=blas_env(os.environ), check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    if cache:
        return cache_counts(done.stderr)
    total = collected(done.stderr)  # (every dump's count: the duties' too)
    if not apart:
        return {"instructions": total}
    from benchmarks._steps import DUTIES_LABEL, step_totals

    on_clock = step_totals(prefix)[DUTIES_LABEL]
    for name in glob.glob(glob.escape(prefix) + "*"):
        os.remove(name)
    return {"instructions": total - on_clock, "duties": on_clock}


def duties_marker(directory: str) -> str | None:
    """``directory`` with the marker library built in it, to count the worker's duties on
    the clock apart; None (with a note on stderr) where it cannot be built."""
    from benchmarks._steps import build_marker

    try:
        build_marker(Path(directory))
    except RuntimeError as exc:
        print(f"python -m benchmarks.instructions: {exc}; the duties on the clock stay in the "
              "worker's figures", file=sys.stderr)
        return None
    return directory


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m benchmarks.instructions", description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--messages", type=int, default=1000, help="corpus messages per pass")
    ap.add_argument("--what", default="featurize,worker-raw,worker-hashes,bare",
                    help=f"comma-separated, of {', '.join(WORKLOADS)}")
    ap.add_argument("--first-pass", action="store_true",
                    help="count one pass less none instead (the first sight of every token "
                         "included: new tokens are hashed then)")
    ap.add_argument("--cache", action="store_true",
                    help="also the simulated L1d and L2 misses per message (cachegrind; slower)")
    ap.add_argument("--ll-bytes", type=int, default=DEFAULT_LL_BYTES,
                    help="with --cache: the simulated last level's size, a power of two >= 65536 "
                         "(default: the 1 MiB L2 of one core; 33554432 for this host's L3, "
                         "16777216 for half of it, as a worker beside another has)")
    ap.add_argument("--steps", action="store_true",
                    help="also each worker workload's instructions a message by step of a batch "
                         "(needs a C compiler and valgrind/callgrind.h; benchmarks/_steps.py)")
    ap.add_argument("--inner", choices=WORKLOADS + PRODUCERS, help=argparse.SUPPRESS)  # the counted process
    ap.add_argument("--inner-steps", help=argparse.SUPPRESS)  # its marker library, with --steps
    ap.add_argument("--inner-duties", help=argparse.SUPPRESS)  # its marker library: duties apart
    ap.add_argument("--reps", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inner:
        marker = None
        if args.inner_steps:
            from benchmarks._steps import instrument

            marker = instrument(args.inner_steps)
        if args.inner_duties:
            from benchmarks._steps import instrument_duties

            instrument_duties(args.inner_duties)
        run_workload(args.inner, args.corpus, args.messages, args.reps)
        if marker is not None:
            marker.streamnb_dump(b"end")
        return 0
    what = [w for w in args.what.split(",") if w]
    unknown = sorted(set(what) - set(WORKLOADS))
    if unknown or args.messages < 1:
        ap.error(f"unknown workload {unknown[0]!r}" if unknown else "--messages must be >= 1")
    ll = args.ll_bytes
    if ll < 65536 or ll & (ll - 1):
        ap.error(f"--ll-bytes must be a power of two >= 65536, got {ll}")
    if ll != DEFAULT_LL_BYTES and not args.cache:
        ap.error("--ll-bytes needs --cache (callgrind simulates no cache)")
    if args.steps and (args.cache or args.first_pass):
        ap.error("--steps counts later passes with callgrind: without --cache and --first-pass")
    if shutil.which("valgrind") is None:
        print("python -m benchmarks.instructions: valgrind is not installed (apt-get install valgrind)",
              file=sys.stderr)
        return 2
    print_header("instructions per message (valgrind --tool=" + ("cachegrind" if args.cache else "callgrind")
                 + ")", "benchmarks.instructions", argv)
    low, high = (0, 1) if args.first_pass else (1, 3)
    rows, per, on_clock = [], {}, {}
    def per_message(runs: list[dict[str, int]]) -> dict[str, float]:
        return {k: (runs[1][k] - runs[0][k]) / ((high - low) * args.messages) for k in runs[0]}

    passes = "first" if args.first_pass else "later"
    with tempfile.TemporaryDirectory(prefix="streamnb-duties-") as directory:
        duties = duties_marker(directory) if not args.cache and any(
            w.startswith("worker-") for w in what) else None
        for w in what:
            runs = [count(w, args.corpus, args.messages, r, args.cache, ll, duties=duties)
                    for r in (low, high)]
            if "duties" in runs[0]:
                on_clock[w] = (runs[1].pop("duties") - runs[0].pop("duties")) / ((high - low) * args.messages)
            if w.startswith("worker-"):  # the producer's part of that process left out
                name = w.replace("worker-", "producer-")
                producer = [count(name, args.corpus, args.messages, r, args.cache, ll) for r in (low, high)]
                runs = [{k: n - p[k] for k, n in run.items()} for run, p in zip(runs, producer, strict=True)]
                rows.append([f"({name}: taken off {w})", passes, args.messages,
                             *[f"{v:,.0f}" for v in per_message(producer).values()]])
            per[w] = per_message(runs)
            rows.append([w, passes, args.messages, *[f"{v:,.0f}" for v in per[w].values()]])
    print(format_table(["workload", "passes", "messages per pass",
                        *[f"{ll_label(ll) if k == 'L2 misses' else k} per message"
                          for k in per[what[0]]]], rows))
    workers = [w for w in what if w.startswith("worker-")]
    for w in workers:
        if w in on_clock:
            print(f"{w}: duties on the clock and the shutdown, apart (not in the figure above; "
                  f"as often as this run's wall time allowed, so load-dependent): "
                  f"{on_clock[w]:,.0f} a message")
        elif not args.cache:
            print(f"{w}: the duties on the clock and the shutdown are IN the figure (no "
                  f"marker library: it depends on the host's load and the run's length)")
    for w in what:
        if args.steps and w.startswith("worker-"):
            try:
                print_steps(w, args.corpus, args.messages, low, high, per[w]["instructions"])
            except RuntimeError as exc:
                print(f"python -m benchmarks.instructions: {exc}", file=sys.stderr)
                return 2
    if "bare" in per and "worker-raw" in per:
        print(f"\nbare parsing / one worker on raw mail, in instructions: "
              f"{per['bare']['instructions'] / per['worker-raw']['instructions']:.1%} "
              f"(benchmark 3's target, in time: >= 90%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

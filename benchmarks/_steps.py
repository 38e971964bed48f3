"""Where a worker's instructions go, step by step: ``python -m benchmarks.instructions
--steps`` (worker workloads).

The counted process loads a small marker library (compiled here from valgrind's
``callgrind.h``) and wraps the steps of a batch (workers/worker/process.py and
committing.py, named below) so that callgrind writes its counts out when each step
starts and ends (``CALLGRIND_DUMP_STATS_AT``): a dump named after a step holds that
step's instructions. As for the totals, the figure a message is the difference of a run
with 3 passes and one with 1, over the messages of 2 passes; what no step holds (reading
the entries, the loop, settling the commit on the wire) is the worker's figure less the
steps'.

The same dumps set the worker's duties on the clock apart in every worker count
(:data:`DUTIES`, :func:`instrument_duties`): what runs on a timer of wall time (the
heartbeat, the snapshot lease and snapshots, the observer's look at the model every 5 s,
the token names published, the claims of idle entries) is done as often as the run's
wall time allows, and valgrind slows the worker, not the clock, so their count in a run
depends on the host's load. They are counted under the name ``duties`` and printed on a
line of their own, with the worker's clean shutdown (their last round: the token names
counted since the last publish are published then, as many more as the run is longer);
the per-message work stays in the worker's figure.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

#: The steps of a batch, by module: none calls another, so each dump is one step's own.
STEPS = (
    ("streamnb_workers.worker.process",
     ("decode", "featurize", "prepare", "catch_up", "predict_items", "account",
      "observe_predictions")),
    ("streamnb_workers.worker.committing", ("commit_content", "_request", "apply_own_delta")),
)
#: The worker's duties on the clock (workers/worker/loop.py ``_intake``): each call,
#: whether or not a timer was due, is counted as ``duties``; so is the worker's clean
#: shutdown, whose work is that of the duties' last round (the token names counted since
#: the last publish published, the final snapshot): once a process, not a message's.
DUTIES = (("streamnb_workers.worker.loop", ("housekeeping", "claim_idle_entries",
                                            "Worker.shutdown")),)
#: The name of the duties' dumps.
DUTIES_LABEL = "duties"
#: What each step is, for the printed table.
WHAT = {
    "decode": "entries -> messages (codec, wire_tokens)",
    "featurize": "messages -> rows (buckets)",
    "prepare": "rows stacked, plan, cache rows, own statistics",
    "catch_up": "the log tail",
    "predict_items": "prequential scores, decisions, error weights",
    "commit_content": "outputs, learn-once keys, cache entries, delta",
    "_request": "the commit's request (delta encoded, cache writes)",
    "apply_own_delta": "the worker's own delta applied",
    "account": "counts and scores of the commit landed",
    "observe_predictions": "the observer: ages, confidence, drift",
}
_MARKER_C = ("#include <valgrind/callgrind.h>\n"
             "void streamnb_dump(const char *name) { CALLGRIND_DUMP_STATS_AT(name); }\n")
_DESC = re.compile(rb"^desc: Trigger: Client Request: (\S+)", re.M)
_TOTAL = re.compile(rb"^(?:summary|totals): (\d+)", re.M)


def build_marker(directory: Path) -> Path:
    """Compile the marker library into ``directory``; RuntimeError (one line) if no C
    compiler or no ``valgrind/callgrind.h`` (Debian: valgrind's own package has it)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("--steps needs a C compiler (cc) to build its marker library")
    src, lib = directory / "marker.c", directory / "libmarker.so"
    src.write_text(_MARKER_C)
    done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(lib), str(src)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError("--steps could not build its marker library (is valgrind/callgrind.h "
                           "installed?): " + done.stderr.strip().splitlines()[-1])
    return lib


def instrument(marker: str) -> ctypes.CDLL:
    """In the counted process: wrap every step of :data:`STEPS` with a dump at its start
    (named ``between``: what came since the last dump) and one at its end (its name)."""
    return _wrap_all(ctypes.CDLL(marker), STEPS)


def instrument_duties(marker: str) -> ctypes.CDLL:
    """In the counted process: wrap the worker's duties on the clock (:data:`DUTIES`) with a
    dump at their start and one, named :data:`DUTIES_LABEL`, at their end."""
    return _wrap_all(ctypes.CDLL(marker), DUTIES, DUTIES_LABEL)


def _wrap_all(lib: ctypes.CDLL, table: Sequence[tuple[str, Sequence[str]]], label: str | None = None) -> ctypes.CDLL:
    """Each function named in ``table`` ((module, names) pairs; ``Class.method`` for a
    method) wrapped with dumps, named ``label`` or, without one, after the function."""
    for module_name, names in table:
        module = importlib.import_module(module_name)
        for name in names:
            *path, attr = name.split(".")
            owner = functools.reduce(getattr, path, module)
            setattr(owner, attr, _wrapped(lib, getattr(owner, attr), (label or attr).encode()))
    return lib


def _wrapped(lib: ctypes.CDLL, step, label: bytes):
    @functools.wraps(step)
    def counted(*args, **kwargs):
        lib.streamnb_dump(b"between")
        try:
            return step(*args, **kwargs)
        finally:
            lib.streamnb_dump(label)
    return counted


def step_totals(prefix: str) -> Counter:
    """Instructions by step name over the dumps ``prefix.*`` of one callgrind run (its
    ``Collected`` total is the sum of every dump's, the last one's at the program's end
    included)."""
    totals: Counter = Counter()
    for name in glob.glob(glob.escape(prefix) + ".*"):
        head = Path(name).read_bytes()[:100_000]
        desc, total = _DESC.search(head), _TOTAL.search(head)
        if desc is not None and total is not None:
            totals[desc.group(1).decode()] += int(total.group(1))
    return totals

"""``streamnb tune`` on a replay's history: the corpus as labelled raw mail through
``--workers`` worker processes with the daemon's defaults (every message judged, then
learnt), then ``streamnb tune`` run on the model's ``:out`` for each ``--goal`` (with
``--last`` where given), its output printed as is.

    python -m benchmarks.tune [--limit N] [--workers 2] [--runs 'accuracy;fpr=0.01;fpr=0.001;fpr=0.01 1300']
                              [--replay]

Each run is ``GOAL`` or ``GOAL LAST``, runs separated by ``;``. With ``--replay``, each
run also gives ``--replay`` the corpus's index (alpha re-evaluated: every candidate
replayed through the daemon). The figures are those of
the prequential scores the workers published, so they do not depend on the host's load.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks._common import DEFAULT_CORPUS, RedisServer, corpus_or_synthetic, print_header
from benchmarks.end_to_end import default_spec, encode_messages, keys, prefill, wait_for, workers

DEFAULT_RUNS = "accuracy;fpr=0.01;fpr=0.001;fpr=0.01 1300"
NAME = "mail"


def corpus_index(root: str, limit: int | None) -> Path:
    """The corpus's index.tsv, or with ``limit`` its first ``limit`` messages' rows in a
    temporary index (absolute paths)."""
    index = Path(root) / "index.tsv"
    if not index.exists():
        raise SystemExit(f"--replay needs the corpus's index: {index} not found")
    if limit is None:
        return index
    rows = index.read_text().splitlines()
    out = Path(tempfile.mkdtemp(prefix="streamnb-tune-")) / "index.tsv"
    out.write_text("\n".join([rows[0], *(f"{Path(root).resolve() / r.split(chr(9), 1)[0]}\t"
                                         f"{r.split(chr(9), 1)[1]}" for r in rows[1:limit + 1])])
                   + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--limit", type=int, default=None, help="the first N messages only")
    ap.add_argument("--workers", type=int, default=2, help="worker processes")
    ap.add_argument("--runs", default=DEFAULT_RUNS, help="'GOAL[ LAST];...' (module docstring)")
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--replay", action="store_true",
                    help="each run with --replay INDEX (the corpus's index.tsv)")
    args = ap.parse_args(argv)
    runs = [r.split() for r in args.runs.split(";") if r.strip()]
    if any(len(r) > 2 for r in runs):
        ap.error(f"--runs: each run is GOAL or GOAL LAST, got {args.runs!r}")
    print_header("streamnb tune on a replay's :out", "benchmarks.tune", argv)
    corpus = corpus_or_synthetic(args.corpus, args.limit, n_synthetic=500)
    messages = encode_messages(corpus, "raw", labelled=True)
    k = keys(NAME)
    print(f"replay: {len(corpus)} labelled messages through {args.workers} workers "
          "(daemon defaults)", flush=True)
    with RedisServer() as server:
        client = server.client()
        prefill(client, NAME, messages)
        with workers(server.url, default_spec(NAME), args.workers) as procs:
            if not wait_for(client, k["out"], len(messages), args.timeout, procs, k["dead"]):
                raise RuntimeError(f"the workers did not process the corpus in {args.timeout}s")
        for run in runs:
            extra = ["--last", run[1]] if len(run) == 2 else []
            if args.replay:
                extra += ["--replay", str(corpus_index(args.corpus, args.limit))]
            cmd = ["tune", "--redis", server.url, "--model", NAME, "--goal", run[0], *extra]
            got = subprocess.run([sys.executable, "-m", "streamnb_workers", *cmd],
                                 capture_output=True, text=True, check=False)
            print(f"\n$ streamnb {' '.join(cmd).replace(server.url, 'URL')}")
            print((got.stdout + got.stderr).rstrip())
            print(f"(exit {got.returncode})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

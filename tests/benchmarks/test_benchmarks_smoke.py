"""Smoke tests of the benchmarks: each core function runs on tiny inputs and returns sane
numbers. No timing assertions (speed figures belong in benchmarks/, not in tests)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import daemon_accuracy, end_to_end, gaussian_throughput, latency, memory  # noqa: E402
from benchmarks import model_throughput as mt  # noqa: E402
from benchmarks._common import REDIS_SERVER, format_table, percentiles, synthetic_mail  # noqa: E402
from streamnb_workers.store.keys import GROUP  # noqa: E402

needs_redis = pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")


def test_percentiles_match_numpy():
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    assert percentiles(values, (50, 99)) == [float(np.percentile(values, 50)),
                                            float(np.percentile(values, 99))]
    assert all(math.isnan(v) for v in percentiles([], (50,)))


def test_format_table_aligns_columns():
    lines = format_table(["a", "n"], [["x", 1.5], ["yy", 1234.0]]).splitlines()
    assert lines[0].split() == ["a", "n"]
    assert lines[2].split() == ["x", "1.5"] and lines[3].split() == ["yy", "1,234"]
    assert len({len(line) for line in lines[1:]}) == 1


def test_score_hand_worked():
    # ham: predicted None and spam -> 2 false positives of 2; spam: 1 missed of 2.
    s = daemon_accuracy.score("t", ["spam", "ham", None, "spam"], ["spam", "spam", "ham", "ham"], 1.0)
    assert (s.fp, s.fn, s.unpredicted) == (2, 1, 1)
    assert s.ham_fp == 1.0 and s.spam_fn == 0.5 and s.accuracy == 0.25
    assert s.accuracy_labelled == pytest.approx(1 / 3)


def test_score_reads_unsure_as_not_flagged():
    # an unsure ham is right, an unsure spam a miss
    s = daemon_accuracy.score("t", ["unsure", "unsure", "spam"], ["ham", "spam", "spam"], 1.0)
    assert (s.fp, s.fn, s.unpredicted) == (0, 1, 0) and s.accuracy == pytest.approx(2 / 3)


def test_quality_slices_measures_both_slices_on_synthetic_mail(capsys):
    from benchmarks import quality_slices

    assert quality_slices.main(["--corpus", "/nonexistent", "--limit", "300"]) == 0
    out = capsys.readouterr().out
    assert "tune on 1..180, check on 181..300" in out
    assert all(v.name in out for v in quality_slices.VARIANTS)


def test_operating_point_reports_calibration_and_both_replays(capsys, tmp_path):
    import importlib.util

    from benchmarks import operating_point

    png = tmp_path / "reliability.png"
    plots = importlib.util.find_spec("matplotlib") is not None  # (the bench extra's)
    assert operating_point.main(["--corpus", "/nonexistent", "--limit", "300"]
                                + (["--plot", str(png)] if plots else [])) == 0
    out = capsys.readouterr().out
    assert "isotonic" in out and "platt" in out and "--prior-half-life 200" in out
    assert "EM prior" in out
    if plots:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_model_throughput_says_when_a_ratio_has_no_steady_rate(capsys):
    """A library capped before its warm-up ended has no steady rate: the ratio line says
    so instead of printing "nanx"."""
    results = [mt.Result("streamnb", "bernoulli", 100, 50, 0.5, 0.9, steady=200.0),
               mt.Result("river", "bernoulli", 1, 5, 1.0, 0.8),
               mt.Result("scikit-learn", "bernoulli", 100, 50, 1.0, 0.8, steady=50.0)]
    mt.print_results(results, total=50)
    out = capsys.readouterr().out
    assert "bernoulli: streamnb b100 / river: 20.0x whole run, no steady rate" in out
    assert "bernoulli: streamnb b100 / sklearn b100: 2.0x whole run, 4.0x steady" in out
    assert "nan" not in out


def test_model_throughput_runs_every_library_on_tiny_mail():
    corpus = synthetic_mail(60, seed=1)
    prep = mt.prepare(corpus, bits=12)
    assert prep.X.shape == (60, 2**12) and prep.X_sklearn.shape == (60, 2**12)
    # The same tokens reach every library: as many distinct tokens per message as buckets
    # (up to collisions, which only merge buckets).
    assert all(prep.X[i].nnz <= len(prep.token_dicts[i]) for i in range(60))
    results = mt.benchmark(prep, batches=(1, 10), cap=30.0)
    libs = {(r.library, r.model, r.batch) for r in results}
    assert ("river", "bernoulli", 1) in libs and ("scikit-learn", "multinomial", 10) in libs
    for r in results:
        assert r.messages == 60 and r.seconds > 0 and r.per_second > 0
        assert 0.0 <= r.accuracy <= 1.0, r
        if r.library == "streamnb":  # two well-separated vocabularies, m = buckets seen
            assert r.accuracy >= 0.8, r
    ratios = mt.ratios(results, batch=10)
    assert set(ratios) == {f"{k}: streamnb b10 / {o}" for k in ("multinomial", "bernoulli")
                           for o in ("river", "sklearn b10")}
    assert all(v > 0 for v in ratios.values())


def test_bernoulli_vocabulary_sweep_reports_features_seen():
    prep = mt.prepare(synthetic_mail(20), bits=14, sklearn=False)
    rows = mt.bernoulli_vs_vocabulary(prep, vocabularies=(100, 1000), probe=5,
                                      river_max_vocab=1000, river_probe=3)
    ours = [r for r in rows if r[0] == "streamnb"]
    # 2 learnt documents of exactly `vocab` distinct columns, plus the first probe's own
    # features are not yet counted when seen is read: seen == vocab.
    assert [r[1] for r in ours] == [100, 1000]
    assert [r[1] for r in rows if r[0] == "river"] == [100, 1000]
    assert all(r[2] > 0 for r in rows)


def test_gaussian_throughput_on_small_data():
    X, y = gaussian_throughput.synthetic(300, 3)
    assert X.shape == (300, 3) and set(y) == {"c0", "c1", "c2"}
    Xb, yb = gaussian_throughput.breast_cancer(100)
    assert Xb.shape == (100, 30) and set(yb) <= {"malignant", "benign"}
    rows = gaussian_throughput.benchmark([("synthetic", X, y)], batches=(50,), cap=30.0)
    assert [r[3] for r in rows] == ["gaussian", "gaussian", "lda", "qda"]
    for row in rows:
        assert row[5] == 300 and row[6] > 0 and 0.5 <= row[7] <= 1.0
    assert rows[0][8] == 1.0  # River against itself


def test_model_bytes_counts_the_dense_tables():
    b = memory.model_bytes()
    # Two classes x 2**20 float64 counts = 16 MiB at least; the multinomial table
    # (2**20 x 3 float64) comes on top once a prediction derived it.
    assert b["statistics"] >= 2 * 2**20 * 8
    assert b["statistics + derived tables"] >= b["statistics"] + 3 * 2**20 * 8
    assert 0 < b["encoded (2 messages learnt)"] < 10_000


@needs_redis
def test_end_to_end_counts_every_message(tmp_path):
    corpus = synthetic_mail(150, seed=2)
    tokens = end_to_end.corpus_tokens(corpus)
    msgs = end_to_end.encode_messages(corpus, "tokens", tokens=tokens)
    with end_to_end.RedisServer() as server:
        # (batches of 50: several commits, so a rate to measure; the default batch takes 150 in one)
        res = end_to_end.run_e2e(server, "smoke", msgs, 1, "tokens", timeout=60, options={"batch": 50})
    assert res.messages == 150 and res.dead == 0
    assert res.per_second > 0 or math.isnan(res.per_second)  # nan if the commits shared one ms
    assert end_to_end.stamps_rate([7, 7, 7]) == (3, pytest.approx(float("nan"), nan_ok=True))
    for cores in (res.worker_cores, res.redis_cores):  # CPU over the processing window
        assert math.isnan(cores) or 0 <= cores < 4  # (nan: too short a window, or no /proc)
    for share in (res.host_idle, res.host_steal):
        assert math.isnan(share) or 0 <= share <= 1


def test_every_run_is_also_a_share_of_the_empty_consumer():
    """9,000 msg/s against the best empty consumer (36,000) is 25%; trial by trial each
    against the empty consumer of its own trial: 9,000 / 30,000 and 8,000 / 36,000."""
    from benchmarks._empty_consumer import EmptyConsumer

    one = end_to_end.E2EResult("tokens", 1, 9_750, 9_000.0, 0)
    report = {"results": [one], "refs": {}, "messages": 9_750, "cores": 2,
              "trials": {("tokens", 1): [9_000.0, 8_000.0]},
              "empty": {"tokens": [EmptyConsumer(9_750, 30_000.0, 25.0), EmptyConsumer(9_750, 36_000.0, 22.0)]}}
    line = next(x for x in end_to_end.summary(report) if "the empty consumer" in x)
    assert "36,000 msg/s, 22.0 us" in line and ": 25%, trial by trial: 30%, 22%" in line
    assert end_to_end.empty_share(report, one) == 0.25


def test_one_worker_on_tokens_is_also_a_multiple_of_river_in_process():
    """9,000 msg/s against River's 1,500 in this process is 6.0x; no River, no line."""
    from benchmarks._river_reference import river_rate, token_dicts

    one = end_to_end.E2EResult("tokens", 1, 9_750, 9_000.0, 0)
    report = {"results": [one], "refs": {end_to_end.RIVER: 1_500.0}, "messages": 9_750, "cores": 2}
    assert ("tokens: 1 worker / River's MultinomialNB in this process: 6.0x (target >= 10x)"
            in end_to_end.summary(report))
    report["refs"] = {}
    assert not any("River" in line for line in end_to_end.summary(report))
    counts = token_dicts([["free", "money", "free"], ["meeting", "notes"]] * 50)
    assert counts[0] == {"free": 1, "money": 1}
    assert river_rate(counts, ["spam", "ham"] * 50, cap=5.0) > 0


def test_the_rate_window_leaves_out_a_late_worker_and_the_end_of_the_run():
    """Worked by hand: w0 commits 100 outputs at 0, 100, ..., 1000 ms; w1 starts 400 ms
    late and commits at 400, 500, ..., 1400. Both commit from 400 to 1000: after the
    window's first millisecond there are 6 commits of each worker (500 .. 1000 ms), 1,200
    outputs in 0.6 s. From the first output to the last: 1,500 after the first ms in 1.4 s."""
    stamps, workers = [], []
    for t in range(0, 1001, 100):
        stamps += [t] * 100
        workers += ["w0"] * 100
    for t in range(400, 1401, 100):
        stamps += [t] * 100
        workers += ["w1"] * 100
    order = sorted(range(len(stamps)), key=stamps.__getitem__)
    stamps, workers = [stamps[i] for i in order], [workers[i] for i in order]
    n, per_s, skew = end_to_end.steady_rate(stamps, workers)
    assert (n, skew) == (2_200, 400)
    assert per_s == pytest.approx(1_200 / 0.6)
    assert end_to_end.stamps_rate(stamps)[1] == pytest.approx(2_100 / 1.4)
    # one worker: the window is the whole run
    alone = [t for t, w in zip(stamps, workers, strict=True) if w == "w0"]
    assert end_to_end.steady_rate(alone, ["w0"] * len(alone)) == (
        1_100, pytest.approx(1_000 / 1.0), 0)
    # a worker that started after the other had finished: no window, no rate
    late = end_to_end.steady_rate([0, 100, 200, 300], ["w0", "w0", "w1", "w1"])
    assert late[0] == 4 and math.isnan(late[1]) and late[2] == 200


def e2e_outputs(name: str, n_mail: int, seed: int, models: list[str], **kw) -> tuple:
    """:func:`end_to_end.run_e2e` of two workers (batches of 25) on ``n_mail`` synthetic
    mails, and the (millisecond, worker) of every output of each of ``models``' ``:out``."""
    from streamnb_workers.wire.outputs import decode_output

    corpus = synthetic_mail(n_mail, seed=seed)
    msgs = end_to_end.encode_messages(corpus, "tokens", tokens=end_to_end.corpus_tokens(corpus))
    with end_to_end.RedisServer() as server:
        res = end_to_end.run_e2e(server, name, msgs, 2, "tokens", timeout=60,
                                 options={"batch": 25}, **kw)
        client = server.client()
        outs = {m: [(end_to_end.id_ms(i), decode_output(f[b"data"])["worker"])
                    for i, f in client.xrange(end_to_end.keys(m)["out"])] for m in models}
    return res, outs


@needs_redis
def test_two_workers_rate_is_measured_while_both_commit():
    res, outs = e2e_outputs("smoke2", 600, 3, ["smoke2"])
    assert res.messages == 600 and res.dead == 0
    stamps, workers = (list(x) for x in zip(*outs["smoke2"], strict=True))
    assert set(workers) == {"w0", "w1"}  # both workers committed
    # the gated start: both began before the stream ran out, so there is a window to measure
    assert math.isfinite(res.per_second) and res.per_second > 0
    first = {w: stamps[workers.index(w)] for w in ("w0", "w1")}
    assert res.start_skew_ms == max(first.values()) - min(first.values())
    expected = end_to_end.steady_rate(stamps, workers)[1]
    assert res.per_second == pytest.approx(expected, nan_ok=True)
    assert res.first_to_last_per_second == pytest.approx(end_to_end.stamps_rate(stamps)[1],
                                                         nan_ok=True)


@needs_redis
def test_independent_workers_each_serve_a_model_of_their_own():
    res, outs = e2e_outputs("apart", 300, 4, ["apart", "apart-m0", "apart-m1"], independent=True)
    assert res.messages == 600 and res.dead == 0 and not outs["apart"]  # no shared model
    rates = []
    for i in (0, 1):  # every message through each model, by its own worker
        entries = outs[f"apart-m{i}"]
        assert len(entries) == 300 and {w for _, w in entries} == {f"w{i}"}
        rates.append(end_to_end.steady_rate([t for t, _ in entries], ["w"] * 300)[1])
    assert res.per_second == pytest.approx(sum(rates), nan_ok=True)


def test_host_cpu_splits_proc_stat_into_idle_steal_and_busy():
    from benchmarks._common import host_cpu_s

    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks of 1/100 s
    assert host_cpu_s("cpu  300 20 100 1000 200 10 30 40 5 0\ncpu0 1 2 3", tick=100) == \
        pytest.approx((12.0, 0.4, 4.6))  # idle = idle + iowait; guest is counted in user
    idle, steal, busy = host_cpu_s()  # this host, since boot
    assert math.isnan(idle) or (idle >= 0 and steal >= 0 and busy > 0)


def test_the_scaling_ceiling_leaves_out_redis_server_and_one_core_per_worker():
    """Worked by hand: two workers at 1.5 cores for 15,000 msg/s use 100 us per message;
    a 2-core host with redis-server on 0.25 of a core leaves 1.75 cores: 17,500 msg/s,
    1.75x one worker's 10,000. On 8 cores the two workers are the bound: 20,000, 2x."""
    E = end_to_end.E2EResult
    one = E("tokens", 1, 9_750, 10_000.0, 0, redis_cpu_us=30.0, worker_cores=0.95, redis_cores=0.2)
    two = E("tokens", 2, 9_750, 15_000.0, 0, redis_cpu_us=20.0, worker_cores=1.5, redis_cores=0.25)
    assert two.worker_cpu_us == pytest.approx(100.0)
    assert end_to_end.scaling_ceiling(one, two, cores=2) == pytest.approx(1.75)
    assert end_to_end.scaling_ceiling(one, two, cores=8) == pytest.approx(2.0)
    lines = end_to_end.summary({"results": [one, two], "refs": {}, "messages": 9_750, "cores": 2})
    assert "tokens: 2 workers / 1 worker: 1.50x (target >= 1.6x); without waits at most " \
           "1.75x on 2 cores (2 workers' 100 us of CPU per message, redis-server's 0.25 " \
           "cores left out)" in lines
    # 1.6x of 10,000 msg/s on 2 cores: 2 s of CPU for 16,000 messages, 125 us each
    assert end_to_end.scaling_budget_us(one, 1.6, cores=2) == pytest.approx(125.0)
    assert "tokens: 1.6x on 2 cores leaves 125 us of CPU per message for 2 workers and " \
           "redis-server together; they used 100 + 20 (1 worker alone: 95 + 30)" in lines
    late = E("tokens", 2, 9_750, 15_000.0, 0, start_skew_ms=120, first_to_last_per_second=13_000.0)
    lines = end_to_end.summary({"results": [one, late], "refs": {}, "messages": 9_750, "cores": 2})
    assert "tokens: 2 workers from the first output to the last (the second worker's start, " \
           "120 ms later, inside): 13,000 msg/s, 1.30x" in lines
    assert not any("first output to the last" in line for line in end_to_end.summary(
        {"results": [one, two], "refs": {}, "messages": 9_750, "cores": 2}))
    lines = end_to_end.summary({"results": [one, two], "refs": {}, "messages": 9_750, "cores": 2,
                                "trials": {("tokens", 1): [10_000.0, 8_000.0],
                                           ("tokens", 2): [15_000.0, 14_000.0]}})
    assert "tokens: 2 workers / 1 worker, trial by trial: 1.50x, 1.75x" in lines
    lines = end_to_end.summary({"results": [one, two], "refs": {}, "messages": 9_750, "cores": 2,
                                "side_by_side": {"tokens": [1.62, 1.8]}, "most_workers": 2})
    assert "tokens: 2 in-process pipelines side by side (no Redis) / one alone, trial by " \
           "trial: 1.62x, 1.80x (the host's own scaling of 2 processes)" in lines
    # two workers on models of their own against the one worker of the same trial:
    # 18,000 / 10,000 and 12,000 / 8,000; 1.4 and 1.35 cores for 18,000 and 12,000 msg/s
    apart = [E("tokens", 2, 19_500, 18_000.0, 0, worker_cores=1.4),
             E("tokens", 2, 19_500, 12_000.0, 0, worker_cores=1.35)]
    lines = end_to_end.summary({"results": [one, two], "refs": {}, "messages": 9_750, "cores": 2,
                                "trials": {("tokens", 1): [10_000.0, 8_000.0],
                                           ("tokens", 2): [15_000.0, 14_000.0]},
                                "independent": {"tokens": apart}, "most_workers": 2})
    assert "tokens: 2 workers on 2 independent models (nothing shared: no other worker's " \
           "deltas, no ordering) / 1 worker, trial by trial: 1.80x, 1.50x; their CPU 78-112 " \
           "us a message" in lines
    raw = E("raw", 1, 9_750, 6_000.0, 0)
    lines = end_to_end.summary({"results": [raw], "messages": 9_750, "cores": 2,
                                "refs": {"bare email.message_from_bytes": 10_000.0},
                                "trials": {("raw", 1): [6_000.0, 5_000.0]},
                                "bare_by_trial": [10_000.0, 6_250.0]})
    assert "raw mail, 1 worker / bare email.message_from_bytes: 60% (target >= 90%)" in lines
    assert "raw mail, 1 worker / bare email.message_from_bytes, trial by trial: 60%, 80%" in lines


def test_spy_stages_takes_the_first_stage_in_order_and_splits_off_waits_for_redis():
    """py-spy's raw lines, made by hand: a log entry applied inside the ordering wait is
    applying; the wait's socket read is waiting for Redis; a frame of no stage (imports)
    is elsewhere; lines without a count are skipped."""
    run = "<module> (workers/worker/__init__.py:1);main (workers/worker/__init__.py:70);Worker.run (workers/worker/loop.py:160);"
    batch = "process_batch (workers/worker/process.py:70);"
    decode = "decode (workers/worker/process.py:130);decode_entries (workers/worker/batch.py:150);"
    wait = ("catch_up (workers/worker/process.py:160);await_earlier (workers/worker/process.py:172);"
            "wait_for_earlier (workers/replication/ordering.py:169);")
    tail = "ModelRuntime.tail (workers/worker/runtime.py:131);Replica.catch_up (workers/replication/replica.py:233);"
    recv = "Pipeline.execute (redis/client.py:1);_HiredisParser.read_from_socket (redis/_parsers/hiredis.py:179)"
    lines = [
        run + batch + decode + "decode_input (streamnb/codec.py:244);_unpack (streamnb/codec.py:121) 7",
        run + batch + "featurize (workers/worker/batch.py:180);Featurizer.featurize_batch "
        "(streamnb/features/featurizer.py:452) 5",
        run + batch + wait + tail + "Replica.apply (workers/replication/replica.py:150) 3",
        run + batch + wait + tail + recv + " 11",
        run + batch + "drop_foreign_labels (workers/worker/batch.py:200) 2",
        "<module> (numpy/__init__.py:1) 4",
        "garbage without a count",
    ]
    assert end_to_end.spy_stages(lines) == {
        "decode (msgpack)": (7, 0), "featurize": (5, 0), "apply other workers' deltas": (3, 0),
        "ordering wait (log polls, :inflight)": (0, 11), "rest of the batch (Python glue)": (2, 0),
        end_to_end.SPY_OUTSIDE: (4, 0)}


def _py_spy_usable() -> str | None:
    """Why py-spy cannot profile a process here, or None."""
    import shutil

    if shutil.which("py-spy") is None:
        return "py-spy is not installed (the bench extra)"
    r = subprocess.run(["py-spy", "dump", "--pid", str(os.getpid())], capture_output=True,
                       text=True, timeout=60)
    return None if r.returncode == 0 else f"py-spy cannot attach here: {r.stderr.strip()[:200]}"


@needs_redis
@pytest.mark.slow
def test_spy_run_profiles_the_workers_for_the_measured_window():
    why = _py_spy_usable()
    if why:
        pytest.skip(why)
    # long enough a run that py-spy, which takes a moment to attach, samples most of it
    msgs = end_to_end.repeated_messages(synthetic_mail(400, seed=5), "tokens", 40)
    assert len(msgs) == 16_000
    result, seconds = end_to_end.spy_run(msgs, "tokens", 1, hz=500)
    assert result.messages == 16_000 and result.dead == 0
    busy = {stage: b for stage, (b, _) in seconds.items()}
    # the window is the processing: most samples are in the batch's stages, and decoding
    # and featurizing are among them (start-up, outside the window, is not sampled)
    assert busy.get("decode (msgpack)", 0) > 0 and busy.get("featurize", 0) > 0
    in_stages = sum(b + w for stage, (b, w) in seconds.items() if stage != end_to_end.SPY_OUTSIDE)
    assert in_stages > 0.8 * sum(b + w for b, w in seconds.values())


@needs_redis
def test_commands_run_counts_the_window_commands_of_the_workers_only():
    msgs = end_to_end.repeated_messages(synthetic_mail(300, seed=9), "tokens", 40)
    result, n_window, stats = end_to_end.commands_run(msgs, "tokens", 2)
    assert result.messages == 12_000 and result.dead == 0
    # the window starts at the first output: a batch or more was done before it
    assert 0 < n_window < 12_000
    # every output of the window is one XADD (run by the commit script), and so is every
    # commit's log entry (at most one per script call: commits, and reads behind them);
    # the producer's 12,000 XADDs, before the window, are not counted
    scripts = stats["evalsha"][0]
    assert n_window < stats["xadd"][0] <= n_window + scripts
    assert stats["evalsha"][0] >= 1 and stats["evalsha"][1] > stats["xadd"][1] > 0
    assert "config|resetstat" not in stats  # the tool's own reset


@needs_redis
def test_commands_table_lists_the_commit_script_per_worker_count(tmp_path, capsys):
    argv = ["--commands", "tokens", "--workers", "1,2", "--corpus", str(tmp_path / "none"),
            "--limit", "300", "--repeat", "20"]
    assert end_to_end.main(argv) == 0
    out = capsys.readouterr().out
    table = out[out.index("\ncommand  ") + 1:]
    header = table.splitlines()[0].split()
    assert header[1:] == ["1w", "calls", "1w", "us/msg", "2w", "calls", "2w", "us/msg"]
    evalsha = next(line.split() for line in table.splitlines() if line.startswith("evalsha"))
    assert int(evalsha[1].replace(",", "")) >= 1 and float(evalsha[2]) > 0
    assert "1 worker(s):" in out and "2 worker(s):" in out
    assert "config|resetstat" not in table  # the tool's own command


def test_side_by_side_pipelines_run_at_the_same_time_and_a_failure_does_not_hang():
    from streamnb_workers.wire.codec import encode_input

    msgs = [encode_input("tokens", [f"t{i % 7}", "x"], label="ab"[i % 2]) for i in range(600)]
    spans = end_to_end.side_by_side_spans(msgs, 2, batch=50)
    assert len(spans) == 2 and all(t0 < t1 for t0, t1 in spans)
    assert max(t0 for t0, _ in spans) < min(t1 for _, t1 in spans)  # they overlapped
    with pytest.raises(RuntimeError, match="side-by-side pipeline failed"):
        end_to_end.side_by_side_spans([b"\xc1"] * 10, 2, batch=5)  # not msgpack: a child fails


@needs_redis
def test_daemon_accuracy_only_the_first_message_is_unlabelled():
    corpus = synthetic_mail(250, seed=3)
    s = daemon_accuracy.through_daemon(corpus, n_workers=1, timeout=60)
    # One worker, everything pre-filled: the first batch of 100 is predicted prequentially
    # (WorkerOptions.prequential), so only the very first message comes before any class.
    assert s.n == 250 and s.unpredicted == 1
    assert s.accuracy_labelled >= 0.9


@needs_redis
def test_latency_measures_each_produced_message():
    corpus = synthetic_mail(120, seed=4)
    rows = latency.benchmark(corpus, rates=(40.0,), worker_counts=(1,), seconds=0.5)
    assert len(rows) == 1
    workers, target, achieved, n, p50, p99, pmax = rows[0]
    assert (workers, target, n) == (1, 40.0, 20)
    assert 0 <= p50 <= p99 <= pmax


@needs_redis
def test_memory_checkpoints():
    corpus = synthetic_mail(50, seed=5)
    rows, extra = memory.benchmark(end_to_end.corpus_tokens(corpus), corpus.labels, [200],
                                   noise=3, chunk=100)
    assert [r[0] for r in rows] == [0, 200]
    assert rows[1][1] > 0 and rows[1][2] > 0
    assert extra["redis bytes per cached message"] > 0


@needs_redis
def test_memory_long_run_reports_redis_and_every_stream(capsys):
    corpus = synthetic_mail(50, seed=5)
    rows = memory.long_run(end_to_end.corpus_tokens(corpus), corpus.labels, 400, noise=3,
                           report_s=0.5, chunk=100,
                           options={"input_trim_s": 0.2, "out_maxlen": 100, "batch": 50})
    assert rows[0][1] == 0 and rows[-1][1] == 400
    seconds, done, used, rss, worker, *lengths = rows[-1]
    assert used > 0 and rss > 0 and worker > 0
    assert len(lengths) == len(memory.STREAMS)
    assert lengths[memory.STREAMS.index("out")] <= 200  # (MAXLEN ~ 100: whole nodes)
    assert "done 400" in capsys.readouterr().out


def test_bernoulli_incremental_refresh_matches_full_derivation():
    """What benchmark 1's vocabulary sweep relies on: BernoulliNB refreshed batch after
    batch (the incremental path) scores exactly as one derived from scratch from the same
    statistics, through weights, unlearning and forgetting."""
    import scipy.sparse as sp

    from streamnb.models.bernoulli import BernoulliNB

    rng = np.random.default_rng(0)
    for smoothing_m in ("columns", "seen"):
        model = BernoulliNB(0.5, n_features=200, smoothing_m=smoothing_m)
        for step in range(25):
            X = sp.random(int(rng.integers(1, 6)), 200, density=0.05, random_state=rng, format="csr")
            y = list(rng.choice(["a", "b", "c"], size=X.shape[0]))
            w = rng.uniform(0.5, 2.0, size=X.shape[0]) if step % 3 == 0 else None
            model.partial_fit(X, y, sample_weight=w)
            if step % 7 == 6:
                model.unlearn(X, y, sample_weight=w)
            if step == 12:
                model.decay(0.9)
            Xt = sp.random(4, 200, density=0.1, random_state=rng, format="csr")
            fresh = BernoulliNB.from_stats(model.stats, **model.get_params())
            np.testing.assert_allclose(model.predict_joint_log_proba(Xt),
                                       fresh.predict_joint_log_proba(Xt), rtol=1e-10, atol=1e-9)


def test_array_sorts_times_each_step_on_equal_results():
    from benchmarks import array_sorts

    rows = array_sorts.measure(rows=5, per_row=20, columns=300, repeat=1)
    assert [r[0].split(":")[0].strip() for r in rows] == [
        "featurize", "plan", "(its packed words", "class sums", "delta merge"]
    assert all(ref > 0 and ours > 0 for _, _, ref, ours in rows)


@needs_redis
def test_commit_cost_reads_redis_own_time_for_each_variant():
    from benchmarks import commit_cost

    with end_to_end.RedisServer() as server:
        client = server.client()
        res = commit_cost.commit_cost(client, batches=2, batch=5)
        reads = commit_cost.read_cost(client, batches=3, batch=4, entry_bytes=50)
        # every variant read every entry (else its time per message would mean nothing)
        pending = [client.xpending(commit_cost.ModelKeys(f"read-{i}").input, GROUP)["pending"]
                   for i in range(2)]
        per_message = [client.hlen(commit_cost.message_hash(commit_cost.ModelKeys("cost-hash"), f"{b}-{i}"))
                       for b in range(2) for i in range(5)]
        buckets = client.keys(commit_cost.ModelKeys("cost0").cache_bucket_prefix + "*")
        cached = sum(client.hlen(k) for k in buckets)
    assert len(res) == 4 and all(math.isfinite(v) and v > 0 for v in res.values())
    # the arguments alone cost less than the commit that gets them
    assert res["the default commit's arguments, to a script returning at once"] < \
        res["commit, cache entries (default: bucket hashes)"]
    assert list(reads) == ["read a batch: XREADGROUP", "read a batch: workers/store/scripts/read.lua"]
    assert all(math.isfinite(v) and v > 0 for v in reads.values())
    assert pending == [12, 12] and per_message == [5] * 10
    assert cached == 10 and 1 <= len(buckets) <= 10  # the default commit wrote every entry


@needs_redis
def test_commit_cost_of_replication_variants_on_a_master_and_replica():
    """Each variant commits every batch on a master with one replica, and the replica holds
    every log entry afterwards (the function raises otherwise; WAIT's reply is checked)."""
    from benchmarks import commit_cost

    res = commit_cost.replication_cost(batches=3, batch=5, row_bytes=40, out_bytes=20,
                                       delta_bytes=10)
    assert list(res) == list(commit_cost.REPLICATION_VARIANTS)
    assert all(ms > 0 and math.isfinite(cpu) and cpu >= 0 for ms, cpu in res.values())


@needs_redis
def test_commit_cost_writes_the_outputs_both_ways():
    """The outputs variant: each way writes every output, byte for byte, and is timed
    from Redis' own accounting (the function checks the stream and raises otherwise)."""
    from benchmarks import commit_cost

    with end_to_end.RedisServer() as server:
        client = server.client()
        res = commit_cost.outputs_cost(client, batches=3, batch=7, out_bytes=20)
        lengths = [client.xlen(f"outputs-{i}") for i in range(2)]
        # the cut is by position: a blob of 7 outputs of 20 bytes gives them back in order
        sent = [bytes([i]) * 20 for i in range(7)]
        commit_cost._XADD_CUT_FROM_ONE(client, ["cut-check"], [b"".join(sent), 7, 20])
        cut = [f[b"data"] for _, f in client.xrange("cut-check")]
    ways = ["outputs written: one argument each (the commit's way)",
            "outputs written: one argument for the batch, cut in the script"]
    assert list(res) == [f"{w}: {what}" for w in ways for what in ("the script", "redis-server CPU")]
    assert all(math.isfinite(v) and v >= 0 for v in res.values())
    assert all(res[f"{w}: the script"] > 0 for w in ways)
    assert lengths == [21, 21] and cut == sent


@needs_redis
def test_commit_cost_sends_the_same_writes_through_lua_and_as_plain_commands(monkeypatch):
    """The Lua layer's variant: both ways leave the same outputs, log, learnt count and
    cache entries, nothing pending; a way that leaves out a write is caught."""
    from benchmarks import commit_cost

    with end_to_end.RedisServer() as server:
        client = server.client()
        res = commit_cost.lua_layer_cost(client, batches=3, batch=6, row_bytes=40,
                                         out_bytes=16, delta_bytes=8)
        both = [commit_cost.ModelKeys(f"lua-layer-{i}") for i in range(2)]
        lengths = [(client.xlen(k.out), client.xlen(k.log), int(client.get(k.learnt)))
                   for k in both]
        client.flushall()
        real = commit_cost._plain_commit

        def without_the_learnt_count(client, keys, ids, req):
            req.n_learnt = 0
            real(client, keys, ids, req)

        monkeypatch.setattr(commit_cost, "_plain_commit", without_the_learnt_count)
        with pytest.raises(RuntimeError, match="the same writes"):
            commit_cost.lua_layer_cost(client, batches=2, batch=3, row_bytes=40)
    assert list(res) == ["the commit script (workers/store/scripts/commit.lua): redis-server CPU",
                         "the same writes as plain commands in one MULTI: redis-server CPU"]
    assert all(math.isfinite(v) and v > 0 for v in res.values())
    assert lengths == [(18, 3, 18)] * 2


@needs_redis
def test_the_ownership_check_cut_from_the_commit_script_finds_lost_ids():
    """benchmarks.commit_cost times the commit's first step on its own: it must be the
    real check (it reports an id acknowledged meanwhile, and one of another consumer)."""
    from benchmarks import commit_cost

    with end_to_end.RedisServer() as server:
        client = server.client()
        keys = commit_cost.ModelKeys("own-test")
        client.xgroup_create(keys.input, GROUP, id="0", mkstream=True)
        ids = commit_cost._pending_ids(client, keys, 6)
        check = commit_cost.ownership_script()
        assert check(client, [keys.input], [GROUP, "bench", 6, *ids]) == b"ok"
        client.xack(keys.input, GROUP, ids[2])
        client.xclaim(keys.input, GROUP, "other", 0, [ids[4]])
        assert check(client, [keys.input], [GROUP, "bench", 6, *ids]) == \
            [b"lost", ids[2].encode(), ids[4].encode()]
        costs = commit_cost.ownership_cost(client, batches=2, batch=5)
    assert list(costs) == ["the commit's ownership check alone",
                           "one XPENDING over the batch's range alone"]
    assert all(math.isfinite(v) and v > 0 for v in costs.values())


def test_commit_packing_cost_times_each_packer_on_the_same_bytes():
    from benchmarks import commit_cost

    res = commit_cost.packing_cost(batch=5, repeat=1)
    assert "redis-py (hiredis)" in res and all(v > 0 for v in res.values())


@needs_redis
@pytest.mark.skipif(sys.platform != "linux", reason="process CPU is read from /proc")
def test_the_cpu_window_reads_a_busy_process_as_about_one_core():
    """The cores columns of the end-to-end table: a process spinning for the whole window
    is about one core, running or waiting for one (on a loaded host it waits), an idle
    redis-server about none."""
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 5: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    try:
        with end_to_end.RedisServer() as server:
            window = end_to_end.CpuWindow(server.client(), [busy])
            window.start()
            time.sleep(0.8)
            window.stop()
    finally:
        busy.kill()
        busy.wait()
    assert 0 < window.worker_cores <= 1.2 and 0 <= window.redis_cores < 0.3
    assert 0.7 < window.worker_cores + window.worker_runqueue < 1.3


@needs_redis
@pytest.mark.skipif(sys.platform != "linux", reason="the run queue is read from /proc")
def test_the_cpu_window_reads_the_run_queue_wait_of_more_processes_than_cores():
    """The run-queue column: one more spinning process than the host has cores, so each
    waits for a CPU about 1/(cores + 1) of the time, none of it the processes' doing."""
    cores = os.cpu_count() or 1
    spin = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 5: pass"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(cores + 1)]
    try:
        with end_to_end.RedisServer() as server:
            window = end_to_end.CpuWindow(server.client(), busy)
            time.sleep(0.3)
            window.start()
            time.sleep(1.5)
            window.stop()
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert 0.5 / (cores + 1) < window.worker_runqueue < 1.0


def test_instructions_per_message_is_the_difference_of_two_counted_runs(monkeypatch, capsys):
    """benchmarks.instructions: (instructions with 3 passes - with 1) / (2 x messages), so
    that start-up, imports and loading the corpus cancel out; for a worker, less what the
    same process counts for the producer alone."""
    from benchmarks import instructions

    counted = {1: 7_000_000, 3: 7_600_000}
    producer = {1: 100_000, 3: 300_000}
    calls: list[tuple[str, int]] = []

    def fake_count(what, corpus, messages, reps, cache=False, ll_bytes=1 << 20, duties=None):
        calls.append((what, reps))
        return {"instructions": (producer if what.startswith("producer-") else counted)[reps]}

    monkeypatch.setattr(instructions.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(instructions, "count", fake_count)
    assert instructions.main(["--what", "featurize,worker-hashes", "--messages", "100"]) == 0
    out = capsys.readouterr().out
    assert calls == [("featurize", 1), ("featurize", 3), ("worker-hashes", 1), ("worker-hashes", 3),
                     ("producer-hashes", 1), ("producer-hashes", 3)]
    assert "3,000" in out  # featurize: (7.6M - 7.0M) / 200
    assert "2,000" in out  # the worker: (7.6M - 0.3M - (7.0M - 0.1M)) / 200
    producer_row = next(line for line in out.splitlines() if line.startswith("(producer-hashes"))
    assert producer_row.split()[-1] == "1,000"  # what was taken off: (0.3M - 0.1M) / 200
    assert instructions.collected("==7== Collected : 1,234,567\n") == 1234567
    counted.update({0: 6_900_000, 1: 7_000_000})
    calls.clear()
    assert instructions.main(["--what", "featurize", "--messages", "100", "--first-pass"]) == 0
    assert calls == [("featurize", 0), ("featurize", 1)]
    assert "1,000" in capsys.readouterr().out  # (7.0M - 6.9M) / 100
    by_what = {"bare": {1: 1_000_000, 3: 1_200_000}, "worker-raw": {1: 2_000_000, 3: 2_500_000},
               "producer-raw": {1: 200_000, 3: 300_000}}
    monkeypatch.setattr(instructions, "count", lambda what, corpus, messages, reps, cache=False,
                        ll_bytes=1 << 20, duties=None: {"instructions": by_what[what][reps]})
    assert instructions.main(["--what", "worker-raw,bare", "--messages", "100"]) == 0
    assert "in instructions: 50.0%" in capsys.readouterr().out  # 1,000 / 2,000 per message


def test_instructions_count_the_duties_on_the_clock_apart(monkeypatch, capsys, tmp_path):
    """A worker's duties on the clock (their count depends on the run's wall time, so on
    the host's load) are the dumps named ``duties``: taken off the worker's figure and
    printed on a line of their own; the per-message work stays in the figure."""
    from benchmarks import instructions

    for i, (name, total) in enumerate([(b"duties", b"summary: 700"), (b"decode", b"summary: 50"),
                                       (b"duties", b"summary: 300")]):
        (tmp_path / f"duties.worker-hashes.3.{i}").write_bytes(
            b"version: 1\ndesc: Trigger: Client Request: " + name + b"\n" + total + b"\n")
    seen: list[list[str]] = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, "", "==1== Collected : 5,000\n")

    monkeypatch.setattr(instructions.subprocess, "run", fake_run)
    got = instructions.count("worker-hashes", "corpus", 100, 3, duties=str(tmp_path))
    assert got == {"instructions": 4000, "duties": 1000}  # Collected holds every dump's count
    assert seen[0][seen[0].index("--inner-duties") + 1] == str(tmp_path / "libmarker.so")
    assert not list(tmp_path.glob("duties.*"))  # the dumps read, then removed
    assert instructions.count("featurize", "corpus", 100, 3, duties=str(tmp_path)) == {"instructions": 5000}
    assert "--inner-duties" not in seen[-1]

    runs = {("worker-hashes", 1): {"instructions": 7_000_000, "duties": 50_000},
            ("worker-hashes", 3): {"instructions": 7_600_000, "duties": 450_000},
            ("producer-hashes", 1): {"instructions": 100_000},
            ("producer-hashes", 3): {"instructions": 300_000}}
    monkeypatch.setattr(instructions.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(instructions, "duties_marker", lambda directory: directory)
    monkeypatch.setattr(instructions, "count", lambda what, corpus, messages, reps, cache=False,
                        ll_bytes=1 << 20, duties=None: dict(runs[what, reps]))
    assert instructions.main(["--what", "worker-hashes", "--messages", "100"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("worker-hashes "))
    assert row.split()[-1] == "2,000"  # (7.6M - 0.3M - (7.0M - 0.1M)) / 200: no duties in it
    assert "duties on the clock and the shutdown, apart" in out and "2,000 a message" in out  # 400k / 200
    # the library not built: the duties stay in, and the script says so
    monkeypatch.setattr(instructions, "duties_marker", lambda directory: None)
    runs = {k: {"instructions": v["instructions"]} for k, v in runs.items()}
    assert instructions.main(["--what", "worker-hashes", "--messages", "100"]) == 0
    assert "the duties on the clock and the shutdown are IN the figure" in capsys.readouterr().out


def test_the_duties_wrap_the_workers_shutdown(monkeypatch):
    """The worker's clean shutdown (its last publish of token names) is counted with the
    duties: ``Class.method`` names in the tables are wrapped too."""
    from benchmarks import _steps
    from streamnb_workers.worker import loop

    dumps: list[bytes] = []

    class Lib:
        def streamnb_dump(self, name: bytes) -> None:
            dumps.append(name)

    assert ("streamnb_workers.worker.loop", ("housekeeping", "claim_idle_entries",
                                             "Worker.shutdown")) in _steps.DUTIES
    monkeypatch.setattr(loop.Worker, "shutdown", lambda self: "down")
    _steps._wrap_all(Lib(), [("streamnb_workers.worker.loop", ("Worker.shutdown",))], "duties")
    assert loop.Worker.shutdown(object()) == "down" and dumps == [b"between", b"duties"]


def test_instructions_by_step(monkeypatch, capsys, tmp_path):
    """``--steps``: each step's instructions a message from callgrind's dumps (named after
    the step), the difference of two runs as for the totals; the rest is the worker's
    figure less the steps'."""
    from benchmarks import _steps, instructions

    for i, (name, total) in enumerate([(b"decode", b"summary: 1200"), (b"decode", b"summary: 800"),
                                       (b"between", b"totals: 5")]):
        (tmp_path / f"run.{i}").write_bytes(b"version: 1\ndesc: Trigger: Client Request: " + name
                                             + b"\n" + total + b"\n")
    assert _steps.step_totals(str(tmp_path / "run")) == {"decode": 2000, "between": 5}
    runs = {1: {"decode": 1_000_000, "predict_items": 500_000, "between": 9},
            3: {"decode": 1_400_000, "predict_items": 900_000, "between": 99}}
    monkeypatch.setattr(_steps, "build_marker", lambda directory: directory / "libmarker.so")
    monkeypatch.setattr(instructions, "count_steps",
                        lambda what, corpus, messages, reps, marker, directory: runs[reps])
    instructions.print_steps("worker-hashes", "corpus", 100, 1, 3, 5000.0)
    rows = {line.split()[0]: line.split()[-2:] for line in capsys.readouterr().out.splitlines()
            if line.startswith(("decode", "predict_items", "featurize", "(the rest)"))}
    assert rows["decode"] == ["2,000", "40%"] and rows["predict_items"] == ["2,000", "40%"]
    assert rows["featurize"] == ["0", "0%"] and rows["(the"] == ["1,000", "20%"]
    monkeypatch.setattr(instructions.shutil, "which", lambda name: "/usr/bin/" + name)
    with pytest.raises(SystemExit) as exc:
        instructions.main(["--what", "worker-hashes", "--steps", "--first-pass"])
    assert exc.value.code == 2


def test_instructions_with_cache_misses(monkeypatch, capsys):
    """``--cache``: cachegrind's instructions and simulated misses, per message, each the
    difference of two runs."""
    from benchmarks import instructions

    runs = {1: {"instructions": 5_000_000, "L1d misses": 40_000, "L2 misses": 9_000},
            3: {"instructions": 5_400_000, "L1d misses": 52_000, "L2 misses": 9_600}}
    seen: list[tuple[bool, int]] = []
    monkeypatch.setattr(instructions.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(instructions, "count", lambda what, corpus, messages, reps, cache=False,
                        ll_bytes=1 << 20, duties=None: seen.append((cache, ll_bytes)) or runs[reps])
    assert instructions.main(["--what", "featurize", "--messages", "100", "--cache"]) == 0
    out = capsys.readouterr().out
    assert seen == [(True, 1 << 20)] * 2 and "L2 misses per message" in out and "cachegrind" in out
    row = next(line for line in out.splitlines() if line.startswith("featurize"))
    assert row.split()[-3:] == ["2,000", "60", "3"]  # 400k, 12k and 600 over 200 messages
    # a last level of another size (an L3, or the share of it a worker beside another has):
    # passed to cachegrind, and the column says which
    seen.clear()
    assert instructions.main(["--what", "featurize", "--messages", "100", "--cache",
                              "--ll-bytes", str(16 << 20)]) == 0
    out = capsys.readouterr().out
    assert seen == [(True, 16 << 20)] * 2 and "last level (16 MiB) misses per message" in out
    assert instructions.cache_sim(16 << 20)[-1] == "--LL=16777216,16,64"
    for bad in (["--ll-bytes", "3000000", "--cache"], ["--ll-bytes", "1024", "--cache"],
                ["--ll-bytes", str(32 << 20)]):  # not a power of two; too small; without --cache
        with pytest.raises(SystemExit) as exc:
            instructions.main(["--what", "featurize", *bad])
        assert exc.value.code == 2
    assert "--ll-bytes" in capsys.readouterr().err
    summary = ("==9== I   refs:      4,741,104,440\n==9== I1  misses: 1\n"
               "==9== D1  misses:       23,516,065  (   16,305,866 rd   +   7,210,199 wr)\n"
               "==9== LLd misses:        3,151,962  (    2,288,593 rd   +     863,369 wr)\n")
    assert instructions.cache_counts(summary) == {
        "instructions": 4_741_104_440, "L1d misses": 23_516_065, "L2 misses": 3_151_962}
    with pytest.raises(RuntimeError, match="L2 misses"):
        instructions.cache_counts(summary.replace("LLd", "LL?"))


def test_instructions_without_valgrind_or_with_a_bad_workload_says_so(monkeypatch, capsys):
    from benchmarks import instructions

    monkeypatch.setattr(instructions.shutil, "which", lambda name: None)
    assert instructions.main(["--what", "featurize"]) == 2
    assert "valgrind is not installed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        instructions.main(["--what", "featurize,nope"])
    assert exc.value.code == 2


@needs_redis
def test_the_counted_workloads_run_on_a_few_messages(tmp_path):
    """What valgrind counts: the featurizing and a worker over its own redis-server (here
    without valgrind, on synthetic mail: tmp_path holds no corpus)."""
    from benchmarks import instructions

    for what in instructions.WORKLOADS:
        assert instructions.main(["--inner", what, "--messages", "30", "--corpus", str(tmp_path),
                                  "--reps", "2"]) == 0


def test_corpus_row_bytes_compares_the_cached_row_with_the_map_form(tmp_path):
    from benchmarks import commit_cost
    from benchmarks._common import DEFAULT_CORPUS, corpus_available

    assert commit_cost.corpus_row_bytes(tmp_path) is None  # no corpus: nothing to say
    if not corpus_available(DEFAULT_CORPUS):
        pytest.skip("the SpamAssassin corpus is not at ../shared/corpus")
    sizes = commit_cost.corpus_row_bytes(DEFAULT_CORPUS)
    assert 0 < sizes["cached"] < 0.6 * sizes["map"] and 0.5 < sizes["gaps share"] < 1
    assert sizes["gaps us"] > 0 and sizes["map us"] > 0


def test_explain_cost_runs_on_a_few_messages(capsys):
    from benchmarks import explain_cost

    assert explain_cost.main(["--train", "40", "--batch", "10", "--batches", "2", "--k", "3",
                              "--capacity", "50"]) == 0
    out = capsys.readouterr().out
    assert "explain K=3, named" in out and "token names, capacity 50" in out


def test_autolearn_labels_every_kth_message_and_scores_flags_by_hand():
    import msgpack

    from benchmarks._common import Corpus
    from benchmarks.autolearn import figures, messages

    corpus = Corpus([b"Subject: a\n\nx"] * 4, ["spam", "ham", "ham", "spam"])
    labels = [msgpack.unpackb(m).get("label") for m in messages(corpus, 2)]
    assert labels == ["spam", None, "ham", None]
    # right: 1, 2 (ham not flagged), 4 missed -> 2 of 4; one ham of two flagged
    assert figures([True, False, True, False], corpus) == (0.5, 0.5, 1)


@needs_redis
def test_class_removal_releases_the_class_keys_alone():
    from benchmarks import class_removal

    seconds, left = class_removal.removal_seconds(3000, 40)
    assert left == 3000 - 40 and seconds > 0
    seconds, released = class_removal.since_seconds(3000)
    assert released == 3000 // 4 and seconds > 0


def test_protocols_client_run_counts_answers_right_and_not_scored():
    from benchmarks.protocols import client_run

    answers = {b"a": "spam", b"b": "ham", b"c": None}
    mails = [(b"a", "spam"), (b"b", "spam"), (b"c", "ham"), (b"a", "spam")]
    run = client_run("stub", lambda port, raw: answers[raw], 0, mails, 1, 2)
    assert (run.mails, run.right, run.not_scored, len(run.whole)) == (4, 2, 1, 4)


@needs_redis
def test_users_run_serves_every_user_and_times_the_cold_ones():
    from benchmarks._users import run_users

    corpus = synthetic_mail(24, seed=3)
    msgs = end_to_end.repeated_messages(corpus, "tokens", 1)
    unlabelled = end_to_end.encode_messages(corpus, "tokens", labelled=False)[0]
    run = run_users(msgs, unlabelled, 6, 8, replica_memory=4096, cold=2, timeout=120)
    assert run.messages == 24 and run.per_second > 0
    assert len(run.cold_first_ms) == len(run.cold_next_ms) == 2
    assert run.rss_mib > 0 and run.idle_rss_mib > 0  # (the worker trims its heap: either way)


def test_users_table_prints_a_dash_without_cold_users():
    from benchmarks._users import _median_max

    assert _median_max([]) == "-"
    assert _median_max([3.0, 1.0, 8.0]) == "3.0 (max 8)"


@needs_redis
def test_duties_run_reads_every_heartbeat_of_an_idle_worker():
    from benchmarks._users import run_duties

    d = run_duties(12, 8, replica_memory=2**30, seconds=5.0, timeout=120)
    assert 0 <= d["max_age_s"] < 30 and d["cpu"] >= 0


@needs_redis
@pytest.mark.redis
def test_tune_runs_streamnb_tune_on_the_replays_history(capsys):
    from benchmarks import tune

    assert tune.main(["--limit", "120", "--workers", "1", "--runs", "accuracy;fpr=0.001 100"]) == 0
    out = capsys.readouterr().out
    assert "$ streamnb tune --redis URL --model mail --goal accuracy\nhistory: 120 entries read" in out
    assert "needs at least 2995; no proposal\n(exit 1)" in out


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not installed")
def test_read_cost_measures_both_reads_for_each_number_of_models():
    from benchmarks.read_cost import measure

    for n in (2, 10):  # below and above intake.ANNOUNCED_AT_ONCE
        row = measure(n, reads=3)
        assert row["models"] == n
        assert all(row[k] >= 0 for k in row if k.endswith("us") or k.endswith("ms"))

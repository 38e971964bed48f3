"""Fault 1: kill -9 of random workers at random moments during a labelled stream."""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.faults.harness import (
    StreamFeeder,
    check_guarantees,
    wait_all_done,
    wait_converged,
    wait_for,
)
from tests.helpers.workers import token_messages

pytestmark = [pytest.mark.slow, pytest.mark.redis]

N_MESSAGES = 5000
N_KILLS = 10


def test_kill_9_random_workers_ten_times(redis_server, procs):
    seed = int(os.environ.get("STREAMNB_FAULT_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    print(f"seed {seed} (rerun with STREAMNB_FAULT_SEED={seed})")
    r = redis_server.client()
    msgs = token_messages(N_MESSAGES, seed=seed % 1000, labelled_share=0.9)
    live = [f"w{i}" for i in range(3)]
    for c in live:
        procs.spawn(c)
    wait_for(lambda: r.hlen("streamnb:{mail}:workers") == 3, 30, "3 workers up")
    feeder = StreamFeeder(r, msgs, chunk=50, pause_s=0.06).start()
    kills = []
    for k in range(N_KILLS):
        time.sleep(rng.uniform(0.2, 0.8))
        victim = rng.choice(live)
        procs.kill(victim)
        # restart under the same name (re-reads its pending entries at once) or a new one
        # (its entries are claimed by the others after claim_idle_ms)
        new = victim if k % 2 == 0 else f"{victim.split('.')[0]}.{k}"
        live[live.index(victim)] = new
        procs.spawn(new)
        kills.append((victim, r.xlen("streamnb:{mail}:out")))
    feeder.join()
    ids = [e.decode() for e, _ in r.xrange("streamnb:{mail}:in")]
    try:
        wait_all_done(r, N_MESSAGES, 90, "every entry processed")
        wait_converged(r, live)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nkills {kills}\n{procs.logs()}") from None
    assert len(kills) == N_KILLS
    # the kills happened while the stream was being processed, not after it
    assert kills[0][1] < N_MESSAGES and kills[N_KILLS // 2][1] < N_MESSAGES, kills
    check_guarantees(r, msgs, ids)
    assert set(procs.stop_all().values()) == {0}

"""Through the daemon: the SpamAssassin 2002 corpus replayed with the spam held back, so the
spam share jumps from about 5% to about 30% after message 2,000, raises a prior-shift drift
event in ``streamnb:{NAME}:events`` within 300 messages of the jump, and none before it.

One worker (a real process on a real redis-server); messages are sent in chunks and each
chunk is fully processed before the events are read, so the position of the first event is
known to within a chunk.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import msgpack
import pytest

from tests.helpers.prometheus import MODEL, send, start_worker, stop, wait_for
from tests.helpers.redis_server import free_port

JUMP = 2000
WITHIN = 300
CHUNK = 25

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.corpus]


def replay_order(corpus: Path, seed: int = 2002) -> list[tuple[str, str]]:
    """(path, label) in corpus (index) order per class, spam held back: about 5% spam in the
    first JUMP messages, about 30% after."""
    rows = [line.split("\t") for line in (corpus / "index.tsv").read_text().splitlines()[1:]]
    ham = [(p, lab) for p, lab, _ in rows if lab == "ham"]
    spam = [(p, lab) for p, lab, _ in rows if lab == "spam"]
    rng = random.Random(seed)
    order: list[tuple[str, str]] = []
    while ham and spam:
        share = 0.05 if len(order) < JUMP else 0.30
        order.append(spam.pop(0) if rng.random() < share else ham.pop(0))
    return order


def prior_events(client) -> list[dict]:
    out = []
    for _, fields in client.xrange(f"streamnb:{{{MODEL}}}:events"):
        event = msgpack.unpackb(fields[b"data"], raw=False)
        if event.get("detector") == "prior_shift":
            out.append(event)
    return out


def test_spam_share_jump_raises_one_prior_shift_event(redis_server, corpus_dir):
    order = replay_order(corpus_dir)
    before = [lab for _, lab in order[:JUMP]].count("spam") / JUMP
    after = [lab for _, lab in order[JUMP:JUMP + WITHIN]].count("spam") / WITHIN
    assert 0.03 < before < 0.07 and 0.22 < after < 0.38

    client = redis_server.client()
    tmp = Path(tempfile.mkdtemp(prefix="streamnb-prior-"))
    worker = start_worker(redis_server.url, "w1", free_port(), tmp / "w1.log")
    out_key = f"streamnb:{{{MODEL}}}:out"
    try:
        def replay(start: int, stop_at: int) -> None:
            send(client, [{"id": f"m{i}", "raw": (corpus_dir / order[i][0]).read_bytes(),
                           "label": order[i][1]} for i in range(start, stop_at)])
            wait_for(lambda: client.xlen(out_key) >= stop_at, 120, f"{stop_at} predictions")

        for start in range(0, JUMP, 500):
            replay(start, min(start + 500, JUMP))
        assert prior_events(client) == [], "prior-shift event before the jump"
        detected_at = None
        for start in range(JUMP, JUMP + WITHIN, CHUNK):
            replay(start, start + CHUNK)
            events = prior_events(client)
            if events:
                detected_at = start + CHUNK
                break
        assert detected_at is not None, f"no prior-shift event within {WITHIN} messages"
        print(f"prior-shift event by message {detected_at} ({detected_at - JUMP} after the jump)")
        assert len(events) == 1
        change = events[0]["change"]
        assert change["recent_shares"]["spam"] > change["reference_shares"]["spam"] + 0.1
        assert abs(change["reference_shares"]["spam"] - before) < 0.03
        assert events[0]["model"] == MODEL and events[0]["worker"] == "w1"
    finally:
        stop(worker)
        shutil.rmtree(tmp, ignore_errors=True)

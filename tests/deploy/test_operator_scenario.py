"""Issue 49's operator scenario, scripted against real servers: streamnb set up as the
README and docs/operations.md set it up, then used by a mail user.

- a worker started with the README's command (``streamnb worker --kind multinomial
  --classes spam,ham``, and ``--error-weight 1`` so that the statistics can be compared
  with one offline fit), on a private redis-server;
- the model trained from a user's Maildir folders as the README does (``streamnb produce
  --label spam ~/Maildir/.Junk``, ``--label ham ~/Maildir``); a typo label tried;
- new mail delivered through ``streamnb milter`` behind a private Postfix and through
  ``streamnb predict -p -``, filed into the inbox or Junk by its verdict;
- mail moved into and out of Junk over IMAP (imaplib) in a private Dovecot running
  deploy/dovecot/ as shipped, whose Sieve scripts pipe it to ``streamnb produce --label
  spam|ham -``: fresh mail learnt, training and delivered mail corrected (relearnt),
  Junk -> Trash and other moves learning nothing; then the training commands again.

Dovecot runs the pipe as the mail user (``nobody``), who cannot run this venv's Python:
its streamnb is tests/helpers/relay.py's stand-in, which has the test run the real
command with the same arguments, environment and stdin while the IMAP command waits.
Needs root, redis-server, Postfix, Dovecot (dovecot-imapd, dovecot-sieve) and pymilter;
skipped otherwise. Synthetic mails (tests/helpers/milter.py) keep it to seconds."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from email import message_from_bytes
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest

from benchmarks.postfix_instance import PostfixInstance
from benchmarks.postfix_instance import unavailable as postfix_unavailable
from streamnb.features import Featurizer
from streamnb_workers.cli.launch import blas_env
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, read_config, resolve_spec
from streamnb_workers.wire.codec import decode_input
from streamnb_workers.worker.learn_weights import is_error
from tests.helpers.dovecot import Dovecot
from tests.helpers.dovecot import unavailable as dovecot_unavailable
from tests.helpers.http import get, sample
from tests.helpers.milter import MilterProcess, mail, stop, wait_for
from tests.helpers.redis_server import REDIS_SERVER, RedisServer, free_port
from tests.helpers.relay import Relay
from tests.helpers.workers import (
    all_done,
    assert_same_stats,
    fast_options,
    learnt_model,
    offline_model,
    url_worker,
)

pytestmark = [pytest.mark.redis]

STREAMNB = Path(sys.executable).parent / "streamnb"
MODEL = "mail"
K = ModelKeys(MODEL)
#: The worker of the README (plus what a test needs: a free metrics port, short blocks,
#: every message's token names counted, ``:in`` kept whole to be replayed).
WORKER = ["worker", "--model", MODEL, "--kind", "multinomial", "--classes", "spam,ham",
          "--error-weight", "1", "--batch", "20", "--block-ms", "50", "--token-names-every", "1",
          "--input-trim-s", "0"]
#: X-Streamnb-* header fields with their continuation lines (not streamnb's own code).
OWN_HEADER = re.compile(rb"^x-streamnb-[^:\r\n]*:.*(?:\r?\n[ \t].*)*\r?\n", re.I | re.M)


def unavailable() -> str | None:
    if REDIS_SERVER is None:
        return "redis-server is not installed"
    if not STREAMNB.exists():
        return f"no streamnb console script beside {sys.executable}"
    if importlib.util.find_spec("Milter") is None:
        return "streamnb milter needs pymilter: pip install 'streamnb[milter]'"
    return postfix_unavailable() or dovecot_unavailable()


def without_own_headers(raw: bytes) -> bytes:
    end = re.search(rb"\r?\n(?=\r?\n)", raw)
    cut = end.end() if end else len(raw)
    return OWN_HEADER.sub(b"", raw[:cut]) + raw[cut:]


def user_mail(label: str, seed: int) -> bytes:
    """A mail of ``label``'s words with a Message-ID (its learn-once key), LF line ends as
    a delivery agent stores it."""
    raw = mail(label, seed, extra_headers={"Message-ID": f"<{label}-{seed}@scenario.test>"})
    return raw.replace(b"\r\n", b"\n")


def key_of(raw: bytes) -> str:
    return "mid:" + message_from_bytes(raw)["Message-ID"].strip("<>")


def start_worker(url: str, client: Any, tmp: Path) -> tuple[subprocess.Popen, int]:
    """The README's worker, once it has registered; (its process, its metrics port)."""
    port = free_port()
    env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
    with open(tmp / "worker.log", "ab") as log:
        worker = subprocess.Popen([str(STREAMNB), WORKER[0], "--redis", url, *WORKER[1:],
                                   "--metrics-port", str(port)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_for(lambda: client.hlen(K.workers) > 0 or worker.poll() is not None, 60, "the worker")
    assert worker.poll() is None, (tmp / "worker.log").read_text()
    return worker, port


@dataclass
class World:
    url: str
    client: Any
    dovecot: Any
    relay: Any
    postfix: Any
    worker: subprocess.Popen
    tmp: Path
    #: ``streamnb_messages_relearnt_total`` of the worker that served the user's part.
    relearnt_metric: float | None = None
    #: key -> (label, the bytes last learnt for it), what the model should hold.
    final: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    #: (key, old label, new label) of each correction, in order.
    corrections: list[tuple[str, str, str]] = field(default_factory=list)
    #: key -> (original, delivered copy) of mail delivered through ``predict -p``.
    piped: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    #: delivered copies (milter and ``predict -p``), by key.
    delivered: dict[str, bytes] = field(default_factory=dict)
    #: The :out entry id where the user's part starts (after training).
    after_training: str = "0-0"
    #: What ``produce --label Spam`` did; the last lines of the training commands run again.
    typo: subprocess.CompletedProcess | None = None
    retrained: list[str] = field(default_factory=list)

    def streamnb(self, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
        env = blas_env({k: v for k, v in os.environ.items() if not k.startswith("STREAMNB_")})
        return subprocess.run([str(STREAMNB), args[0], "--redis", self.url, *args[1:]],
                              input=stdin, capture_output=True, env=env, timeout=120)

    def idle(self) -> None:
        wait_for(lambda: all_done(self.client, 1, K), 60, "the worker to catch up")

    def outs(self, after: str = "0-0") -> list[dict]:
        return [msgpack.unpackb(f[b"data"], raw=False, strict_map_key=False)
                for _, f in self.client.xrange(K.out, min=f"({after}" if after != "0-0" else "-")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    if (why := unavailable()) is not None:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("scenario")
    with RedisServer() as server, Relay(STREAMNB, user="nobody") as relay:
        client = server.client()
        worker, metrics_port = start_worker(server.url, client, tmp)
        w = None
        try:
            learn_env = f"STREAMNB_REDIS_URL={server.url}\nSTREAMNB_MODEL={MODEL}\n"
            with Dovecot(streamnb=relay.program, learn_env=learn_env) as dovecot, \
                    MilterProcess(server.url, tmp / "milter.log", timeout=10) as milter, \
                    PostfixInstance(free_port(), f"inet:127.0.0.1:{milter.port}") as postfix:
                w = World(server.url, client, dovecot, relay, postfix, worker, tmp)
                play(w, metrics_port)
                yield w
        finally:
            stop(w.worker if w is not None else worker)


# -- the script ----------------------------------------------------------------------------

def play(w: World, metrics_port: int) -> None:
    imap = w.dovecot.imap()
    try:
        for box in ("INBOX", "Junk", "Archive", "Trash"):  # made at their first use
            assert imap.select(f'"{box}"')[0] == "OK"
        train(w)
        try_typo(w)
        deliver(w)
        correct(w, imap)
        # the training commands again (docs/operations.md's catch-up after an outage)
        w.retrained = learn_folders(w)
    finally:
        imap.logout()
    status, body = get(metrics_port, "/metrics")
    assert status == 200
    w.relearnt_metric = sample(body, "streamnb_messages_relearnt_total", model=MODEL)
    # restarted (as an upgrade does): it publishes the token names it counted as it stops
    assert stop(w.worker) == 0
    w.worker, _port = start_worker(w.url, w.client, w.tmp)


def train(w: World) -> None:
    """Six spam in ~/Maildir/.Junk, six ham in the inbox, learnt as the README learns."""
    for label, box in (("spam", "Junk"), ("ham", "INBOX")):
        for seed in range(6):
            raw = user_mail(label, seed)
            w.dovecot.deliver(raw, box)
            w.final[key_of(raw)] = (label, raw)
    for line in learn_folders(w):
        assert line.startswith("sent 6 of 6 messages (6 labelled)"), line
    w.after_training = w.client.xrevrange(K.out, count=1)[0][0].decode()


def learn_folders(w: World) -> list[str]:
    """The README's training commands; the last line each printed."""
    lines = []
    for label, box in (("spam", "Junk"), ("ham", "INBOX")):
        done = w.streamnb("produce", "--model", MODEL, "--label", label,
                          str(w.dovecot.maildir(box)))
        assert done.returncode == 0, done.stderr
        lines.append(done.stdout.decode().strip().splitlines()[-1])
    w.idle()
    return lines


def try_typo(w: World) -> None:
    """``--label Spam``: produce refuses it (nothing sent); written to ``:in`` directly, it
    is a dead letter ``bad_label``: the model keeps its two classes."""
    added = int(w.client.xinfo_stream(K.input)["entries-added"])
    path = w.tmp / "typo.eml"
    path.write_bytes(user_mail("spam", 50))
    w.typo = w.streamnb("produce", "--model", MODEL, "--label", "Spam", str(path))
    assert int(w.client.xinfo_stream(K.input)["entries-added"]) == added
    w.client.xadd(K.input, {"data": msgpack.packb(
        {"id": "typo", "raw": user_mail("spam", 51), "label": "Spam"}, use_bin_type=True)})
    w.idle()


def file_by_verdict(w: World, copy: bytes) -> None:
    w.dovecot.deliver(copy, "Junk" if message_from_bytes(copy)["X-Streamnb-Verdict"] == "spam"
                      else "INBOX")
    w.delivered[key_of(copy)] = copy


def deliver(w: World) -> None:
    """Two mails through Postfix and the milter, two through ``predict -p``."""
    for seed, label in ((10, "spam"), (11, "ham")):
        w.postfix.send(user_mail(label, seed).replace(b"\n", b"\r\n"))
    wait_for(lambda: len(w.postfix.delivered()) >= 2, 60, "Postfix to deliver")
    for copy in w.postfix.delivered():
        file_by_verdict(w, copy)
    for seed, label in ((12, "spam"), (13, "ham")):
        raw = user_mail(label, seed)
        done = w.streamnb("predict", "--model", MODEL, "-p", "-", stdin=raw)
        assert done.returncode == (0 if label == "spam" else 1), done.stderr  # bogofilter's
        w.piped[key_of(raw)] = (raw, done.stdout)
        file_by_verdict(w, done.stdout)


def uid_of(imap, mailbox: str, raw: bytes) -> bytes:
    assert imap.select(f'"{mailbox}"')[0] == "OK"
    [uid] = imap.uid("SEARCH", None, "HEADER", "Message-ID",
                     message_from_bytes(raw)["Message-ID"])[1][0].split()
    return uid


def move(w: World, imap, raw: bytes, src: str, dst: str, learns: str | None,
         verb: str = "MOVE") -> None:
    """Move (or copy) the mail of ``raw``'s Message-ID from ``src`` to ``dst`` over IMAP;
    ``learns``: the label the move teaches (None: nothing), which updates what the model
    should hold and, for a key learnt under another label, the corrections."""
    runs = len(w.relay.runs)
    typ, data = imap.uid(verb, uid_of(imap, src, raw), f'"{dst}"')
    assert typ == "OK", data
    w.idle()
    new_runs = w.relay.runs[runs:]
    if learns is None:
        assert new_runs == [], [r.argv for r in new_runs]
        return
    [run] = new_runs
    assert run.argv == ["produce", "--model", MODEL, "--label", learns, "-"]
    assert (run.code, run.stderr) == (0, b""), run.stderr
    key = key_of(raw)
    old = w.final.get(key)
    if old is not None and old[0] != learns:
        w.corrections.append((key, old[0], learns))
    w.final[key] = (learns, run.stdin)


def correct(w: World, imap) -> None:
    spam = [user_mail("spam", s) for s in range(6)]
    ham = [user_mail("ham", s) for s in range(6)]
    by_seed = {int(re.search(rb"-(\d+)@scenario", k.encode()).group(1)): c
               for k, c in w.delivered.items()}
    milter_spam, milter_ham, piped_spam, piped_ham = (by_seed[s] for s in (10, 11, 12, 13))
    move(w, imap, spam[0], "Junk", "INBOX", "ham")        # trained as spam: corrected
    move(w, imap, ham[0], "INBOX", "Junk", "spam")        # trained as ham: corrected
    move(w, imap, milter_ham, "INBOX", "Junk", "spam")    # delivered, never learnt: learnt
    move(w, imap, piped_spam, "Junk", "Archive", "ham")   # the same, out of Junk
    move(w, imap, milter_spam, "Junk", "Trash", None)     # thrown away: nothing
    move(w, imap, piped_ham, "INBOX", "Junk", "spam")     # learnt as spam ...
    move(w, imap, piped_ham, "Junk", "INBOX", "ham")      # ... the user changes their mind
    move(w, imap, spam[1], "Junk", "INBOX", "ham")        # corrected ...
    move(w, imap, spam[1], "INBOX", "Junk", "spam")       # ... and back
    move(w, imap, ham[1], "INBOX", "Archive", None)       # not about Junk: nothing
    move(w, imap, ham[0], "Junk", "Junk", "spam", verb="COPY")  # already learnt as spam


# -- what the acceptance asks -------------------------------------------------------

def test_a_typo_label_is_refused(world):
    assert world.typo.returncode == 2
    err = world.typo.stderr.decode()
    assert err.count("\n") == 1 and "Spam" in err, err
    dead = [msgpack.unpackb(f[b"data"], raw=False) for _, f in world.client.xrange(K.dead)]
    assert [d["reason"] for d in dead] == ["bad_label"]
    assert read_config(world.client, MODEL).classes == ["spam", "ham"]


def test_every_correction_is_relearnt_exactly_once(world):
    assert [(k, was, new) for k, was, new in world.corrections] == [
        (key_of(user_mail("spam", 0)), "spam", "ham"),
        (key_of(user_mail("ham", 0)), "ham", "spam"),
        (key_of(user_mail("ham", 13)), "spam", "ham"),
        (key_of(user_mail("spam", 1)), "spam", "ham"),
        (key_of(user_mail("spam", 1)), "ham", "spam"),
    ]
    relearnt = [(o["id"], o["was"], o["true_label"], o["learned"]) for o in world.outs()
                if o.get("reason") == "relearnt"]
    assert relearnt == [(f"stdin:{k}", was, new, True) for k, was, new in world.corrections]
    assert world.relearnt_metric == len(world.corrections)


def test_the_statistics_are_one_offline_fit_of_the_final_labels(world):
    """Every learn, relearn and the moves that learn nothing leave what one fit of the final
    labels gives, on the mails without their X-Streamnb-* headers: those headers taught
    the model nothing."""
    cfg = read_config(world.client, MODEL)
    assert cfg.error_weight == 1.0
    stripped = [{"raw": without_own_headers(raw), "label": label}
                for label, raw in world.final.values()]
    assert sum(b"X-Streamnb-Verdict" in raw for _, raw in world.final.values()) == 3
    want = offline_model(cfg.kind, cfg.model_params, cfg.featurizer, stripped)
    assert_same_stats(learnt_model(world.client, MODEL)[0], want)


def test_no_x_streamnb_token_was_learnt(world):
    """The tokens the delivered copies' own headers would make have no counts, and none is
    among the names ``streamnb tokens`` lists."""
    cfg = read_config(world.client, MODEL)
    featurizer = Featurizer.from_config(cfg.featurizer)
    names: set[str] = set()
    for copy in world.delivered.values():
        # the tokens these headers make under another name, renamed back
        disguised = re.sub(rb"(?im)^x-streamnb-", b"X-Qtreamnb-", copy)
        names |= {t.replace("qtreamnb", "streamnb")
                  for t in featurizer.tokens(("raw", disguised)) if "qtreamnb" in t}
    assert {"header:x-streamnb-verdict", "header:x-streamnb-score",
            "header:x-streamnb-id"} <= names
    done = world.streamnb("tokens", "--model", MODEL, "--json", *sorted(names))
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.decode().splitlines()]
    assert len(rows) == len(names) and not any(any(r["counts"].values()) for r in rows), rows
    listed = world.streamnb("tokens", "--model", MODEL, "--top", "1000", "--min-count", "1")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.decode().lower().splitlines()[1:]
    named = [line.split("\t")[0] for line in lines if not line.startswith("#")]
    assert len(named) > 20 and {"viagra", "meeting"} <= set(named), lines[:30]
    assert not [line for line in lines if "x-streamnb" in line]


def test_verdicts_stay_spam_or_ham(world):
    """After the corrections, every verdict the user's part produced and those of new mail
    are spam or ham (the typo made no third class, nothing is unsure)."""
    labels = [o["label"] for o in world.outs(world.after_training) if o.get("id") != "typo"]
    assert labels and set(labels) <= {"spam", "ham"}, labels
    (folder := world.tmp / "new-mail").mkdir()
    for label, seed in (("spam", 60), ("ham", 61), ("spam", 62), ("ham", 63)):
        (folder / f"{label}-{seed}.eml").write_bytes(user_mail(label, seed))
    done = world.streamnb("predict", "--model", MODEL, str(folder))
    assert done.returncode == 0, done.stderr
    for line in done.stdout.decode().splitlines():
        path, verdict, _score = line.split("\t")
        assert Path(path).name.startswith(verdict + "-"), line


def test_a_delivered_copy_predicts_as_its_original(world):
    """``predict -p``'s output and the mail it was given: the same ``log_proba`` from
    ``predict`` and from a worker reading them from ``:in``."""
    (folder := world.tmp / "same").mkdir()
    mails = {f"{kind}-{n}": raw for n, pair in enumerate(world.piped.values())
             for kind, raw in zip(("original", "copy"), pair, strict=True)}
    for name, raw in mails.items():
        (folder / f"{name}.eml").write_bytes(raw)
        world.client.xadd(K.input, {"data": msgpack.packb({"id": f"same-{name}", "raw": raw},
                                                          use_bin_type=True)})
    done = world.streamnb("predict", "--model", MODEL, "--json", str(folder))
    assert done.returncode == 0, done.stderr
    by_predict = {Path(o["file"]).stem: o["log_proba"]
                  for o in map(json.loads, done.stdout.decode().splitlines())}
    world.idle()
    by_worker = {o["id"][len("same-"):]: o["log_proba"] for o in world.outs()
                 if o["id"].startswith("same-")}
    assert set(by_predict) == set(by_worker) == set(mails)
    for n, (original, copy) in enumerate(world.piped.values()):
        assert copy != original and copy.startswith(original.split(b"\n\n")[0])
        logs = [by[f"{kind}-{n}"] for by in (by_predict, by_worker) for kind in ("original", "copy")]
        assert all(lp == logs[0] for lp in logs), logs


def test_training_from_the_folders_again_changes_nothing(world):
    """After the user's moves each folder holds mail learnt with its folder's label: the
    README's commands run again send nothing (the statistics test above covers the rest)."""
    assert len(world.retrained) == 2
    for line in world.retrained:
        m = re.fullmatch(r"sent 0 of (\d+) messages .*; (\d+) already learnt, not sent", line)
        assert m and m.group(1) == m.group(2) and int(m.group(1)) >= 6, line


def test_with_the_mail_default_error_weight_the_verdicts_say_what_was_learnt(world):
    """The scenario's input, replayed in its order into a model made with the mail defaults
    (error weight 2, as the README's command without ``--error-weight`` makes it): its
    statistics are one fit of each mail's last label, weighted 2 where the verdict
    published with that learn (or relearn) got the label wrong, else 1."""
    spec = ModelSpec("mail-default", kind="multinomial", classes=["spam", "ham"])
    cfg = resolve_spec(spec)
    assert cfg.error_weight == 2.0
    keys = ModelKeys(spec.name)
    pipe = world.client.pipeline(transaction=False)
    for _, f in world.client.xrange(K.input):
        pipe.xadd(keys.input, {"data": f[b"data"]})
    pipe.execute()
    url_worker(world.url, [spec], fast_options("w-default", batch=20)).run_until_idle()
    payloads = {eid.decode(): msgpack.unpackb(f[b"data"], raw=False)
                for eid, f in world.client.xrange(keys.input)}
    rule, final = cfg.make_decision_rule(), {}
    for _, f in world.client.xrange(keys.out):
        o = msgpack.unpackb(f[b"data"], raw=False, strict_map_key=False)
        if o.get("learned"):
            p = payloads[o["entry"]]
            wrong = is_error(o["label"], o["true_label"], rule, sorted(o["log_proba"]))
            final[p.get("key") or key_of(p["raw"])] = (o["true_label"], p["raw"],
                                                       2.0 if wrong else 1.0)
    assert {k: label for k, (label, _, _) in final.items()} == \
        {k: label for k, (label, _) in world.final.items()}
    weights = [weight for _, _, weight in final.values()]
    assert 1.0 in weights and 2.0 in weights, weights
    featurizer = cfg.make_featurizer()
    rows = [featurizer.featurize(decode_input(msgpack.packb(
        {"raw": without_own_headers(raw)}, use_bin_type=True), "0-0").as_payload())
        for _, raw, _ in final.values()]
    want = cfg.make_model().partial_fit(featurizer.stack(rows), [v[0] for v in final.values()],
                                        sample_weight=np.array(weights))
    assert_same_stats(learnt_model(world.client, spec.name)[0], want, rtol=1e-12)

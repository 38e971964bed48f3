"""``streamnb produce`` of mails learnt before under another label: sent (the worker
relearns them), counted by old and new label in the summary; the statistics are those of
one clean run of the final labels. Against a real redis-server and a real worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamnb_workers.client.produce import ProduceReport, produce
from tests.helpers.workers import (
    ROOT,
    assert_same_stats,
    count_spec,
    fast_options,
    learnt_model,
    url_worker,
)

pytestmark = pytest.mark.redis

WORDS = {"spam": "cheap meds winner prize", "ham": "meeting notes lunch agenda"}


def write_mails(folder: Path, labels: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, label in enumerate(labels):
        (folder / f"{i:03d}.eml").write_bytes(
            b"From: a@example.org\nMessage-ID: <%d.relearn@example.org>\nSubject: n%d\n\n%s %d\n"
            % (i, i, WORDS[label].encode(), i))


def write_index(folder: Path, labels: list[str], name: str) -> Path:
    index = folder / name
    index.write_text("path\tlabel\n" + "".join(f"{i:03d}.eml\t{lab}\n"
                                                for i, lab in enumerate(labels)))
    return index


def learn(redis_server, model: str):
    url_worker(redis_server.url, [count_spec(model)], fast_options(f"w-{model}")).run_until_idle()
    return learnt_model(redis_server.client(), model)[0]


def cli(redis_server, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "streamnb_workers", *args, "--redis",
                           redis_server.url], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_produce_sends_mails_learnt_under_another_label_and_says_so(redis_server, tmp_path):
    first = ["spam", "spam", "spam", "ham", "ham", "ham"]
    final = ["ham", "ham", "spam", "spam", "ham", "ham"]
    folder = tmp_path / "mail"
    write_mails(folder, first)
    r = redis_server.client()
    produce(r, "clean", [], index=str(write_index(folder, final, "final.tsv")), progress=False)
    clean = learn(redis_server, "clean")

    done = cli(redis_server, "produce", "--allow-new", "--model", "mail", "--index",
               str(write_index(folder, first, "first.tsv")))
    assert done.returncode == 0, done.stderr
    learn(redis_server, "mail")
    done = cli(redis_server, "produce", "--model", "mail", "--index",
               str(write_index(folder, final, "final.tsv")))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "sent 3 of 6 messages (3 labelled) to streamnb:{mail}:in; 3 already learnt, not sent, "
        "3 relearnt (2 spam -> ham, 1 ham -> spam)")
    assert_same_stats(learn(redis_server, "mail"), clean)

    # one mail moved back: one relearnt, the model as if it had always been spam
    done = cli(redis_server, "produce", "--model", "mail", "--label", "spam",
               str(folder / "000.eml"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("0 already learnt, not sent, 1 relearnt (ham -> spam)")
    produce(r, "clean", [str(folder / "000.eml")], label="spam", progress=False)
    assert_same_stats(learn(redis_server, "mail"), learn(redis_server, "clean"))
    # the same again: learnt with that label, not sent
    again = produce(r, "mail", [str(folder / "000.eml")], label="spam", progress=False)
    assert (again.sent, again.already_learnt, again.relearnt) == (0, 1, {})


def test_the_relearnt_summary():
    report = ProduceReport()
    assert report.relearnt_summary == ""
    report.relearnt[("spam", "ham")] = 4
    assert report.relearnt_summary == "4 relearnt (spam -> ham)"
    report.relearnt[("ham", "spam")] = 1
    assert report.relearnt_summary == "5 relearnt (4 spam -> ham, 1 ham -> spam)"

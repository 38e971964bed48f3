"""streamnb produce: .eml, maildir, mbox, directories, JSON lines and index files, sent to a
real redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from streamnb_workers.client.produce import produce
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.wire.codec import decode_input

pytestmark = pytest.mark.redis

MAIL = b"From: a@example.com\nSubject: %s\n\nbody %s\n"


def entries(client, model="mail"):
    out = []
    for entry_id, fields in client.xrange(ModelKeys(model).input):
        out.append(decode_input(fields[b"data"], entry_id.decode()))
    return out


def test_eml_files_and_directories_with_label(redis_server, tmp_path):
    d = tmp_path / "mail"
    (d / "sub").mkdir(parents=True)
    (d / "a.eml").write_bytes(MAIL % (b"a", b"a"))
    (d / "sub" / "b.eml").write_bytes(MAIL % (b"b", b"b"))
    (d / ".hidden").write_bytes(b"not mail")
    r = redis_server.client()
    rep = produce(r, "mail", [str(d)], label="ham", progress=False)
    assert (rep.sent, rep.skipped, rep.labelled) == (2, 0, 2)
    msgs = entries(r)
    assert [m.id for m in msgs] == ["mail/a.eml", "mail/sub/b.eml"]
    assert [m.label for m in msgs] == ["ham", "ham"]
    assert msgs[1].payload == (d / "sub" / "b.eml").read_bytes()


def test_maildir_and_mbox(redis_server, tmp_path):
    md = tmp_path / "Maildir"
    for sub in ("cur", "new", "tmp"):
        (md / sub).mkdir(parents=True)
    (md / "cur" / "1:2,S").write_bytes(MAIL % (b"cur", b"1"))
    (md / "new" / "2").write_bytes(MAIL % (b"new", b"2"))
    (md / "tmp" / "3").write_bytes(MAIL % (b"tmp", b"3"))  # not delivered yet: not sent
    box = tmp_path / "spam.mbox"
    box.write_bytes(b"".join(b"From x@y Mon Jan  1 00:00:00 2002\n" + MAIL % (s, s) + b"\n"
                             for s in (b"one", b"two", b"three")))
    r = redis_server.client()
    rep = produce(r, "mail", [str(md), str(box)], progress=False)
    assert rep.sent == 5 and rep.labelled == 0
    msgs = entries(r)
    assert [m.id for m in msgs] == ["Maildir/cur/1:2,S", "Maildir/new/2",
                                    "spam.mbox#0", "spam.mbox#1", "spam.mbox#2"]
    assert b"Subject: two" in msgs[3].payload and b"From x@y" not in msgs[3].payload
    assert all(m.label is None for m in msgs)


def test_single_message_with_from_line_is_one_mail(redis_server, tmp_path):
    f = tmp_path / "00001.abc"
    data = b"From someone@example.com Thu Aug 22 12:36:23 2002\n" + MAIL % (b"x", b"y")
    f.write_bytes(data)
    r = redis_server.client()
    assert produce(r, "mail", [str(f)], progress=False).sent == 1
    (m,) = entries(r)
    assert m.id == "00001.abc" and m.payload == data


def test_jsonl_records_bad_lines_skipped(redis_server, tmp_path):
    f = tmp_path / "records.jsonl"
    f.write_text("\n".join([
        json.dumps({"text": "cheap meds", "label": "spam", "id": "t1"}),
        json.dumps({"x": [0.5, 1.5]}),
        "{not json",
        json.dumps({"ref": "t1", "label": "ham"}),
        json.dumps({"text": "a", "tokens": ["b"]}),  # two payloads: refused by the codec
        json.dumps(["a list"]),
    ]) + "\n")
    r = redis_server.client()
    err = []

    class Err:
        def write(self, s):
            err.append(s)

        def flush(self):
            pass

        def isatty(self):
            return False

    rep = produce(r, "mail", [str(f)], label="ham", progress=False, stderr=Err())
    assert (rep.sent, rep.skipped) == (3, 3)
    msgs = entries(r)
    assert [m.id for m in msgs] == ["t1", "records.jsonl:2", "records.jsonl:4"]
    # a record's own label wins over --label; a ref keeps its own label
    assert [m.label for m in msgs] == ["spam", "ham", "ham"]
    assert msgs[1].payload.tolist() == [0.5, 1.5]
    assert msgs[2].ref == "t1"
    text = "".join(err)
    assert "records.jsonl:3" in text and "records.jsonl:5" in text and "records.jsonl:6" in text


def test_index_labels_and_times(redis_server, tmp_path):
    (tmp_path / "spam").mkdir()
    (tmp_path / "ham").mkdir()
    (tmp_path / "spam" / "s1").write_bytes(MAIL % (b"s", b"1"))
    (tmp_path / "ham" / "h1").write_bytes(MAIL % (b"h", b"1"))
    (tmp_path / "ham" / "unlisted").write_bytes(MAIL % (b"u", b"1"))
    idx = tmp_path / "index.tsv"
    idx.write_text("path\tlabel\tunix_time\nham/h1\tham\t1000\nspam/s1\tspam\t2000.5\n")
    r = redis_server.client()
    rep = produce(r, "mail", [], index=str(idx), progress=False)  # no PATH: index order
    assert rep.sent == 2
    msgs = entries(r)
    assert [(m.id, m.label, m.ts) for m in msgs] == [("ham/h1", "ham", 1000.0), ("spam/s1", "spam", 2000.5)]
    # with PATHs: files the index lists get its labels, the others none
    r.delete(ModelKeys("mail").input)
    produce(r, "mail", [str(tmp_path / "ham")], index=str(idx), progress=False)
    assert [(m.id, m.label) for m in entries(r)] == [("ham/h1", "ham"), ("ham/unlisted", None)]


def test_corpus_index_through_the_cli(redis_server, corpus_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "streamnb_workers", "produce", "--redis", redis_server.url, "--model", "sa",
         "--allow-new", "--index", str(corpus_dir / "index.tsv"), "--chunk", "200"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    n_rows = sum(1 for _ in (corpus_dir / "index.tsv").open()) - 1
    assert proc.stdout.strip() == (f"sent {n_rows} of {n_rows} messages ({n_rows} labelled) to "
                                   "streamnb:{sa}:in; 0 already learnt, not sent")
    assert proc.stderr == ""  # not a terminal: no progress bar
    r = redis_server.client()
    assert r.xlen(ModelKeys("sa").input) == n_rows
    first = r.xrange(ModelKeys("sa").input, count=1)[0][1][b"data"]
    obj = msgpack.unpackb(first, raw=False)
    path, label, _ = (corpus_dir / "index.tsv").read_text().splitlines()[1].split("\t")
    assert obj["id"] == path and obj["label"] == label
    assert obj["raw"] == (corpus_dir / path).read_bytes()


def test_cli_errors_are_one_line(redis_server, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "streamnb_workers", "produce", "--allow-new", *args],
                              capture_output=True, text=True, timeout=60)

    p = run("--redis", redis_server.url, "--model", "m", str(tmp_path / "missing"))
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "does not exist" in p.stderr
    p = run("--redis", redis_server.url, "--model", "m", "--label", "a", "--index", "x.tsv", "f")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "not allowed with" in p.stderr
    p = run("--redis", redis_server.url, "--model", "m")
    assert p.returncode == 2 and "nothing to send" in p.stderr
    assert Path(tmp_path).exists()

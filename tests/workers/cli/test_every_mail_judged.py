"""Every mail judged, against a real redis-server: a mail over the size limit is cut at a
MIME boundary (headers kept, ``defect:truncated``), predicted and learnt, whether the
producer or the worker cut it; ``produce`` refuses what is not mail, and an empty directory."""

from __future__ import annotations

import email.mime.application
import email.mime.multipart
import email.mime.text

import msgpack
import numpy as np
import pytest

from streamnb.features import MailTokenizer
from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES
from streamnb.features.truncate import cut_mail, truncated_size
from streamnb_workers.cli.main import main
from streamnb_workers.store.keys import GROUP, ModelKeys
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.workers import fast_options, url_worker

K = ModelKeys("mail")


def big_mail(size: int = 5_000_000, seed: int = 0, words: str = "cheap meds winner") -> bytes:
    """A multipart mail: a text part, then a base64 attachment of about ``size`` bytes."""
    rng = np.random.default_rng(seed)
    m = email.mime.multipart.MIMEMultipart()
    m["Subject"], m["From"], m["Message-ID"] = words, "a@example.com", f"<big{seed}@example.com>"
    m.attach(email.mime.text.MIMEText(f"{words} click here now"))
    m.attach(email.mime.application.MIMEApplication(
        rng.integers(0, 256, size * 3 // 4, dtype=np.uint8).tobytes(), Name="big.bin"))
    return m.as_bytes()


# ------------------------------------------------------------------ the cut
def test_the_cut_keeps_headers_and_ends_at_a_mime_boundary():
    raw = big_mail()
    assert len(raw) > 5_000_000
    cut = cut_mail(raw, DEFAULT_MAX_MESSAGE_BYTES)
    assert len(cut) <= DEFAULT_MAX_MESSAGE_BYTES and truncated_size(cut) == len(raw)
    body = cut.split(b"\r\n", 1)[1]
    assert raw.startswith(body)  # (the original bytes, up to the cut)
    assert body.split(b"\n\n", 1)[0] == raw.split(b"\n\n", 1)[0]  # every header kept
    assert raw[len(body):].startswith(b"--=====")  # cut where a boundary line starts
    assert cut_mail(cut, DEFAULT_MAX_MESSAGE_BYTES) == cut
    a = MailTokenizer().analyse(raw)
    assert {"defect:truncated", "subject:cheap", "winner"} <= set(a.tokens)
    assert a.size == len(raw)
    b = MailTokenizer().analyse(cut)  # cut by the producer: the same tokens and size
    assert (b.tokens, b.size) == (a.tokens, a.size)


def test_a_mail_without_a_boundary_is_cut_at_a_line_end_and_headers_alone_at_a_line():
    raw = b"Subject: long\n\n" + b"word " * 100 + b"\n" + b"x" * 5000
    cut = cut_mail(raw, 1200)
    assert len(cut) <= 1200 and cut.endswith(b"word \n")
    headers = b"".join(b"X-H%d: %s\n" % (i, b"v" * 50) for i in range(100)) + b"\nbody"
    cut = cut_mail(headers, 1200)
    assert len(cut) <= 1200 and cut.endswith(b"\n") and truncated_size(cut) == len(headers)


# ------------------------------------------------------------------ through the daemon
@pytest.mark.redis
def test_a_5_mb_mail_gets_a_prediction_and_is_learnt(redis_server, tmp_path, capsys):
    r = redis_server.client()
    url = redis_server.url
    # argmax labels and weight-1 learning from the first class on (no mail defaults), so
    # three labelled mails give a verdict and counts of messages
    spec = ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 12},
                     decision={"min_class_weight": None}, error_weight=1)
    # straight onto the stream (another producer, no cut): 5 MB under the 8 MiB entry bound
    r.xadd(K.input, {"data": msgpack.packb({"id": "big-raw", "raw": big_mail(seed=1),
                                            "label": "spam"}, use_bin_type=True)})
    # through streamnb produce, which cuts it before sending
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "big.eml").write_bytes(big_mail(seed=2))
    (tmp_path / "in" / "ham.eml").write_bytes(b"Subject: lunch\n\nteam meeting notes\n")
    assert main(["produce", "--redis", url, "--model", "mail", "--allow-new", "--label", "spam",
                 str(tmp_path / "in" / "big.eml")]) == 0
    assert main(["produce", "--redis", url, "--model", "mail", "--allow-new", "--label", "ham",
                 str(tmp_path / "in" / "ham.eml")]) == 0
    sizes = [len(f[b"data"]) for _, f in r.xrange(K.input)]
    assert sizes[0] > 5_000_000 and sizes[1] <= DEFAULT_MAX_MESSAGE_BYTES + 200
    r.xadd(K.input, {"data": msgpack.packb({"id": "probe", "raw": big_mail(seed=3)},
                                           use_bin_type=True)})
    w = url_worker(url, [spec], fast_options("w1"))
    w.run_until_idle()
    assert r.xlen(K.dead) == 0 and r.xpending(K.input, GROUP)["pending"] == 0
    outs = {o["id"]: o for o in (decode_output(f[b"data"]) for _, f in r.xrange(K.out))}
    assert outs["big-raw"]["learned"] is True
    produced = [o for i, o in outs.items() if i not in ("big-raw", "probe")]
    assert sorted((o["true_label"], o["learned"]) for o in produced) == [
        ("ham", True), ("spam", True)]
    assert outs["probe"]["label"] == "spam"  # a prediction for the unlabelled 5 MB mail
    assert w.models["mail"].replica.model.class_count_.tolist() == [1.0, 2.0]  # ham, spam
    capsys.readouterr()


@pytest.mark.redis
def test_produce_refuses_what_is_not_mail_and_an_empty_directory(redis_server, tmp_path, capsys):
    url = redis_server.url
    d = tmp_path / "box"
    d.mkdir()
    (d / "a.eml").write_bytes(b"Subject: hi\n\nhello\n")
    (d / "empty.eml").write_bytes(b"")
    (d / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (d / "nul.eml").write_bytes(b"Subject: x\x00y\n\nbody")
    (d / "plain.txt").write_bytes(b"just some text\n")
    assert main(["produce", "--redis", url, "--model", "mail", "--allow-new", str(d)]) == 1
    out, err = capsys.readouterr()
    assert "box/empty.eml: empty, not mail" in err
    assert "box/image.png: binary (NUL bytes in the headers), not mail" in err
    assert "box/plain.txt: does not start with a header line, not mail" in err
    assert "box/nul.eml: binary (NUL bytes in the headers), not mail" in err
    assert "sent 1 of 5 messages" in out and "skipped 4" in out
    empty = tmp_path / "nothing"
    (empty / "sub").mkdir(parents=True)
    (empty / ".hidden").write_bytes(b"Subject: x\n\ny")
    assert main(["produce", "--redis", url, "--model", "mail", "--allow-new", str(d / "a.eml"),
                 str(empty)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"streamnb: error: {str(empty)!r} is an empty directory: no message to send"]
    assert redis_server.client().xlen(K.input) == 1  # nothing more was sent


@pytest.mark.redis
def test_produce_keys_a_cut_mail_as_the_whole_mail(redis_server, tmp_path):
    """The learn-once key of a mail without a Message-ID is a hash of its bytes: produce
    takes it from the whole mail before cutting, as a worker given the whole mail would."""
    from streamnb_workers.client.produce import produce
    from streamnb_workers.wire.learn_keys import message_key

    r = redis_server.client()
    raw = b"Subject: big\n\n" + b"word " * 600_000  # 3 MB, no Message-ID
    (tmp_path / "big.eml").write_bytes(raw)
    produce(r, "mail", [str(tmp_path / "big.eml")], label="spam")
    (_, fields), = r.xrange(K.input)
    sent = msgpack.unpackb(fields[b"data"], raw=False)
    assert len(sent["raw"]) <= DEFAULT_MAX_MESSAGE_BYTES and truncated_size(sent["raw"]) == len(raw)
    assert sent["key"] == message_key(raw, "raw") != message_key(sent["raw"], "raw")

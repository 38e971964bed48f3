"""A piped mail's header block, the headers written into it and the bytes left as they came
(no Redis): every mail of the shipped SpamAssassin sample, and the edge cases."""

from __future__ import annotations

import io

import pytest

from streamnb_workers.cli.demo import load_sample
from streamnb_workers.cli.pipe_message import PipedMessage, verdict_exit_code

HEADERS = [("X-Streamnb-Verdict", "spam"), ("X-Streamnb-Score", "12.34")]


def rewrite(raw: bytes, max_size: int = 512 * 1024, headers=HEADERS) -> tuple[PipedMessage, bytes]:
    m = PipedMessage.from_bytes(raw, max_size)
    out = io.BytesIO()
    m.write_with_headers(out, headers)
    m.close()
    return m, out.getvalue()


def test_every_sample_mail_gains_two_lines_and_keeps_every_other_byte():
    for mail in load_sample():
        m, out = rewrite(mail.raw)
        end = m.header_end
        assert end is not None and end > 0, mail.path
        sep = m.linesep
        added = b"".join(f"{k}: {v}".encode() + sep for k, v in HEADERS)
        # the header block without its blank line, our two lines, then the rest as it was
        head = mail.raw[:end]
        blank = sep if head.endswith(sep + sep) or head.endswith(b"\n" + sep) else b""
        if not blank:  # a mail whose header block ends at the end of the mail
            assert end == len(mail.raw)
        assert out == head[:len(head) - len(blank)] + added + blank + mail.raw[end:], mail.path
        assert m.scored_bytes() == mail.raw[:m.max_size]


@pytest.mark.parametrize("raw, want", [
    # LF, folded forged header of ours removed, other folded header kept
    (b"A: 1\nX-STREAMNB-score: 9\n 9\nB: x\n  y\n\nbody\n",
     b"A: 1\nB: x\n  y\nX-Streamnb-Verdict: spam\nX-Streamnb-Score: 12.34\n\nbody\n"),
    # CRLF kept for the added lines
    (b"A: 1\r\n\r\nbody\r\n\r\n",
     b"A: 1\r\nX-Streamnb-Verdict: spam\r\nX-Streamnb-Score: 12.34\r\n\r\nbody\r\n\r\n"),
    # an mbox From_ line stays first
    (b"From a@b Sat Jan  1 00:00:00 2000\nA: 1\n\nFrom me\n",
     b"From a@b Sat Jan  1 00:00:00 2000\nA: 1\nX-Streamnb-Verdict: spam\nX-Streamnb-Score: 12.34\n\nFrom me\n"),
    # headers only, no final line end
    (b"A: 1\nB: 2", b"A: 1\nB: 2\nX-Streamnb-Verdict: spam\nX-Streamnb-Score: 12.34\n"),
    # no headers at all: a blank first line
    (b"\nbody", b"X-Streamnb-Verdict: spam\nX-Streamnb-Score: 12.34\n\nbody"),
    # empty input
    (b"", b"X-Streamnb-Verdict: spam\nX-Streamnb-Score: 12.34\n"),
    # a header named like ours but for a prefix only is kept
    (b"X-Streamnbx: 1\n\nb", b"X-Streamnbx: 1\nX-Streamnb-Verdict: spam\nX-Streamnb-Score: 12.34\n\nb"),
])
def test_edge_cases(raw, want):
    assert rewrite(raw)[1] == want


def test_a_header_block_longer_than_the_part_scored():
    raw = b"From x\n" + b"".join(b"H%d: %s\n" % (i, b"v" * 50) for i in range(100)) + b"\nbody\n"
    m, out = rewrite(raw, max_size=1024)
    assert m.header_end is None
    # the new fields go after the From_ line; nothing else changes
    assert out == b"From x\nX-Streamnb-Verdict: spam\nX-Streamnb-Score: 12.34\n" + raw[len(b"From x\n"):]
    assert len(m.scored_bytes()) == 1024


@pytest.mark.parametrize("verdict, classes, positive, code", [
    ("spam", ["ham", "spam"], None, 0),
    ("ham", ["ham", "spam"], None, 1),
    ("unsure", ["ham", "spam"], None, 2),
    (None, ["ham", "spam"], None, 3),
    ("ham", ["ham", "spam"], "ham", 0),
    ("spam", ["ham", "spam"], "nope", 3),     # a --positive that is no class: no verdict
    ("sports", ["news", "sports", "weather"], None, 1),   # positive: weather (last sorted)
    ("weather", ["news", "sports", "weather"], None, 0),
    (1, [0, 1], None, 0),                     # int labels
    ("spam", [], None, 3),
])
def test_exit_codes(verdict, classes, positive, code):
    assert verdict_exit_code(verdict, classes, positive) == code

"""The fast mail reader (streamnb.features.mime) against the standard-library path.

``MailTokenizer.analyse(raw, fast=False)`` parses with ``email.parser`` only: the reference.
The fast path must give the same tokens, in the same order, and the same meta vector, on
real mail and on crafted corner cases; what it does not reproduce it hands to the stdlib.
The fast word rules, address parser and letter counts are checked against the plain
implementations they replace.
"""

from __future__ import annotations

import base64
import csv
import email.utils

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.features.mail import MailAnalysis, MailTokenizer, _getaddresses
from streamnb.features.mime import Unsupported, parse_message
from streamnb.features.text import URL_RE, WordRules, _url_host, host_tokens

TOKENIZER = MailTokenizer()


def assert_paths_agree(raw: bytes, tokenizer: MailTokenizer = TOKENIZER) -> None:
    fast, slow = tokenizer.analyse(raw), tokenizer.analyse(raw, fast=False)
    assert fast.tokens == slow.tokens
    np.testing.assert_array_equal(fast.meta(), slow.meta())
    assert (fast.parts, fast.attachments, fast.recipients, fast.received) == (
        slow.parts, slow.attachments, slow.recipients, slow.received)


def fast_path_reads(raw: bytes) -> bool:
    """Whether the fast reader takes the message itself (no stdlib fallback)."""
    try:
        TOKENIZER._analyse_fast(raw, MailAnalysis())
    except Unsupported:
        return False
    return True


# ------------------------------------------------------------------ real mail
@pytest.mark.corpus
def test_corpus_fast_path_equals_stdlib_path(corpus_dir):
    with open(corpus_dir / "index.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    fallbacks = 0
    for row in rows:
        raw = (corpus_dir / row["path"]).read_bytes()
        assert_paths_agree(raw)
        fallbacks += not fast_path_reads(raw)
    assert fallbacks <= len(rows) // 100  # only the odd message goes to the stdlib (3 here)


# ------------------------------------------------------------------ crafted corner cases
B64 = base64.b64encode("Gratuit aujourd'hui au café".encode()).decode()
CASES = {
    "plain": b"From: Bob <bob@x.org>\nSubject: hi\n\nhello there world\n",
    "mbox_from": b"From bob@x.org  Mon Jan 1 00:00:00 2002\nSubject: hi\n\nbody words here\n",
    "crlf": b"From: a@x.org\r\nSubject: crlf\r\n folded\r\nContent-Type: multipart/mixed; boundary=B\r\n\r\n"
            b"pre\r\n--B\r\nContent-Type: text/plain\r\n\r\nfirst part\r\n--B\r\n\r\nsecond part\r\n--B--\r\nepi\r\n",
    "no_separator": b"Subject: x\nthis line is body text\nmore text\n",
    "first_line_continuation": b"  folded first\nSubject: x\n\nbody text\n",
    "misplaced_from": b"Subject: x\nFrom someone else\nTo: a@b.org\n\nbody text\n",
    "colon_header": b"Subject: x\n: no name here\n\tcontinued\nTo: a@b.org\n\nbody text\n",
    "blank_value_folded": b"Subject:   \n\tfolded value\nX-Empty:\n\nbody\n",
    "headers_only": b"Subject: only headers\nTo: a@b.org",
    "no_boundary": b"Content-Type: multipart/mixed\n\nmultipart without boundary text\n",
    "start_not_found": b"Content-Type: multipart/mixed; boundary=B\n\n--C\nnot our boundary text\n",
    "close_first": b"Content-Type: multipart/mixed; boundary=B\n\npreamble words\n--B--\nepilogue words\n",
    "close_not_found": b"Content-Type: multipart/mixed; boundary=B\n\n--B\n\nunterminated part text\n",
    "consecutive_boundaries": b'Content-Type: multipart/mixed; boundary="B"\n\n--B\n--B  \n--B--\n--B\n\nafter runs\n--B--\n',
    "boundary_like_lines": b"Content-Type: multipart/mixed; boundary=B\n\n--B\n\n--Bxyz is text\n --B indented\n--B--x\n--B--\n",
    "nested": b"Content-Type: multipart/mixed; boundary=o\n\n--o\nContent-Type: multipart/alternative; boundary=i\n\n"
              b"--i\nContent-Type: text/plain\n\nplain words\n--i\nContent-Type: text/html\n\n<b>html</b> words\n--i--\n"
              b"inner epilogue\n--o\nContent-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: base64\n\n"
              + B64.encode() + b"\n--o--\n",
    "inner_part_cut_by_outer": b"Content-Type: multipart/mixed; boundary=o\n\n--o\nContent-Type: multipart/mixed; boundary=i\n\n"
                               b"--i\n\ninner text\n--o\n\nouter text\n--o--\n",
    "invalid_multipart_cte": b"Content-Type: multipart/mixed; boundary=B\nContent-Transfer-Encoding: base64\n\n--B\n\nx y z\n--B--\n",
    "quoted_params": b'Content-Type: text/plain; name="a;b.TXT"; charset="ISO-8859-1"\n'
                     b'Content-Disposition: attachment; filename="<inv.exe>"\n\ncaf\xe9 ouvert\n',
    "attachment_names": b"Content-Type: multipart/mixed; boundary=B\n\n--B\nContent-Type: application/pdf; name=doc.PDF\n"
                        b"Content-Transfer-Encoding: base64\n\nJVBERi0=\n--B\nContent-Type: image/gif\n"
                        b"Content-Disposition: inline; filename=noext\n\nGIF\n--B--\n",
    "base64_bad_padding": b"Content-Transfer-Encoding: base64\n\naGVsbG8gd29ybGQ\n",
    "base64_garbage": b"Content-Transfer-Encoding: base64\n\n!!!@@@ not base64 ====\n",
    "base64_upper_cte": b"Content-Transfer-Encoding: BASE64\n\n" + B64.encode() + b"\n",
    "base64_trailing_space_cte": b"Content-Transfer-Encoding: base64 \n\n" + B64.encode() + b"\n",
    "quoted_printable": b"Content-Type: text/plain; charset=iso-8859-1\nContent-Transfer-Encoding: quoted-printable\n\n"
                        b"t=E9l=E9phone gratuit=\nment =3D ok\n",
    "non_ascii_headers": b"From: \xff\xfe <\xc3@\xe2\x82.example>\nTo: \xf0\x9f\x98\nSubject: caf\xe9 \xc0\xaf\n"
                         b"Content-Type: text/plain; charset=\"utf-8\"; name=\"\xff\"\n\nbad \xff\xfe bytes\n",
    "rfc2047": b"Subject: =?iso-8859-1?q?Caf=E9_offers?= today\nFrom: =?utf-8?b?Qm9i?= <bob@x.org>\n\nbody\n",
    "unknown_charset": b"Content-Type: text/plain; charset=x-no-such-charset\n\ncaf\xe9 ouvert\n",
    "html_entities_nbsp": b"Content-Type: text/html\n\n<p>Caf&eacute;&nbsp;OPEN <a href='http://X.example.com/p'>Now</a>"
                          b"<!-- c --> www.Shop.example.org/x</p>",
    "addresses": b'From: "Doe, J." <j@x.org>\nTo: a@b.org, Bob Smith <b@y.org>, c@z.org (Carol), , undisclosed:;\n'
                 b'Cc: "Q \\"x\\"" <q@w.org>\nReply-To: <>\nReturn-Path: <bounce@r.example.net>\n\nbody\n',
    "received": b"Received: from mx.spam.example.net ([10.1.2.3]) by mail.local.org with SMTP\n"
                b"Received: from [192.168.0.1] by host.example.com\n\nbody\n",
    "digest": b"Content-Type: multipart/digest; boundary=B\n\n--B\n\nSubject: inner\n\ndigest body\n--B--\n",
    "rfc822": b"Content-Type: multipart/mixed; boundary=B\n\n--B\nContent-Type: message/rfc822\n\n"
              b"Subject: inner\n\nforwarded text\n--B--\n",
    "lone_cr": b"Subject: x\rTo: a@b.org\n\nbody\rtext\n",
    "rfc2231": b"Content-Type: application/octet-stream; name*=utf-8''caf%C3%A9.exe\n\nxx\n",
    "uuencode": b"Content-Transfer-Encoding: x-uuencode\n\nbegin 644 a.txt\n#86)C\n`\nend\n",
    "mbox_from_closing_headers": b"Subject: x\nFrom bob Mon Jan 1\n\nbody\n",
}


@pytest.mark.parametrize("name", list(CASES))
def test_crafted_fast_path_equals_stdlib_path(name):
    assert_paths_agree(CASES[name])


@pytest.mark.parametrize("name", ["digest", "rfc822", "lone_cr", "rfc2231", "uuencode", "mbox_from_closing_headers"])
def test_what_the_fast_reader_does_not_reproduce_goes_to_the_stdlib(name):
    assert not fast_path_reads(CASES[name])


def test_common_mail_takes_the_fast_path():
    for name in ["plain", "mbox_from", "crlf", "nested", "addresses", "received", "no_boundary"]:
        assert fast_path_reads(CASES[name]), name


def test_depth_limit_goes_to_the_stdlib_path():
    """At the MIME depth limit the stdlib path decides (``defect:mime_depth`` as before)."""
    depth = 12
    head = b"".join(f"Content-Type: multipart/mixed; boundary=b{i}\n\n--b{i}\n".encode() for i in range(depth))
    raw = head + b"Content-Type: text/plain\n\ndeep text\n"
    assert not fast_path_reads(raw)
    assert "defect:mime_depth" in TOKENIZER.tokenize(raw)
    assert_paths_agree(raw)


def test_limits_agree_on_both_paths():
    part = b"--XX\nContent-Type: text/plain\n\n" + b"spam words here " * 50 + b"\n"
    raw = b"Content-Type: multipart/mixed; boundary=XX\n\n" + part * 200 + b"--XX--\n"
    from streamnb.codec import Limits

    for limits in [Limits(max_mime_parts=64, max_tokens=2_000), Limits(max_decoded_bytes=5_000),
                   Limits(max_text_chars=300), Limits(max_message_bytes=3_000)]:
        assert_paths_agree(raw, MailTokenizer(limits=limits))


def test_parts_and_payloads_as_the_stdlib_sees_them():
    root = parse_message(CASES["nested"])
    outer = list(root.children())
    assert [p.content_type() for p in outer] == ["multipart/alternative", "text/plain"]
    inner = list(outer[0].children())
    assert [p.payload() for p in inner] == [b"plain words", b"<b>html</b> words"]
    assert outer[1].payload().decode() == "Gratuit aujourd'hui au café"
    assert outer[1].charset() == "utf-8"


MIME_PIECES = st.lists(st.sampled_from([
    b"Content-Type: multipart/mixed; boundary=B\n", b"Content-Type: multipart/alternative; boundary=\"C\"\n",
    b"Content-Type: text/html\n", b"Content-Type: text/plain; charset=utf-8\n",
    b"Content-Transfer-Encoding: base64\n", b"Content-Transfer-Encoding: quoted-printable\n",
    b"--B\n", b"--B--\n", b"--C\n", b"--C--\n", b"\n", b"\r\n", b" folded\n", b"From x\n", b": odd\n",
    b"word WORD caf\xe9 http://a.example.com/x\n", b"<p>tag</p>&amp;\n", b"aGVsbG8=\n", b"=E9t=\n",
    b"Subject: =?utf-8?q?x?=\n", b"To: a@b.org, \"N, M\" <c@d.org>\n", b"x@y\n", b"--B", b"\xff\xfe",
]), max_size=30)


@settings(max_examples=300, deadline=None)
@given(MIME_PIECES)
def test_random_mime_fragments_agree(pieces):
    assert_paths_agree(b"".join(pieces))


# ------------------------------------------------------------------ the pieces
ADDRESS_FIELDS = [
    "", " ", "a@b.org", "a@b.org,", "a@b.org, ", ",,", "Bob <b@y.org>", '"Doe, J." <j@x.org>',
    "  Bob   Smith\n\t<b@y.org>  ,c@d", "c@z.org (Carol)", "c@z.org\n (Carol)", "x", "Bob Smith",
    "<>", '"" <a@b>', 'A"B" <a@b>', "a@b@c", "undisclosed-recipients:;", "<a@b> junk", "a @ b.org",
    "Bob <b@y.org> (c)", "a@[1.2.3.4]", "é@ü.example, Zoë <z@ö.example>", "a@b.org (x (y) z)",
]


@pytest.mark.parametrize("field", ADDRESS_FIELDS)
def test_getaddresses_matches_the_stdlib(field):
    assert _getaddresses(field) == email.utils.getaddresses([field])


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet='ab@.,<>" ()\\:;\t\né', max_size=30))
def test_getaddresses_matches_the_stdlib_on_random_fields(field):
    assert _getaddresses(field) == email.utils.getaddresses([field])


WORD_TEXT = st.lists(st.sampled_from(list("abcXYZ@.-!'\" \t\n\xa0é日_") + ["supercalifragilistic"]),
                     max_size=60).map("".join)


@settings(max_examples=400, deadline=None)
@given(WORD_TEXT, st.integers(1, 4), st.integers(3, 12), st.sampled_from([None, 0, 1, 3, 10]), st.integers(0, 3))
def test_fast_word_rules_match_the_word_loop(text, lo, hi, limit, already):
    rules = WordRules(min_len=lo, max_len=hi)
    fast, loop = ["x"] * already, ["x"] * already
    rules.words(text, fast, limit)
    rules._word_loop(text.lower(), loop, limit)
    assert fast == loop


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(list("hHtpsfFmMwW:/.aé_ -\n") + ["http://", "www.", "mailto:"]), max_size=30).map("".join))
def test_url_scan_matches_url_re(text):
    """The fast URL scan finds what the documented ``URL_RE`` finds."""
    out: list[str] = []
    rest = WordRules().urls(text, out)
    expected: list[str] = []
    if "://" in text or "www." in text or "WWW." in text:
        for m in URL_RE.finditer(text):
            expected.append("proto:" + (m.group(1) or "http").lower())
            expected.extend(host_tokens("url", _url_host(m.group(2))))
        assert rest == URL_RE.sub(" ", text)
    assert out == expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_text_stats_match_str_methods(text):
    a = MailAnalysis()
    a.add_text_stats(text, from_html=False)
    assert a.letters == sum(c.isalpha() for c in text)
    assert a.upper == sum(c.isupper() for c in text)
    assert a.non_ascii == sum(ord(c) > 127 for c in text)

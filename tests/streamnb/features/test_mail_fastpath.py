"""The fast mail reader (streamnb.features.mime) against the standard-library path.

``MailTokenizer.analyse(raw, fast=False)`` parses with ``email.parser`` only: the reference.
The fast path must give the same tokens, in the same order, and the same meta vector, on
real mail and on crafted corner cases; what it does not reproduce it hands to the stdlib.
The fast word rules, address parser, letter counts, header block scan, URL scan, HTML tag
tokens and the case-spelt regexes are checked against the plain implementations they replace.
"""

from __future__ import annotations

import base64
import csv
import email.utils
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.features.mail import MailAnalysis, MailTokenizer
from streamnb.features.mail_headers import _getaddresses
from streamnb.features.markup import strip_html
from streamnb.features.mime import (
    Unsupported,
    _header_block_end,
    _plain_headers,
    parse_message,
    parse_part,
)
from streamnb.features.text import URL_RE, WordRules, _url_host, host_tokens

TOKENIZER = MailTokenizer()


def assert_paths_agree(raw: bytes, tokenizer: MailTokenizer = TOKENIZER) -> None:
    """Both paths give the same analysis, and the fast one did not fail on the way (an
    error in it falls back to the stdlib path silently; only ``Unsupported`` may)."""
    fast_path_reads(raw)  # raises any error other than Unsupported
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
    from streamnb.features import FeatureLimits as Limits

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


def test_a_folded_boundary_goes_to_the_standard_parser():
    """A boundary parameter folded onto a second line holds a line break: the standard
    parser reads line by line and never finds it; the fast reader must not either (it
    used to find it across the two lines). Found by the test below."""
    raw = b"Content-Type: multipart/mixed; boundary=B\n folded\n--B\n folded\n"
    assert not fast_path_reads(raw)
    assert_paths_agree(raw)
    assert "defect:startboundarynotfounddefect" in TOKENIZER.analyse(raw).tokens


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


# ------------------------------------------------------------------ scans that replace a regex
# Each fast scan is checked against the plain regex (or loop) it replaces.
_OLD_HEADER_BLOCK = re.compile(rb"(?>(?:From |[\x21-\x39\x3b-\x7e]*:|[\t ])[^\r\n]*(?:\r?\n|\Z))*")
_OLD_PLAIN_FIELD = re.compile(
    r"([\x21-\x39\x3b-\x7e]+):[ \t]*((?:[^ \t\r\n][^\r\n]*)?(?:\r?\n[ \t][^\r\n]*)*)(?:\r?\n|\Z)")
HEADER_LINES = st.lists(st.sampled_from([
    b"Subject: hi\n", b"To:  a@b.org\r\n", b"X-Empty:\n", b"X-Blank:   \n", b" folded\n", b"\tfolded\r\n",
    b"From x Mon\n", b": no name\n", b"no colon here\n", b"\n", b"\r\n", b"Bad\rline: x\n", b"A: b\r",
    b"Name-With.Dots: v", b"x:y\n", b"\xff: high\n",
]), max_size=12).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(HEADER_LINES, HEADER_LINES, st.integers(0, 3))
def test_header_block_and_fields_match_the_line_regexes(head, rest, start):
    buf = head + rest
    start = min(start, len(buf))
    block_end = _header_block_end(buf, start, len(buf))
    assert block_end == _OLD_HEADER_BLOCK.match(buf, start).end()
    if b"\r" not in buf or buf.count(b"\r") == buf.count(b"\r\n"):  # (lone ones: unsupported)
        plain = _plain_headers(buf, start, block_end)
        if plain is not None:
            text = buf[start:block_end].decode("ascii")
            if text.startswith("From "):
                text = text[re.match(r"[^\r\n]*(?:\r?\n|\Z)", text).end() :]
            assert plain == _OLD_PLAIN_FIELD.findall(text)


def test_part_names_and_index_are_lower_case():
    part = parse_part(b"Subject: a\nX-Y: 1\nsubject: b\nRECEIVED: r\n\nbody")
    assert part.names() == ["subject", "x-y", "subject", "received"]
    assert part.header_index() == {"subject": ["a", "b"], "x-y": ["1"], "received": ["r"]}
    assert part.get_all("subject") == ["a", "b"] and part.get_all("cc") == []


_OLD_RECEIVED_HOST = re.compile(r"(?=[fb])\b(?:from|by)\s+([a-z0-9][a-z0-9.-]*[a-z0-9])", re.I)
_OLD_LINK = re.compile(
    r"""(?i)\b(?:href|src|action)\s*=\s*["']?\s*(?:https?|ftp)://(?:[^/?#@\s"'>]*@)?([a-z0-9][a-z0-9.-]*)""")
# The letters IGNORECASE matches beyond ASCII (İ ı ſ K) are in the alphabets.
CASE_TEXT = st.lists(st.sampled_from(
    ["from", "FROM", "fRoM", "by", "BY", "href", "HREF", "src", "ſrc", "actıon", "actİon", "http://", "httpſ://",
     "ftp://", "=", "'", " ", "\t", "a", "x.y", "-", "K", "İ", "ı", "ſ", "é", "_", "@", "9", "[", "]", ".", "b", "f"]),
    max_size=25).map("".join)


@settings(max_examples=500, deadline=None)
@given(CASE_TEXT)
def test_case_spelt_out_regexes_match_their_ignorecase_forms(text):
    from streamnb.features.mail_headers import _RECEIVED_HOST
    from streamnb.features.markup import _LINK

    assert _RECEIVED_HOST.findall(text) == _OLD_RECEIVED_HOST.findall(text)
    assert _LINK.findall(text) == _OLD_LINK.findall(text)


@pytest.mark.parametrize("text", [
    "ſrc=http://a.example", "actİon = 'http://b.example'", "actıon=ftp://c.example", "href=httpſ://d.example",
    "HREF=HTTP://\u212aelvin.example", "xhref=http://no.example", "from ſ.example BY ı.example", "frOm K.x",
])
def test_case_spelt_out_regexes_on_the_odd_letters(text):
    from streamnb.features.mail_headers import _RECEIVED_HOST
    from streamnb.features.markup import _LINK

    assert _RECEIVED_HOST.findall(text) == _OLD_RECEIVED_HOST.findall(text)
    assert _LINK.findall(text) == _OLD_LINK.findall(text)


def _old_received_tokens(text: str) -> list[str]:
    out = []
    for host in _OLD_RECEIVED_HOST.findall(text)[:4]:
        out.extend(host_tokens("received", host))
    out.extend("received:" + ".".join(ip) for ip in re.findall(r"\[(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.\d{1,3}\]", text)[:2])
    return out


@pytest.mark.parametrize("value", [
    "from a.example.com ([10.1.2.3]) by b.example.org with SMTP id x",
    "from x by y by z from w by v from u ([1.2.3.4]) [5.6.7.8] [9.9.9.9]",
    "FROM Mail.Example.NET by [127.0.0.1]", "nothing here", "from  ſ.example by K.example",
])
def test_received_tokens_match_the_regexes(value):
    from streamnb.features.mail_headers import _received_tokens

    out: list[str] = []
    _received_tokens(value, out)
    assert out == _old_received_tokens(value)


def _old_strip_tokens(pieces: list[str], max_tag_tokens: int) -> list[str]:
    tokens: list[str] = []
    for slash, name, attrs in zip(pieces[1::4], pieces[2::4], pieces[3::4], strict=True):
        if len(tokens) >= max_tag_tokens:
            break
        if not slash:
            tokens.append("html:" + name.lower())
        for host in _OLD_LINK.findall(attrs):
            tokens.extend(host_tokens("url", host))
    return tokens


HTML = st.lists(st.sampled_from([
    "<a href='http://x.example.com/'>", "</a>", "<P>", "</p >", "<img src=http://a.b.c/x src=ftp://u@d.e>",
    "<b title='a://b'>", "text ", '<A HREF="HTTPS://Q.R">', "<!-- c -->", "</a href=http://close.example/>",
    "<x hreF = 'http://h.example/'>", "&amp;", "<script>x</script>",
]), max_size=30).map("".join)


@settings(max_examples=400, deadline=None)
@given(HTML, st.sampled_from([0, 1, 2, 3, 5, 8, 2000]))
def test_html_tokens_match_the_tag_loop(markup, cap):
    from streamnb.features.markup import _COMMENT, _DROP, _TAG

    _, tokens = strip_html(markup, cap)
    stripped = _DROP.sub(lambda m: f" <{m.group(1)}> ", _COMMENT.sub("", markup))
    assert tokens == _old_strip_tokens(_TAG.split(stripped), cap)


@pytest.mark.parametrize("text", [
    "x " + "http://a.example/ " * 300,  # more candidates than the scan tries: one regex pass
    "İ www.x.example http://y.example",  # lower-casing changes the length: one regex pass
    "WwW.a.example wWw.b.example mailto://c@d.example ftp://e.example/x httpſ://f.example",
])
def test_url_scan_fallbacks_match_url_re(text):
    out: list[str] = []
    rest = WordRules().urls(text, out)
    expected: list[str] = []
    for m in URL_RE.finditer(text):
        expected.append("proto:" + (m.group(1) or "http").lower())
        expected.extend(host_tokens("url", _url_host(m.group(2))))
    assert out == expected and rest == URL_RE.sub(" ", text)


@pytest.mark.parametrize("text", ["", "Abc", "ÀÉ é ß", "Straße ΣΑΣ — “quoted” ﬀ K", "日本語 ABC", "\udc80x"])
def test_text_stats_of_mixed_scripts(text):
    a = MailAnalysis()
    a.add_text_stats(text, from_html=False)
    assert (a.letters, a.upper, a.non_ascii) == (
        sum(c.isalpha() for c in text), sum(c.isupper() for c in text), sum(ord(c) > 127 for c in text))


def test_memoised_header_values_give_the_same_tokens():
    raw = (b"From: Bob <bob@x.org>\nTo: a@b.org, c@d.org\nFrom: (\nSubject: same subject\n"
           b"Content-Type: text/plain; charset=utf-8; name=a.txt\n\nbody words\n")
    first, second = TOKENIZER.analyse(raw), TOKENIZER.analyse(raw)
    assert first.tokens == second.tokens and first.defects == second.defects
    assert first.recipients == second.recipients == 2
    np.testing.assert_array_equal(first.meta(), second.meta())
    assert_paths_agree(raw)


def test_unsupported_parameters_stay_unsupported_when_memoised():
    assert not fast_path_reads(CASES["rfc2231"])
    assert not fast_path_reads(CASES["rfc2231"])


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=" \t\n\xa0.,;:!?-_=/\\|'\"<>#&abcXYZé@1", max_size=40))
def test_word_header_tokens_match_split_and_join(text):
    from streamnb.features.mail_headers import _SUBJECT_SPLIT

    words = [w for w in _SUBJECT_SPLIT.split(text) if w]
    expected = tuple(f"subject:{t}" for t in WordRules().tokens(" ".join(words)))
    assert TOKENIZER.header_tokenizer.value_tokens("subject", text) == expected


def test_header_names_in_the_options_match_without_regard_to_case():
    raw = b"From: Bob <bob@example.com>\nSubject: Cheap meds\nX-Mailer: Foo 1.0\n\nbody text"
    upper = MailTokenizer(headers=("Subject", "X-MAILER"))
    lower = MailTokenizer(headers=("subject", "x-mailer"))
    assert upper.headers == ("subject", "x-mailer")
    expected = lower.analyse(raw).tokens
    assert "subject:cheap" in expected and "x-mailer:foo" in expected
    assert upper.analyse(raw).tokens == expected == upper.analyse(raw, fast=False).tokens


def test_clear_memos_empties_them_and_tokens_do_not_depend_on_them():
    from streamnb.features import mail_headers, mime_params, text

    raw = (b"From: Bob <bob@example.com>\nReceived: from relay.example.net by mx.example.org\n"
           b"Content-Type: text/html; charset=utf-8\nSubject: Cheap meds\n\n"
           b'<a href="http://x.example.com/p">NOW</a> visit www.example.com today')
    tok = MailTokenizer()
    warm = tok.analyse(raw).tokens
    assert mail_headers._VALUE_CACHES and mime_params._PARAMS
    mail_headers.clear_memos()
    assert not mail_headers._VALUE_CACHES and not mime_params._PARAMS
    assert text._cached_host_tokens.cache_info().currsize == 0
    assert tok.analyse(raw).tokens == warm == tok.analyse(raw, fast=False).tokens

"""Tokenizer rules, one test per rule, and the hostile mails of the issue (none may raise)."""

from __future__ import annotations

import base64
import time

import pytest

from streamnb.features import FeatureLimits as Limits
from streamnb.features import MailTokenizer, WordRules, strip_html, tokenize_email, tokenize_text
from streamnb.features.mail import META_FEATURES


def body_tokens(raw: bytes) -> list[str]:
    """Tokens without header/structure ones: what the body words produced."""
    prefixes = ("header:", "subject:", "from:", "to:", "message-id:", "content-type:", "part:",
                "charset:", "encoding:", "defect:")
    return [t for t in tokenize_email(raw) if not t.startswith(prefixes)]


# ------------------------------------------------------------------ word rules
def test_length_window_and_lowercase():
    assert tokenize_text("a an The quick brown") == ["the", "quick", "brown"]
    assert WordRules(lowercase=False).tokens("The Quick") == ["The", "Quick"]
    assert WordRules(min_len=1, max_len=3).tokens("a an the quick") == ["a", "an", "the", "skip:q 0"]


def test_long_runs_become_skip_tokens():
    # 13 chars -> "skip:a 10"; 25 chars -> "skip:x 20" (length rounded down to 10).
    assert tokenize_text("abcdefghijklm " + "x" * 25) == ["skip:a 10", "skip:x 20"]
    assert tokenize_text("twelve_chars") == ["twelve_chars"]


def test_punctuation_stripped_from_word_ends():
    assert tokenize_text('"Hello," (world)! ...free...') == ["hello", "world", "free"]


def test_urls_become_proto_and_host_tokens():
    toks = tokenize_text("see https://user@Mail.Example.co.uk:8080/path?q=1 and www.foo.org/x")
    assert toks == ["proto:https", "url:mail.example.co.uk", "url:co.uk", "proto:http",
                    "url:www.foo.org", "url:foo.org", "see", "and"]


def test_email_addresses_keep_the_domain():
    assert tokenize_text("write to bob@example.com now") == ["write", "email:example.com", "now"]


def test_non_ascii_words_add_an_8bit_share_token():
    assert tokenize_text("café") == ["café", "8bit%:30"]  # 1 of 4 characters: 25% -> 30


def test_bigrams_optional():
    assert WordRules(ngrams=True).tokens("cheap meds now") == [
        "cheap", "meds", "bi:cheap meds", "now", "bi:meds now"]


def test_text_token_limit():
    assert len(WordRules().tokens("word " * 100, limit=10)) == 10


def test_the_word_loop_stops_at_the_limit_after_any_kind_of_word():
    """Also after a short e-mail address (it used to read one more word after it); a
    word's own tokens (word, bigram, 8bit%) are not split."""
    rules = WordRules(ngrams=True)
    for text, first in [("bob@ex.org " + "x" * 30 + " more words", ["email:ex.org"]),
                        ("verylongwordhere x " * 5, ["skip:v 10"]),
                        ("zürich genève " * 5, ["zürich", "8bit%:20"])]:
        out: list[str] = []
        rules._word_loop(text, out, limit=1)
        assert out == first == rules.tokens(text)[: len(first)]
        assert rules.tokens(text, limit=1) == first[:1]


# ------------------------------------------------------------------ html
def test_html_tags_links_comments_scripts_entities():
    text, toks = strip_html(
        '<html><body><p>Vi<!-- x -->agra &amp; more</p><script>var spam = 1;</script>'
        '<a href="https://shop.example.net/buy">here</a><img src=\'http://img.host.org/a.gif\'></body></html>'
    )
    assert text.split() == ["Viagra", "&", "more", "here"]
    assert toks == ["html:html", "html:body", "html:p", "html:script", "html:a", "url:shop.example.net",
                    "url:example.net", "html:img", "url:img.host.org", "url:host.org"]


def test_html_unclosed_tag_and_comment_do_not_hang():
    start = time.perf_counter()
    text, toks = strip_html("<p" + "a" * 200_000 + "<!--" + "<" * 50_000)
    assert time.perf_counter() - start < 2.0
    assert isinstance(text, str)


# ------------------------------------------------------------------ mail rules
SIMPLE = (
    b"From sender@example.com  Thu Aug 22 13:17:22 2002\n"
    b"Received: from mx.spam.example.net ([10.1.2.3]) by mail.local.org with SMTP\n"
    b"From: \"Cheap Pharmacy\" <deals@Pharma.Example.biz>\n"
    b"To: alice@one.org, bob@two.org\n"
    b"Cc: carol@three.org\n"
    b"Subject: =?iso-8859-1?q?Caf=E9_offers?= today!!\n"
    b"X-Mailer: Microsoft Outlook Express 5.00\n"
    b"Message-Id: <abc@mailer.example.biz>\n"
    b"Content-Type: text/plain; charset=us-ascii\n"
    b"\n"
    b"Buy now at http://pharma.example.biz/x\n"
)


def test_mbox_from_line_is_tolerated_and_headers_tokenized():
    toks = tokenize_email(SIMPLE)
    assert not any(t.startswith("defect:") for t in toks)
    for expected in [
        "header:received", "header:x-mailer",
        "subject:café", "subject:offers", "subject:today", "subject:8bit%:30",
        "from:pharma.example.biz", "from:name:cheap", "from:name:pharmacy",
        "to:one.org", "to:two.org", "cc:three.org",
        "received:mx.spam.example.net", "received:example.net", "received:mail.local.org",
        "received:10.1.2",
        "x-mailer:microsoft", "x-mailer:outlook", "x-mailer:express",
        "message-id:mailer.example.biz", "content-type:text/plain", "part:text/plain", "charset:us-ascii",
        "proto:http", "url:pharma.example.biz", "buy", "now",
    ]:
        assert expected in toks, expected


def test_missing_headers_give_none_tokens():
    toks = tokenize_email(b"\n\nhello there")
    assert {"subject:none", "from:none", "to:none", "message-id:none"} <= set(toks)


def test_base64_and_quoted_printable_bodies_are_decoded():
    b64 = base64.b64encode("Gratuit aujourd'hui au café".encode()).decode()
    raw = (f"Content-Type: text/plain; charset=utf-8\nContent-Transfer-Encoding: base64\n\n{b64}\n").encode()
    assert {"gratuit", "aujourd'hui", "café"} <= set(body_tokens(raw))
    raw = b"Content-Type: text/plain; charset=iso-8859-1\nContent-Transfer-Encoding: quoted-printable\n\nt=E9l=E9phone gratuit=\nment\n"
    toks = tokenize_email(raw)
    assert "téléphone" in toks and "gratuitment" in toks and "encoding:quoted-printable" in toks


def test_html_part_gives_tags_hosts_and_text():
    raw = b"Content-Type: text/html\n\n<p>Click <a href='http://win.example.com/'>HERE</a></p>"
    toks = body_tokens(raw)
    assert toks == ["html:p", "html:a", "url:win.example.com", "url:example.com", "click", "here"]


def test_mime_structure_and_attachment_extension():
    raw = (
        b"Content-Type: multipart/mixed; boundary=XX\n\n--XX\nContent-Type: text/plain\n\nsee attached\n"
        b"--XX\nContent-Type: application/octet-stream; name=\"invoice.EXE\"\n"
        b"Content-Disposition: attachment; filename=\"invoice.EXE\"\nContent-Transfer-Encoding: base64\n\nTVqQAAMAAAAEAAAA\n--XX--\n"
    )
    a = MailTokenizer().analyse(raw)
    assert {"part:multipart/mixed", "part:text/plain", "part:application/octet-stream",
            "attachment:exe", "see", "attached"} <= set(a.tokens)
    assert a.parts == 3 and a.attachments == 1


# ------------------------------------------------------------------ hostile mail
def test_broken_mime_boundary_featurizes_with_a_defect():
    raw = b"Content-Type: multipart/mixed; boundary=NOPE\n\n--OTHER\nContent-Type: text/plain\n\nhello world\n"
    toks = tokenize_email(raw)
    assert any(t.startswith("defect:") for t in toks)
    assert "hello" in toks and "world" in toks  # the text is still read


def test_undecodable_charset_falls_back_with_a_defect():
    raw = b"Content-Type: text/plain; charset=x-no-such-charset\n\ncaf\xe9 ouvert"
    toks = tokenize_email(raw)
    assert "defect:charset" in toks and "café" in toks and "ouvert" in toks


def test_invalid_bytes_in_a_known_charset_are_replaced():
    toks = tokenize_email(b"Content-Type: text/plain; charset=utf-8\n\nbad \xff\xfe bytes here")
    assert "bad" in toks and "bytes" in toks and "here" in toks


def test_base64_garbage_does_not_raise():
    raw = b"Content-Type: text/plain\nContent-Transfer-Encoding: base64\n\n!!!@@@###$$$ not base64 at all ====\n"
    assert isinstance(tokenize_email(raw), list)


def test_deeply_nested_multiparts_stop_at_the_depth_limit():
    depth = 200
    head = b"".join(
        f"Content-Type: multipart/mixed; boundary=b{i}\n\n--b{i}\n".encode() for i in range(depth)
    )
    raw = head + b"Content-Type: text/plain\n\ndeep text\n" + b"".join(
        f"--b{i}--\n".encode() for i in reversed(range(depth))
    )
    a = MailTokenizer(limits=Limits(max_mime_depth=8)).analyse(raw)
    assert "defect:mime_depth" in a.tokens
    assert a.parts <= 9
    assert "deep" not in a.tokens


def test_zip_bomb_like_repeated_parts_are_bounded():
    part = b"--XX\nContent-Type: text/plain\n\n" + b"spam words here " * 50 + b"\n"
    raw = b"Content-Type: multipart/mixed; boundary=XX\n\n" + part * 5000 + b"--XX--\n"
    limits = Limits(max_mime_parts=64, max_tokens=20_000)
    start = time.perf_counter()
    a = MailTokenizer(limits=limits).analyse(raw)
    assert time.perf_counter() - start < 10.0
    assert "defect:too_many_parts" in a.tokens
    assert a.parts == 65 and len(a.tokens) <= 20_000


def test_decoded_size_budget():
    raw = b"Content-Type: text/plain\n\n" + b"word " * 10_000
    a = MailTokenizer(limits=Limits(max_decoded_bytes=1000)).analyse(raw)
    assert "defect:decoded_budget" in a.tokens
    assert a.tokens.count("word") <= 200


def test_oversized_raw_is_truncated_not_rejected():
    a = MailTokenizer(limits=Limits(max_message_bytes=100)).analyse(b"Subject: big\n\n" + b"x " * 1000)
    assert "defect:truncated" in a.tokens and a.size == 2014


@pytest.mark.parametrize("raw", [b"", b"   \n\n  ", b"\x00\x01\x02", b"\n", b"From \n"])
def test_empty_and_junk_messages_featurize(raw):
    toks = tokenize_email(raw)
    assert isinstance(toks, list) and toks


def test_too_many_tokens_are_cut_and_counted():
    a = MailTokenizer(limits=Limits(max_tokens=50)).analyse(b"Subject: x\n\n" + b"word " * 1000)
    assert len(a.tokens) == 50 and a.tokens[-1] == "defect:too_many_tokens" and a.defects >= 1


# ------------------------------------------------------------------ meta features
def test_meta_vector_hand_worked():
    raw = (
        b"To: a@x.org, b@y.org\nContent-Type: multipart/alternative; boundary=B\n\n"
        b"--B\nContent-Type: text/plain\n\nABCD efgh!\n"
        b"--B\nContent-Type: text/html\n\n<b>AB</b> http://u.example.com/\n--B--\n"
    )
    a = MailTokenizer().analyse(raw)
    meta = dict(zip(META_FEATURES, a.meta().tolist(), strict=True))
    import math

    assert meta["log_size"] == pytest.approx(math.log1p(len(raw)))
    assert meta["log_parts"] == pytest.approx(math.log1p(3))
    assert meta["log_recipients"] == pytest.approx(math.log1p(2))
    assert meta["log_urls"] == pytest.approx(math.log1p(1))
    # The line break before a boundary belongs to the boundary (RFC 2046), so the text is
    # "ABCD efgh!" (10 chars) and the html text, tags -> spaces, " AB  http://u.example.com/" (26).
    plain, html_text = "ABCD efgh!", " AB  http://u.example.com/"
    assert meta["html_share"] == pytest.approx(len(html_text) / (len(plain) + len(html_text)))
    letters = sum(c.isalpha() for c in plain + html_text)
    uppers = sum(c.isupper() for c in plain + html_text)
    assert meta["upper_share"] == pytest.approx(uppers / letters)
    assert meta["log_exclaim"] == pytest.approx(math.log1p(1))
    assert meta["log_tokens"] == pytest.approx(math.log1p(len(a.tokens)))


def test_without_letter_counts_the_tokens_and_lengths_are_the_same():
    """``letter_counts=False`` (a featurizer without the meta vector) skips the letter
    counts only: the same tokens, text lengths and other counts; those four stay 0."""
    from streamnb.features import Featurizer

    raw = (b"From: Bob <bob@example.com>\nContent-Type: multipart/alternative; boundary=B\n\n"
           b"--B\nContent-Type: text/plain\n\nFREE Caf\xe9 $$$ now!\n"
           b"--B\nContent-Type: text/html\n\n<b>BUY</b> http://u.example.com/\n--B--\n")
    full, lean = MailTokenizer().analyse(raw), MailTokenizer(letter_counts=False).analyse(raw)
    assert lean.tokens == full.tokens and lean.text_chars == full.text_chars > 0
    assert (lean.html_chars, lean.urls, lean.parts) == (full.html_chars, full.urls, full.parts)
    # "FREE Caf\xe9 $$$ now!" and " BUY  http://u.example.com/": upper-case FREE C BUY,
    # letters 11 + 18, one non-ASCII, $$$ and !
    assert (full.upper, full.letters, full.non_ascii, full.exclaim) == (8, 29, 1, 4)
    assert (lean.upper, lean.letters, lean.non_ascii, lean.exclaim) == (0, 0, 0, 0)
    assert Featurizer().mail.letter_counts is False and Featurizer(meta=True).mail.letter_counts is True


def test_html_declarations_are_markup_not_words():
    """``<!DOCTYPE ...>`` used to leak into the text (``doctype html public w3c//dtd``)."""
    text, tokens = strip_html('<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 4.0//EN">'
                              '<?xml version="1.0"?><p>Hi<!x>there</p>')
    assert text.split() == ["Hi", "there"] and tokens == ["html:p"]

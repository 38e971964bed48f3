"""The tokenizer's C steps and the C token hash table against the Python code they stand for.

Every rule of the tokenizer is Python code; a C step (:mod:`streamnb.features.steps`) gives
the same result on the input it takes and declines the rest. Each test runs a rule with
``C_STEPS`` and with ``REFERENCE_STEPS`` (the Python code alone) on generated input and
compares the two; hand-worked tests pin the edges of each C function; the corpus test
compares the whole analysis of every corpus message. The C token table is compared with
the dict (``REFERENCE_TABLE``), ``unique_buckets`` with its numpy form. CI sets
``STREAMNB_REQUIRE_SPEEDUPS=1`` so that a build that silently left the C modules out
fails there instead of testing only the Python code.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import string
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb._cmodules import optional_c_module
from streamnb.features import hashing, mail, mail_headers
from streamnb.features import markup as markup_module
from streamnb.features import mime as mime_module
from streamnb.features import text as text_rules
from streamnb.features.steps import C_STEPS, REFERENCE_STEPS
from streamnb.features.text import WordRules

speedups = optional_c_module("streamnb.features._speedups")


def test_c_modules_built_where_ci_requires_them():
    if os.environ.get("STREAMNB_REQUIRE_SPEEDUPS", "") in ("", "0"):
        pytest.skip("STREAMNB_REQUIRE_SPEEDUPS is not set")
    assert C_STEPS is not None, "streamnb.features._speedups was not built (no C compiler?)"
    assert hashing.C_TABLE is not None
    assert optional_c_module("streamnb._kernels") is not None, "streamnb._kernels was not built"


needs_speedups = pytest.mark.skipif(C_STEPS is None, reason="streamnb.features._speedups is not built")


@needs_speedups
@pytest.mark.parametrize(("value", "expected"), [
    ("", [True, True, True, True]),
    ("0", [True, True, True, True]),
    ("1", [False, False, False, False]),
    ("hash_table, multinomial_jll", [True, False, False, False]),  # word_hashes goes with the table
    ("tokenizer,streamnb._kernels", [False, True, False, False]),
])
def test_the_switch_turns_off_what_it_names(value, expected):
    """STREAMNB_PURE_PYTHON: 1 for every C module, or a list of modules, functions and
    pieces; what it names is gone for the whole process, the rest stays."""
    probe = ("from streamnb.features import hashing, steps; "
             "from streamnb.models import prequential; "
             "print([steps.C_STEPS is not None, hashing.C_TABLE is not None, "
             "prequential.MULTINOMIAL_JLL is not None, "
             "(steps.C_STEPS or steps.REFERENCE_STEPS).word_hashes is not None])")
    env = dict(os.environ, STREAMNB_PURE_PYTHON=value)
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(expected)


def both(run: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``run(steps)`` with the C steps, then with the reference steps."""
    return run(C_STEPS), run(REFERENCE_STEPS)


def words(rules: WordRules, text: str, limit: int | None = None) -> list[str]:
    out: list[str] = []
    rules.words(text, out, limit)
    return out


def same_words(rules: WordRules, text: str, limit: int | None = None) -> list[str]:
    """The tokens of the C word rules, checked equal to the reference's."""
    c, reference = both(lambda steps: words(WordRules(rules.lowercase, rules.min_len, rules.max_len,
                                                      rules.ngrams, steps), text, limit))
    assert c == reference
    return c


# Words and their edges: letters (both cases), digits, every stripped punctuation mark,
# '@' and '.', str.split()'s ASCII white space (\x1c-\x1f too) and other control characters;
# then non-ASCII letters (Latin-1, 2- and 4-byte kinds, an upper case that lower-cases to
# two characters), non-ASCII white space (no-break, em, ideographic space, U+0085) and
# punctuation that is not stripped.
ASCII_CHARS = (list("abcxyzABCXYZ0129@.@.-") + list(text_rules._PUNCT)
               + list(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f") + ["\x00", "\x7f", "$", "%"])
ascii_text = st.text(alphabet=st.sampled_from(ASCII_CHARS), max_size=300)
any_text = st.text(
    alphabet=st.sampled_from(ASCII_CHARS + list("éüßİЖж中文€—«»\xa0\u2003\u3000\x85\u200b😀")),
    max_size=300,
)
long_words = st.lists(
    st.builds(lambda a, b, dot: a + "@" + b if dot else a + b,
              st.text(alphabet=string.ascii_letters + "@.", min_size=0, max_size=70),
              st.text(alphabet=string.ascii_letters + ".", max_size=10), st.booleans()),
    max_size=20,
).map(" ".join)


@needs_speedups
@settings(max_examples=400, deadline=None)
@given(text=st.one_of(ascii_text, any_text, long_words), lo=st.integers(1, 4), hi=st.integers(1, 16),
       lowercase=st.booleans())
def test_c_word_rules_equal_the_python_ones(text, lo, hi, lowercase):
    same_words(WordRules(lowercase=lowercase, min_len=lo, max_len=max(lo, hi)), text)


@needs_speedups
@settings(max_examples=100, deadline=None)
@given(text=st.one_of(long_words, any_text), limit=st.integers(0, 30))
def test_c_word_rules_cut_at_the_limit_as_the_python_ones(text, limit):
    same_words(WordRules(), text, limit)


@needs_speedups
def test_c_word_rules_hand_worked():
    rules = WordRules()
    assert same_words(rules, "FREE!!! (cheap) a bob@Example.org x@y "
                             "supercalifragilistic verylongname@example.com a@b@c.d\x1cend") == [
        "free", "cheap", "email:example.org", "email:y", "skip:s 20", "email:example.com",
        "a@b@c.d", "end"]
    # the edges: 12 and 13 characters, e-mail addresses of 59 and 60 characters
    edges = ["a" * 12, "b" * 13, "x@" + "d" * 53 + ".org", "y@" + "d" * 54 + ".org",
             "nodot@" + "d" * 20, "two@at@" + "d" * 10 + ".org"]
    assert [len(w) for w in edges[2:4]] == [59, 60]
    assert same_words(rules, " ".join(edges)) == [
        "a" * 12, "skip:b 10", "email:" + "d" * 53 + ".org", "skip:y 60", "skip:n 20",
        "skip:t 20"]
    # non-ASCII: 8bit% shares (1 of 6 rounds to 20, 1 of 21 to 0), a long word's first
    # character, a short address without one, a long one (48 characters) with one, and a
    # word too long (68) to be an address
    text = ("zürich\xa0naïveté x" + "é" * 20 + " ab@né.fr " + "q" * 40 + "@exé.com "
            + "r" * 60 + "@exé.com")
    assert same_words(rules, text) == [
        "zürich", "8bit%:20", "naïveté", "8bit%:30", "skip:x 20", "8bit%:100", "email:né.fr",
        "email:exé.com", "8bit%:0", "skip:r 60", "8bit%:0"]
    with pytest.raises(TypeError):
        speedups.word_tokens(b"abc", 3, 12, [])
    with pytest.raises(TypeError):
        speedups.word_tokens("abc", 3, 12, ())


def listed_hashes(text: str, lo: int, hi: int) -> list[int]:
    """The stable hashes of word_tokens' tokens, computed afresh (not read from the table,
    which a wrong key in word_hashes would fill with the wrong values): what it must give."""
    out: list[str] = []
    speedups.word_tokens(text, lo, hi, out)
    return [hashing._blake64(t) for t in out]


@needs_speedups
@settings(max_examples=400, deadline=None)
@given(text=st.one_of(ascii_text, long_words, any_text, st.text(alphabet=st.characters(max_codepoint=255))),
       lo=st.integers(1, 4), hi=st.integers(1, 16), prefix=st.binary(max_size=16), lower=st.booleans())
def test_c_word_hashes_equal_the_hashes_of_the_word_tokens(text, lo, hi, prefix, lower):
    hi = max(lo, hi)
    out = bytearray(prefix)  # appended after what the bytearray holds
    n = speedups.word_hashes(text, lo, hi, out, lower)  # (text beyond Latin-1 too)
    assert bytes(out[: len(prefix)]) == prefix and len(out) == len(prefix) + 8 * n
    expected = listed_hashes(text.lower() if lower else text, lo, hi)
    assert np.frombuffer(bytes(out[len(prefix):]), dtype=np.uint64).tolist() == expected


@needs_speedups
def test_c_word_hashes_hand_worked():
    text = "free CHEAP!! a bob@example.org supercalifragilistic free " + " ".join(f"w{i}" for i in range(40))
    out = bytearray()
    n = speedups.word_hashes(text.lower(), 3, 12, out)
    tokens = ["free", "cheap", "email:example.org", "skip:s 20", "free"] + [f"w{i}" for i in range(10, 40)]
    assert n == len(tokens)
    assert np.frombuffer(bytes(out), dtype=np.uint64).tolist() == [hashing._blake64(t) for t in tokens]
    # tokens new to the table (misses) give the same hashes as the dict cache's
    hashing.token_hash64.cache_clear()
    out = bytearray()
    assert speedups.word_hashes("never seen before", 3, 12, out) == 3
    assert np.frombuffer(bytes(out), dtype=np.uint64).tolist() == [
        hashing._blake64(t) for t in ("never", "seen", "before")]
    assert speedups.word_hashes("", 3, 12, out) == 0 and len(out) == 24
    # Latin-1 text: a word with a character beyond ASCII is made a str (with its 8bit%
    # token); a no-break space splits words as str.split() does
    out = bytearray()
    tokens = ["caf\xe9", "8bit%:30", "cr\xe8me", "8bit%:20", "na\xefve", "8bit%:20", "plain", "words"]
    assert speedups.word_hashes("caf\xe9\xa0cr\xe8me (na\xefve) plain\xa0words", 3, 12, out) == 8
    assert np.frombuffer(bytes(out), dtype=np.uint64).tolist() == [hashing._blake64(t) for t in tokens]
    out = bytearray()  # lower-cased as they are hashed, both kinds of word
    assert speedups.word_hashes("CAF\xc9\xa0Cr\xe8me (NA\xcfVE) Plain\xa0WORDS", 3, 12, out, True) == 8
    assert np.frombuffer(bytes(out), dtype=np.uint64).tolist() == [hashing._blake64(t) for t in tokens]
    out = bytearray()  # beyond Latin-1: \u0130 lower-cases to two characters
    assert speedups.word_hashes("\u0131x \u0130x \u2019quoted\u2019 ab", 3, 12, out, True) == 4
    assert np.frombuffer(bytes(out), dtype=np.uint64).tolist() == [
        hashing._blake64(t) for t in ("i\u0307x", "8bit%:30", "\u2019quoted\u2019", "8bit%:30")]
    with pytest.raises(TypeError):
        speedups.word_hashes("abc", 3, 12, [])
    with pytest.raises(ValueError):
        speedups.word_hashes("abc", 0, 12, bytearray())


@needs_speedups
def test_c_module_strips_the_same_punctuation():
    assert speedups.PUNCT == text_rules._PUNCT


@needs_speedups
@pytest.mark.corpus
def test_corpus_tokens_equal_with_and_without_the_c_steps(corpus_dir):
    with open(corpus_dir / "index.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    raws = [(corpus_dir / row["path"]).read_bytes() for row in rows]
    mail_headers.clear_memos()
    with_c, without = both(lambda steps: [mail.MailTokenizer(steps=steps).analyse(raw) for raw in raws])
    assert sum(len(a.tokens) for a in with_c) > 500_000
    assert [a.tokens for a in with_c] == [a.tokens for a in without]
    # the meta counts too (C text_counts against add_text_stats' Python counts)
    assert sum(a.upper for a in with_c) > 10_000 and sum(a.non_ascii for a in with_c) > 1_000
    assert with_c == without


# ------------------------------------------------------------------ the URL rule


def urls(text: str, steps) -> tuple[str, list[str]]:
    out: list[str] = []
    return WordRules(steps=steps).urls(text, out), out


# URL pieces in any case (schemes, www., user parts, ports, paths), what ends a URL (white
# space of both kinds, quotes, brackets), word characters before a scheme (Latin-1 letters,
# digits, '_'), and characters beyond Latin-1 that IGNORECASE folds onto scheme letters.
URL_PIECES = ["http", "https", "HTTPS", "hTtP", "ftp", "FTP", "mailto", "MailTo", "www.", "WWW.",
              "Www.", "wWW.", "://", ":/", "@", "/", "?", "#", ".", "..", "-", "x", "Ab", "9", "_",
              "com", "a.b.c", " ", "\n", "\xa0", "\x85", "\x1c", "\t", '"', "'", "<", ">", "(", ")",
              "[", "]", "{", "}", "\xe9", "\xaa", "\xb2", "\xc9", "!", ",", ":"]
url_text = st.lists(st.sampled_from(URL_PIECES), max_size=40).map("".join)
odd_url_text = st.lists(st.sampled_from(URL_PIECES + ["\u017f", "\u0130", "\u0131", "\u212a", "\u4e2d"]),
                        max_size=40).map("".join)


@needs_speedups
@settings(max_examples=600, deadline=None)
@given(text=st.one_of(url_text, odd_url_text))
def test_c_url_rule_equals_the_python_one(text):
    c, reference = both(lambda steps: urls(text, steps))
    assert c == reference


@needs_speedups
def test_c_url_rule_hand_worked():
    out: list[str] = []
    text = "see HTTPS://user@Mail.Example.co.uk:8080/x?y, www.A-B.org. and xhttp://no.example"
    # each URL becomes one space (the "," after y belongs to the first URL)
    assert speedups.url_scan(text, out) == "see" + " " * 5 + "and xhttp://no.example"
    assert out == ["proto:https", "url:mail.example.co.uk", "url:co.uk",
                   "proto:http", "url:www.a-b.org", "url:a-b.org"]
    assert speedups.url_scan("http:// ftp://x", out := []) == "http://  "  # a URL needs a character
    assert out == ["proto:ftp", "url:x"]
    assert speedups.url_scan("mailto://@ www.-x", out := []) == "   "  # no host: the proto only
    assert out == ["proto:mailto", "proto:http", "url:www.-x"]
    assert speedups.url_scan("http://x \u017f", []) is None  # ſ folds onto s: the Python rule
    with pytest.raises(TypeError):
        speedups.url_scan(b"http://x", [])

# ------------------------------------------------------------------ strip_html

# Markup pieces: tag openers with white space of both kinds and slashes, names (letters,
# digits, longer than the 16-character limit), attributes with links, comments, script and
# style, a lone '>', text in Latin-1 and beyond it.
HTML_PIECES = ["<", ">", "</", "< /", "<\t/ ", "/", " ", "\n", "\xa0", "\x85", "\x1c", "a", "B", "p",
               "9", "br", "DIV", "x" * 17, "=", '"', "'", ' href="http://Ex.example.com/a"', " src=ftp://h.org",
               "<!--", "-->", "<!DOCTYPE html>", "<?xml?>", "<script>", "</SCRIPT >", "<style x>",
               "&amp;", "&nbsp;", "\xe9", "\xff",
               # link attributes in pieces: names in any case after word characters, blanks and
               # quotes around '=', schemes, user parts, hosts ending in '.' or '-'
               "href", "HREF", "src", "Src", "action", "ACTION", "xhref", "_src", " = ", "=\t'", "https://",
               "HTTP://", "ftp://", "http:/", "u@", "@", "@-", "x.y.z", "a.b", ".", "-", "?q", "#f", "actio", "hre",
               "sr", "n", "</script", "</StYle", "\t>"]
markup_text = st.lists(st.sampled_from(HTML_PIECES), max_size=60).map("".join)
odd_markup = st.lists(st.sampled_from(HTML_PIECES + ["\u2003", "\u4e2d", "\u017f"]), max_size=60).map("".join)
long_attributes = st.builds(lambda name, n, close: f"<{name}{' ' * n}{'>' if close else ''}tail",
                            st.sampled_from(["a", "Q" * 16, "q" * 30]), st.integers(1990, 2010), st.booleans())


def regex_clean(markup: str) -> str:
    markup = markup_module._COMMENT.sub("", markup)
    markup = markup_module._DECLARATION.sub(" ", markup)
    return markup_module._DROP.sub(lambda m: f" <{m.group(1)}> ", markup)


def regex_text(markup: str) -> str:
    """strip_html's text before unescaping, by the regexes: the passes, then the split."""
    return " ".join(markup_module._TAG.split(regex_clean(markup))[::4])


@needs_speedups
@settings(max_examples=800, deadline=None)
@given(markup=st.one_of(markup_text, odd_markup, long_attributes), limit=st.integers(0, 12))
def test_c_html_strip_and_tag_tokens_equal_the_python_ones(markup, limit):
    if set(markup) & set("\u0130\u0131\u017f\u212a"):  # folded onto ASCII letters by IGNORECASE
        assert speedups.html_strip(markup, 2000) is None  # strip_html uses the regexes
    for max_tag_tokens in (limit, 2000):  # the cut at the limit, and none
        c, reference = both(lambda steps: markup_module.strip_html(markup, max_tag_tokens, steps))  # noqa: B023
        assert c == reference


@needs_speedups
@settings(max_examples=800, deadline=None)
@given(markup=st.one_of(markup_text, odd_markup, long_attributes,
                        markup_text.map(lambda t: t + "\n"), markup_text.map(lambda t: "<!DOCTYPE " + t)))
def test_c_html_strip_text_is_the_regex_passes_and_split(markup):
    got = speedups.html_strip(markup, 2000)
    if not set(markup) & set("\u0130\u0131\u017f\u212a"):  # (beyond Latin-1: on a stand-in)
        assert got[0] == regex_text(markup)
    else:
        assert got is None


@needs_speedups
def test_c_html_strip_hand_worked():
    def text(markup: str) -> str:
        return speedups.html_strip(markup, 10)[0]

    assert text("a<!-- x -->b<!-- open\n") == "ab\n"  # an open comment stops at `$`
    assert speedups.html_strip("<?xml v?><!x<y>", 10) == (" <!x ", ["html:y"])  # no '<' inside a declaration
    assert speedups.html_strip("<SCRIPT a>x</script >y<style>z", 10) == \
        ("   y   ", ["html:script", "html:style"])  # the elements become " <name> "
    assert speedups.html_strip("<scripts>x</scripts>", 10) == (" x ", ["html:scripts"])  # \b after the name
    assert text("<style>z</StYle\xa0\t>w") == "   w"  # \s* before the '>'
    assert text("<!" + "x" * 2000 + ">") == " " and text("<!" + "x" * 2001 + ">")[:3] == "<!x"
    assert speedups.html_strip("a< /B x>b<1>c<i", 10) == ("a b<1>c ", ["html:i"])  # the split
    assert speedups.html_strip("", 10) == ("", [])
    markup = ('<p>Buy<!-- x --> <A HREF="http://u@Ex.example.com/a">now</a>'
              '<script>var x;</script>&amp; <img src=ftp://h.org></p>')
    text_, tokens = speedups.html_strip(markup, 2000)
    pieces = markup_module._TAG.split(regex_clean(markup))
    assert text_ == " ".join(pieces[::4]) and "&amp;" in text_  # unescaped by the caller
    assert tokens == speedups.tag_tokens(pieces[1::4], pieces[2::4], pieces[3::4], 2000)
    assert tokens == ["html:p", "html:a", "url:ex.example.com", "url:example.com", "html:script",
                      "html:img", "url:h.org"]
    assert speedups.html_strip(markup, 3) == (text_, tokens[:4])  # a tag's tokens are not split
    assert speedups.html_strip(markup, 0) == (text_, [])
    assert speedups.html_strip("no tags &lt;", 5) == ("no tags &lt;", [])
    many = "".join(f"<b{i % 7}>w{i}" for i in range(300))  # more tags than the first room
    assert speedups.html_strip(many, 2000) == (" " + " ".join(f"w{i}" for i in range(300)),
                                               [f"html:b{i % 7}" for i in range(300)])
    assert speedups.html_strip("\u2003<p>", 5) == ("\u2003 ", ["html:p"])  # beyond Latin-1: a stand-in
    assert speedups.html_strip("\u017f<p>", 5) is None  # ſ folds onto s: the steps one by one
    with pytest.raises(ValueError, match="max_tag_tokens"):
        speedups.html_strip("<p>", -1)
    for bad in (b"<p>", None):
        with pytest.raises(TypeError):
            speedups.html_strip(bad, 5)


@needs_speedups
def test_c_tag_tokens_hand_worked():
    slashes, names = ["", "", "/", ""], ["P", "a", "a", "IMG"]
    attributes = ["", ' href="http://x.Example.com/p"', "", " SRC = ' https://u@a.b.c.d/x' xsrc=http://no.example"]
    assert speedups.tag_tokens(slashes, names, attributes, 2000) == [
        "html:p", "html:a", "url:x.example.com", "url:example.com", "html:img", "url:a.b.c.d", "url:c.d"]
    # the limit falls inside the first linked tag's tokens: they are kept whole
    assert speedups.tag_tokens(slashes, names, attributes, 3) == [
        "html:p", "html:a", "url:x.example.com", "url:example.com"]
    assert speedups.tag_tokens(slashes, names, attributes, 0) == []
    # only href, src and action name a link; a user part without a host after it is none
    near = [" actio = http://no.example hre=http://no.example", " ACTION=ftp://u@@-x.org:21"]
    assert speedups.tag_tokens(["", ""], ["form", "form"], near, 2000) == [
        "html:form", "html:form", "url:u"]
    assert speedups.tag_tokens(["/"], ["a"], [" href=http://h\u2003"], 10) is None  # not Latin-1
    assert speedups.tag_tokens([""], ["\xe9"], [""], 10) is None  # a name beyond ASCII: not a tag name
    with pytest.raises(ValueError):
        speedups.tag_tokens(slashes, names, attributes[:1], 10)
    with pytest.raises(ValueError):
        speedups.tag_tokens(slashes, names, attributes, -1)

# ------------------------------------------------------------------ Received headers


def received(text: str, steps) -> list[str]:
    out: list[str] = []
    mail_headers._received_tokens(text, out, steps)
    return out


# Received pieces: from/by in any case after word and non-word characters, white space of
# both kinds, host runs ending in '.' or '-', IPv4 literals with 1 to 4 digits per number.
RECEIVED_PIECES = ["from", "FROM", "From", "by", "BY", "bY", "xfrom", "_by", " ", "  ", "\t", "\n", "\xa0",
                   "\x85", "mail", "Example", ".", "-", "co.uk", "a", "9", "(", ")", ";", "[", "]", "1", "12",
                   "123", "1234", "10.1.2.3", "[1.2.3.4]", "\xe9", "helo=", "with", "esmtp", "id"]
received_text = st.lists(st.sampled_from(RECEIVED_PIECES), max_size=60).map("".join)
odd_received = st.lists(st.sampled_from(RECEIVED_PIECES + ["\u0131", "\u212a", "\u2003", "\u0660"]),
                        max_size=60).map("".join)


@needs_speedups
@settings(max_examples=600, deadline=None)
@given(text=st.one_of(received_text, odd_received))
def test_c_received_tokens_equal_the_python_ones(text):
    c, reference = both(lambda steps: received(text, steps))
    assert c == reference


@needs_speedups
def test_c_received_tokens_hand_worked():
    text = ("from mail.Example.co.uk ([10.1.2.3] helo=x) by mx1.example.org; from a. by b.c- "
            "[1.2.3.4567] [9.9.9.9] [8.8.8.8] by five.example by six.example")
    out: list[str] = []
    assert speedups.received_tokens(text, out) is True
    # 4 hosts at most ("a." is no host: one character), then 2 IPv4 prefixes at most
    assert out == ["received:mail.example.co.uk", "received:co.uk", "received:mx1.example.org",
                   "received:example.org", "received:b.c", "received:five.example",
                   "received:10.1.2", "received:9.9.9"]
    assert speedups.received_tokens("from \u0131x.example", out := []) is False and out == []

# ------------------------------------------------------------------ header fields


def regex_fields(text: str, crlf: bool) -> list[tuple[str, str]]:
    pieces = mime_module._FIELD_START.split(text)
    values = [v.rstrip("\r\n") for v in pieces[2::2]] if crlf else pieces[2::2]
    return list(zip(pieces[1::2], values, strict=True))


# Header lines in pieces: names (with the characters around ':' that end them), colons,
# blanks, continuations, line breaks with and without carriage returns.
FIELD_PIECES = ["\n", "\r\n", "\r", "Subject", "X-A", "a", "~!", ":", "::", " ", "\t", "  ", "\n\t", "\n ",
                "value", "From ", "a b", "=?x?=", ";", "\x7f"]
field_text = st.lists(st.sampled_from(FIELD_PIECES), max_size=40).map("".join)
# ... and as lines: a name (of field characters, or with a space, DEL or nothing), a
# colon or not, blanks, a value, a line break.
field_lines = st.lists(
    st.tuples(st.text(alphabet="aZ9-~!\x7f ", max_size=4), st.sampled_from([":", "", "::"]),
              st.sampled_from(["", " ", "\t", " \t "]), st.sampled_from(["", "v", "v w", "\r", ":"]),
              st.sampled_from(["\n", "\r\n", "\n\t", "\n "])),
    max_size=8,
).map(lambda lines: "\n" + "".join("".join(line) for line in lines))


@needs_speedups
@settings(max_examples=600, deadline=None)
@given(text=st.one_of(field_text, field_lines, field_text.map(lambda t: t + "\xe9")), crlf=st.booleans())
def test_c_header_fields_equal_the_regex_split(text, crlf):
    got = speedups.header_fields(text, crlf)
    assert got == (regex_fields(text, crlf) if text.isascii() else None)


@needs_speedups
def test_c_header_fields_hand_worked():
    text = "\nSubject: hi\r\n\tthere\r\nX-A:\r\nTo:  b\r\n"
    assert speedups.header_fields(text, True) == [("Subject", "hi\r\n\tthere"), ("X-A", ""), ("To", "b")]
    assert speedups.header_fields(text, False)[-1] == ("To", "b\r\n")
    assert speedups.header_fields("no field", False) == []

# ------------------------------------------------------------------ header blocks


def python_block(buf: bytes, start: int, end: int):
    """(block end, plain pairs or None) by the Python functions (the reference)."""
    block_end = mime_module._header_block_end(buf, start, end)
    return block_end, mime_module._plain_headers(buf, start, block_end, REFERENCE_STEPS)


# Header block lines: fields, continuations, mbox From lines (first and later), lines that
# start with a colon or are no header at all, blank lines, lone and paired carriage
# returns, bytes above 127, a "From" without its space, and a body after the block.
BLOCK_LINES = st.lists(st.sampled_from([
    b"Subject: hi\n", b"To:  a@b.org\r\n", b"X-Empty:\n", b"X-Blank:   \n", b" folded\n", b"\tfolded\r\n",
    b"From x Mon\n", b"From x\r\n", b"From", b"From:", b": no name\n", b"no colon here\n", b"\n", b"\r\n",
    b"Bad\rline: x\n", b"A: b\r", b"Name-With.Dots: v", b"x:y\n", b"\xff: high\n", b"X: \xe9t\xe9\n",
    b"\r", b"body text\n", b":", b" ", b"\t",
]), max_size=14).map(b"".join)


@needs_speedups
@settings(max_examples=1000, deadline=None)
@given(buf=BLOCK_LINES, start=st.integers(0, 6), cut=st.integers(0, 6))
def test_c_header_block_equals_the_python_one(buf, start, cut):
    end = max(len(buf) - cut, 0)
    start = min(start, end)
    block_end = speedups.header_block_end(buf, start, end)
    assert (block_end, speedups.plain_headers(buf, start, block_end)) == python_block(buf, start, end)


@needs_speedups
def test_c_header_block_hand_worked():
    buf = b"From a Mon\r\nSubject: hi\r\n\tthere\r\nX-A:\r\n\r\nbody: not a header\r\n"
    assert speedups.header_block_end(buf, 0, len(buf)) == buf.index(b"\r\n\r\n") + 2
    assert speedups.plain_headers(buf, 0, buf.index(b"\r\n\r\n") + 2) == [
        ("Subject", "hi\r\n\tthere"), ("X-A", "")]
    # a lone carriage return ends the block before its line; a line that is no header ends it
    for block in (b"A: 1\nB: 2\rx\nC: 3\n", b"A: 1\nnot a header\nC: 3\n"):
        assert speedups.header_block_end(block, 0, len(block)) == 5
    assert speedups.header_block_end(b"body", 0, 4) == 0
    for block in (b"A: 1\n: odd\n", b"A: \xe9\n", b"A: 1\nFrom x\n"):  # a line that starts with
        assert speedups.plain_headers(block, 0, len(block)) is None  # ':', a high byte, From
    with pytest.raises(ValueError):
        speedups.header_block_end(b"A: 1\n", 0, 9)
    with pytest.raises(TypeError):
        speedups.plain_headers(bytearray(b"A: 1\n"), 0, 5)


# ------------------------------------------------------------------ header index and tokens


def python_names_and_index(pairs):
    return mime_module._names_and_index(pairs, REFERENCE_STEPS)


header_name = st.sampled_from(["To", "TO", "to", "Subject", "X-Mailer", "x-MAILER", "Received", "a-Z~!",
                               "Content-Type", "to ", "\udce9x", "Nam\xe9"])
header_pairs = st.lists(st.tuples(header_name, st.sampled_from(["", "v", "a@b.c", "=?x?="])), max_size=12)


@needs_speedups
@settings(max_examples=400, deadline=None)
@given(pairs=header_pairs)
def test_c_header_index_equals_the_python_one(pairs):
    got = speedups.header_index(pairs)
    if all(name.isascii() for name, _ in pairs):
        assert got == python_names_and_index(pairs)
        names, index = got
        assert all(type(values) is list for values in index.values())
    else:
        assert got is None
    assert mime_module._names_and_index(pairs, C_STEPS) == python_names_and_index(pairs)


@needs_speedups
def test_c_header_index_hand_worked():
    pairs = [("To", "a"), ("Subject", "s"), ("TO", "b"), ("x-Y", "c")]
    assert speedups.header_index(pairs) == (["to", "subject", "to", "x-y"],
                                            {"to": ["a", "b"], "subject": ["s"], "x-y": ["c"]})
    assert speedups.header_index([]) == ([], {})
    with pytest.raises(TypeError):
        speedups.header_index([("To", "a", "extra")])
    with pytest.raises(TypeError):
        speedups.header_index(tuple(pairs))


def both_header_tokens(tokenizer: mail.MailTokenizer, names: list[str], index: dict,
                       start: mail.MailAnalysis | None = None):
    """(C, Python) analyses after the header stage (C ``header_tokens`` with the C steps,
    ``HeaderTokenizer.add`` with the reference ones), each from a copy of ``start`` and an empty memo;
    the memos they leave must be equal too."""
    results, memos = [], []
    for steps in (C_STEPS, REFERENCE_STEPS):
        tok = dataclasses.replace(tokenizer, steps=steps)
        mail_headers.clear_memos()
        a = mail.MailAnalysis(tokens=list(start.tokens), defects=start.defects,
                              recipients=start.recipients) if start else mail.MailAnalysis()
        cache = mail_headers._value_cache(tok.rules)
        if steps.header_tokens is not None:
            steps.header_tokens(names, index, tok.header_tokenizer.spec, cache, a)
        else:
            tok.header_tokenizer.add(names, index.get, a)
        results.append(a)
        memos.append(dict(cache))
    assert memos[0] == memos[1]
    return results


# Header values: addresses in their common and odd forms (groups, an unbalanced quote or
# bracket, which getaddresses cannot read or reads its own way), encoded words, subjects
# with separators and URLs, Received hosts and IPs, message ids with and without a domain,
# long values (past the memo's 256 characters and the 2,000-character text cap).
HEADER_VALUES = ["Bob <bob@example.com>", '"Doe, J." <j@x.org>, c@z.org (Carol)', "a@b.c, d@e.f",
                 "undisclosed-recipients:;", '"unbalanced <x@y.z>', "<>", "", "  ", "x@y",
                 "=?utf-8?q?Caf=C3=A9?= <cafe@example.fr>", "=?iso-8859-1?b?SGVsbG8=?=", "=?broken",
                 "Cheap meds!!! Buy now: http://spam.example/x", "Re: [list] hello_world", "FREE $$$",
                 "from mail.example.com ([10.1.2.3]) by mx.example.org", "<abc@Mail.Example.COM>",
                 "<no-at-sign>", "<x@>", "text/html; charset=utf-8", "Mozilla 4.7 [en]",
                 "a" * 300, "s" * 256, "t@" * 128 + "x", "from \u0131x.example by y.example [1.2.3.4]", "w " * 1500 + "@tail.example", "Nam\xe9 <n@\xe9.example>"]
HEADER_NAMES = ["subject", "from", "to", "cc", "reply-to", "return-path", "received", "x-mailer",
                "message-id", "content-type", "sender", "x-other", "x-" + "long" * 12]
header_index_dicts = st.dictionaries(
    st.sampled_from(HEADER_NAMES), st.lists(st.sampled_from(HEADER_VALUES), min_size=1, max_size=40),
    max_size=10)


@needs_speedups
@settings(max_examples=300, deadline=None)
@given(index=header_index_dicts, extra_names=st.lists(st.sampled_from(HEADER_NAMES), max_size=3),
       header_names=st.booleans(), cap=st.sampled_from([998, 40, 5000]),
       headers=st.sampled_from([mail.DEFAULT_HEADERS, ("cc", "subject", "x-other", "sender")]))
def test_c_header_tokens_equal_the_python_method(index, extra_names, header_names, cap, headers):
    from streamnb.features import FeatureLimits as Limits

    tokenizer = mail.MailTokenizer(headers=headers, header_names=header_names,
                                   limits=Limits(max_header_chars=cap))
    names = [name for name, values in index.items() for _ in values] + extra_names
    with_c, without = both_header_tokens(tokenizer, names, index,
                                         start=mail.MailAnalysis(tokens=["x"], defects=1, recipients=2))
    assert with_c == without


@needs_speedups
def test_c_header_tokens_hand_worked(monkeypatch):
    def getaddresses(field, steps):  # an address list that cannot be read: the defect paths
        if "UNREADABLE" in field:
            raise ValueError(field)
        return saved(field, steps)

    saved = mail_headers._getaddresses
    monkeypatch.setattr(mail_headers, "_getaddresses", getaddresses)  # (counts and tokens)
    index = {"subject": ["Cheap meds"], "from": ["Bob <bob@Example.com>"],
             "to": ["a@b.c, d@e.f", "g@h.i"], "cc": ["UNREADABLE"],
             "received": ["from mail.example.com ([10.1.2.3]) by mx.example.org", "by b.example"],
             "message-id": ["<abc@Mail.Example.COM>"]}
    names = ["received", "received", "from", "to", "to", "subject", "cc", "message-id"]
    with_c, without = both_header_tokens(mail.MailTokenizer(), names, index)
    assert with_c == without
    assert with_c.tokens == [
        "header:received", "header:from", "header:to", "header:subject", "header:cc", "header:message-id",
        "subject:cheap", "subject:meds", "from:example.com", "from:name:bob", "to:b.c", "to:e.f", "to:h.i",
        "defect:address", "defect:address",  # the cc count, then its value's tokens
        "received:mail.example.com", "received:example.com", "received:mx.example.org",
        "received:example.org", "received:10.1.2", "received:b.example",
        "message-id:mail.example.com"]
    assert (with_c.recipients, with_c.received, with_c.defects) == (3, 2, 2)
    # the bounds: 32 values of a header at most (all of them counted), header names cut to
    # 40 characters when one is longer (41 here), then each cut name once
    index = {"x-mailer": [f"mailer{i}" for i in range(35)], "received": [f"by h{i}.example" for i in range(35)]}
    names = ["x-" + "a" * 38, "x-" + "a" * 39, "x-" + "a" * 38 + "b", "x-mailer"]
    with_c, without = both_header_tokens(mail.MailTokenizer(), names, index)
    assert with_c == without
    assert with_c.tokens[:2] == ["header:x-" + "a" * 38, "header:x-mailer"]
    assert with_c.received == 35
    assert with_c.tokens.count("received:h31.example") == 1 and "received:h32.example" not in with_c.tokens
    assert "x-mailer:mailer31" in with_c.tokens and "x-mailer:mailer32" not in with_c.tokens
    # the memo: the same value again comes from it, with the same tokens
    index = {"subject": ["Cheap meds"], "to": ["a@b.c, d@e.f", "g@h.i"]}
    names = ["to", "subject"]
    a = mail.MailAnalysis()
    tokenizer = mail.MailTokenizer()
    cache = mail_headers._value_cache(tokenizer.rules)
    spec = tokenizer.header_tokenizer.spec
    speedups.header_tokens(names, index, spec, cache, a)
    assert ("subject", "Cheap meds") in cache and cache["a@b.c, d@e.f, g@h.i"] == 3
    b = mail.MailAnalysis()
    speedups.header_tokens(names, index, spec, cache, b)
    assert b == a
    with pytest.raises(TypeError):
        speedups.header_tokens(names, {"to": ("a@b.c",)}, spec, cache, mail.MailAnalysis())
    with pytest.raises(TypeError):
        speedups.header_tokens(names, index, spec[:5], cache, mail.MailAnalysis())


def python_addresses(field: str) -> list[tuple[str, str]] | None:
    return mail_headers._address_matches(field, REFERENCE_STEPS)


# Address-list pieces: atoms (with dots, Latin-1 letters, characters no rule names), quoted
# words (with a backslash or a carriage return inside, unterminated), <, >, @, commas,
# comments, every kind of white space the rules name and some they do not, groups.
ADDRESS_PIECES = ["a", "Bob", "x.y", "caf\xe9", "\x0b", "\xa0", "@", "b.org", '"Doe, J."', '"q\\x"', '"r\rs"',
                  '"', "<", ">", ",", " ", "  ", "\t", "\r\n", "\n", "(Carol)", "(", ")", "(x\\y)", "()", ":", ";",
                  "[", "]", "\\", "g:", "\x00", "\u0131"]
address_text = st.lists(st.sampled_from(ADDRESS_PIECES), max_size=24).map("".join)
# ... and address lists made of the rules' own parts, each part drawn with its edges:
# blanks of each kind around them, quoted words with a backslash or a carriage return,
# comments with them, separators other than a comma, junk after an address.
_blank = st.sampled_from(["", " ", "  ", "\t", "\r\n", "\n", "\x0b"])
_word = st.sampled_from(["Bob", "x.y", "caf\xe9", '"Doe, J."', '"q\\x"', '"r\rs"', '""', "a@b", '"'])
_spec = st.sampled_from(["a@b.c", "x@y", "a.b@c.d", "@b", "a@", "a b@c", "\xe9@x"])
_comment = st.sampled_from(["", "(Carol)", "()", "(x\\y)", "(r\rs)", "(a(b))", "(n\nl)"])
_routed = st.tuples(_blank, st.lists(_word, max_size=3), _blank, _blank, _spec, _blank).map(
    lambda t: t[0] + " ".join(t[1]) + t[2] + "<" + t[3] + t[4] + t[5] + ">")
_bare = st.tuples(_blank, _spec, st.sampled_from(["", " ", "\t", "\n"]), _comment).map(
    lambda t: t[0] + t[1] + (t[2] + t[3] if t[3] else ""))
_entry = st.tuples(st.one_of(_routed, _bare), _blank, st.sampled_from([",", ",", ";", "", " x", ",,"])).map(
    lambda t: t[0] + t[1] + t[2])
address_lists = st.lists(_entry, max_size=4).map("".join)


@needs_speedups
@settings(max_examples=2000, deadline=None)
@given(field=st.one_of(address_text, address_lists))
def test_c_addresses_equal_the_regex_loop(field):
    got = speedups.addresses(field)
    if max(map(ord, field), default=0) > 255:
        assert got is None
    else:
        assert (None if got is False else got) == python_addresses(field)


@needs_speedups
def test_c_addresses_hand_worked():
    field = '"Doe, J." <j@x.org>, Bob  Smith <b@y.org>, c@z.org (Carol),d@e.f'
    assert speedups.addresses(field) == [("Doe, J.", "j@x.org"), ("Bob Smith", "b@y.org"), ("Carol", "c@z.org"),
                                         ("", "d@e.f")]
    assert speedups.addresses("a@b <c@d>") is False and speedups.addresses("bad <x>") is False
    # the edges of each part: a backslash in a quoted word or a comment, a line break
    # before '>', a separator other than a comma, an empty quoted word in a phrase
    for field in ('"q\\x" <a@b.c>', "a@b.c (x\\y)", "<a@b.c\r\n>", "a@b.c; d@e.f"):
        assert speedups.addresses(field) is False and python_addresses(field) is None
    assert speedups.addresses('"" Bob <a@b.c>') == [(" Bob", "a@b.c")] == python_addresses('"" Bob <a@b.c>')
    assert speedups.addresses("") == [] and speedups.addresses("\u0131 <a@b>") is None
    with pytest.raises(TypeError):
        speedups.addresses(b"a@b")


# Subject pieces: every separator, white space of both kinds, letters of both cases
# (Latin-1 ones too, whose lower case stays Latin-1), '@', the backtick (stripped from
# word ends, not a separator), long words and characters beyond Latin-1.
SUBJECT_PIECES = (list(mail_headers._SUBJECT_SEPARATORS) + [" ", "\t", "\xa0", "\x85", "\x1c", "Re", "FREE", "caf\xe9",
                  "\xc9T\xc9", "\xdf", "\xff", "@", "`", "a@b.c", "x" * 14, "\u0131", "\u20ac", "9"])
subject_text = st.lists(st.sampled_from(SUBJECT_PIECES), max_size=30).map("".join)


@needs_speedups
@settings(max_examples=500, deadline=None)
@given(text=st.one_of(subject_text, st.text(alphabet=st.characters(max_codepoint=255), max_size=40)),
       lowercase=st.booleans(), lo=st.integers(1, 4))
def test_c_value_words_equal_the_regex_split(text, lowercase, lo):
    rules = WordRules(lowercase=lowercase, min_len=lo)
    c, reference = both(lambda steps: mail.MailTokenizer(rules=rules, steps=steps).header_tokenizer.value_tokens("subject", text))
    assert c == reference


@needs_speedups
def test_c_value_words_hand_worked():
    args = (3, 12, True, mail_headers._SUBJECT_SEPARATORS)
    assert speedups.value_words("Re: [list] FREE$$$ caf\xc9-cr\xe8me...now!! `quoted`", "subject:", *args) == (
        "subject:list", "subject:free$$$", "subject:caf\xe9", "subject:8bit%:30", "subject:cr\xe8me",
        "subject:8bit%:20", "subject:now", "subject:quoted")
    assert speedups.value_words("caf\xe9", "subject:", *args) == ("subject:caf\xe9", "subject:8bit%:30")
    assert speedups.value_words("\u20ac price", "subject:", *args) is None  # beyond Latin-1
    # every Latin-1 letter lower-cases as str.lower does
    letters = "".join(chr(c) for c in range(256) if chr(c).isalpha())
    high = sum(c > "\x7f" for c in letters)  # 65 of 117: 8bit%:60
    assert speedups.value_words(letters, "", 1, 1000, True, "") == (
        letters.lower(), f"8bit%:{int(high * 10 / len(letters) + 0.5) * 10}")
    with pytest.raises(TypeError):
        speedups.value_words("x", "subject:", 3, 12, True, "\u20ac")


@needs_speedups
def test_c_header_tokens_empty_a_full_memo(monkeypatch):
    """The memo's bound: at its size it is emptied before the next entry, as _remember does."""
    monkeypatch.setattr(mail_headers, "_CACHE_SIZE", 3)  # (the Python memo, the C step's spec)
    index = {"subject": [f"subject {i}" for i in range(5)], "x-mailer": ["m1", "m2"]}
    caches = []
    for steps in (C_STEPS, REFERENCE_STEPS):
        tokenizer = mail.MailTokenizer(steps=steps)  # (its header spec holds the memo's size)
        mail_headers.clear_memos()
        cache = mail_headers._value_cache(tokenizer.rules)
        a = mail.MailAnalysis()
        if steps.header_tokens is not None:
            steps.header_tokens([], index, tokenizer.header_tokenizer.spec, cache, a)
        else:
            tokenizer.header_tokenizer.add([], index.get, a)
        caches.append(dict(cache))
    assert caches[0] == caches[1] and len(caches[0]) == 1  # 7 values: emptied at 3 and 6

# ------------------------------------------------------------------ the text letter counts


def text_stats(text: str, steps) -> mail.MailAnalysis:
    a = mail.MailAnalysis()
    a.add_text_stats(text, True, True, steps)
    return a


@needs_speedups
@settings(max_examples=400, deadline=None)
@given(text=st.one_of(any_text, st.text(max_size=200)))
def test_c_text_counts_equal_the_python_ones(text):
    c, reference = both(lambda steps: text_stats(text, steps))
    assert c == reference


@needs_speedups
def test_c_text_counts_hand_worked():
    # H W O R L D, circled A (upper-case, not a letter) and sigma: 8 upper-case; the letters
    # are H e-acute l l o W O R L D sigma sigma; e-acute, circled A and the sigmas: 4 non-ASCII
    assert speedups.text_counts("H\xe9llo WORLD! $ \u24b6\u03a3\u03c3") == (8, 12, 4, 2)
    assert speedups.text_counts("") == (0, 0, 0, 0)
    assert speedups.text_counts("\xa0\xd7\xf7\xaa") == (0, 1, 4, 0)  # only the ordinal is alphabetic
    with pytest.raises(TypeError):
        speedups.text_counts(b"bytes")
    c, reference = both(lambda steps: text_stats("ab" * 100_000, steps))
    assert (c.letters, c.upper) == (200_000, 0) and c == reference  # from 200,000 characters every
    # one counts as a letter


# ------------------------------------------------------------------ the token hash table


def python_hashes(tokens: list[str]) -> list[int]:
    return list(map(hashing.REFERENCE_TABLE.lookup, tokens))  # the dict: the reference


@needs_speedups
@settings(max_examples=200, deadline=None)
@given(lists=st.lists(st.lists(st.one_of(any_text, st.sampled_from(["a", "b", "ab", ""])),
                               max_size=20), max_size=8))
def test_c_token_hashes_equal_the_python_ones(lists):
    total = sum(map(len, lists))
    got = hashing._hashes(lists, total, table=hashing.C_TABLE)
    assert got.dtype == np.uint64
    assert got.tolist() == python_hashes([t for tokens in lists for t in tokens])
    assert hashing._hashes(lists, total, table=hashing.REFERENCE_TABLE).tolist() == got.tolist()
    assert [hashing.C_TABLE.lookup(t) for tokens in lists for t in tokens] == got.tolist()


@pytest.fixture
def small_c_cache():
    """The C table re-made with room for 8 tokens (16 slots: probing and emptying happen
    all the time), restored afterwards."""
    speedups.hash_cache_init(8, hashing._blake64)
    yield
    speedups.hash_cache_init(hashing.HASH_CACHE_SIZE, hashing._blake64)


@needs_speedups
def test_c_token_hash_cache_is_bounded_and_stays_exact(small_c_cache):
    tokens = [f"tok{i}" for i in range(200)] * 3 + ["é", "日本語", "x" * 1000]
    out = np.empty(len(tokens), dtype=np.uint64)
    speedups.hash_lists([tokens[:300], tuple(tokens[300:])], out)
    assert out.tolist() == python_hashes(tokens)
    assert 0 < speedups.hash_cache_len() <= 8
    assert hashing.token_hash64.cache_info().currsize <= 8
    speedups.hash_cache_clear()
    assert speedups.hash_cache_len() == 0


@needs_speedups
def test_c_token_hash_cache_rejects_what_it_cannot_hash():
    out = np.empty(2, dtype=np.uint64)
    with pytest.raises(TypeError, match="tokens must be str"):
        speedups.hash_lists([["a", 3]], out)
    with pytest.raises(TypeError, match="tokens must be str, got bytes"):  # in a later block
        speedups.hash_lists([[f"t{i}" for i in range(20)] + [b"x"]], np.empty(21, np.uint64))
    with pytest.raises(TypeError):
        speedups.hash_lists([5], out)
    with pytest.raises(ValueError, match="too small"):
        speedups.hash_lists([["a", "b", "c"]], out)
    with pytest.raises(ValueError, match="larger"):
        speedups.hash_lists([["a"]], out)
    with pytest.raises(BufferError):  # read-only
        speedups.hash_lists([["a", "b"]], bytes(16))
    with pytest.raises((BufferError, ValueError)):  # not contiguous
        speedups.hash_lists([["a", "b"]], np.empty(4, dtype=np.uint64)[::2])


@needs_speedups
def test_a_token_new_to_the_c_table_is_hashed_by_the_miss_function(small_c_cache):
    """A miss calls the Python function (once: the next lookup is a hit), whatever the
    token: empty, a lone surrogate, beyond one BLAKE2b block."""
    calls: list[str] = []

    def counting(token: str) -> int:
        calls.append(token)
        return hashing._blake64(token)

    speedups.hash_cache_init(8, counting)
    tokens = ["fresh", "", "\ud800", "é" * 64, "y" * 257]
    assert [speedups.hash_one(t) for t in tokens * 2] == [hashing._blake64(t) for t in tokens * 2]
    assert calls == tokens
    with pytest.raises(TypeError, match="callable"):
        speedups.hash_cache_init(8, None)
    with pytest.raises(TypeError, match="2 arguments"):
        speedups.hash_cache_init(8, counting, b"key")


@needs_speedups
def test_c_token_hash_cache_passes_the_miss_error_on(small_c_cache):
    def fails(token: str) -> int:
        raise RuntimeError("no hash for " + token)

    speedups.hash_cache_init(8, fails)
    with pytest.raises(RuntimeError, match="no hash for new"):
        speedups.hash_one("new")


bucket_lists = st.lists(
    st.one_of(st.lists(st.integers(0, 2**64 - 1), max_size=40),  # insertion sort
              st.lists(st.integers(0, 2**64 - 1), min_size=33, max_size=400),  # sorted on top bits
              st.lists(st.integers(0, 2**64 - 1), max_size=5).map(lambda v: v * 60)),  # repeats
    max_size=8)


@needs_speedups
@settings(max_examples=400, deadline=None)
@given(lists=bucket_lists, bits=st.integers(1, hashing.MAX_HASH_BITS))
def test_c_unique_buckets_equal_the_numpy_ones(lists, bits):
    hasher = hashing.TokenHasher(bits)
    hashes = np.array([h for values in lists for h in values], dtype=np.uint64)
    sizes = np.array([len(values) for values in lists], dtype=np.int64)
    got = hasher.unique_buckets_many(hashes.copy(), sizes)
    want = hasher._unique_buckets_numpy(hashes.copy(), sizes)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert all(g.dtype == np.int32 for g in got) and len(got) == len(lists)


@needs_speedups
def test_c_unique_buckets_hand_worked():
    # bits 4: 17 -> 1, 33 -> 1, 2 -> 2, 255 -> 15; a list of 40 of 3 values
    hashes = np.array([17, 1, 2, 33, 255, 2] + [9, 3, 7] * 40, dtype=np.uint64)
    sizes = np.array([3, 0, 3, 120], dtype=np.int64)
    out = np.full(126, -1, dtype=np.int32)
    counts = np.empty(4, dtype=np.int64)
    assert speedups.unique_buckets(hashes, sizes, 4, out, counts) is None
    assert counts.tolist() == [2, 0, 3, 3]
    assert out[:8].tolist() == [1, 2, 1, 2, 15, 3, 7, 9]


@needs_speedups
@pytest.mark.parametrize("bits", [4, 11, 20])
def test_c_unique_buckets_of_mail_sized_lists_with_runs_of_neighbours(bits):
    """Lists like a mail's (thousands of hashes, a few hundred distinct, repeated in any
    order), their buckets in runs of neighbours that collide in the C set of distinct
    buckets and wrap around its end (and crowd the buckets of its sort), one list after
    another through the same set; and lists of hash-like values spread evenly, of up to
    2,048 distinct buckets (sorted by their top bits) and more (the radix sort)."""
    rng = np.random.default_rng(bits)
    hasher = hashing.TokenHasher(bits)
    lists = []
    for n, distinct in [(2_000, 300), (1, 1), (0, 0), (5_000, 900), (64, 64), (9_000, 4_000)]:
        start = int(rng.integers(1 << 40))
        values = (start + np.arange(distinct, dtype=np.uint64)) if distinct else np.empty(0, np.uint64)
        lists.append(rng.choice(values, size=n) if n else values)
    for n, distinct in [(3_000, 1_000), (4_000, 2_048), (9_000, 3_000)]:
        values = rng.integers(0, 2**63, size=distinct, dtype=np.uint64)
        lists.append(rng.choice(values, size=n))
    hashes = np.concatenate(lists).astype(np.uint64)
    sizes = np.array([v.size for v in lists], dtype=np.int64)
    got = hasher.unique_buckets_many(hashes.copy(), sizes)
    want = hasher._unique_buckets_numpy(hashes.copy(), sizes)
    assert [g.tolist() for g in got] == [w.tolist() for w in want]


@needs_speedups
def test_c_unique_buckets_rejects_inconsistent_buffers():
    hashes = np.arange(4, dtype=np.uint64)
    out, counts = np.empty(4, dtype=np.int32), np.empty(2, dtype=np.int64)
    with pytest.raises(ValueError, match="do not add up"):
        speedups.unique_buckets(hashes, np.array([2, 1]), 8, out, counts)
    with pytest.raises(ValueError, match="do not add up"):
        speedups.unique_buckets(hashes, np.array([5, -1]), 8, out, counts)
    with pytest.raises(ValueError, match="one item per list"):
        speedups.unique_buckets(hashes, np.array([2, 2]), 8, out, counts[:1])
    with pytest.raises(ValueError, match="too small"):
        speedups.unique_buckets(hashes, np.array([2, 2]), 8, out[:3], counts)
    with pytest.raises(ValueError, match="bits"):
        speedups.unique_buckets(hashes, np.array([2, 2]), 32, out, counts)
    with pytest.raises(TypeError, match="8-byte items"):
        speedups.unique_buckets(hashes, np.array([2, 2]), 8, out.astype(np.int64), counts)
    with pytest.raises(BufferError):  # read-only
        speedups.unique_buckets(hashes, np.array([2, 2]), 8, bytes(16), counts)


def test_the_dict_table_equals_the_one_in_use():
    """The dict table (what a build without the C module runs) gives what the table in use
    gives, for lists and tuples of tokens."""
    lists = [["cheap", "meds", "é", ""], [], ("tuple", "of", "tokens"), ["cheap"] * 3]
    total = sum(map(len, lists))
    in_use = hashing._hashes(lists, total).tolist()
    assert hashing._hashes(lists, total, table=hashing.REFERENCE_TABLE).tolist() == in_use == python_hashes(
        [t for tokens in lists for t in tokens])
    more = hashing.token_hashes(["more", "é"]).tobytes()  # a message's word hashes after its tokens
    assert hashing.TokenHasher().hashes_of(lists[0], more).tolist() == python_hashes(lists[0] + ["more", "é"])

"""The raw-mail hot path's C steps against independent oracles: ``html.unescape`` for the
C ``html_unescape`` (generated text, hand-worked edges and the text of every corpus HTML
part), keyed BLAKE2b (``hashing._blake64``) of the Python code's tokens for the hashes of
``word_hashes`` and ``html_strip``, and the tokens of every corpus mail with the C steps
against the Python code alone.
The Python path (``REFERENCE_STEPS``) is checked against the same oracles."""

from __future__ import annotations

import csv
import html

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamnb.features import hashing, mail, mail_headers
from streamnb.features import markup as markup_module
from streamnb.features.hashing import token_hashes
from streamnb.features.steps import C_STEPS, REFERENCE_STEPS
from streamnb.features.text import WordRules

needs_speedups = pytest.mark.skipif(
    C_STEPS is None, reason="streamnb.features._speedups is not built"
)
STEPS = [
    pytest.param(C_STEPS, id="C", marks=needs_speedups),
    pytest.param(REFERENCE_STEPS, id="reference"),
]

# ------------------------------------------------------------------ html_unescape

ENTITY_PIECES = [
    "&",
    "#",
    ";",
    "x",
    "X",
    "amp",
    "AMP",
    "lt",
    "nbsp",
    "eacute",
    "not",
    "notin",
    "copy",
    "frac12",
    "CounterClockwiseContourIntegral",
    "0",
    "1",
    "9",
    "65",
    "128",
    "150",
    "x41",
    "xD800",
    "xdfff",
    "x10FFFF",
    "x110000",
    "99999999999999999999",
    "0000065",
    "a",
    "b=",
    "=",
    " ",
    "\t",
    "\n",
    "\f",
    "\r",
    "<",
    ">",
    "\u00e9",
    "\u2019",
    "\U0001f600",
    "fFfF",
    "&#",
    "&#x",
    "&amp",
    "&nbsp",
    "&ampx",
    "&notit",
    "&Eacute",
    "ab" * 17,
]
entity_text = st.lists(st.sampled_from(ENTITY_PIECES), max_size=40).map("".join)


@pytest.mark.parametrize("steps", STEPS)
@settings(max_examples=1500, deadline=None)
@given(text=st.one_of(entity_text, st.text(max_size=60)))
def test_unescape_equals_html_unescape(steps, text):
    assert markup_module.unescape(text, steps) == html.unescape(text)


@pytest.mark.parametrize("steps", STEPS)
@pytest.mark.parametrize(
    "text",
    [
        "",
        "no reference",
        "&",
        "&&",
        "&;",
        "&#;",
        "&#x;",
        "&#xg;",
        "& amp;",
        "&amp;",
        "&amp",
        "&ampere;",
        "&notit;",
        "&notin;",
        "&#0;",
        "&#1;",
        "&#13;",
        "&#128;",
        "&#150;",
        "&#x80;",
        "&#xD800;",
        "&#xdfff",
        "&#x10FFFF;",
        "&#x110000;",
        "&#1114112;",
        "&#99999999999999999999999;",
        "&#xFDD0;",
        "&#127;",
        "&#65&#66;",
        "&#x41x",
        "a&b=2&c=3",
        "&" + "a" * 32 + ";",
        "&" + "a" * 33 + ";",
        "&nbsp&nbsp;x",
        "&CounterClockwiseContourIntegral;",
        "caf\u00e9 &eacute; \u2019&rsquo;",
        "\U0001f600&lt;",
        "&\r;",
        "&\u00e9;",
        "&#\u0661;",  # (an Arabic-Indic digit is no [0-9])
    ],
)
def test_unescape_hand_worked(steps, text):
    assert markup_module.unescape(text, steps) == html.unescape(text)


@needs_speedups
def test_unescape_declines_nothing_and_keeps_a_text_without_references():
    text = "plain text, no ampersand"
    assert C_STEPS.html_unescape(text, *markup_module._UNESCAPE_TABLES) is text


# ------------------------------------------------------------------ strip_html's passes, skipped


@pytest.mark.parametrize(
    "markup",
    [
        "<p>plain</p>",
        "<!DOCTYPE html><p>x</p>",
        "<?xml v?><b>y</b>",
        "<script>a<b></script>z",
        "<STYLE x=1>p{}</style >t",
        "<!DOCTYPE x><script>s</script><i>i</i>",
        "<<!x>script>no</script>",
        "<!-- c --><script>s</script>t",
        "<<!-- -->!x>y",
        "<<!-- -->script>q</script>r",
        "<sCrIpT>open",
        "<span>s</span><strong>t</strong><style",
        "<!x",
        "<?",
        "<!-",
        "<!--",
        "a<",
        "<s",
        "<styles>no</styles>",
    ],
)
def test_strip_html_equals_the_regex_passes(markup):
    """The C html_strip, which skips a pass that has nothing to act on, against the
    regexes of markup.strip_html run one after the other (the Python path)."""
    expected = markup_module.strip_html(markup, 2000, REFERENCE_STEPS)
    assert markup_module.strip_html(markup, 2000, C_STEPS or REFERENCE_STEPS) == expected


HTML_PIECES = [
    "<p>",
    "</P >",
    "<a href='http://Www.Example.COM/x'>",
    "<img src=https://a.b.example.org.>",
    "<form action=ftp://user@Host.example.net>",
    "<b>",
    "text",
    " ",
    "\n",
    "<!-- c -->",
    "<!--",
    "-->",
    "<script>",
    "</script>",
    "<STYLE x=1>",
    "</style >",
    "<!DOCTYPE x>",
    "<?xml?>",
    "<",
    ">",
    "\u2019",
    "\u00e9",
    "\u4e2d",
    "\u2003",
    "\u0661",
    "\u017f",
    "\u0130",
    "\U0001f600",
    "&amp;",
    '<a href="http://x.\u4e2d.y/">',
    "<scrip",
    "t>",
    "/",
    "\u00a0",
    "<\u2003b>",
]


@pytest.mark.parametrize("steps", STEPS)
@settings(max_examples=1500, deadline=None)
@given(
    markup=st.lists(st.sampled_from(HTML_PIECES), max_size=30).map("".join), limit=st.integers(0, 6)
)
def test_strip_html_of_any_markup_equals_the_regexes(steps, markup, limit):
    """strip_html with the C html_strip (markup beyond Latin-1 on a stand-in) against its
    regexes run by the re module one after the other (the Python path alone)."""
    expected = markup_module.strip_html(markup, limit, REFERENCE_STEPS)
    assert markup_module.strip_html(markup, limit, steps) == expected


@needs_speedups
@settings(max_examples=500, deadline=None)
@given(
    markup=st.lists(
        st.sampled_from(
            [
                "<p>",
                "</p>",
                "<A HREF='http://Www.Example.COM/x'>",
                "<img src=https://a.b.example.org.>",
                "<form action=ftp://user@Host.example.net>",
                "<B>",
                "text ",
                "<!-- c -->",
                "<script>s</script>",
                '<a href="http://x.y">',
                " caf\u00e9 ",
                "&amp;",
                "<br/>",
                "<TABLE width=1>",
                "\u2019",
                "<p>\u4e2d",
            ]
        ),
        max_size=30,
    ).map("".join),
    limit=st.integers(0, 12),
)
def test_strip_html_hashes_equal_the_tokens_hashed(markup, limit):
    """html_strip with a bytearray: the text as without it, and the stable hashes of the
    Python path's tokens (hashing._blake64, keyed BLAKE2b), appended after what was there."""
    text, tokens = markup_module.strip_html(markup, limit, REFERENCE_STEPS)
    hashes = bytearray(b"\x01" * 8)
    assert markup_module.strip_html(markup, limit, C_STEPS, hashes=hashes) == (text, [])
    assert hashes[:8] == b"\x01" * 8
    assert np.frombuffer(bytes(hashes[8:]), dtype=np.uint64).tolist() == [
        hashing._blake64(t) for t in tokens
    ]


# ------------------------------------------------------------------ word hashes beyond Latin-1

WIDE_PIECES = [
    "\u0130",
    "\u0131",
    "\u03a3",
    "\u03c3",
    "\u212a",
    "\u2019",
    "\u201c",
    "\u00e9",
    "\u00c9",
    "\u1e9e",
    "\ufb03",
    "\U0001f600",
    "\u2003",
    "\u3000",
    "\xa0",
    " ",
    "\n",
    "A",
    "b",
    "Cd",
    "word",
    "WORD",
    "@",
    ".",
    "!",
    "x@y.org",
    "-",
    "supercalifragilistic",
]
wide_text = st.lists(st.sampled_from(WIDE_PIECES), max_size=40).map("".join)


def assert_word_hashes_equal_the_rules(text, lo, hi, lower):
    """C word_hashes against the Python word rules' tokens hashed by hashing._blake64."""
    hi = max(lo, hi)
    rules = WordRules(min_len=lo, max_len=hi, lowercase=lower, steps=REFERENCE_STEPS)
    tokens: list[str] = []
    rules.words(text, tokens)
    out = bytearray()
    assert C_STEPS.word_hashes(text, lo, hi, out, lower) == len(tokens)
    assert np.frombuffer(bytes(out), dtype=np.uint64).tolist() == [
        hashing._blake64(t) for t in tokens
    ]


@needs_speedups
@settings(max_examples=1500, deadline=None)
@given(
    text=st.one_of(wide_text, st.text(max_size=40)),
    lo=st.integers(1, 4),
    hi=st.integers(1, 14),
    lower=st.booleans(),
)
def test_word_hashes_equal_the_python_word_rules(text, lo, hi, lower):
    """The C word_hashes on any text (Latin-1 or beyond) against the Python word rules,
    their tokens hashed by hashing._blake64 (keyed BLAKE2b), not read from the table."""
    assert_word_hashes_equal_the_rules(text, lo, hi, lower)


LATIN1_PIECES = [
    "\u00e9",
    "\u00c9",
    "\u00df",
    "\u00b5",
    "\u00ff",
    "\u00c0",
    "\xa0",
    " ",
    "\n",
    "A",
    "b",
    "Cd",
    "word",
    "WORD",
    "@",
    ".",
    "!",
    "x@Y.org",
    "a@b@c",
    "-",
    "supercalifragilistic",
    "Verylongword" * 6,
    "\u00c9t\u00c9@d\u00f6main.de",
]
latin1_text = st.lists(st.sampled_from(LATIN1_PIECES), max_size=40).map("".join)


@needs_speedups
@settings(max_examples=1500, deadline=None)
@given(text=latin1_text, lo=st.integers(1, 4), hi=st.integers(1, 80), lower=st.booleans())
def test_word_hashes_of_odd_latin1_words(text, lo, hi, lower):
    """Odd words of Latin-1 text (long, with '@', beyond ASCII), hashed on their characters
    in C, against the Python word rules' tokens hashed by hashing._blake64."""
    assert_word_hashes_equal_the_rules(text, lo, hi, lower)


URL_PIECES = [
    "http://",
    "HTTPS://",
    "www.",
    "WWW.",
    "ftp://",
    "mailto://",
    "x",
    "Host.Example.com",
    "/p?q",
    "@",
    "user@",
    " ",
    "\u2003",
    "\u00e9",
    "\u4e2d",
    "\u0661",
    "\u0130",
    "\u017f",
    "_",
    "(",
    "'",
    "\U0001f600",
    ".",
    "-",
    "\u03a3",
    "\n",
]
FOLDED = set("\u0130\u0131\u017f\u212a")


@needs_speedups
@settings(max_examples=2000, deadline=None)
@given(
    text=st.one_of(
        st.lists(st.sampled_from(URL_PIECES), max_size=30).map("".join), st.text(max_size=40)
    )
)
def test_url_scan_of_any_text_equals_the_url_regex(text):
    """The C url_scan (on a Latin-1 stand-in beyond Latin-1) against WordRules.urls run by
    the re module's _URL_SCAN (the Python path): the same text and tokens, or None for a
    text with a character IGNORECASE folds onto an ASCII letter."""
    expected_tokens: list[str] = []
    expected = WordRules(steps=REFERENCE_STEPS).urls(text, expected_tokens)
    tokens: list[str] = []
    got = C_STEPS.url_scan(text, tokens)
    if got is None:
        assert FOLDED & set(text)
        return
    assert (got, tokens) == (expected, expected_tokens)


# ------------------------------------------------------------------ the corpus


def corpus_raws(corpus_dir) -> list[bytes]:
    with open(corpus_dir / "index.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    return [(corpus_dir / row["path"]).read_bytes() for row in rows]


@needs_speedups
@pytest.mark.corpus
def test_corpus_html_text_unescapes_as_html_unescape(corpus_dir, monkeypatch):
    """Every text strip_html unescapes on the corpus, C against html.unescape."""
    seen: list[str] = []
    real = markup_module.unescape

    def spy(text, steps=C_STEPS):
        seen.append(text)
        return real(text, steps)

    monkeypatch.setattr(markup_module, "unescape", spy)
    tokenizer = mail.MailTokenizer(steps=C_STEPS)
    for raw in corpus_raws(corpus_dir):
        tokenizer.analyse(raw)
    assert sum(text.count("&") for text in seen) > 5_000
    for text in seen:
        assert C_STEPS.html_unescape(text, *markup_module._UNESCAPE_TABLES) == html.unescape(text)


def all_hashes(a) -> list[int]:
    """The stable hashes of every token of an analysis (those in its list, then its words')."""
    words = np.frombuffer(bytes(a.word_hashes or b""), dtype=np.uint64)
    return token_hashes(a.tokens).tolist() + words.tolist()


@needs_speedups
@pytest.mark.corpus
def test_corpus_hashed_analysis_equals_the_python_code(corpus_dir):
    """What the featurizer takes (``hash_words``: word tokens as their hashes) with the C
    steps, against the Python code alone, on every corpus mail."""
    mail_headers.clear_memos()
    fast, reference = mail.MailTokenizer(steps=C_STEPS), mail.MailTokenizer(steps=REFERENCE_STEPS)
    for raw in corpus_raws(corpus_dir):
        a, b = fast.analyse(raw, hash_words=True), reference.analyse(raw, hash_words=True)
        assert a.n_tokens == b.n_tokens
        assert sorted(all_hashes(a)) == sorted(all_hashes(b))
        assert a.meta().tolist() == b.meta().tolist()

"""HTML to text, keeping what spam filters learn from: tag names and link hosts.

Comments are removed without a space (``vi<!-- -->agra`` is ``viagra``), ``<script>`` and
``<style>`` contents are dropped, declarations and processing instructions
(``<!DOCTYPE ...>``, ``<?xml ...?>``) become a space, every other tag becomes a space and an
``html:<tag>`` token, hosts in ``href``/``src`` attributes become ``url:`` tokens, and character
references are unescaped. Regular expressions, not a DOM: spam HTML is rarely
well-formed, and this runs in linear time on any input (tags are found and replaced in
one ``re.split`` pass, without a Python call per tag). With the C steps
(:mod:`streamnb.features.steps`) these passes, the tag split and the tag tokens of Latin-1
markup, and of markup beyond Latin-1 read through a Latin-1 stand-in, run in one C call
(the same text and tokens); of the markup it declines, the tag tokens of Latin-1
attributes do.

>>> text, tokens = strip_html('<p>Buy <a href="http://x.example.com/p">NOW</a><!-- z --></p>')
>>> text.split()
['Buy', 'NOW']
>>> tokens
['html:p', 'html:a', 'url:x.example.com', 'url:example.com']
"""

from __future__ import annotations

import html
import html.entities
import re
from functools import lru_cache
from itertools import chain, compress, count, repeat
from operator import contains, not_

from streamnb.features.steps import DEFAULT_STEPS, TokenizerSteps
from streamnb.features.text import ALNUM, host_tokens_cached

__all__ = ["clear_link_memo", "strip_html", "unescape"]

_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
#: Declarations and processing instructions (``<!DOCTYPE ...>``, ``<?xml ...?>``): markup,
#: not text. Bounded like a tag's attributes.
_DECLARATION = re.compile(r"<[!?][^<>]{0,2000}>")
# [^<>]* (not [^>]*): a run of unclosed "<script" openers must not rescan to the end each
# time (quadratic: 160 kB of "<script " took 1.8 s).
_DROP = re.compile(r"<(script|style)\b[^<>]*>.*?(?:</\1\s*>|$)", re.S | re.I)
_TAG = re.compile(r"<\s*(/?)\s*([a-zA-Z][a-zA-Z0-9]{0,15})([^>]{0,2000})>?")
#: ``(?i)\b(?:href|src|action)\s*=\s*["']?\s*(?:https?|ftp)://(?:[^/?#@\s"'>]*@)?([a-z0-9][a-z0-9.-]*)``
#: (the host of a link), written to start with a character set (the regex engine skips
#: ahead to it in C; IGNORECASE would make it test every character), the word boundary
#: checked with a look-behind. The letters IGNORECASE adds (``ſ`` for s, ``İ ı`` for i)
#: are spelt out.
_LINK = re.compile(
    r"""[hHsS\u017faA](?<!\w.)(?:(?<=[hH])[rR][eE][fF]|(?<=[sS\u017f])[rR][cC]|(?<=[aA])[cC][tT][iI\u0130\u0131][oO][nN])"""
    rf"""\s*=\s*["']?\s*(?:[hH][tT][tT][pP][sS\u017f]?|[fF][tT][pP])://(?:[^/?#@\s"'>]*@)?([{ALNUM}][{ALNUM}.-]*)"""
)


def _link_hosts(attributes: str) -> tuple[str, ...]:
    """The ``url:`` tokens of the links in one tag's attributes, memoised for attributes of
    up to 512 characters (mail repeats its links and images)."""
    if len(attributes) > 512:
        return _find_link_hosts(attributes)
    return _cached_link_hosts(attributes)


def _find_link_hosts(attributes: str) -> tuple[str, ...]:
    return tuple(
        chain.from_iterable([host_tokens_cached("url", host) for host in _LINK.findall(attributes)])
    )


_cached_link_hosts = lru_cache(maxsize=2048)(_find_link_hosts)


def clear_link_memo() -> None:
    """Empty the memo of link hosts per tag's attributes."""
    _cached_link_hosts.cache_clear()


#: html.unescape's tables, for the C step (which takes them as arguments), and the
#: longest name without a ';' (only those can be a prefix match).
_UNESCAPE_TABLES = (
    html.entities.html5,
    html._invalid_charrefs,
    html._invalid_codepoints,
    max(len(name) for name in html.entities.html5 if not name.endswith(";")),
)


def unescape(text: str, steps: TokenizerSteps = DEFAULT_STEPS) -> str:
    """``html.unescape(text)`` (the C step ``html_unescape`` where it is built: the same
    matches and replacements, from the same tables, without a Python call per reference).

    >>> unescape("caf&eacute; &amp;c &#x263a; &notit; &#0;")
    'café &c ☺ ¬it; \ufffd'
    """
    if steps.html_unescape is not None:
        return steps.html_unescape(text, *_UNESCAPE_TABLES)
    return html.unescape(text)


def strip_html(
    markup: str,
    max_tag_tokens: int = 2000,
    steps: TokenizerSteps = DEFAULT_STEPS,
    hashes: bytearray | None = None,
) -> tuple[str, list[str]]:
    """Return the visible text of ``markup`` and its ``html:``/``url:`` tokens. The C step
    ``html_strip`` (all of this but the unescaping; markup beyond Latin-1 through a Latin-1
    stand-in) declines markup with a character that IGNORECASE folds onto an ASCII letter
    (``İ ı ſ K``), and ``tag_tokens`` (the tokens of the split tags) attributes beyond
    Latin-1: the code below takes those. ``hashes`` (a
    bytearray, for a caller that only hashes tokens): where ``html_strip`` takes the
    markup, the tokens' stable hashes are appended to it (native uint64, as
    :meth:`WordRules.hash_words <streamnb.features.text.WordRules.hash_words>` appends
    them) and the list returned is empty; the same hashes, without a str per token. (The
    C token table fills ``hashes``: with it off, so is ``word_hashes``, and the tokens are
    returned.)"""
    if steps.html_strip is not None and max_tag_tokens >= 0:
        done = steps.html_strip(
            markup, max_tag_tokens, hashes if steps.word_hashes is not None else None
        )
        if done is not None:  # (Latin-1 markup: every step below but the unescaping, in C)
            return unescape(done[0], steps), done[1]
    markup = _COMMENT.sub("", markup)
    markup = _DECLARATION.sub(" ", markup)
    markup = _DROP.sub(lambda m: f" <{m.group(1)}> ", markup)
    # One regex pass: split() interleaves the text between tags with each tag's 3 groups.
    pieces = _TAG.split(markup)
    text = unescape(" ".join(pieces[::4]), steps)
    slashes, names, attributes = pieces[1::4], pieces[2::4], pieces[3::4]
    if steps.tag_tokens is not None and max_tag_tokens >= 0:
        c_tokens = steps.tag_tokens(slashes, names, attributes, max_tag_tokens)
        if c_tokens is not None:  # (Latin-1 attributes: the rest of this function, in C)
            return text, c_tokens
    # html:<name> of the opening tags, lower-cased in one call (names are ASCII, no blank).
    opened = list(compress(names, map(not_, slashes)))
    tags = ("html:" + " html:".join(opened)).lower().split(" ") if opened else []
    linked = list(compress(count(), map(contains, attributes, repeat("://"))))  # tags with a URL
    if not linked:
        return text, tags[:max_tag_tokens]
    # Each tag gives its html: token (an opening tag), then the hosts of its links; tags
    # are taken until the tokens reach the limit.
    tokens: list[str] = []
    groups: list[tuple[int, int]] = []  # where the tokens of each tag with hosts start and end
    taken = done = closing = 0  # html: tokens copied, tags passed, closing tags among them
    for i in linked:
        closing += slashes[done:i].count("/")
        done = i
        if len(tokens) - taken + i - closing >= max_tag_tokens:  # tokens of the tags before i
            break
        hosts = _link_hosts(attributes[i])
        if hosts:
            opening = not slashes[i]
            tokens.extend(tags[taken : i - closing + opening])  # up to the html: token of tag i
            taken = i - closing + opening
            groups.append((len(tokens) - opening, len(tokens) + len(hosts)))
            tokens.extend(hosts)
    tokens.extend(tags[taken : taken + max_tag_tokens])
    if len(tokens) > max_tag_tokens:
        cut = max_tag_tokens
        for first, end in groups:  # a tag's tokens are not split: the one reaching the limit
            if first < max_tag_tokens < end:
                cut = end
        del tokens[cut:]
    return text, tokens

"""Word rules shared by every text tokenizer (body text, subjects, plain ``text`` payloads).

Rules, in order (after SpamBayes' tokenizer):

1. URLs (``scheme://host/...`` and ``www.host``) become ``proto:<scheme>`` and
   ``url:<host>`` plus ``url:<last two labels of the host>``, and are removed from the text.
2. Text is split on white space; punctuation is stripped from both ends of each word.
3. E-mail addresses become ``email:<domain>`` (the local part is dropped).
4. Words are lower-cased (option ``lowercase``).
5. Words of ``min_len``..``max_len`` characters (3..12) are kept as they are; shorter
   ones are dropped; longer ones become ``skip:<first character> <length rounded down
   to 10>`` (SpamBayes' trick: long runs say something, their exact text rarely does).
6. Words with non-ASCII characters add an ``8bit%:<share rounded to 10>`` token.
7. Optional word bigrams ``bi:<w1> <w2>`` (option ``ngrams``).
8. Optional orthogonal sparse bigrams (option ``osb``, the window N: 0 is off, CRM114 and
   rspamd use 5): each word token (a kept word, or its ``skip:``/``email:`` token) paired
   with each of the N - 1 word tokens before it in the same text, the distance in the
   token: ``osb<d>:<earlier> <word>``, d = 1 (adjacent) .. N - 1. ``a b c`` with N = 3
   gives ``osb1:a b``, ``osb1:b c``, ``osb2:a c`` (after ``b`` and ``c`` in turn).

Words go through list comprehensions: ASCII text one token per kept word, other text the
same rules with a per-word step only for the words that need one (``@``, too long,
non-ASCII). URLs are looked for only where one can start (before a ``://``, at a
``www.``). Host tokens are memoised (:func:`host_tokens_cached`). With the C steps
(:mod:`streamnb.features.steps`, the rules' ``steps``) the words and the URLs of Latin-1
text take the same rules in C.

>>> tokenize_text("Visit http://www.Cheap-Meds.biz/now for FREE!!! pharmacy-supercalifragilistic")
['proto:http', 'url:www.cheap-meds.biz', 'url:cheap-meds.biz', 'visit', 'for', 'free', 'skip:p 20']
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, repeat

from streamnb.features.steps import DEFAULT_STEPS, TokenizerSteps

__all__ = [
    "ALNUM",
    "MAX_OSB_WINDOW",
    "URL_RE",
    "WordRules",
    "clear_host_memo",
    "host_tokens",
    "host_tokens_cached",
    "tokenize_text",
]

#: URLs: a scheme or a bare ``www.`` host, up to white space or a quote/bracket.
URL_RE = re.compile(r"""(?i)\b(?:(https?|ftp|mailto)://|(?=www\.))([^\s"'<>()\[\]{}]+)""")
#: The same matches, faster: starts with a character set (the regex engine skips ahead in
#: C) and checks the word boundary with a look-behind. Groups: the first letter, the rest
#: of the scheme (None for ``www.``), the rest of the URL.
_URL_SCAN = re.compile(
    r"""(?i)([hfmw])(?<!\w.)(?:((?<=h)ttps?|(?<=f)tp|(?<=m)ailto)://|(?<=w)(?=ww\.))([^\s"'<>()\[\]{}]+)"""
)
#: ``[a-z0-9]`` under IGNORECASE, for a character set without the flag: the ASCII letters
#: and digits, and the 4 other letters IGNORECASE matches (``İ ı ſ K``, see :mod:`re`).
ALNUM = "a-zA-Z0-9\u0130\u0131\u017f\u212a"
_HOST_RE = re.compile(r"^(?:[^/?#@\s]*@)?([a-z0-9][a-z0-9.-]*)", re.I)
_PUNCT = "\"'.,;:!?()[]{}<>*`~|^_=+-/\\#&"
_SPLIT = re.compile(r"\s+")
#: The widest OSB window (rule 8): N - 1 pair tokens per word.
MAX_OSB_WINDOW = 8



def host_tokens(prefix: str, host: str) -> list[str]:
    """``prefix:<host>`` and ``prefix:<last two labels>`` for a host name (lower-cased)."""
    host = host.lower().strip(".")
    if not host:
        return []
    out = [f"{prefix}:{host}"]
    labels = host.split(".")
    if len(labels) > 2:
        out.append(f"{prefix}:{'.'.join(labels[-2:])}")
    return out


@lru_cache(maxsize=4096)
def _cached_host_tokens(prefix: str, host: str) -> tuple[str, ...]:
    return tuple(host_tokens(prefix, host))


def host_tokens_cached(prefix: str, host: str) -> tuple[str, ...]:
    """:func:`host_tokens` as a tuple, memoised for host names of DNS length (mail repeats
    the same relays and link hosts; longer strings are not kept)."""
    if len(host) > 253:
        return tuple(host_tokens(prefix, host))
    return _cached_host_tokens(prefix, host)


def clear_host_memo() -> None:
    """Empty the memo of :func:`host_tokens_cached`."""
    _cached_host_tokens.cache_clear()


def _url_host(rest: str) -> str:
    m = _HOST_RE.match(rest)
    return m.group(1) if m else ""


def _crack(m: re.Match[str], out: list[str]) -> str:
    """Append the ``proto:`` and ``url:`` tokens of one :data:`_URL_SCAN` match."""
    first, scheme, rest = m.groups()
    if scheme is None:  # www.host: the first letter belongs to the host
        out.append("proto:http")
        rest = first + rest
    else:
        out.append("proto:" + (first + scheme).lower())
    out.extend(host_tokens_cached("url", _url_host(rest)))
    return " "


def _url_starts(text: str, most: int = 256) -> list[int] | None:
    """Where a :data:`_URL_SCAN` match can start, ascending: up to 6 characters before a
    ``://`` (the scheme) and at a ``www.`` in any case. None past ``most`` of those, or
    when lower-casing changes the length of the text (positions would not line up)."""
    starts: list[int] = []
    find = text.find
    i = find("://")
    while i >= 0:
        if len(starts) >= most:
            return None
        starts.extend(range(max(i - 6, 0), max(i - 2, 0)))
        i = find("://", i + 3)
    low = text.lower()  # www. in any case (only W lower-cases to w, only . to .)
    if len(low) != len(text):
        return None
    find = low.find
    i = find("www.")
    while i >= 0:
        if len(starts) >= most:
            return None
        starts.append(i)
        i = find("www.", i + 4)
    starts.sort()
    return starts


@dataclass(frozen=True, slots=True)
class WordRules:
    """The word rules above, with their options, and the steps they run
    (:mod:`streamnb.features.steps`; rules of other steps give the same tokens).

    >>> WordRules(min_len=2).tokens("a bb ccc")
    ['bb', 'ccc']
    """

    lowercase: bool = True
    min_len: int = 3
    max_len: int = 12
    ngrams: bool = False
    steps: TokenizerSteps = field(default=DEFAULT_STEPS, repr=False)
    #: The OSB window N (rule 8): 0 off, else 2..:data:`MAX_OSB_WINDOW` (after ``steps``,
    #: so the fields before it keep their positions).
    osb: int = 0

    def urls(self, text: str, out: list[str]) -> str:
        """Append URL tokens to ``out``; return the text with the URLs blanked out (the C
        ``url_scan`` for Latin-1 text, which declines other text)."""
        url_scan = self.steps.url_scan
        if url_scan is not None and (scanned := url_scan(text, out)) is not None:
            return scanned  # (Latin-1 text: the same rule in C, the test below first)
        if "://" not in text and "www." not in text and "WWW." not in text:
            return text
        starts = _url_starts(text)
        if starts is None:  # many candidates (or an odd lower-casing): one regex pass
            return _URL_SCAN.sub(lambda m: _crack(m, out), text)
        # _URL_SCAN.sub, trying the regex only where a match can start.
        pieces = []
        pos = 0
        match = _URL_SCAN.match
        for start in starts:
            if start >= pos and (m := match(text, start)) is not None:
                pieces.append(text[pos:start])
                _crack(m, out)
                pos = m.end()
        if not pieces:
            return text
        pieces.append(text[pos:])
        return " ".join(pieces)

    def words(self, text: str, out: list[str], limit: int | None = None) -> None:
        """Append the tokens of the words of ``text`` to ``out`` (at most ``limit`` in all).

        List comprehensions with a per-word call only for the words that need one (``@``,
        too long, non-ASCII), or the C ``word_tokens`` step; bigrams, a zero minimum length
        and a cut at ``limit`` take the word loop (:meth:`_word_loop`). All give the same
        tokens in the same order.
        """
        if self.lowercase:
            text = text.lower()
        if self.ngrams or self.osb or self.min_len < 1:
            self._word_loop(text, out, limit)
            return
        lo, hi = self.min_len, self.max_len
        word_tokens = self.steps.word_tokens
        if word_tokens is not None:
            start = len(out)
            word_tokens(text, lo, hi, out)
            if limit is not None and len(out) > limit:
                del out[start:]
                self._word_loop(text, out, limit)  # where to cut: as the loop cuts
            return
        if not text.isascii():  # a no-break space (HTML &nbsp;) splits words as a space
            text = text.replace("\xa0", " ")  # does; without it, the text may be ASCII
        words = text.split()  # str.split() splits where \s+ does
        if not text.isascii() and not "".join(words).isascii():  # (not only white space)
            odd_tokens = self._odd_tokens
            tokens = list(chain.from_iterable(
                [(w,) if len(w) <= hi and w.isascii() and "@" not in w else odd_tokens(w)
                 for w in map(str.strip, words, repeat(_PUNCT)) if len(w) >= lo]))
        elif "@" in text:
            odd = self._odd_word
            tokens = [w if len(w) <= hi and "@" not in w else odd(w)
                      for w in map(str.strip, words, repeat(_PUNCT)) if len(w) >= lo]
        else:
            tokens = [w if len(w) <= hi else f"skip:{w[0]} {len(w) // 10 * 10}"
                      for w in map(str.strip, words, repeat(_PUNCT)) if len(w) >= lo]
        if limit is not None and len(out) + len(tokens) > limit:
            self._word_loop(text, out, limit)  # where to cut: as the loop cuts
        else:
            out.extend(tokens)

    def hash_words(self, text: str, out: list[str], hashes: bytearray) -> None:
        """:meth:`words` without a limit, for a caller that only hashes the tokens: the C
        ``word_hashes`` step appends the stable hashes of the word tokens to ``hashes``
        (uint64, what :func:`~streamnb.features.hashing.token_hashes` gives for them)
        without making the common token a str; bigrams, OSB or no such step append the
        tokens to ``out``. Either way the same tokens are hashed, in their order.

        >>> import numpy as np
        >>> from streamnb.features.hashing import token_hashes
        >>> out, hashes = [], bytearray()
        >>> WordRules().hash_words("Cheap MEDS now", out, hashes)
        >>> got = token_hashes(out).tolist() + np.frombuffer(hashes, np.uint64).tolist()
        >>> got == token_hashes(["cheap", "meds", "now"]).tolist()
        True
        """
        word_hashes = self.steps.word_hashes
        if word_hashes is not None and not self.ngrams and not self.osb and self.min_len >= 1 and \
                word_hashes(text, self.min_len, self.max_len, hashes, self.lowercase) is not None:
            return  # (lower-cased word by word in C: str.lower of a whole text costs more)
        self.words(text, out)

    def _odd_word(self, w: str) -> str:
        """The word token (no ``8bit%:``) of a word that is too long or holds an ``@``."""
        n = len(w)
        if n > self.max_len:
            if "@" in w and "." in w and w.count("@") == 1 and n < 60:
                return "email:" + w.split("@", 1)[1]
            return f"skip:{w[0]} {n // 10 * 10}"
        if w.count("@") == 1:
            return "email:" + w.split("@", 1)[1]
        return w

    def _odd_tokens(self, w: str) -> tuple[str, ...]:
        """The tokens of any word that :meth:`_odd_word` does not cover (non-ASCII)."""
        token = self._odd_word(w)
        if w.isascii() or (len(w) <= self.max_len and w.count("@") == 1):  # short e-mail: no 8bit%
            return (token,)
        high = len(w) - len(w.encode("ascii", "ignore"))
        return token, f"8bit%:{int(high * 10 / len(w) + 0.5) * 10}"

    def _word_loop(self, text: str, out: list[str], limit: int | None) -> None:
        """The word rules one word at a time (:meth:`_odd_tokens`), with bigrams between
        words kept as they are and OSB pairs (:meth:`_osb_pairs`), stopping once ``out``
        holds ``limit`` tokens."""
        lo = self.min_len
        prev = None
        window: list[str] = []  # the OSB window: the last osb - 1 word tokens, newest last
        append, extend = out.append, out.extend
        for raw in _SPLIT.split(text):
            w = raw.strip(_PUNCT)
            if len(w) < lo:
                continue
            tokens = self._odd_tokens(w)
            if self.osb:
                self._osb_pairs(window, tokens[0], out)
            if tokens[0] is w:  # kept as it is (then its 8bit% token, if any)
                append(w)
                if self.ngrams and prev is not None:
                    append(f"bi:{prev} {w}")
                prev = w
                extend(tokens[1:])
            else:  # skip: or email:
                extend(tokens)
                prev = None
            if limit is not None and len(out) >= limit:
                return

    def _osb_pairs(self, window: list[str], token: str, out: list[str]) -> None:
        """Append ``token`` to ``out`` paired with each earlier word token of ``window``
        (``osb<d>:<earlier> <token>``, d the distance), then slide ``token`` into it.

        >>> out, window = [], []
        >>> for t in ("a", "b", "c"):
        ...     WordRules(osb=3)._osb_pairs(window, t, out)
        >>> out, window
        (['osb1:a b', 'osb1:b c', 'osb2:a c'], ['b', 'c'])
        """
        n = len(window)
        out.extend([f"osb{n - i}:{window[i]} {token}" for i in range(n - 1, -1, -1)])
        window.append(token)
        if n + 1 >= self.osb:
            del window[0]

    def tokens(self, text: str, limit: int | None = None) -> list[str]:
        """URL tokens, then word tokens, of one piece of text."""
        out: list[str] = []
        text = self.urls(text, out)
        self.words(text, out, limit)
        return out if limit is None else out[:limit]


_DEFAULT_RULES = WordRules()


def tokenize_text(text: str, rules: WordRules = _DEFAULT_RULES) -> list[str]:
    """Tokens of a plain-text document under ``rules`` (see the module docstring)."""
    return rules.tokens(text)

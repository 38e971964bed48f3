"""The e-mail tokenizer: raw RFC 822 bytes -> tokens and a small dense meta vector.

Parsing reproduces the standard library's ``email.parser.BytesParser`` with the
``compat32`` policy (which records defects instead of raising); an mbox ``From `` line is
accepted. The common path is :mod:`streamnb.features.mime`, a reader on bytes that gives
the same header values, parts, payloads and defects with a few regex passes instead of
the feed parser's line-by-line Python loop; address lists in their common forms are read
with one regex (``email.utils.getaddresses`` takes the rest). Whatever that reader does
not reproduce (nested ``message/*``, digests, uuencode, RFC 2231 parameters, lone
carriage returns, MIME nested to the depth limit; see its docstring), and any error in
it, sends the message to the standard parser: both paths give the same tokens, in the
same order (``analyse(raw, fast=False)`` runs the standard one; tests compare them).
Tokens come from

* selected headers, prefixed with the header name: ``subject:`` words, ``from:`` /
  ``to:`` / ``cc:`` / ``reply-to:`` / ``return-path:`` address domains (and the words of
  the sender's display name), ``received:`` hosts and IP prefixes, ``x-mailer:`` words,
  ``message-id:`` domain, the top ``content-type:``; and ``header:<name>`` for every
  header present (option ``header_names``);
* the MIME structure: ``part:<type/subtype>`` per part, ``charset:<name>``,
  ``encoding:<cte>``, ``attachment:<file extension>``;
* the decoded text parts (transfer encodings and charsets decoded; an unknown charset
  falls back to latin-1 with a ``defect:charset`` token), with HTML reduced to text
  plus ``html:<tag>`` and ``url:<host>`` tokens (:mod:`streamnb.features.markup`), run
  through the word rules of :mod:`streamnb.features.text`.

The per-character steps (Received tokens, letter counts, address lists and the header
stage here, the word rules and URLs in :mod:`~streamnb.features.text`, HTML tags in
:mod:`~streamnb.features.markup`, header fields in :mod:`~streamnb.features.mime`) take the
tokenizer's C steps where they are built (:mod:`streamnb.features.steps`), on Latin-1
input; ``MailTokenizer(steps=REFERENCE_STEPS)`` runs this Python code alone, which is
what defines the tokens (docs/architecture.md, decision 14).

It never raises: every defect the parser reports, and every limit hit, becomes a
``defect:<name>`` token and is counted. Limits (:class:`~streamnb.features.payload.FeatureLimits`) bound
the raw size, MIME depth, number of parts, decoded text bytes and tokens.

>>> raw = b"From: Bob <bob@example.com>\\nSubject: Cheap meds\\n\\nBuy cheap meds now"
>>> tokenize_email(raw)[:6]
['header:from', 'header:subject', 'subject:cheap', 'subject:meds', 'from:example.com', 'from:name:bob']
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from email import policy
from email.message import Message
from email.parser import BytesParser
from functools import partial
from itertools import repeat

import numpy as np

from streamnb.features.mail_headers import (
    _ADDRESS_DEFECT,
    _CACHE_SIZE,
    _CACHED_CHARS,
    _address_count,
    _decode_checked,
    _decode_header,
    _getaddresses,
    _received_tokens,
    _remember,
    _value_cache,
)
from streamnb.features.markup import strip_html
from streamnb.features.mime import Part, Unsupported, parse_message
from streamnb.features.payload import DEFAULT_FEATURE_LIMITS, FeatureLimits
from streamnb.features.steps import DEFAULT_STEPS, TokenizerSteps
from streamnb.features.text import WordRules
from streamnb.features.truncate import cut_mail, truncated_size

__all__ = [
    "DEFAULT_HEADERS",
    "META_FEATURES",
    "MailAnalysis",
    "MailTokenizer",
    "text_meta",
    "tokenize_email",
]

#: Headers tokenized by default (lower-case names).
DEFAULT_HEADERS = (
    "subject",
    "from",
    "to",
    "cc",
    "reply-to",
    "return-path",
    "received",
    "x-mailer",
    "message-id",
    "content-type",
)
_ADDRESS_HEADERS = frozenset({"from", "to", "cc", "reply-to", "return-path", "sender"})

#: Names of the meta-feature columns, in order. Counts are ``log1p``-transformed.
META_FEATURES = (
    "log_size",  # log1p(raw bytes)
    "log_parts",  # log1p(MIME parts)
    "log_urls",  # log1p(URLs in the text)
    "html_share",  # share of body text that came from HTML parts
    "log_recipients",  # log1p(To + Cc addresses)
    "upper_share",  # share of upper-case letters among letters of the body text
    "log_tokens",  # log1p(tokens)
    "log_defects",  # log1p(defects)
    "log_attachments",  # log1p(non-text parts with a file name)
    "log_received",  # log1p(Received headers)
    "non_ascii_share",  # share of non-ASCII characters in the body text
    "log_exclaim",  # log1p('!' and '$' in the body text)
)
N_META = len(META_FEATURES)

#: What separates the words of a subject-like header value, with white space.
_SUBJECT_SEPARATORS = ".,;:!?()[]{}\"'<>*/\\|=+~#&^_-"
_SUBJECT_SPLIT = re.compile(rf"[\s{re.escape(_SUBJECT_SEPARATORS)}]+")
_PARSER = BytesParser(policy=policy.compat32)
#: Latin-1 byte -> 2 for str.isupper, 1 for the other str.isalpha, 0 for the rest.
_LATIN1_LETTER_CLASS = bytes(2 if chr(i).isupper() else int(chr(i).isalpha()) for i in range(256))
_LATIN1_RUNS = re.compile(r"[\x00-\xff]+")


def _python_text_counts(text: str, letters: bool = True) -> tuple[int, int, int, int]:
    """``(upper, letters, non_ascii, exclaim)`` characters of ``text`` (str.isupper,
    str.isalpha, above U+007F, ``!`` or ``$``), as the C ``text_counts`` step counts them.
    ``letters=False`` skips the first two (0).

    >>> _python_text_counts("H\xe9llo WORLD! $")
    (6, 10, 1, 2)
    """
    upper = n_letters = 0
    if letters:  # Latin-1 characters (ASCII, often U+00A0 of &nbsp;): one bytes.translate
        # to letter classes, then two C counts
        classes = text.encode("latin-1", "ignore").translate(_LATIN1_LETTER_CLASS)
        upper = classes.count(2)
        n_letters = classes.count(1) + upper
        if len(classes) < len(text):  # the others: map() over str methods counts in C
            rest = _LATIN1_RUNS.sub("", text)
            n_letters += sum(map(str.isalpha, rest))
            upper += sum(map(str.isupper, rest))
    high = 0 if text.isascii() else len(text) - len(text.encode("ascii", "ignore"))
    return upper, n_letters, high, text.count("!") + text.count("$")



class _PastTokenLimit(Exception):
    """A message analysed with its word tokens hashed has more tokens than the limit: it is
    analysed again with every token a str (where the limit cuts depends on their order)."""


@dataclass(slots=True)
class MailAnalysis:
    """What the tokenizer found in one message: tokens, defects and the raw meta counts.
    With ``word_hashes`` (a bytearray; :meth:`MailTokenizer.analyse` with ``hash_words``)
    the body's word tokens are there as their stable hashes (uint64) instead of in
    ``tokens``, where only the others are (:attr:`n_tokens` counts both)."""

    tokens: list[str] = field(default_factory=list)
    defects: int = 0
    size: int = 0
    parts: int = 0
    urls: int = 0
    html_chars: int = 0
    text_chars: int = 0
    upper: int = 0
    letters: int = 0
    non_ascii: int = 0
    exclaim: int = 0
    recipients: int = 0
    attachments: int = 0
    received: int = 0
    word_hashes: bytearray | None = None

    @property
    def n_tokens(self) -> int:
        """How many tokens: those in :attr:`tokens` and those hashed in :attr:`word_hashes`."""
        return len(self.tokens) + (0 if self.word_hashes is None else len(self.word_hashes) // 8)

    def defect(self, name: str) -> None:
        self.defects += 1
        self.tokens.append(f"defect:{name}")

    def add_text_stats(self, text: str, from_html: bool, letter_counts: bool = True,
                       steps: TokenizerSteps = DEFAULT_STEPS) -> None:
        """Count the characters of one piece of body text (:func:`_python_text_counts`, or
        the C ``text_counts`` step). From 200,000 characters on, every character counts as
        a letter (and none as upper-case): a bound on the work, kept as it was for the same
        meta vectors. ``letter_counts=False`` counts only its length (upper-case, letters,
        non-ASCII and ``!``/``$`` stay as they are)."""
        n = len(text)
        self.text_chars += n
        if from_html:
            self.html_chars += n
        if not letter_counts:
            return
        if n < 200_000:
            upper, letters, high, exclaim = (steps.text_counts or _python_text_counts)(text)
        else:
            _, _, high, exclaim = _python_text_counts(text, letters=False)
            upper, letters = 0, n
        self.upper += upper
        self.letters += letters
        self.non_ascii += high
        self.exclaim += exclaim

    def meta(self) -> np.ndarray:
        """The dense meta vector, in :data:`META_FEATURES` order."""
        log1p = math.log1p
        text = max(self.text_chars, 1)
        return np.array(
            [
                log1p(self.size),
                log1p(self.parts),
                log1p(self.urls),
                self.html_chars / text,
                log1p(self.recipients),
                self.upper / max(self.letters, 1),
                log1p(self.n_tokens),
                log1p(self.defects),
                log1p(self.attachments),
                log1p(self.received),
                self.non_ascii / text,
                log1p(self.exclaim),
            ],
            dtype=np.float64,
        )


@dataclass(frozen=True, slots=True)
class MailTokenizer:
    """Tokenize raw mail (see the module docstring) under fixed options and limits.

    >>> tok = MailTokenizer()
    >>> a = tok.analyse(b"Subject: Hello\\nContent-Type: text/html\\n\\n<b>Hello</b> world")
    >>> [t for t in a.tokens if not t.startswith(("header:", "to:", "from:", "message-id:"))]
    ['subject:hello', 'content-type:text/html', 'part:text/html', 'html:b', 'hello', 'world']
    >>> float(a.meta()[3])  # html_share
    1.0
    """

    rules: WordRules = WordRules()
    #: Headers to tokenize, matched without regard to case (stored lower-case).
    headers: Sequence[str] = DEFAULT_HEADERS
    header_names: bool = True
    limits: FeatureLimits = DEFAULT_FEATURE_LIMITS
    #: Count the body text's upper-case, letter, non-ASCII and ``!``/``$`` characters for
    #: the meta vector; False leaves those counts at 0 (a featurizer without the meta
    #: vector needs none of them). The tokens are the same either way.
    letter_counts: bool = True
    #: The per-character steps (:mod:`streamnb.features.steps`), the word rules' too: the
    #: same tokens with any of them.
    steps: TokenizerSteps = field(default=DEFAULT_STEPS, repr=False)
    #: What C ``header_tokens`` needs of these options (derived; see :meth:`_header_spec`).
    _spec: tuple = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", tuple(name.lower() for name in self.headers))
        if self.rules.steps is not self.steps:
            object.__setattr__(self, "rules", replace(self.rules, steps=self.steps))
        object.__setattr__(self, "_spec", self._header_spec())

    def _header_spec(self) -> tuple:
        """The options, bounds and Python callbacks of :meth:`_headers`, for the C loop."""
        cap = self.limits.max_header_chars
        return (self.headers, self.header_names, cap, min(cap, 2000), _CACHE_SIZE, _CACHED_CHARS,
                self._value_tokens, partial(_address_count, steps=self.steps), _decode_header,
                partial(_received_tokens, steps=self.steps), _ADDRESS_DEFECT)

    def tokenize(self, raw: bytes) -> list[str]:
        return self.analyse(raw).tokens

    def analyse(self, raw: bytes, fast: bool = True, hash_words: bool = False) -> MailAnalysis:
        """Tokens and meta counts of one message; never raises. ``fast=False`` parses with
        the standard library only (the fast reader gives the same tokens where it applies).
        ``hash_words``: the body's word tokens as their stable hashes in
        :attr:`MailAnalysis.word_hashes` (for a caller that only hashes tokens: the same
        hashes, without a str per word), unless the message has more tokens than the limit."""
        a = MailAnalysis(size=len(raw), word_hashes=bytearray() if hash_words else None)
        try:
            data = self._prepare(raw, a)
            if data is not None:
                a = self._parse(data, a, fast)
        except _PastTokenLimit:
            return self.analyse(raw, fast)
        except RecursionError:
            a.defect("recursion")
        except Exception as exc:  # a parser corner case: the message still gets tokens
            a.defect("error_" + type(exc).__name__.lower())
        limit = self.limits.max_tokens
        if a.word_hashes is not None and a.n_tokens > limit:
            return self.analyse(raw, fast)  # (the tokens cut below are the first ones)
        if len(a.tokens) > limit:
            del a.tokens[limit:]
            a.defects += 1
            a.tokens[-1] = "defect:too_many_tokens"
        return a

    # ------------------------------------------------------------------ parsing
    def _prepare(self, raw: bytes, a: MailAnalysis) -> bytes | None:
        """The raw bytes, cut to the size limit (:func:`~streamnb.features.truncate.cut_mail`:
        headers kept, at a MIME boundary where there is one); None (and a defect) for an
        empty message."""
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raw = str(raw).encode("utf-8", "surrogatepass")
        raw = cut_mail(bytes(raw), self.limits.max_message_bytes)
        original = truncated_size(raw)
        if original is not None:  # cut here or by the producer: the same bytes either way
            a.size = original
            a.defect("truncated")
        if not raw or raw.isspace():
            a.defect("empty")
            return None
        return raw

    def _parse(self, raw: bytes, a: MailAnalysis, fast: bool) -> MailAnalysis:
        """The fast reader when it can read the message, else the standard library."""
        if fast:
            trial = MailAnalysis(size=a.size, tokens=list(a.tokens), defects=a.defects,
                                 word_hashes=None if a.word_hashes is None else bytearray(a.word_hashes))
            try:
                self._analyse_fast(raw, trial)
                return trial
            except _PastTokenLimit:
                raise
            except Exception:  # Unsupported, or a corner case: the standard parser decides
                pass
        self._analyse_stdlib(raw, a)
        return a

    def _analyse_fast(self, raw: bytes, a: MailAnalysis) -> None:
        """The common path: :mod:`streamnb.features.mime` on bytes; raises
        :class:`~streamnb.features.mime.Unsupported` for what it does not reproduce."""
        root = parse_message(raw, self.steps)
        if not root.is_multipart() and root.content_type().startswith("multipart/"):
            root.defects.append("multipartinvariantviolationdefect")
        for name in root.defects:
            a.defect(name)
        index = root.header_index()
        if self.steps.header_tokens is not None:
            self.steps.header_tokens(root.names(), index, self._spec, _value_cache(self.rules), a)
        else:
            self._headers(root.names(), index.get, a)
        self._walk_fast(root, 0, a, [self.limits.max_decoded_bytes])

    def _analyse_stdlib(self, raw: bytes, a: MailAnalysis) -> None:
        """Every message: ``email.parser.BytesParser`` (compat32)."""
        try:
            msg = _PARSER.parsebytes(raw)
        except RecursionError:  # MIME nested past Python's stack: keep headers and text
            a.defect("recursion")
            msg = _PARSER.parsebytes(raw, headersonly=True)
        for d in msg.defects:
            a.defect(type(d).__name__.lower())
        self._headers([name.lower() for name in msg.keys()], msg.get_all, a)
        budget = [self.limits.max_decoded_bytes]
        self._walk(msg, 0, a, budget)

    def _headers(self, names: Sequence[str], get_all: Callable[[str], Sequence[object] | None],
                 a: MailAnalysis) -> None:
        """Header tokens, from the header ``names`` (lower-case, in order) and their values
        (``get_all(name)``: a list, empty or None when absent)."""
        tokens = a.tokens
        if self.header_names:  # each name once, in order of first appearance
            keys = dict.fromkeys(names)
            if keys and max(map(len, keys)) > 40:
                keys = dict.fromkeys([key[:40] for key in keys])
            tokens.extend(["header:" + key for key in keys])
        cap = self.limits.max_header_chars
        text_cap = min(cap, 2000)
        cache = _value_cache(self.rules)
        for name in self.headers:
            values = get_all(name)
            if not values:  # (no recipients, no Received headers: the counts stay 0)
                if name in ("subject", "from", "to", "message-id"):
                    tokens.append(name + ":none")
                continue
            if name in ("to", "cc"):
                joined = ", ".join([str(v)[:cap] for v in values])
                count = cache.get(joined)
                if count is None:
                    count = _address_count(joined, self.steps)
                    if len(joined) <= _CACHED_CHARS:
                        _remember(cache, joined, count)
                if count < 0:
                    a.defect("address")
                else:
                    a.recipients += count
            elif name == "received":
                a.received = len(values)
            # The common value is a str without encoded words: taken as it is.
            texts = [value[:text_cap] if type(value) is str and "=?" not in value
                     else _decode_header(value, cap)[:2000] for value in values[:32]]
            if name == "received":
                for text in texts:
                    _received_tokens(text, tokens, self.steps)
            elif name == "message-id":
                for text in texts:
                    at = text.rfind("@")
                    dom = text[at + 1 :].strip(" <>").lower() if at >= 0 else ""
                    tokens.append("message-id:" + (dom or "no-domain")[:60])
            else:  # the same value gives the same tokens: memoised (mail repeats them)
                for text in texts:
                    key = (name, text)
                    hit = cache.get(key)
                    if hit is None:
                        hit = self._value_tokens(name, text)
                        if len(text) <= _CACHED_CHARS:
                            _remember(cache, key, hit)
                    tokens.extend(hit)
                    if hit is _ADDRESS_DEFECT:
                        a.defects += 1

    def _value_tokens(self, name: str, text: str) -> tuple[str, ...]:
        """The tokens of one value of header ``name`` (not ``received``/``message-id``); the
        C ``value_words`` step declines text beyond Latin-1, which the regex split takes."""
        if name in _ADDRESS_HEADERS:
            try:
                pairs = _getaddresses(text, self.steps)
            except Exception:
                return _ADDRESS_DEFECT
            out = []
            for display, addr in pairs[:16]:
                at = addr.rfind("@")
                out.append(f"{name}:" + (addr[at + 1 :].lower()[:60] if at >= 0 else "no-domain"))
                if name == "from" and display:
                    out.extend(["from:name:" + w for w in self.rules.tokens(display)])
            return tuple(out)
        if name == "content-type":
            return ("content-type:" + text.split(";", 1)[0].strip().lower()[:60],)
        # Words between separator runs, joined by one space: the runs become spaces (every
        # '.', ':' and '/' with them, so no URL is left for the URL rule: the word rules only).
        prefix = name + ":"
        rules = self.rules
        value_words = self.steps.value_words
        if value_words is not None and not rules.ngrams and rules.min_len >= 1:
            done = value_words(text, prefix, rules.min_len, rules.max_len, rules.lowercase,
                               _SUBJECT_SEPARATORS)
            if done is not None:  # (Latin-1 text: the same in C)
                return done
        words: list[str] = []
        rules.words(_SUBJECT_SPLIT.sub(" ", text).strip(" "), words)
        return tuple([prefix + t for t in words])

    def _enter_part(self, a: MailAnalysis) -> bool:
        """Count one more MIME part; False past the token or part limits (then skip it)."""
        if a.n_tokens > self.limits.max_tokens:
            if a.word_hashes is not None:
                raise _PastTokenLimit
            return False  # cut and counted by analyse()
        if a.parts >= self.limits.max_mime_parts:
            if a.parts == self.limits.max_mime_parts:
                a.defect("too_many_parts")
                a.parts += 1
            return False
        a.parts += 1
        return True

    @staticmethod
    def _leaf_tokens(a: MailAnalysis, charset: str | None, cte: str | None,
                     filename: str | None, maintype: str) -> None:
        """``charset:``, ``encoding:`` and ``attachment:`` tokens of a non-multipart part."""
        if charset:
            a.tokens.append("charset:" + charset[:40])
        if cte:
            a.tokens.append("encoding:" + cte.strip().lower()[:40])
        if filename:
            ext = filename.rsplit(".", 1)[-1].lower()[:10] if "." in filename else ""
            a.tokens.append("attachment:" + (ext or "none"))
            if maintype != "text":
                a.attachments += 1

    def _walk(self, part: Message, depth: int, a: MailAnalysis, budget: list[int]) -> None:
        if not self._enter_part(a):
            return
        ctype = part.get_content_type()
        a.tokens.append("part:" + ctype[:60])
        if depth > 0:
            for d in part.defects:
                a.defect(type(d).__name__.lower())
        if part.is_multipart():
            if depth >= self.limits.max_mime_depth:
                a.defect("mime_depth")
                return
            sub = part.get_payload()
            for child in sub if isinstance(sub, list) else []:
                self._walk(child, depth + 1, a, budget)
            return
        charset = part.get_content_charset()
        cte, filename = part.get("content-transfer-encoding"), part.get_filename()
        self._leaf_tokens(a, charset, str(cte) if cte else None,
                          str(filename) if filename else None, part.get_content_maintype())
        # A multipart whose boundary never appears keeps its body as one string: read it as text.
        if self._within_budget(a, budget) and part.get_content_maintype() in ("text", "multipart"):
            data = part.get_payload(decode=True)
            if isinstance(data, bytes):
                self._text_part(data, charset, ctype, a, budget)

    def _walk_fast(self, part: Part, depth: int, a: MailAnalysis, budget: list[int]) -> None:
        """:meth:`_walk` over :class:`~streamnb.features.mime.Part` (same tokens, same order)."""
        if not self._enter_part(a):
            return
        ctype = part.content_type()
        a.tokens.append("part:" + ctype[:60])
        multipart = part.is_multipart()  # splitting the body records the multipart defects
        if depth > 0:
            for name in part.defects:
                a.defect(name)
        if multipart:
            if depth >= self.limits.max_mime_depth:
                raise Unsupported("MIME depth limit")  # the stdlib path marks it as before
            for child in part.children():
                self._walk_fast(child, depth + 1, a, budget)
            return
        charset = part.charset()
        maintype = ctype.partition("/")[0]
        self._leaf_tokens(a, charset, part.get("content-transfer-encoding"), part.filename(),
                          maintype)
        if self._within_budget(a, budget) and maintype in ("text", "multipart"):
            self._text_part(part.payload(), charset, ctype, a, budget)

    @staticmethod
    def _within_budget(a: MailAnalysis, budget: list[int]) -> bool:
        if budget[0] <= 0:
            a.defect("decoded_budget")
            return False
        return True

    def _text_part(self, data: bytes, charset: str | None, ctype: str, a: MailAnalysis,
                   budget: list[int]) -> None:
        """Decode (budget, charset) and tokenize the payload of one text part."""
        if len(data) > budget[0]:
            data = data[: budget[0]]
            a.defect("decoded_budget")
        budget[0] -= len(data)
        text, known, valid = _decode_checked(data, charset or "latin-1")
        if not known:
            a.defect("charset")
        if not valid:
            a.defect("undecodable")
        is_html = ctype == "text/html"
        if is_html:
            text, tag_tokens = strip_html(text[: self.limits.max_text_chars], steps=self.steps)
            a.tokens.extend(tag_tokens)
        self._body_text(text[: self.limits.max_text_chars], is_html, a)

    def _body_text(self, text: str, from_html: bool, a: MailAnalysis) -> None:
        a.add_text_stats(text, from_html, self.letter_counts, self.steps)
        before = len(a.tokens)
        text = self.rules.urls(text, a.tokens)
        if len(a.tokens) > before:  # one proto: token per URL
            a.urls += sum(map(str.startswith, a.tokens[before:], repeat("proto:")))
        if a.word_hashes is None:
            self.rules.words(text, a.tokens, limit=self.limits.max_tokens + 1)
            return
        self.rules.hash_words(text, a.tokens, a.word_hashes)
        if a.n_tokens > self.limits.max_tokens:
            raise _PastTokenLimit


def text_meta(text: str, n_tokens: int) -> np.ndarray:
    """The meta vector of a plain-text payload (mail-only columns are 0).

    >>> text_meta("FREE money!", 2)[[5, 6]].round(3).tolist()
    [0.444, 1.099]
    """
    a = MailAnalysis(size=len(text.encode("utf-8", "surrogatepass")))
    a.add_text_stats(text, from_html=False)
    a.urls = len(re.findall(r"(?i)https?://|www\.", text))
    a.tokens = [""] * n_tokens
    return a.meta()


_DEFAULT_TOKENIZER = MailTokenizer()


def tokenize_email(raw: bytes, tokenizer: MailTokenizer = _DEFAULT_TOKENIZER) -> list[str]:
    """The tokens of one raw message under the default options (never raises)."""
    return tokenizer.tokenize(raw)

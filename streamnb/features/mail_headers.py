"""The headers of a mail: their tokens and counts (:class:`HeaderTokenizer`, the header
stage of :class:`streamnb.features.mail.MailTokenizer`), the values they come from
(address lists, Received hosts, RFC 2047 and charset decoding) and the bounded memos of
header value tokens.

The per-character steps here (address lists, Received tokens) take the tokenizer's C
steps where they are built (:mod:`streamnb.features.steps`); the Python code below is
what they reproduce.
"""

from __future__ import annotations

import codecs
import email.header
import email.utils
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

from streamnb.features.mail_meta import MailAnalysis
from streamnb.features.markup import clear_link_memo
from streamnb.features.mime_params import clear_params_memo
from streamnb.features.payload import DEFAULT_FEATURE_LIMITS, FeatureLimits
from streamnb.features.steps import DEFAULT_STEPS, TokenizerSteps
from streamnb.features.text import ALNUM, WordRules, clear_host_memo, host_tokens_cached

__all__ = ["HeaderTokenizer", "clear_memos", "decode_checked"]

#: ``(?i)\b(?:from|by)\s+([a-z0-9][a-z0-9.-]*[a-z0-9])`` (the relay hosts), written to start
#: with a character set (the regex engine skips ahead to it in C; IGNORECASE would make
#: it test every character), the word boundary checked with a look-behind.
_RECEIVED_HOST = re.compile(
    rf"[fFbB](?<!\w.)(?:(?<=[fF])[rR][oO][mM]|(?<=[bB])[yY])\s+([{ALNUM}][{ALNUM}.-]*[{ALNUM}])"
)
#: An IPv4 literal: its first three numbers (the /24 network), as written.
_IPV4 = re.compile(r"\[(\d{1,3}\.\d{1,3}\.\d{1,3})\.\d{1,3}\]")

# Address lists in their common forms (``addr``, ``addr (Name)``, ``Name <addr>``,
# ``"Name" <addr>``, comma-separated), parsed as ``email.utils.getaddresses`` parses them;
# anything else (groups, comments elsewhere, escapes, empty entries) goes to the stdlib.
_ATOM = r'[^()<>@,:;"\[\]\\ \t\r\n]+'  # dots allowed: phrase atoms, local parts, domains
_QUOTED = r'"[^"\\\r]*"'
_PHRASE_WORD = re.compile(rf"{_QUOTED}|{_ATOM}")
_ADDRESS = re.compile(
    rf"[ \t\r\n]*(?:"
    rf"(?:((?:{_QUOTED}|{_ATOM})(?:[ \t\r\n]+(?:{_QUOTED}|{_ATOM}))*)[ \t\r\n]*)?"
    rf"<[ \t\r\n]*({_ATOM}@{_ATOM})[ \t]*>"
    rf"|({_ATOM}@{_ATOM})(?:[ \t]*\(([^()\\\r]*)\))?"
    rf")[ \t\r\n]*(?:,|\Z)"
)


def _getaddresses(field: str, steps: TokenizerSteps = DEFAULT_STEPS) -> list[tuple[str, str]]:
    """``email.utils.getaddresses([field])``: (display name, address) pairs.

    >>> _getaddresses('"Doe, J." <j@x.org>, Bob  Smith <b@y.org>, c@z.org (Carol)')
    [('Doe, J.', 'j@x.org'), ('Bob Smith', 'b@y.org'), ('Carol', 'c@z.org')]
    """
    pairs = _address_matches(field, steps)
    return email.utils.getaddresses([field]) if pairs is None else pairs


def _address_matches(
    field: str, steps: TokenizerSteps = DEFAULT_STEPS
) -> list[tuple[str, str]] | None:
    """The pairs of the common forms, one :data:`_ADDRESS` match after the other, or None
    where one fails (the C ``addresses`` step declines text beyond Latin-1)."""
    if steps.addresses is not None and (got := steps.addresses(field)) is not None:
        return None if got is False else got
    pairs = []
    pos, end = 0, len(field)
    match = _ADDRESS.match
    while pos < end:
        m = match(field, pos)
        if m is None:
            return None
        phrase, routed, bare, comment = m.groups()
        if routed is not None:
            name = (
                " ".join([w[1:-1] if w[0] == '"' else w for w in _PHRASE_WORD.findall(phrase)])
                if phrase
                else ""
            )
            pairs.append((name, routed))
        else:
            pairs.append((comment or "", bare))
        pos = m.end()
    return pairs


def _address_count(joined: str, steps: TokenizerSteps = DEFAULT_STEPS) -> int:
    """How many addresses an address list holds; -1 when it cannot be read."""
    try:
        return len(_getaddresses(joined, steps))
    except Exception:
        return -1


#: Tokens of header values, per word rules: (name, value) -> tokens, and the To/Cc
#: address list -> its number of addresses (-1: unreadable). Mail repeats these values
#: (senders, recipients, mailers, content types). Bounded: values of at most
#: ``_CACHED_CHARS`` characters, a dict emptied when it reaches ``_CACHE_SIZE`` entries,
#: dicts for at most 4 sets of word rules.
_VALUE_CACHES: dict[WordRules, dict] = {}
_CACHE_SIZE = 2048
_CACHED_CHARS = 256
#: The tokens of an address header that ``email.utils.getaddresses`` cannot read.
_ADDRESS_DEFECT = ("defect:address",)


def clear_memos() -> None:
    """Empty the tokenizer's memos (header values, MIME parameters, relay and link hosts),
    e.g. to time it cold; they refill as mail comes."""
    _VALUE_CACHES.clear()
    clear_params_memo()
    clear_host_memo()
    clear_link_memo()


def _value_cache(rules: WordRules) -> dict:
    """The memo of header value tokens under ``rules``."""
    cache = _VALUE_CACHES.get(rules)
    if cache is None:
        if len(_VALUE_CACHES) >= 4:
            _VALUE_CACHES.clear()
        cache = _VALUE_CACHES.setdefault(rules, {})
    return cache


def _remember(cache: dict, key: object, value: object) -> None:
    """``cache[key] = value``, emptying ``cache`` first when it is full."""
    if len(cache) >= _CACHE_SIZE:
        cache.clear()
    cache[key] = value


def _received_tokens(text: str, out: list[str], steps: TokenizerSteps = DEFAULT_STEPS) -> None:
    """``received:`` tokens of one Received value: up to 4 relay hosts, 2 IPv4 /24 prefixes
    (the C ``received_tokens`` step declines values beyond Latin-1)."""
    if steps.received_tokens is not None and steps.received_tokens(text, out):
        return
    hosts = _RECEIVED_HOST.findall(text)
    for host in hosts[:4] if len(hosts) > 4 else hosts:
        out.extend(host_tokens_cached("received", host))
    if "[" in text:
        out.extend(["received:" + ip for ip in _IPV4.findall(text)[:2]])


def _decode_header(value: object, max_chars: int = DEFAULT_FEATURE_LIMITS.max_header_chars) -> str:
    """A header value as text: RFC 2047 words decoded, undecodable bytes replaced. Only the
    first ``max_chars`` characters are decoded (the stdlib decoder is quadratic)."""
    if isinstance(value, email.header.Header):
        value = str(value)
    text = str(value)[:max_chars]
    if "=?" not in text:
        return text
    try:
        parts = email.header.decode_header(text)
    except Exception:
        return text
    out = []
    for chunk, charset in parts:
        if isinstance(chunk, bytes):
            out.append(_decode_bytes(chunk, charset or "latin-1")[0])
        else:
            out.append(chunk)
    return "".join(out)


def _decode_bytes(data: bytes, charset: str) -> tuple[str, bool]:
    """Decode with ``charset``; on an unknown charset use latin-1. Returns (text, known)."""
    text, known, _ = decode_checked(data, charset)
    return text, known


def decode_checked(data: bytes | memoryview, charset: str) -> tuple[str, bool, bool]:
    """``data`` decoded with ``charset``: (text, charset known, bytes valid in it). Invalid
    bytes become U+FFFD; an unknown charset (or a codec that fails on anything) decodes as
    latin-1. ``data`` may be any bytes-like object (``str(data, charset)`` is
    ``bytes.decode``).

    >>> decode_checked(b"caf\\xc3\\xa9", "utf-8"), decode_checked(b"\\xff", "utf-8")
    (('café', True, True), ('\\ufffd', True, False))
    >>> decode_checked(b"caf\\xe9", "x-unknown")
    ('café', False, True)
    """
    try:
        codecs.lookup(charset)
    except (LookupError, ValueError):
        return str(data, "latin-1"), False, True
    try:
        return str(data, charset), True, True
    except UnicodeDecodeError:
        pass
    except Exception:  # a codec that raises on anything at all
        return str(data, "latin-1"), False, True
    try:
        return str(data, charset, "replace"), True, False
    except Exception:
        return str(data, "latin-1"), False, True


#: What separates the words of a subject-like header value, with white space.
_SUBJECT_SEPARATORS = ".,;:!?()[]{}\"'<>*/\\|=+~#&^_-"
_SUBJECT_SPLIT = re.compile(rf"[\s{re.escape(_SUBJECT_SEPARATORS)}]+")
_ADDRESS_HEADERS = frozenset({"from", "to", "cc", "reply-to", "return-path", "sender"})


@dataclass(frozen=True, slots=True)
class HeaderTokenizer:
    """The header stage of :class:`~streamnb.features.mail.MailTokenizer`, under its
    options: the tokens of a message's headers (``header:<name>`` per header present, then
    those of the values of ``headers``) and their counts (recipients, Received headers,
    defects), added to a :class:`~streamnb.features.mail_meta.MailAnalysis`. The C
    ``header_tokens`` step runs the same loop where it is built (:attr:`spec`).

    >>> stage = HeaderTokenizer(WordRules(), ("subject", "to"), True, DEFAULT_FEATURE_LIMITS)
    >>> a = MailAnalysis()
    >>> stage.add(["subject"], {"subject": ["Cheap meds"]}.get, a)
    >>> a.tokens
    ['header:subject', 'subject:cheap', 'subject:meds', 'to:none']
    """

    rules: WordRules
    #: Headers whose values are tokenized (lower-case names).
    headers: tuple[str, ...]
    #: Whether each header present gives a ``header:<name>`` token.
    header_names: bool
    limits: FeatureLimits
    steps: TokenizerSteps = field(default=DEFAULT_STEPS, repr=False)
    #: What the C ``header_tokens`` step takes of these options: bounds and the Python
    #: callbacks of :meth:`add` (derived).
    spec: tuple = field(init=False, repr=False, compare=False, default=())

    def __post_init__(self) -> None:
        cap = self.limits.max_header_chars
        object.__setattr__(
            self,
            "spec",
            (
                self.headers,
                self.header_names,
                cap,
                min(cap, 2000),
                _CACHE_SIZE,
                _CACHED_CHARS,
                self.value_tokens,
                partial(_address_count, steps=self.steps),
                _decode_header,
                partial(_received_tokens, steps=self.steps),
                _ADDRESS_DEFECT,
            ),
        )

    def add_indexed(self, names: Sequence[str], index: dict, a: MailAnalysis) -> None:
        """:meth:`add` for the header ``names`` (lower-case, in order) and ``index`` (name ->
        its values), by the C ``header_tokens`` step where it is built."""
        if self.steps.header_tokens is not None:
            self.steps.header_tokens(names, index, self.spec, _value_cache(self.rules), a)
        else:
            self.add(names, index.get, a)

    def add(
        self,
        names: Sequence[str],
        get_all: Callable[[str], Sequence[object] | None],
        a: MailAnalysis,
    ) -> None:
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
            texts = [
                value[:text_cap]
                if type(value) is str and "=?" not in value
                else _decode_header(value, cap)[:2000]
                for value in values[:32]
            ]
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
                        hit = self.value_tokens(name, text)
                        if len(text) <= _CACHED_CHARS:
                            _remember(cache, key, hit)
                    tokens.extend(hit)
                    if hit is _ADDRESS_DEFECT:
                        a.defects += 1

    def value_tokens(self, name: str, text: str) -> tuple[str, ...]:
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
        if value_words is not None and not rules.ngrams and not rules.osb and rules.min_len >= 1:
            done = value_words(
                text, prefix, rules.min_len, rules.max_len, rules.lowercase, _SUBJECT_SEPARATORS
            )
            if done is not None:  # (Latin-1 text: the same in C)
                return done
        words: list[str] = []
        rules.words(_SUBJECT_SPLIT.sub(" ", text).strip(" "), words)
        return tuple([prefix + t for t in words])

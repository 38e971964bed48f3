"""Header values of a mail: address lists, Received hosts, RFC 2047 and charset
decoding, and the bounded memos of header value tokens (used by
:class:`streamnb.features.mail.MailTokenizer`).

The per-character steps here (address lists, Received tokens) take the tokenizer's C
steps where they are built (:mod:`streamnb.features.steps`); the Python code below is
what they reproduce.
"""

from __future__ import annotations

import codecs
import email.header
import email.utils
import re

from streamnb.features.payload import DEFAULT_FEATURE_LIMITS
from streamnb.features.steps import DEFAULT_STEPS, TokenizerSteps
from streamnb.features.text import _ALNUM, WordRules, host_tokens_cached

#: ``(?i)\b(?:from|by)\s+([a-z0-9][a-z0-9.-]*[a-z0-9])`` (the relay hosts), written to start
#: with a character set (the regex engine skips ahead to it in C; IGNORECASE would make
#: it test every character), the word boundary checked with a look-behind.
_RECEIVED_HOST = re.compile(
    rf"[fFbB](?<!\w.)(?:(?<=[fF])[rR][oO][mM]|(?<=[bB])[yY])\s+([{_ALNUM}][{_ALNUM}.-]*[{_ALNUM}])")
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


def _address_matches(field: str, steps: TokenizerSteps = DEFAULT_STEPS) -> list[tuple[str, str]] | None:
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
            name = " ".join([w[1:-1] if w[0] == '"' else w for w in _PHRASE_WORD.findall(phrase)]) if phrase else ""
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
    from streamnb.features import markup, mime, text

    _VALUE_CACHES.clear()
    mime._PARAMS.clear()
    text._cached_host_tokens.cache_clear()
    markup._cached_link_hosts.cache_clear()


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
    text, known, _ = _decode_checked(data, charset)
    return text, known


def _decode_checked(data: bytes, charset: str) -> tuple[str, bool, bool]:
    """(text, charset known, bytes valid in it): invalid bytes become U+FFFD."""
    try:
        codecs.lookup(charset)
    except (LookupError, ValueError):
        return data.decode("latin-1"), False, True
    try:
        return data.decode(charset), True, True
    except UnicodeDecodeError:
        pass
    except Exception:  # a codec that raises on anything at all
        return data.decode("latin-1"), False, True
    try:
        return data.decode(charset, "replace"), True, False
    except Exception:
        return data.decode("latin-1"), False, True

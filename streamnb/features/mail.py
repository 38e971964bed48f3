"""The e-mail tokenizer: raw RFC 822 bytes -> tokens and a small dense meta vector.

Parsing uses the standard library (``email.parser.BytesParser`` with the ``compat32``
policy, which records defects instead of raising); an mbox ``From `` line is accepted.
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

It never raises: every defect the parser reports, and every limit hit, becomes a
``defect:<name>`` token and is counted. Limits (:class:`streamnb.codec.Limits`) bound
the raw size, MIME depth, number of parts, decoded text bytes and tokens.

>>> raw = b"From: Bob <bob@example.com>\\nSubject: Cheap meds\\n\\nBuy cheap meds now"
>>> tokenize_email(raw)[:6]
['header:from', 'header:subject', 'subject:cheap', 'subject:meds', 'from:example.com', 'from:name:bob']
"""

from __future__ import annotations

import codecs
import email.header
import email.utils
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from email import policy
from email.message import Message
from email.parser import BytesParser

import numpy as np

from streamnb.codec import DEFAULT_LIMITS, Limits
from streamnb.features.markup import strip_html
from streamnb.features.text import WordRules, host_tokens

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

_RECEIVED_HOST = re.compile(r"\b(?:from|by)\s+([a-z0-9][a-z0-9.-]*[a-z0-9])", re.I)
_IPV4 = re.compile(r"\[(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.\d{1,3}\]")
_SUBJECT_SPLIT = re.compile(r"[\s.,;:!?()\[\]{}\"'<>*/\\|=+~#&^_-]+")
_PARSER = BytesParser(policy=policy.compat32)


@dataclass(slots=True)
class MailAnalysis:
    """What the tokenizer found in one message: tokens, defects and the raw meta counts."""

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

    def defect(self, name: str) -> None:
        self.defects += 1
        self.tokens.append(f"defect:{name}")

    def add_text_stats(self, text: str, from_html: bool) -> None:
        n = len(text)
        self.text_chars += n
        if from_html:
            self.html_chars += n
        # map() over str methods counts in C, without a Python frame per character.
        self.letters += sum(map(str.isalpha, text)) if n < 200_000 else n
        self.upper += sum(map(str.isupper, text)) if n < 200_000 else 0
        if not text.isascii():  # every character outside ASCII is dropped by this encode
            self.non_ascii += n - len(text.encode("ascii", "ignore"))
        self.exclaim += text.count("!") + text.count("$")

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
                log1p(len(self.tokens)),
                log1p(self.defects),
                log1p(self.attachments),
                log1p(self.received),
                self.non_ascii / text,
                log1p(self.exclaim),
            ],
            dtype=np.float64,
        )


def _decode_header(value: object, max_chars: int = DEFAULT_LIMITS.max_header_chars) -> str:
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
    headers: Sequence[str] = DEFAULT_HEADERS
    header_names: bool = True
    limits: Limits = DEFAULT_LIMITS

    def tokenize(self, raw: bytes) -> list[str]:
        return self.analyse(raw).tokens

    def analyse(self, raw: bytes) -> MailAnalysis:
        """Tokens and meta counts of one message; never raises."""
        a = MailAnalysis(size=len(raw))
        try:
            self._analyse(raw, a)
        except RecursionError:
            a.defect("recursion")
        except Exception as exc:  # a parser corner case: the message still gets tokens
            a.defect("error_" + type(exc).__name__.lower())
        limit = self.limits.max_tokens
        if len(a.tokens) > limit:
            del a.tokens[limit:]
            a.defects += 1
            a.tokens[-1] = "defect:too_many_tokens"
        return a

    # ------------------------------------------------------------------ parsing
    def _analyse(self, raw: bytes, a: MailAnalysis) -> None:
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raw = str(raw).encode("utf-8", "surrogatepass")
        raw = bytes(raw)
        if len(raw) > self.limits.max_message_bytes:
            raw = raw[: self.limits.max_message_bytes]
            a.defect("truncated")
        if not raw.strip():
            a.defect("empty")
            return
        try:
            msg = _PARSER.parsebytes(raw)
        except RecursionError:  # MIME nested past Python's stack: keep headers and text
            a.defect("recursion")
            msg = _PARSER.parsebytes(raw, headersonly=True)
        for d in msg.defects:
            a.defect(type(d).__name__.lower())
        self._headers(msg, a)
        budget = [self.limits.max_decoded_bytes]
        self._walk(msg, 0, a, budget)

    def _headers(self, msg: Message, a: MailAnalysis) -> None:
        wanted = self.headers
        items = msg.items()
        if self.header_names:
            seen = set()
            for name, _ in items:
                key = name.lower()[:40]
                if key not in seen:
                    seen.add(key)
                    a.tokens.append("header:" + key)
        rules = self.rules
        for name in wanted:
            values = msg.get_all(name) or []
            if name == "received":
                a.received = len(values)
            if name in ("to", "cc"):
                try:
                    cap = self.limits.max_header_chars
                    a.recipients += len(email.utils.getaddresses([str(v)[:cap] for v in values]))
                except Exception:
                    a.defect("address")
            if not values:
                if name in ("subject", "from", "to", "message-id"):
                    a.tokens.append(f"{name}:none")
                continue
            for value in values[:32]:
                text = _decode_header(value, self.limits.max_header_chars)[:2000]
                if name in _ADDRESS_HEADERS:
                    self._address(name, text, a)
                elif name == "received":
                    for host in _RECEIVED_HOST.findall(text)[:4]:
                        a.tokens.extend(host_tokens("received", host))
                    for ip in _IPV4.findall(text)[:2]:
                        a.tokens.append("received:" + ".".join(ip))
                elif name == "message-id":
                    at = text.rfind("@")
                    dom = text[at + 1 :].strip(" <>").lower() if at >= 0 else ""
                    a.tokens.append("message-id:" + (dom or "no-domain")[:60])
                elif name == "content-type":
                    a.tokens.append("content-type:" + text.split(";", 1)[0].strip().lower()[:60])
                else:
                    words = [w for w in _SUBJECT_SPLIT.split(text) if w]
                    sub = rules.tokens(" ".join(words))
                    a.tokens.extend(f"{name}:{t}" for t in sub)

    def _address(self, name: str, text: str, a: MailAnalysis) -> None:
        try:
            pairs = email.utils.getaddresses([text])
        except Exception:
            a.defect("address")
            return
        for display, addr in pairs[:16]:
            at = addr.rfind("@")
            a.tokens.append(f"{name}:" + (addr[at + 1 :].lower()[:60] if at >= 0 else "no-domain"))
            if name == "from" and display:
                a.tokens.extend(f"from:name:{w}" for w in self.rules.tokens(display))

    def _walk(self, part: Message, depth: int, a: MailAnalysis, budget: list[int]) -> None:
        if len(a.tokens) > self.limits.max_tokens:
            return  # cut and counted by analyse()
        if a.parts >= self.limits.max_mime_parts:
            if a.parts == self.limits.max_mime_parts:
                a.defect("too_many_parts")
                a.parts += 1
            return
        a.parts += 1
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
        if charset:
            a.tokens.append("charset:" + charset[:40])
        cte = part.get("content-transfer-encoding")
        if cte:
            a.tokens.append("encoding:" + str(cte).strip().lower()[:40])
        filename = part.get_filename()
        if filename:
            ext = str(filename).rsplit(".", 1)[-1].lower()[:10] if "." in str(filename) else ""
            a.tokens.append("attachment:" + (ext or "none"))
            if part.get_content_maintype() != "text":
                a.attachments += 1
        # A multipart whose boundary never appears keeps its body as one string: read it as text.
        textual = part.get_content_maintype() in ("text", "multipart")
        if not textual or budget[0] <= 0:
            if budget[0] <= 0:
                a.defect("decoded_budget")
            return
        data = part.get_payload(decode=True)
        if not isinstance(data, bytes):
            return
        if len(data) > budget[0]:
            data = data[: budget[0]]
            a.defect("decoded_budget")
        budget[0] -= len(data)
        text, known, valid = _decode_checked(data, charset or "latin-1")
        if not known:
            a.defect("charset")
        if not valid:
            a.defect("undecodable")
        is_html = part.get_content_type() == "text/html"
        if is_html:
            text, tag_tokens = strip_html(text[: self.limits.max_text_chars])
            a.tokens.extend(tag_tokens)
        self._body_text(text[: self.limits.max_text_chars], is_html, a)

    def _body_text(self, text: str, from_html: bool, a: MailAnalysis) -> None:
        a.add_text_stats(text, from_html)
        before = len(a.tokens)
        text = self.rules.urls(text, a.tokens)
        a.urls += sum(1 for t in a.tokens[before:] if t.startswith("proto:"))
        self.rules.words(text, a.tokens, limit=self.limits.max_tokens + 1)


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

"""The e-mail tokenizer: raw RFC 822 bytes -> tokens and a small dense meta vector (the
counts of :mod:`streamnb.features.mail_meta`).

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
  header present (option ``header_names``): the header stage,
  :class:`~streamnb.features.mail_headers.HeaderTokenizer`;
* the MIME structure: ``part:<type/subtype>`` per part, ``charset:<name>``,
  ``encoding:<cte>``, ``attachment:<file extension>``;
* the decoded text parts (transfer encodings and charsets decoded; an unknown charset
  falls back to latin-1 with a ``defect:charset`` token), with HTML reduced to text
  plus ``html:<tag>`` and ``url:<host>`` tokens (:mod:`streamnb.features.markup`), run
  through the word rules of :mod:`streamnb.features.text`.

The per-character steps (Received tokens, address lists and the header stage in
:mod:`~streamnb.features.mail_headers`, letter counts in :mod:`~streamnb.features.mail_meta`,
the word rules and URLs in :mod:`~streamnb.features.text`, HTML tags in
:mod:`~streamnb.features.markup`, header fields in :mod:`~streamnb.features.mime`) take the
tokenizer's C steps where they are built (:mod:`streamnb.features.steps`), on Latin-1
input; ``MailTokenizer(steps=REFERENCE_STEPS)`` runs the Python code alone, which is
what defines the tokens (docs/architecture.md, decision 14).

It never raises: every defect the parser reports, and every limit hit, becomes a
``defect:<name>`` token and is counted. Limits (:class:`~streamnb.features.payload.FeatureLimits`) bound
the raw size, MIME depth, number of parts, decoded text bytes and tokens.

>>> raw = b"From: Bob <bob@example.com>\\nSubject: Cheap meds\\n\\nBuy cheap meds now"
>>> tokenize_email(raw)[:6]
['header:from', 'header:subject', 'subject:cheap', 'subject:meds', 'from:example.com', 'from:name:bob']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from email import policy
from email.message import Message
from email.parser import BytesParser
from itertools import repeat

from streamnb.features.mail_headers import HeaderTokenizer, decode_checked
from streamnb.features.mail_meta import META_FEATURES, N_META, MailAnalysis, text_meta
from streamnb.features.markup import strip_html
from streamnb.features.mime import Part, Unsupported, parse_message
from streamnb.features.own_headers import strip_own_headers
from streamnb.features.payload import DEFAULT_FEATURE_LIMITS, FeatureLimits
from streamnb.features.steps import DEFAULT_STEPS, TokenizerSteps
from streamnb.features.text import WordRules
from streamnb.features.truncate import cut_mail, truncated_size

__all__ = [
    "DEFAULT_HEADERS",
    "META_FEATURES",
    "N_META",
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
_PARSER = BytesParser(policy=policy.compat32)


class _PastTokenLimit(Exception):
    """A message analysed with its word tokens hashed has more tokens than the limit: it is
    analysed again with every token a str (where the limit cuts depends on their order)."""


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
    #: The header stage under these options (derived).
    header_tokenizer: HeaderTokenizer = field(init=False, repr=False, compare=False, default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "headers", tuple(name.lower() for name in self.headers))
        if self.rules.steps is not self.steps:
            object.__setattr__(self, "rules", replace(self.rules, steps=self.steps))
        object.__setattr__(
            self,
            "header_tokenizer",
            HeaderTokenizer(self.rules, self.headers, self.header_names, self.limits, self.steps),
        )

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
        headers kept, at a MIME boundary where there is one) and without streamnb's own
        header fields (:func:`~streamnb.features.own_headers.strip_own_headers`); None (and a
        defect) for an empty message."""
        if not isinstance(raw, (bytes, bytearray, memoryview)):
            raw = str(raw).encode("utf-8", "surrogatepass")
        raw = cut_mail(bytes(raw), self.limits.max_message_bytes)
        original = truncated_size(raw)
        raw = strip_own_headers(raw)  # the verdicts a delivered copy carries, the cut marker
        a.size = len(raw)
        if original is not None:  # cut here or by the producer: the same bytes either way
            a.size = original
            a.cut = True  # boundaries after the cut are not missing: only this defect
            a.defect("truncated")
        if not raw or raw.isspace():
            a.defect("empty")
            return None
        return raw

    def _parse(self, raw: bytes, a: MailAnalysis, fast: bool) -> MailAnalysis:
        """The fast reader when it can read the message, else the standard library (which
        starts from what ``a`` held before the fast reader gave up)."""
        if fast:
            n_tokens, defects = len(a.tokens), a.defects
            try:
                self._analyse_fast(raw, a)
                return a
            except _PastTokenLimit:
                raise
            except Exception:  # Unsupported, or a corner case: the standard parser decides
                a.rewind(n_tokens, defects)
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
        self.header_tokenizer.add_indexed(root.names(), root.header_index(), a)
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
        self.header_tokenizer.add([name.lower() for name in msg.keys()], msg.get_all, a)
        budget = [self.limits.max_decoded_bytes]
        self._walk(msg, 0, a, budget)

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
    def _leaf_tokens(
        a: MailAnalysis, charset: str | None, cte: str | None, filename: str | None, maintype: str
    ) -> None:
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
        self._leaf_tokens(
            a,
            charset,
            str(cte) if cte else None,
            str(filename) if filename else None,
            part.get_content_maintype(),
        )
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
        charset, filename = part.charset_and_filename()
        maintype = ctype.partition("/")[0]
        self._leaf_tokens(a, charset, part.get("content-transfer-encoding"), filename, maintype)
        if self._within_budget(a, budget) and maintype in ("text", "multipart"):
            self._text_part(part.payload_buffer(), charset, ctype, a, budget)

    @staticmethod
    def _within_budget(a: MailAnalysis, budget: list[int]) -> bool:
        if budget[0] <= 0:
            a.defect("decoded_budget")
            return False
        return True

    def _text_part(
        self,
        data: bytes | memoryview,
        charset: str | None,
        ctype: str,
        a: MailAnalysis,
        budget: list[int],
    ) -> None:
        """Decode (budget, charset) and tokenize the payload of one text part."""
        if len(data) > budget[0]:
            data = data[: budget[0]]
            a.defect("decoded_budget")
        budget[0] -= len(data)
        text, known, valid = decode_checked(data, charset or "latin-1")
        if not known:
            a.defect("charset")
        if not valid:
            a.defect("undecodable")
        is_html = ctype == "text/html"
        if is_html:
            text, tag_tokens = strip_html(
                text[: self.limits.max_text_chars], steps=self.steps, hashes=a.word_hashes
            )
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


_DEFAULT_TOKENIZER = MailTokenizer()


def tokenize_email(raw: bytes, tokenizer: MailTokenizer = _DEFAULT_TOKENIZER) -> list[str]:
    """The tokens of one raw message under the default options (never raises)."""
    return tokenizer.tokenize(raw)

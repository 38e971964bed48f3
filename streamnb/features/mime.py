"""A small RFC 822 / MIME reader on bytes: the common path of the mail tokenizer.

It reproduces what ``email.parser.BytesParser(policy=compat32)`` yields for the parts the
tokenizer reads (header names and values, defects, content types, parameters, transfer
decoded payloads), without building ``Message`` objects or reading the input line by line
in Python:

* the header block ends at the first line that is neither a header, a continuation nor
  an mbox ``From `` line (one regex search for a line break not followed by one); a
  blank line after it is consumed, anything else is a ``MissingHeaderBodySeparatorDefect``.
  Fields are cut at the line breaks that start one (one ``re.split``); folded values keep
  their line breaks, values with non-ASCII bytes become what ``str(email.header.Header)``
  makes of them;
* a multipart body is cut at its boundary lines (``--boundary`` then optional ``--``,
  blanks and a line break, found with one regex per boundary); the line break before a
  boundary belongs to the boundary (RFC 2046), consecutive boundary lines delimit no
  part, and a part ends at a boundary line of any enclosing multipart (a region of the
  parent never holds a line of a grand-parent's boundary, so only the parent's own
  boundary is searched). ``StartBoundaryNotFoundDefect``, ``CloseBoundaryNotFoundDefect``,
  ``NoBoundaryInMultipartDefect``, ``InvalidMultipartContentTransferEncodingDefect`` and
  ``MultipartInvariantViolationDefect`` are reported where the standard parser does;
* payloads are decoded as ``Message.get_payload(decode=True)`` does (base64 with the
  same padding fall-backs, quoted-printable with ``binascii.a2b_qp``).

What it does not reproduce raises :class:`Unsupported`, and the caller uses the standard
library instead: a lone carriage return (the standard parser ends lines there), nested
``message/*`` parts, ``multipart/digest``, uuencoded payloads, RFC 2231 parameters and
backslashes in parameters, a boundary folded onto a second line, an mbox ``From `` line
closing a header block, MIME nesting at the depth limit. Every search is a single forward
regex scan: linear in the input. With the C steps (:mod:`streamnb.features.steps`) the
header block's end, its fields and the names' index of plain (ASCII) blocks are found in
C; other blocks are read by the Python code below.

>>> part = parse_part(b"From x  Mon\\nSubject: hi\\n\\tthere\\nContent-Type: text/plain; charset=\\"UTF-8\\"\\n\\nbody\\n")
>>> part.headers
[('Subject', 'hi\\n\\tthere'), ('Content-Type', 'text/plain; charset="UTF-8"')]
>>> part.content_type(), part.param("charset"), part.payload()
('text/plain', 'UTF-8', b'body\\n')
>>> root = parse_part(b"Content-Type: multipart/mixed; boundary=B\\n\\n--B\\n\\none\\n--B\\n\\ntwo\\n--B--\\n")
>>> [child.payload() for child in root.children()]
[b'one', b'two']
"""

from __future__ import annotations

import binascii
import email.charset
import email.header
import re
from collections.abc import Iterator
from itertools import repeat

from streamnb.features.mime_params import header_params, unquote
from streamnb.features.steps import DEFAULT_STEPS, TokenizerSteps

__all__ = ["Part", "Unsupported", "parse_message", "parse_part"]


class Unsupported(Exception):
    """The message uses something this reader does not reproduce: use the standard parser."""


#: The header block: header, continuation and mbox ``From `` lines (the standard
#: parser's ``headerRE``), each up to its line break or the end of the input. It ends
#: where a line starts otherwise: the first line, or a line break not followed by one.
_HEADER_LINE = re.compile(rb"From |[\x21-\x39\x3b-\x7e]*:|[\t ]")
_HEADER_BLOCK_END = re.compile(rb"\n(?!From |[\x21-\x39\x3b-\x7e]*:|[\t ])")
#: A carriage return that ends no line (parse_message refuses them; parse_part ends the
#: header block before the line holding one, as the standard parser's line regex does).
_LONE_CR = re.compile(rb"\r(?!\n)")
_LINE = re.compile(rb"[^\r\n]*\r?\n|[^\r\n]+\Z")
_BLANK_LINE = re.compile(rb"\r?\n")
#: A line of a header block that is no field nor continuation (mbox ``From `` or a colon).
_ODD_LINE = re.compile(rb"\n(?:From |:)")
#: The start of a field of a plain block (after a line break): name, colon and blanks.
_FIELD_START = re.compile(r"\n([\x21-\x39\x3b-\x7e]+):[ \t]*")
_BOUNDARY_TAIL = re.compile(rb"(--)?[ \t]*(?:\r?\n|\Z)")


def _header_text(name: str, value: bytes) -> str:
    """A header value as ``compat32`` returns it (non-ASCII bytes: ``str(Header)``)."""
    if value.isascii():
        return value.decode("ascii")
    text = value.decode("ascii", "surrogateescape")
    return str(email.header.Header(text, charset=email.charset.UNKNOWN8BIT, header_name=name))


def _names_and_index(headers: list[tuple[str, str]], steps: TokenizerSteps = DEFAULT_STEPS
                     ) -> tuple[list[str], dict[str, list[str]]]:
    """The lower-cased header names in order, and lower-case name -> its values in order
    (the C ``header_index`` step declines names beyond ASCII).

    >>> _names_and_index([("To", "a"), ("Subject", "s"), ("TO", "b")])
    (['to', 'subject', 'to'], {'to': ['a', 'b'], 'subject': ['s']})
    """
    if steps.header_index is not None and (built := steps.header_index(headers)) is not None:
        return built
    # Names hold no line break (and only ASCII or surrogate-escaped bytes, which
    # lower-case one by one): lower-case them all in one call.
    names = "\n".join([key for key, _ in headers]).lower().split("\n") if headers else []
    index: dict[str, list[str]] = {}
    for key, (_, value) in zip(names, headers, strict=True):
        if key in index:
            index[key].append(value)
        else:
            index[key] = [value]
    return names, index


def _decode_b(data: bytes) -> bytes:
    """``email._encoded_words.decode_b`` (the payload, its defects are not reported)."""
    pad_err = len(data) % 4
    missing_padding = b"==="[: 4 - pad_err] if pad_err else b""
    try:
        return binascii.a2b_base64(data + missing_padding, strict_mode=True)
    except binascii.Error:
        pass
    for candidate in (data, data + b"=="):
        try:
            return binascii.a2b_base64(candidate)
        except binascii.Error:
            pass
    return data


class Part:
    """One message or MIME part: its headers, defects and body (a slice of the input)."""

    __slots__ = ("_body_end", "_body_start", "_buf", "_children", "_ctype", "_index", "_names", "_split_done",
                 "_steps", "_trim", "defects", "headers")

    def __init__(self, buf: bytes, headers: list[tuple[str, str]], defects: list[str],
                 body_start: int, body_end: int, trim: bool, steps: TokenizerSteps = DEFAULT_STEPS) -> None:
        self._buf = buf
        self._steps = steps
        self.headers = headers
        self.defects = defects
        self._body_start = body_start
        self._body_end = body_end
        self._trim = trim  # a part inside a multipart: the line break before the boundary goes
        self._index: dict[str, list[str]] | None = None
        self._names: list[str] | None = None
        self._children: list[tuple[int, int]] | None = None
        self._split_done = False
        self._ctype: str | None = None

    # ---------------------------------------------------------------- headers
    def names(self) -> list[str]:
        """The header names, lower-cased, in order (repeats kept)."""
        if self._names is None:
            self._names, self._index = _names_and_index(self.headers, self._steps)
        return self._names

    def header_index(self) -> dict[str, list[str]]:
        """Lower-case header name -> its values, in order."""
        if self._index is None:
            self._names, self._index = _names_and_index(self.headers, self._steps)
        return self._index

    def get_all(self, name: str) -> list[str]:
        """Values of header ``name`` (lower-case), in order."""
        index = self._index if self._index is not None else self.header_index()
        return index.get(name, [])

    def get(self, name: str) -> str | None:
        """The first value of header ``name`` (lower-case), None without one."""
        values = (self._index if self._index is not None else self.header_index()).get(name)
        return values[0] if values else None

    def content_type(self) -> str:
        """``Message.get_content_type`` (default ``text/plain``; digests are unsupported)."""
        if self._ctype is None:
            value = self.get("content-type")
            ctype = "text/plain" if value is None else value.partition(";")[0].strip().lower()
            self._ctype = ctype if ctype.count("/") == 1 else "text/plain"
        return self._ctype

    def param(self, name: str, header: str = "content-type") -> str | None:
        """``Message.get_param(name, header=header)`` for plain (non RFC 2231) parameters."""
        value = self.get(header)
        if value is None:
            return None
        params = header_params(value)
        if params is None:
            raise Unsupported("RFC 2231 or escaped parameter")
        return params.get(name)

    def charset(self) -> str | None:
        """``Message.get_content_charset``."""
        charset = self.param("charset")
        if charset is None or not charset.isascii():
            return None
        return charset.lower()

    def filename(self) -> str | None:
        """``Message.get_filename``."""
        name = self.param("filename", "content-disposition")
        if name is None:
            name = self.param("name")
        return None if name is None else unquote(name).strip()

    def charset_and_filename(self) -> tuple[str | None, str | None]:
        """:meth:`charset` and :meth:`filename`, the ``Content-Type`` parameters read once."""
        index = self._index if self._index is not None else self.header_index()
        values = index.get("content-type")
        params = header_params(values[0]) if values else {}
        if params is None:
            raise Unsupported("RFC 2231 or escaped parameter")
        charset = params.get("charset")
        if charset is not None:
            charset = charset.lower() if charset.isascii() else None
        name = None
        if index.get("content-disposition"):
            name = self.param("filename", "content-disposition")
        if name is None:
            name = params.get("name")
        return charset, None if name is None else unquote(name).strip()

    # ---------------------------------------------------------------- body
    def body(self) -> bytes:
        """The raw body. In a multipart, the line break before the boundary is not part of it
        (unless this part is itself a multipart: the standard parser trims its epilogue)."""
        return bytes(self.body_view())

    def body_view(self) -> memoryview:
        """:meth:`body`, a view of the message's bytes (no copy)."""
        if self.is_multipart():
            raise ValueError("a split multipart has no single body")
        buf, start, end = self._buf, self._body_start, self._body_end
        if self._trim and end > start and buf[end - 1] == 10 and \
                not self.content_type().startswith("multipart/"):
            end -= 2 if end - start >= 2 and buf[end - 2] == 13 else 1  # (\r\n or \n)
        return memoryview(buf)[start:end]

    def payload(self) -> bytes:
        """``Message.get_payload(decode=True)`` of a part that is not a multipart."""
        data = self.payload_buffer()
        return data if isinstance(data, bytes) else bytes(data)

    def payload_buffer(self) -> bytes | memoryview:
        """:meth:`payload`, where it is the body as it is a view of the message's bytes (no
        copy of the body: decode it with ``str(data, charset)``, as ``bytes.decode``)."""
        cte = (self.get("content-transfer-encoding") or "").lower()
        body = self.body_view()
        if cte == "quoted-printable":
            return binascii.a2b_qp(body)
        if cte == "base64":  # (the line breaks out: what b"".join(body.splitlines()) leaves)
            return _decode_b(bytes(body).translate(None, b"\r\n"))
        if cte in ("x-uuencode", "uuencode", "uue", "x-uue"):
            raise Unsupported("uuencode")
        return body

    def is_multipart(self) -> bool:
        """True when the body was split into parts (``Message.is_multipart``); the first
        call splits it and records the multipart defects."""
        if not self._split_done:
            self._split_done = True
            self._children = self._split()
        return self._children is not None

    def children(self) -> Iterator[Part]:
        """The sub-parts of a multipart, parsed one at a time."""
        if self.is_multipart():
            for start, end in self._children or ():
                yield parse_part(self._buf, start, end, trim=True, steps=self._steps)

    def _split(self) -> list[tuple[int, int]] | None:
        ctype = self.content_type()
        if not ctype.startswith("multipart/"):
            if ctype.startswith("message/"):
                raise Unsupported("message/* part")
            return None
        if ctype == "multipart/digest":
            raise Unsupported("multipart/digest")
        boundary = self.param("boundary")
        if boundary is None:
            self.defects.append("noboundaryinmultipartdefect")
            return None
        boundary = unquote(boundary).rstrip()
        if not boundary.isascii() or "\n" in boundary or "\r" in boundary:
            # (a folded one: the standard parser reads line by line and never finds it)
            raise Unsupported("non-ASCII or folded boundary")
        if (self.get("content-transfer-encoding") or "8bit").lower() not in ("7bit", "8bit", "binary"):
            self.defects.append("invalidmultipartcontenttransferencodingdefect")
        regions, preamble_end = _split_multipart(
            self._buf, self._body_start, self._body_end,
            boundary.encode("ascii"), self.defects)
        self._body_end = preamble_end
        return regions


def _split_multipart(buf: bytes, start: int, end: int, boundary: bytes,
                     defects: list[str]) -> tuple[list[tuple[int, int]] | None, int]:
    """The feed parser's boundary loop over ``buf[start:end]``: (sub-part regions, end of
    the text payload). Regions are None when no opening boundary was found: the body up to
    a closing boundary (or the end) then stays one text payload."""
    lines = _boundary_lines(buf, start, end, b"--" + boundary)
    m = next(lines, None)
    if m is None or m[2]:
        defects.append("startboundarynotfounddefect")
        return None, end if m is None else m[0]
    regions: list[tuple[int, int]] = []
    while m is not None:
        run_end = m[1]  # consecutive boundary lines (closing ones too) delimit no part
        m = next(lines, None)
        while m is not None and m[0] == run_end:
            run_end = m[1]
            m = next(lines, None)
        regions.append((run_end, m[0] if m is not None else end))
        if m is not None and m[2]:
            return regions, end
    defects.append("closeboundarynotfounddefect")
    return regions, end


def _boundary_lines(buf: bytes, start: int, end: int, marker: bytes) -> Iterator[tuple[int, int, bool]]:
    """(start, end, closing) of each line of ``buf[start:end]`` that is ``marker`` followed by
    an optional ``--``, blanks and a line break (the feed parser's boundary regex)."""
    pos = start
    find, tail = buf.find, _BOUNDARY_TAIL.match
    while (i := find(marker, pos, end)) >= 0:
        if i == start or buf[i - 1] == 0x0A:  # at a line start (lone CRs are unsupported)
            m = tail(buf, i + len(marker), end)
            if m:
                yield i, m.end(), m.group(1) is not None
                pos = m.end()
                continue
        pos = i + 1


def parse_message(raw: bytes, steps: TokenizerSteps = DEFAULT_STEPS) -> Part:
    """The top-level part of a raw message (a lone carriage return is unsupported)."""
    if b"\r" in raw and raw.count(b"\r") != raw.count(b"\r\n"):
        raise Unsupported("lone carriage return")
    return parse_part(raw, steps=steps)


def parse_part(buf: bytes, start: int = 0, end: int | None = None, trim: bool = False,
               steps: TokenizerSteps = DEFAULT_STEPS) -> Part:
    """Parse the headers of the message or part in ``buf[start:end]`` (the C steps
    ``header_block_end`` and ``plain_headers`` read bytes, the Python code any buffer)."""
    if end is None:
        end = len(buf)
    defects: list[str] = []
    is_bytes = type(buf) is bytes
    block_end = (steps.header_block_end if steps.header_block_end is not None and is_bytes
                 else _header_block_end)(buf, start, end)
    body_start = block_end
    if block_end < end:
        blank = _BLANK_LINE.match(buf, block_end, end)
        if blank:
            body_start = blank.end()
        else:
            defects.append("missingheaderbodyseparatordefect")
    if steps.plain_headers is not None and is_bytes:
        headers = steps.plain_headers(buf, start, block_end)
    else:
        headers = _plain_headers(buf, start, block_end, steps)
    if headers is None:
        headers = _headers_by_line(buf, start, block_end, defects)
    return Part(buf, headers, defects, body_start, end, trim, steps)


def _header_block_end(buf: bytes, start: int, end: int) -> int:
    """Where the header block of ``buf[start:end]`` ends: at the first line that is no
    header, continuation nor mbox ``From `` line (or that holds a lone carriage return)."""
    if start < end and not _HEADER_LINE.match(buf, start, end):
        return start
    m = _HEADER_BLOCK_END.search(buf, start, end)
    block_end = end if m is None else m.start() + 1
    if buf.find(b"\r", start, block_end) >= 0 and (cr := _LONE_CR.search(buf, start, block_end)):
        block_end = buf.rfind(b"\n", start, cr.start()) + 1 or start  # its line is no header
    return block_end


def _plain_headers(buf: bytes, start: int, end: int, steps: TokenizerSteps = DEFAULT_STEPS
                   ) -> list[tuple[str, str]] | None:
    """The common header block in one regex pass: ASCII, every line a header or its
    continuation (after an optional mbox ``From `` line). None for anything else.

    Every line of the block already starts as ``From ``, ``<name>:``, ``:`` or a blank
    (``_HEADER_LINE``), so it is plain when no line but the first is a ``From `` line, no
    line starts with a colon and the first field is no continuation.
    """
    block = buf[start:end]
    if not block.isascii() or _ODD_LINE.search(block):
        return None
    text = block.decode("ascii")
    if text.startswith("From "):
        eol = text.find("\n")  # (the block holds no lone carriage return)
        text = text[eol + 1 :] if eol >= 0 else ""
    if text.startswith((" ", "\t", ":")):
        return None
    # Split at the line breaks that start a field: [before, name, value, name, value, ...].
    # A value is what follows the blanks after the colon up to the next field: folded
    # line breaks kept, the final one (with its carriage return) dropped.
    crlf = "\r" in text
    if not crlf and text.endswith("\n"):
        text = text[:-1]
    if steps.header_fields is not None:  # (the same split in C)
        return steps.header_fields("\n" + text, crlf)
    pieces = _FIELD_START.split("\n" + text)
    if crlf:
        return list(zip(pieces[1::2], map(str.rstrip, pieces[2::2], repeat("\r\n")), strict=True))
    return list(zip(pieces[1::2], pieces[2::2], strict=True))


def _headers_by_line(buf: bytes, start: int, end: int, defects: list[str]) -> list[tuple[str, str]]:
    """The feed parser's ``_parse_headers``, line by line (defects recorded)."""
    lines = _LINE.findall(buf, start, end)
    headers: list[tuple[str, str]] = []
    name = ""
    value: list[bytes] = []
    for lineno, line in enumerate(lines):
        if line[:1] in (b" ", b"\t"):
            if not name:
                defects.append("firstheaderlineiscontinuationdefect")
            else:
                value.append(line)
            continue
        if name:
            headers.append(_header(name, value))
            name, value = "", []
        if line.startswith(b"From "):
            if lineno == 0:
                continue
            if lineno == len(lines) - 1:
                raise Unsupported("mbox From line closing the header block")
            defects.append("misplacedenvelopeheaderdefect")
            continue
        i = line.find(b":")
        if i == 0:
            defects.append("invalidheaderdefect")
            continue
        name = line[:i].decode("ascii", "surrogateescape")
        value = [line[i + 1 :].lstrip(b" \t")]
    if name:
        headers.append(_header(name, value))
    return headers


def _header(name: str, lines: list[bytes]) -> tuple[str, str]:
    value = b"".join(lines).rstrip(b"\r\n")
    return name, _header_text(name, value)

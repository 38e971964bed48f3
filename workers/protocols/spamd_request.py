"""A spamd request read off a connection (SpamAssassin's spamd/PROTOCOL), and the error
lines spamd answers a bad one with.

``COMMAND SPAMC/x.y``, header lines ``Name: value``, a blank line, then the mail
(``Content-length`` bytes of it; without the header, up to the end of the stream).
Headers are matched by name without regard to case; ones not known are ignored, as the
protocol asks. Errors are :class:`SpamdError`: spamd's status codes (sysexits.h) and its
messages, one line, after which the connection is closed.

>>> parse_request_line(b"CHECK SPAMC/1.5")
('CHECK', 1.5)
>>> parse_request_line(b"GET / HTTP/1.1")
Traceback (most recent call last):
...
streamnb_workers.protocols.spamd_request.SpamdError: SPAMD/1.0 76 Bad header line: GET / HTTP/1.1
>>> h = Headers(); h.add(b"Content-length: 12"); h.add(b"User: root"); (h.length, h.user)
(12, 'root')
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

from streamnb_workers.protocols.limits import ClientGone, DeadlineReader, Limits, LineTooLong

__all__ = ["COMMANDS", "EX_DATAERR", "EX_OK", "EX_PROTOCOL", "EX_TEMPFAIL", "EX_TIMEOUT",
           "EX_UNAVAILABLE", "Headers", "Request", "SpamdError", "parse_request_line",
           "read_request"]

#: spamd's status codes (sysexits.h) this server answers with.
EX_OK = 0
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_TEMPFAIL = 75
EX_PROTOCOL = 76
EX_NOPERM = 77
EX_TIMEOUT = 79

#: The commands and whether a mail follows their headers.
COMMANDS = {"CHECK": True, "SYMBOLS": True, "REPORT": True, "REPORT_IFSPAM": True,
            "PROCESS": True, "HEADERS": True, "TELL": True, "PING": False, "SKIP": False}


class SpamdError(Exception):
    """An answer that ends the connection: ``SPAMD/1.0 CODE MESSAGE``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"SPAMD/1.0 {code} {message}")
        self.code = code
        self.message = message

    def line(self) -> bytes:
        return f"{self}\r\n".encode("ascii", "replace")


def _printable(data: bytes, limit: int = 80) -> str:
    text = data[:limit].decode("latin-1")
    return "".join(c if c.isprintable() and c.isascii() else "?" for c in text)


def protocol_error(detail: str) -> SpamdError:
    return SpamdError(EX_PROTOCOL, f"Bad header line: {detail}")


def parse_request_line(line: bytes) -> tuple[str, float]:
    """``(command, version)`` of ``COMMAND SPAMC/x.y``; EX_PROTOCOL otherwise."""
    command, _, version = line.partition(b" ")
    name = command.decode("latin-1")
    if name not in COMMANDS or not version.startswith(b"SPAMC/"):
        raise protocol_error(_printable(line))
    try:
        number = float(version[6:].decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise protocol_error(_printable(line)) from None
    if not 0.0 < number < 100.0:
        raise protocol_error(_printable(line))
    return name, number


@dataclass(slots=True)
class Headers:
    """The request headers this server reads."""

    length: int | None = None
    user: str | None = None
    message_class: str | None = None
    set_local: bool = False
    set_remote: bool = False
    remove_local: bool = False
    remove_remote: bool = False
    zlib: bool = False
    count: int = 0

    def add(self, line: bytes) -> None:
        name, sep, value = line.partition(b":")
        if not sep or not name.strip():
            raise protocol_error("(header not in 'Name: value' format)")
        key = name.strip().lower()
        text = value.strip().decode("latin-1")
        if key == b"content-length":
            if not text.isdigit() or not text.isascii() or len(text) > 15:
                raise protocol_error("(Content-Length contains non-numeric bytes)")
            self.length = int(text)
        elif key == b"user":
            self.user = text or None
        elif key == b"message-class":
            if text.lower() not in ("spam", "ham"):
                raise protocol_error("(Message-class header contains invalid class)")
            self.message_class = text.lower()
        elif key == b"set":
            self.set_local, self.set_remote = "local" in text.lower(), "remote" in text.lower()
        elif key == b"remove":
            self.remove_local = "local" in text.lower()
            self.remove_remote = "remote" in text.lower()
        elif key == b"compress":
            if text.lower() != "zlib":
                raise protocol_error(f"(compression type not supported: {_printable(value.strip())})")
            self.zlib = True


@dataclass(slots=True)
class Request:
    """A whole request: the mail's first ``max_size`` bytes and its whole size."""

    command: str
    version: float
    headers: Headers = field(default_factory=Headers)
    body: bytes = b""
    size: int = 0


def read_headers(reader: DeadlineReader, limits: Limits) -> Headers:
    headers = Headers()
    while True:
        try:
            line = reader.readline()
        except ClientGone:
            raise protocol_error("(EOF during headers)") from None
        if not line:
            return headers
        headers.count += 1
        if headers.count > limits.max_headers:
            raise protocol_error("(too many headers)")
        headers.add(line)


def _inflate(data: bytes, limit: int) -> tuple[bytes, int]:
    """(the first ``limit`` bytes of the zlib stream ``data`` inflated, a size: ``limit``
    + 1 when there was more)."""
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise SpamdError(EX_UNAVAILABLE, f"Service Unavailable: zlib: {exc}") from None
    return out[:limit], len(out)


def read_request(reader: DeadlineReader, limits: Limits) -> Request:
    """The next request on ``reader`` (SpamdError for a bad one; SlowClient, ClientGone and
    LineTooLong from the reader pass)."""
    try:
        first = reader.readline()
    except ClientGone:
        raise protocol_error("(closed before headers)") from None
    except LineTooLong:
        raise protocol_error("(request line too long)") from None
    command, version = parse_request_line(first)
    request = Request(command, version)
    with_headers = version > 1.0 if COMMANDS[command] else version >= 1.5
    try:
        if with_headers:
            request.headers = read_headers(reader, limits)
    except LineTooLong:
        raise protocol_error("(header line too long)") from None
    if not COMMANDS[command]:
        return request
    expected = request.headers.length
    if request.headers.zlib and expected is None:
        raise SpamdError(EX_UNAVAILABLE, "Service Unavailable: Compress requires "
                                         "Content-length header")
    body, seen = reader.read(expected, limits.max_size + 1)
    if expected is not None and seen != expected:
        raise protocol_error(f"(Content-Length mismatch: Expected {expected} bytes, "
                             f"got {seen} bytes)")
    if request.headers.zlib:
        body, seen = _inflate(body, limits.max_size + 1)
    request.body, request.size = body[:limits.max_size], seen
    return request

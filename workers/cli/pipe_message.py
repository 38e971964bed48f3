"""A mail read from a pipe: its header block, our headers in it, and the exit code of a
verdict (``streamnb predict -``).

The message is spooled (in memory up to a bound, then on disk), so a large mail costs
bounded memory; only its first ``max_size`` bytes are looked at and scored, headers first,
as the milter does. What is written back is the header block with ``X-Streamnb-*`` fields
removed (a sender cannot forge a verdict) and the new ones added before the blank line,
then every byte after the header block unchanged. Added lines end as the message's first
line does (CRLF or LF).

>>> m = PipedMessage.from_bytes(b"From: a@b\\nX-Streamnb-Verdict: ham\\n  (forged)\\nSubject: s\\n\\nbody\\n")
>>> m.header_end, m.linesep
(57, b'\\n')
>>> m.scored_bytes()
b'From: a@b\\nSubject: s\\n\\nbody\\n'
>>> out = io.BytesIO(); m.write_with_headers(out, [("X-Streamnb-Verdict", "spam")])
>>> out.getvalue()
b'From: a@b\\nSubject: s\\nX-Streamnb-Verdict: spam\\n\\nbody\\n'
>>> out = io.BytesIO(); PipedMessage.from_bytes(b"\\x89PNG\\n").write_marked(out, [("X-A", "b")])
>>> out.getvalue()
b'X-A: b\\n\\x89PNG\\n'
>>> verdict_exit_code("spam", ["ham", "spam"]), verdict_exit_code("ham", ["ham", "spam"])
(0, 1)
>>> verdict_exit_code("unsure", ["ham", "spam"]), verdict_exit_code(None, [])
(2, 3)
"""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any, BinaryIO

from streamnb.decision import UNSURE, DecisionRule
from streamnb.features.own_headers import is_own_header
from streamnb.features.payload import DEFAULT_MAX_MESSAGE_BYTES

__all__ = [
    "EXIT_ERROR",
    "EXIT_NEGATIVE",
    "EXIT_POSITIVE",
    "EXIT_UNSURE",
    "PipedMessage",
    "verdict_exit_code",
]

#: Exit codes of one judged message, bogofilter's: spam (the positive class), ham (any
#: other class), unsure, and no verdict at all.
EXIT_POSITIVE = 0
EXIT_NEGATIVE = 1
EXIT_UNSURE = 2
EXIT_ERROR = 3

#: Bytes of a piped mail kept in memory; beyond, the spool is a temporary file.
SPOOL_IN_MEMORY = 8 * 1024 * 1024
_CHUNK = 64 * 1024


def verdict_exit_code(verdict: Any, classes: Sequence[Any], positive: Any = None) -> int:
    """The exit code of a verdict: :data:`EXIT_POSITIVE` for the positive class
    (``positive``, else the last class in sorted order as for the decision rule: spam of
    ham/spam), :data:`EXIT_UNSURE` for ``unsure``, :data:`EXIT_NEGATIVE` for any other
    class, :data:`EXIT_ERROR` for no verdict (or a ``positive`` that is not a class)."""
    if verdict is None or not classes:
        return EXIT_ERROR
    if verdict == UNSURE:
        return EXIT_UNSURE
    try:
        pos = DecisionRule(positive=positive).positive_index(list(classes))
    except ValueError:
        return EXIT_ERROR
    return EXIT_POSITIVE if str(verdict) == str(list(classes)[pos]) else EXIT_NEGATIVE


def _header_end(head: bytes, whole: bool) -> int | None:
    """Offset just past the blank line that ends the header block of ``head``; the end of
    ``head`` when ``whole`` (the entire message) and it has no blank line (a mail with no
    body); None when the header block does not end within ``head``."""
    if head.startswith((b"\r\n", b"\n")):
        return 0
    ends = [i for i in (head.find(b"\n\n"), head.find(b"\n\r\n")) if i >= 0]
    if ends:
        i = min(ends)
        return i + (2 if head[i:i + 2] == b"\n\n" else 3)
    return len(head) if whole else None


def _fields(header: bytes) -> list[bytes]:
    """The header block as its fields, each with its continuation lines and line ends."""
    fields: list[bytes] = []
    for line in header.splitlines(keepends=True):
        if fields and line[:1] in (b" ", b"\t"):
            fields[-1] += line
        else:
            fields.append(line)
    return fields


def _is_own(field: bytes) -> bool:
    name, sep, _ = field.partition(b":")
    return bool(sep) and is_own_header(name)


class PipedMessage:
    """One mail: its bytes spooled, the offset past its header block (``header_end``,
    None when the header block is longer than the part looked at) and its line end."""

    def __init__(self, spool: BinaryIO, size: int, head: bytes, max_size: int) -> None:
        self.spool = spool
        self.size = size
        self.head = head
        self.max_size = max_size
        self.header_end = _header_end(head, whole=size <= len(head))
        first = head.find(b"\n")
        self.linesep = b"\r\n" if first > 0 and head[first - 1:first] == b"\r" else b"\n"

    @classmethod
    def read(cls, stream: BinaryIO, max_size: int) -> PipedMessage:
        """Spool everything ``stream`` holds; the first ``max_size`` bytes are ``head``."""
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)
        size = 0
        head = bytearray()
        while chunk := stream.read(_CHUNK):
            spool.write(chunk)
            size += len(chunk)
            if len(head) < max_size:
                head += chunk[:max_size - len(head)]
        return cls(spool, size, bytes(head), max_size)  # type: ignore[arg-type]

    @classmethod
    def from_bytes(cls, data: bytes, max_size: int = DEFAULT_MAX_MESSAGE_BYTES) -> PipedMessage:
        return cls.read(io.BytesIO(data), max_size)

    def close(self) -> None:
        self.spool.close()

    def _parts(self) -> tuple[bytes, bytes, int]:
        """(the header fields kept, the blank line or b"", the offset where the rest starts)."""
        if self.header_end is None:
            # No end of headers within the part looked at: the new fields go first (after
            # an mbox "From " line), nothing is removed.
            at = self.head.find(b"\n") + 1 if self.head.startswith(b"From ") else 0
            return self.head[:at], b"", at
        header = self.head[:self.header_end]
        blank = b""
        for end in (b"\r\n", b"\n"):
            if header.endswith(end) and (len(header) == len(end) or header[:-len(end)].endswith(b"\n")):
                header, blank = header[:-len(end)], end
                break
        kept = b"".join(f for f in _fields(header) if not _is_own(f))
        if kept and not kept.endswith(b"\n"):
            kept += self.linesep
        return kept, blank, self.header_end

    def scored_bytes(self) -> bytes:
        """What is sent to the workers: the mail without our headers, at most ``max_size``
        bytes of it (headers first)."""
        kept, blank, rest = self._parts()
        return (kept + blank + self.head[rest:])[:self.max_size]

    def write_with_headers(self, out: BinaryIO, headers: Iterable[tuple[str, str]]) -> None:
        """Write the mail to ``out`` with ``headers`` in place of our old ones; every byte
        after the header block as it came."""
        kept, blank, rest = self._parts()
        added = b"".join(f"{name}: {value}".encode("ascii") + self.linesep for name, value in headers)
        out.write(kept + added + blank)
        self.spool.seek(rest)
        shutil.copyfileobj(self.spool, out, _CHUNK)
        out.flush()

    def write_marked(self, out: BinaryIO, headers: Iterable[tuple[str, str]]) -> None:
        """Write ``headers`` and then every byte of the input as it came (input that is not
        mail: no header block to put them in, nothing of it changed)."""
        out.write(b"".join(f"{name}: {value}".encode("ascii") + self.linesep
                           for name, value in headers))
        self.spool.seek(0)
        shutil.copyfileobj(self.spool, out, _CHUNK)
        out.flush()

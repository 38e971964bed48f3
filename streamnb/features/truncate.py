"""Mail over the size limit, cut so that it is still judged: the whole header block, the
body up to the last MIME boundary (else line end) before the limit, and a first header
line saying the mail was cut and how long it was.

The cut is one pure function used wherever mail is cut (``streamnb produce`` and
``predict`` before sending, the tokenizer on whatever arrives larger), so a mail cut by the
producer and the same mail cut by a worker are the same bytes, with the same tokens
(``defect:truncated``) and the same size meta feature (the original size, from the marker).
streamnb's own header fields (:mod:`streamnb.features.own_headers`) are taken out before
the mail is measured and cut, as the tokenizer takes them out: a delivered copy is cut as
the mail it was.

>>> mail = b"Subject: hi\\n\\n--b\\nfirst part\\n--b\\n" + b"x" * 200 + b"\\n--b--\\n"
>>> cut = cut_mail(mail, 120)
>>> cut
b'X-Streamnb-Truncated: 239\\r\\nSubject: hi\\n\\n--b\\nfirst part\\n'
>>> truncated_size(cut), truncated_size(mail), cut_mail(cut, 120) == cut
(239, None, True)
"""

from __future__ import annotations

import re

from streamnb.features.own_headers import strip_own_headers

__all__ = ["TRUNCATED_HEADER", "cut_mail", "truncated_size"]

#: The header line a cut mail starts with: ``X-Streamnb-Truncated: <original bytes>``.
TRUNCATED_HEADER = b"X-Streamnb-Truncated"
_MARKER = re.compile(rb"X-Streamnb-Truncated: (\d{1,15})\r\n")
#: The end of the header block.
_HEADER_END = re.compile(rb"\r?\n\r?\n")
#: A line that starts a MIME boundary delimiter (``--boundary``).
_BOUNDARY = re.compile(rb"\n--[^\r\n]")


def truncated_size(raw: bytes) -> int | None:
    """The original size a cut mail records in its first line; None if it was not cut."""
    m = _MARKER.match(raw)
    return int(m.group(1)) if m else None


def cut_mail(raw: bytes, limit: int, size: int | None = None) -> bytes:
    """``raw`` if it is at most ``limit`` bytes (or is already cut), else the marker line,
    the header block, and the body up to the start of the last MIME boundary line before the
    limit (else to the last line end before it, else to the limit); at most ``limit`` bytes
    in all unless the header block alone is longer, then it is cut at a line end too.
    ``size``: the whole mail's size where ``raw`` is only its start (a reader that kept
    the first bytes of a larger mail, as the milter does). Sizes and the cut are those of
    ``raw`` without streamnb's own header fields.

    >>> cut_mail(b"Subject: hi\\n\\nline one\\nline two", 60, size=5000)
    b'X-Streamnb-Truncated: 5000\\r\\nSubject: hi\\n\\nline one\\n'
    >>> cut_mail(b"X-Streamnb-Id: 7\\nSubject: hi\\n\\nline one\\nline two", 60, size=5017)
    b'X-Streamnb-Truncated: 5000\\r\\nSubject: hi\\n\\nline one\\n'
    """
    if (len(raw) <= limit and (size is None or size <= limit)) or truncated_size(raw) is not None:
        return raw
    whole = raw
    raw = strip_own_headers(raw)
    size = len(raw) if size is None else max(size - (len(whole) - len(raw)), len(raw))
    if size <= limit:
        return whole
    marker = TRUNCATED_HEADER + b": " + str(size).encode() + b"\r\n"
    room = max(0, limit - len(marker))
    head = _HEADER_END.search(raw, 0, room + 4)
    body_from = head.end() if head is not None and head.end() <= room else 0
    window = raw[:room]
    cut = None
    if body_from:
        starts = [m.start() + 1 for m in _BOUNDARY.finditer(window, body_from - 1)]
        if starts:
            cut = starts[-1]
    if cut is None:
        end = window.rfind(b"\n", body_from)
        cut = end + 1 if end >= 0 else room
    return marker + raw[:max(cut, body_from)]

"""The header fields streamnb writes into mail (``X-Streamnb-Verdict``, ``-Score``,
``-Id``, ``-Tokens``, the ``X-Streamnb-Truncated`` marker of a cut mail): never features.

A delivered mail carries the verdict the daemon gave it; when it is trained back (moved
into Junk, say), those fields must not teach the model its own past verdicts. So every
header field whose name starts with :data:`OWN_HEADER_PREFIX` (any case, continuation
lines included) is taken out of a mail before it is tokenized, measured or keyed: a mail
and its delivered copy give the same tokens, meta vector and learn-once key. The fields
are found as ``email.parser`` finds header fields (compat32: lines from the start up to
the first empty line or the first line that is no header line, ``\\r\\n``, ``\\n`` or
``\\r`` line ends), so taking one out changes nothing else the parser sees.

>>> mail = (b"From: a@b\\nX-Streamnb-Verdict: spam\\nx-streamnb-score: 4.2\\n (folded)\\n"
...         b"Subject: s\\n\\nX-Streamnb-Id: body text stays\\n")
>>> strip_own_headers(mail)
b'From: a@b\\nSubject: s\\n\\nX-Streamnb-Id: body text stays\\n'
>>> strip_own_headers(b"Subject: s\\n\\nbody\\n") == b"Subject: s\\n\\nbody\\n"
True
"""

from __future__ import annotations

import re

__all__ = ["OWN_HEADER_PREFIX", "is_own_header", "strip_own_headers"]

#: Every header name streamnb writes starts with this (compared case-insensitively).
OWN_HEADER_PREFIX = "x-streamnb-"
_PREFIX = OWN_HEADER_PREFIX.encode("ascii")
#: The end of what can be the header block: a line break followed by an empty line.
_BLANK_LINE = re.compile(rb"\n\r?\n|\r\r")
#: One line with its line end (as the feed parser splits them).
_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)?")
#: A line the feed parser takes as a header line (``email.feedparser.headerRE``).
_HEADER_LINE = re.compile(rb"From |[\x21-\x39\x3b-\x7e]*:|[\t ]")


def is_own_header(name: str | bytes) -> bool:
    """Whether a header field's name is one of streamnb's (:data:`OWN_HEADER_PREFIX`).

    >>> is_own_header("X-STREAMNB-Verdict"), is_own_header(b"X-Spam-Score")
    (True, False)
    """
    if isinstance(name, bytes):
        name = name.decode("latin-1")
    return name.strip().lower().startswith(OWN_HEADER_PREFIX)


def strip_own_headers(raw: bytes) -> bytes:
    """``raw`` without its header fields named ``X-Streamnb-*`` (and their continuation
    lines); ``raw`` itself when it has none."""
    blank = _BLANK_LINE.search(raw)
    if _PREFIX not in raw[: blank.end() if blank else len(raw)].lower():
        return raw
    kept: list[bytes] = []
    pos, end, dropping = 0, len(raw), False
    while pos < end:
        line = _LINE.match(raw, pos).group()
        if line in (b"\n", b"\r\n", b"\r") or not _HEADER_LINE.match(line):
            break  # the end of the header block
        if line[:1] in (b" ", b"\t"):
            if not dropping:
                kept.append(line)
        else:
            dropping = line[: len(_PREFIX)].lower() == _PREFIX
            if not dropping:
                kept.append(line)
        pos += len(line)
    if sum(map(len, kept)) == pos:
        return raw  # (an X-Streamnb- line past the header block)
    kept.append(raw[pos:])
    return b"".join(kept)

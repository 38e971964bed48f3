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
#: The header block as the feed parser reads it: the lines it takes as header lines
#: (``email.feedparser.headerRE``), each with its line end (``\r\n``, ``\r`` or ``\n``).
_HEADER_BLOCK = re.compile(rb"(?:(?:From |[\x21-\x39\x3b-\x7e]*:|[\t ])[^\r\n]*(?:\r\n|\r|\n|\Z))*")
#: One of our fields in a header block: its first line and its continuation lines.
_OWN_FIELD = re.compile(
    rb"(?<![^\r\n])(?i:x-streamnb-)[\x21-\x39\x3b-\x7e]*:[^\r\n]*(?:\r\n|\r|\n|\Z)"
    rb"(?:[\t ][^\r\n]*(?:\r\n|\r|\n|\Z))*")


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
    end = raw.find(b"\n\n")  # past the header block (bytes.find: a fast look for the
    crlf = raw.find(b"\n\r\n", 0, len(raw) if end < 0 else end)  # common case, none of ours)
    end = len(raw) if end < 0 and crlf < 0 else crlf if crlf >= 0 else end
    if _PREFIX not in raw[:end].lower():
        return raw
    head = _HEADER_BLOCK.match(raw).end()
    kept = _OWN_FIELD.sub(b"", raw[:head])
    return raw if len(kept) == head else kept + raw[head:]

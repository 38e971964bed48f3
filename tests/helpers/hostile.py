"""Hostile inputs shared by the security tests: crafted mail, corpus samples, cost checks.

Every builder returns raw RFC 822 bytes. Sizes are chosen to hit a limit of
:class:`streamnb_workers.wire.codec.Limits` (message size, MIME depth, parts, decoded bytes, tokens) or
a known slow path of a parser (quadratic header decoding, regex backtracking).
"""

from __future__ import annotations

import csv
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Generous CPU-time ceiling (process time) for one message of at most 1 MiB; measured
#: costs are about 100x below it. It catches quadratic blow-ups, not small regressions.
CPU_CEILING_S = 3.0
#: Peak memory a single message may add to the process (ru_maxrss growth).
RSS_CEILING_BYTES = 256 << 20


def many_parts(n: int = 100_000) -> bytes:
    """A multipart message with ``n`` tiny parts (about 8 bytes each)."""
    body = b"".join(b"--b\n\nx\n" for _ in range(n))
    return b'From: a@x.example\nContent-Type: multipart/mixed; boundary="b"\n\n' + body + b"--b--\n"


def long_line(n: int = 10_000_000) -> bytes:
    """One body line of ``n`` bytes (no white space)."""
    return b"From: a@x.example\nSubject: long\n\n" + b"a" * n


def nested_html(depth: int = 200_000) -> bytes:
    """Billion-laughs-style HTML: deep nesting, entity chains, unclosed script/comment openers."""
    body = (b"<div>" * depth + b"&amp;amp;amp;" * 1000 + b"<script " * 10_000
            + b"<!--" * 1000 + b"<a href=http://" * 1000)
    return b"From: a@x.example\nContent-Type: text/html\n\n" + body


def unclosed_script(n: int = 120_000) -> bytes:
    """``n`` unclosed ``<script`` openers (a regex that rescans to the end is quadratic)."""
    return b"From: a@x.example\nContent-Type: text/html\n\n" + b"<script " * n


def invalid_utf8() -> bytes:
    """Invalid UTF-8 in headers, names, parameters and a body that claims utf-8."""
    junk = bytes(range(0x80, 0x100))
    return (b"From: \xff\xfe <\xc3@\xe2\x82.example>\nTo: \xf0\x9f\x98\nSubject: \xc0\xaf\xed\xa0\x80"
            + junk + b"\nContent-Type: text/plain; charset=\"utf-8\"; name=\"\xff\"\n"
            b"Content-Disposition: attachment; filename=\"\xfe\xff.\xe9xe\"\n\n" + junk * 4000)


def big_header(n: int = 1 << 20) -> bytes:
    """A 1 MB Subject header and a 1 MB To header of addresses."""
    subject = b"Subject: " + b"w " * (n // 2) + b"\n"
    to = b"To: " + b"a@b.example, " * (n // 13) + b"\n"
    return subject + to + b"\nbody\n"


def encoded_word_bomb(n: int = 60_000) -> bytes:
    """``n`` RFC 2047 encoded words in Subject and From (the stdlib decodes them in O(n^2))."""
    words = b"=?utf-8?b?YWFh?= " * n
    return b"From: " + words[: 200_000] + b"<a@x.example>\nSubject: " + words + b"\n\nbody\n"


def deep_mime(depth: int = 5_000) -> bytes:
    """Multiparts nested ``depth`` deep (beyond Python's recursion limit)."""
    return b"".join(b'Content-Type: multipart/mixed; boundary="b%d"\n\n--b%d\n' % (i, i)
                    for i in range(depth))


CRAFTED: dict[str, Callable[[], bytes]] = {
    "100k_parts": many_parts,
    "10mb_line": long_line,
    "nested_html": nested_html,
    "unclosed_script": unclosed_script,
    "invalid_utf8": invalid_utf8,
    "1mb_header": big_header,
    "encoded_word_bomb": encoded_word_bomb,
    "encoded_word_bomb_4mb": lambda: encoded_word_bomb(240_000),
    "deep_mime": deep_mime,
}


def corpus_messages(corpus: Path, n: int, stride: int = 1) -> list[bytes]:
    """The first ``n`` messages of the corpus index (every ``stride``-th)."""
    out = []
    with open(corpus / "index.tsv", newline="") as f:
        for i, row in enumerate(csv.DictReader(f, delimiter="\t")):
            if i % stride == 0:
                out.append((corpus / row["path"]).read_bytes())
            if len(out) >= n:
                break
    return out


def cost(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """(result, CPU seconds, ru_maxrss growth in bytes) of ``fn()``."""
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.process_time()
    result = fn()
    dt = time.process_time() - t0
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    return result, dt, grown


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")

"""docs/protocol.md lists every dead-letter reason the code can emit, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Where a reason is written: a MalformedMessage, a Dead letter, or a named constant.
_EMITTED = [
    re.compile(r'MalformedMessage\(\s*"([a-z_]+)"'),
    re.compile(r'Dead\([^,()]+,\s*"([a-z_]+)"'),
    re.compile(r'^[A-Z_]+_REASON\s*=\s*"([a-z_]+)"', re.M),
    re.compile(r'^REF_EXPIRED\s*=\s*"([a-z_]+)"', re.M),
]


def emitted_reasons() -> set[str]:
    found: set[str] = set()
    for path in [*(ROOT / "workers").glob("*.py"), *(ROOT / "streamnb" / "features").glob("*.py")]:
        text = path.read_text(encoding="utf-8")
        for pattern in _EMITTED:
            found.update(pattern.findall(text))
    return found


def documented_reasons() -> set[str]:
    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    section = text.split("## Reason codes", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))


def test_protocol_documents_exactly_the_reasons_the_code_emits():
    emitted = emitted_reasons()
    assert {"not_msgpack", "poison", "bad_category", "ref_expired"} <= emitted  # (the scan works)
    assert documented_reasons() == emitted

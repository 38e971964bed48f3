"""docs/protocol.md lists every dead-letter reason the code can emit, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Where a reason is given: the first argument of a MalformedMessage, the second of a Dead
#: letter; a string literal, or a module-level constant holding one.
_GIVEN = [
    re.compile(r'MalformedMessage\(\s*("[a-z_]+"|[A-Z][A-Z0-9_]*)'),
    re.compile(r'Dead\([^,()]+,\s*("[a-z_]+"|[A-Z][A-Z0-9_]*)'),
]
_CONSTANT = re.compile(r'^([A-Z][A-Z0-9_]*)\s*(?::\s*\w+\s*)?=\s*"([a-z_]+)"', re.M)


def emitted_reasons() -> set[str]:
    texts = [p.read_text(encoding="utf-8") for p in
             [*(ROOT / "workers").rglob("*.py"), *(ROOT / "streamnb" / "features").glob("*.py")]]
    constants = {name: value for text in texts for name, value in _CONSTANT.findall(text)}
    found: set[str] = set()
    for text in texts:
        for pattern in _GIVEN:
            for given in pattern.findall(text):
                if given.startswith('"'):
                    found.add(given.strip('"'))
                else:
                    assert given in constants, f"reason constant {given} not found"
                    found.add(constants[given])
    return found


def documented_reasons() -> set[str]:
    text = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    section = text.split("## Reason codes", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, re.M))


def test_protocol_documents_exactly_the_reasons_the_code_emits():
    emitted = emitted_reasons()
    assert {"not_msgpack", "poison", "bad_category", "ref_expired"} <= emitted  # (the scan works)
    assert documented_reasons() == emitted


def test_the_dead_letter_counter_starts_a_series_for_every_reason():
    from streamnb_workers.observe.metrics import DEAD_LETTER_REASONS

    assert set(DEAD_LETTER_REASONS) == emitted_reasons()

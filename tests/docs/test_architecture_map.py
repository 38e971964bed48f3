"""docs/architecture.md's module map is the tree: one row per package folder (and per
folder of Lua scripts), naming exactly the modules that folder holds."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"


def folders() -> dict[str, set[str]]:
    """Each folder of the library and the daemon -> the modules (and scripts) it holds."""
    out: dict[str, set[str]] = {}
    for top in ("streamnb", "workers"):
        for d in sorted((ROOT / top).rglob("*")):
            if not d.is_dir() or d.name == "__pycache__":
                continue
            if (d / "__init__.py").exists() or any(d.glob("*.lua")):
                mods = {p.stem for p in d.glob("*.py") if p.stem != "__init__"}
                mods |= {p.name for p in d.glob("*.lua")} | {p.name for p in d.glob("*.c")}
                out[d.relative_to(ROOT).as_posix() + "/"] = mods
        out[f"{top}/"] = {p.stem for p in (ROOT / top).glob("*.py") if p.stem != "__init__"} \
            | {p.name for p in (ROOT / top).glob("*.[ch]")}
    return out


def module_map() -> dict[str, set[str]]:
    """The map's rows: folder -> the modules its second column names."""
    text = DOC.read_text()
    section = text[text.index("## Module map"):]
    section = section[:section.index("\n## ", 1)]
    rows: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        folder = cells[0].strip("`")
        rows[folder] = set(re.findall(r"`([^`]+)`", cells[1]))
    return rows


def test_every_folder_has_a_row_naming_its_modules():
    tree, rows = folders(), module_map()
    assert set(rows) == set(tree), (f"folders without a row: {sorted(set(tree) - set(rows))}; "
                                    f"rows without a folder: {sorted(set(rows) - set(tree))}")
    for folder, modules in tree.items():
        assert rows[folder] == modules, (
            f"{folder}: the map names {sorted(rows[folder] - modules)} that the folder does "
            f"not hold, and not {sorted(modules - rows[folder])}")

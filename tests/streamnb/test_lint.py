"""Static checks that are part of the test suite: ruff, and no pickle/eval in the package."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "streamnb", ROOT / "workers"]


def test_ruff_is_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).exists():
        pytest.skip("ruff is not installed (it is in the test extra)")
    proc = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


# Redis' EVAL/EVALSHA (client.eval, client.evalsha) run the Lua commit script and are fine.
FORBIDDEN = re.compile(
    r"\b(import pickle|from pickle|import cPickle|marshal\.loads)|(?<![.\w])(eval|exec)\("
)


def test_no_pickle_or_eval_in_the_package() -> None:
    offenders = []
    for pkg in PACKAGES:
        for path in pkg.rglob("*.py"):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if FORBIDDEN.search(code) and "literal_eval" not in code:
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)

"""The README's Python example runs and prints what its comments say."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_example_prints_what_it_promises(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README has no Python example"
    code = blocks[0]
    promised = [m.group(1).strip() for m in re.finditer(r"print\(.*\)\s+# (.+)", code)]
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.splitlines()
    for want in promised:
        assert want in printed, f"README promises {want!r}; the example printed {printed}"


def test_readme_gives_the_two_fresh_machine_commands() -> None:
    text = README.read_text()
    assert "streamnb demo" in text
    ci = (README.parent / ".ci" / "run").read_text()
    # CI runs exactly the README's test command
    assert "python -m pytest" in text and "\npython -m pytest\n" in ci
    # ...after installing what the README's command installs
    extras = re.search(r"pip install -e '(\.\[[^\]]*\])' && python -m pytest", text)
    assert extras and f"pip install -q -e '{extras.group(1)}'" in ci

"""The daemon's doctests. Its folder, workers/, is imported as ``streamnb_workers`` (the
name it installs under), so its modules are collected here by that name instead of by
pytest's ``--doctest-modules``, which would import them a second time as ``workers.*``."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import streamnb_workers

MODULES = sorted(m.name for m in pkgutil.iter_modules(streamnb_workers.__path__,
                                                      "streamnb_workers.")
                 if m.name != "streamnb_workers.__main__")
#: Modules that need an optional extra: the module the extra brings (streamnb[milter]).
OPTIONAL = {"streamnb_workers.milter.session": "Milter"}


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name: str) -> None:
    if name in OPTIONAL:
        pytest.importorskip(OPTIONAL[name])
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) of {name} failed (output above)"


def test_no_top_level_workers_package(tmp_path) -> None:
    """The daemon installs under this project's name: outside the source tree (whose
    folder is workers/), no top-level ``workers`` can be imported."""
    import subprocess
    import sys

    code = ("import importlib.util, streamnb_workers; "
            "print(importlib.util.find_spec('workers'), streamnb_workers.__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["None", "streamnb_workers"]

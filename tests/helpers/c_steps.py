"""Running a test with a C step and with its reference (the Python or numpy code it stands for)."""

from __future__ import annotations

from types import ModuleType

import pytest


def c_or_reference(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                   module: ModuleType, attribute: str) -> str:
    """For a fixture with ``params=["C", <the reference's name>]``: the C function
    ``module.attribute`` as built (skipped where it is not), or switched off (None) so
    that the reference runs. Returns the param."""
    if request.param == "C" and getattr(module, attribute) is None:
        pytest.skip(f"{module.__name__}.{attribute}: its C module is not built")
    if request.param != "C":
        monkeypatch.setattr(module, attribute, None)
    return request.param

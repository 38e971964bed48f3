"""docs/models.md's examples run as doctests (they are the documentation's only code)."""

from __future__ import annotations

import doctest
import warnings
from pathlib import Path

from streamnb.exceptions import SingularCovarianceWarning

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


def test_the_examples_of_docs_models_md_run():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingularCovarianceWarning)  # one-sample classes at first
        result = doctest.testfile(str(DOC), module_relative=False,
                                  optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 20
    assert result.failed == 0, f"{result.failed} example(s) of {DOC.name} failed (output above)"

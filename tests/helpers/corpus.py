"""Where the SpamAssassin 2002 corpus is (``STREAMNB_CORPUS``, else ../shared beside the
project): tests that need it skip cleanly where it is absent."""

from __future__ import annotations

import os
from pathlib import Path

CORPUS = Path(os.environ.get(
    "STREAMNB_CORPUS",
    Path(__file__).resolve().parents[3] / "shared" / "corpus" / "spamassassin-2002",
))

"""A prediction as the commands print it: one line for a person.

>>> print(format_prediction({"id": "m1", "label": "spam", "log_proba": {"spam": -0.1, "ham": -2.4},
...                          "top_tokens": ["cheap", "viagra"]}))
m1: spam  (P(spam)=0.905, P(ham)=0.091)  tokens: cheap viagra
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["format_prediction"]


def format_prediction(result: dict[str, Any]) -> str:
    """One human line: ``id: label  (P(spam)=0.98, P(ham)=0.02)  tokens: ...``."""
    probs = sorted(((float(np.exp(v)), str(c)) for c, v in result.get("log_proba", {}).items()),
                   reverse=True)
    text = ", ".join(f"P({c})={p:.3f}" for p, c in probs)
    line = f"{result.get('id')}: {result.get('label')}  ({text})"
    if result.get("top_tokens"):
        line += "  tokens: " + " ".join(result["top_tokens"])
    return line

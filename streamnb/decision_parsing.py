"""The decision options as an operator writes them (``streamnb worker --class-prior ...``),
parsed into what :class:`streamnb.decision.DecisionRule` takes; a ValueError says what
was expected."""

from __future__ import annotations

__all__ = ["parse_class_prior", "parse_half_life", "parse_loss_matrix", "parse_rate",
           "parse_unsure_band"]


def _pairs(text: str, what: str, example: str) -> list[tuple[str, str]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"{what} expects entries like {example!r}, got {part!r}")
        out.append((name.strip(), value.strip()))
    if not out:
        raise ValueError(f"{what} expects entries like {example!r}, got {text!r}")
    return out


def _number(value: str, what: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{what} expects a number, got {value!r}") from None


def parse_class_prior(text: str) -> dict[str, float]:
    """``"spam=0.2,ham=0.8"`` -> ``{"spam": 0.2, "ham": 0.8}``.

    >>> parse_class_prior("spam=0.2, ham=0.8")
    {'spam': 0.2, 'ham': 0.8}
    """
    return {k: _number(v, "--class-prior") for k, v in _pairs(text, "--class-prior", "spam=0.2,ham=0.8")}


def parse_loss_matrix(text: str) -> dict[str, dict[str, float]]:
    """``"ham:spam=10,spam:ham=1"`` (``true:predicted=loss``) -> nested map.

    >>> parse_loss_matrix("ham:spam=10, spam:ham=1")
    {'ham': {'spam': 10.0}, 'spam': {'ham': 1.0}}
    """
    out: dict[str, dict[str, float]] = {}
    for key, value in _pairs(text, "--loss-matrix", "ham:spam=10,spam:ham=1"):
        true, sep, pred = key.partition(":")
        if not sep or not true or not pred:
            raise ValueError(f"--loss-matrix entries are true:predicted=loss, got {key!r}")
        out.setdefault(true, {})[pred] = _number(value, "--loss-matrix")
    return out


def parse_unsure_band(text: str) -> tuple[float, float]:
    """``"0.4,0.6"`` -> ``(0.4, 0.6)``.

    >>> parse_unsure_band("0.4,0.6")
    (0.4, 0.6)
    """
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2:
        raise ValueError(f"--unsure-band expects two probabilities 'lo,hi', got {text!r}")
    lo, hi = (_number(p, "--unsure-band") for p in parts)
    if not 0.0 <= lo <= hi <= 1.0:
        raise ValueError(f"--unsure-band expects 0 <= lo <= hi <= 1, got {text!r}")
    return lo, hi


def parse_rate(text: str) -> float:
    """``"0.001"`` -> ``0.001``: a rate strictly between 0 and 1 (``--target-fpr``).

    >>> parse_rate("0.001")
    0.001
    """
    rate = _number(text, "--target-fpr")
    if not 0.0 < rate < 1.0:
        raise ValueError(f"--target-fpr expects a rate between 0 and 1 (exclusive), got {text!r}")
    return rate


def parse_half_life(text: str) -> float:
    """``"200"`` -> ``200.0``: a number of labelled messages in [1, 1e12]
    (``--prior-half-life``).

    >>> parse_half_life("200")
    200.0
    """
    value = _number(text, "--prior-half-life")
    if not 1.0 <= value <= 1e12:
        raise ValueError(f"--prior-half-life expects a number of messages in [1, 1e12], got {text!r}")
    return value

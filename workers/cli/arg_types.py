"""Argument types of the ``streamnb`` command: each turns one option's text into its value
or raises ``argparse.ArgumentTypeError`` with one line that says what was expected.

>>> port("9500"), positive_int("3"), number_in(0, 3600, "seconds", open_low=True, open_high=True)("2.5")
(9500, 3, 2.5)
>>> whole_number_in(1024, 1_000_000, "bytes")("12")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: expected 1024..1000000 bytes, got 12
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

from streamnb_workers.client.forget_since import since_ms
from streamnb_workers.replication.challenger import parse_spec
from streamnb_workers.wire.codec import DEFAULT_MAX_ENTRY_BYTES
from streamnb_workers.wire.learn_sources import check_source

__all__ = ["challenger_spec", "finite_float", "float_list", "non_negative_float", "non_negative_int",
           "number_in", "octal_mode", "port", "positive_int", "shrinkage", "since_time",
           "source_name", "whole_number_in"]


def whole_number_in(low: int, high: int | None, what: str = "a whole number",
                    expected: str | None = None) -> Callable[[str], int]:
    """The type of a whole number in ``[low, high]`` (``high`` None: no upper bound);
    ``expected`` words the error (default: from the bounds and ``what``)."""
    if expected is None:
        expected = f"{low}..{high} {what}" if high is not None else f"{what} >= {low}"

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    convert.__name__ = f"whole_number_in_{low}_{high}"
    return convert


def number_in(low: float, high: float, what: str = "a number", open_low: bool = False,
              open_high: bool = False) -> Callable[[str], float]:
    """The type of a finite number between ``low`` and ``high`` (bounds included unless
    ``open_low``/``open_high``; infinite bounds leave that side free)."""
    expected = f"{what} in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"

    def convert(text: str) -> float:
        value = finite_float(text)
        if value < low or value > high or (open_low and value == low) or (open_high and value == high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value

    convert.__name__ = f"number_in_{low:g}_{high:g}"
    return convert


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


positive_int = whole_number_in(1, None)
non_negative_int = whole_number_in(0, None)
port = whole_number_in(0, 65535, expected="a port 0..65535")
non_negative_float = number_in(0.0, math.inf, "a number")
shrinkage = number_in(0.0, 1.0, "a shrinkage")


def float_list(text: str) -> list[float]:
    try:
        return [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected numbers separated by commas (0.3,0.7), got {text!r}") from None


def max_bytes(text: str) -> int:
    """A mail size limit in bytes, from 1024 to the 8 MiB entry bound (``1048576``).

    >>> max_bytes("2097152")
    2097152
    """
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 1024 <= n <= DEFAULT_MAX_ENTRY_BYTES:
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes from 1024 to {DEFAULT_MAX_ENTRY_BYTES}, got {text!r}")
    return n


#: The units :func:`memory_size` reads.
SIZE_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
              "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}


def memory_size(text: str) -> int:
    """A memory size: bytes, or a number with a unit (KiB, MiB, GiB, TiB, KB, MB, GB, TB);
    0 for none.

    >>> memory_size("512MiB"), memory_size("1.5 GB"), memory_size("0")
    (536870912, 1500000000, 0)
    """
    t = text.strip()
    number = t.rstrip("KMGTiBb ").strip()
    unit = t[len(number):].strip().upper()
    try:
        n = float(number)
    except ValueError:
        n = -1.0
    if unit not in SIZE_UNITS or not 0 <= n < 2**63 / SIZE_UNITS[unit]:
        raise argparse.ArgumentTypeError(f"expected a size such as 512MiB or 2GB, got {text!r}")
    return int(n * SIZE_UNITS[unit])


def class_list(text: str) -> list[str] | str:
    """Declared classes, comma separated (``spam,ham``): distinct, non-empty; ``any``:
    any label is a class.

    >>> class_list("spam, ham"), class_list("any")
    (['spam', 'ham'], 'any')
    """
    if text.strip() == "any":
        return "any"
    classes = [p.strip() for p in text.split(",")]
    if not all(classes) or len(set(classes)) != len(classes) or max(map(len, classes)) > 256:
        raise argparse.ArgumentTypeError(
            f"expected distinct, non-empty class labels separated by commas (spam,ham), got {text!r}")
    return classes


def octal_mode(text: str) -> str:
    """An octal permission mode, checked and kept as text (``"660"``)."""
    try:
        mode = int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an octal mode like 660, got {text!r}") from None
    if not 0 <= mode <= 0o777:
        raise argparse.ArgumentTypeError(f"expected an octal mode 0..777, got {text!r}")
    return text


def challenger_spec(text: str) -> str:
    """A challenger SPEC (``key=value`` pairs, workers/replication/challenger.py), as given;
    which keys the model takes is checked when the worker reads its config.

    >>> challenger_spec("alpha=0.5,osb=5")
    'alpha=0.5,osb=5'
    >>> challenger_spec("alpha")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: expected key=value pairs such as alpha=0.5,osb=5, got 'alpha'
    """
    try:
        parse_spec(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected key=value pairs such as alpha=0.5,osb=5, got {text!r}") from None
    return text


def source_name(text: str) -> str:
    """A source a producer may name (workers/wire/learn_sources.py).

    >>> source_name("imap")
    'imap'
    """
    try:
        return check_source(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def since_time(text: str) -> int:
    """The type of ``forget --since TIME``: ms since the epoch, not in the future.

    >>> since_time("2026-12-07T10:00:00+01:00")
    1796634000000
    """
    try:
        value = since_ms(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value > time.time() * 1000:
        raise argparse.ArgumentTypeError(f"expected a time not in the future, got {text!r}")
    return value

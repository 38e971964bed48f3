"""Bounds on what decoding one stream entry may cost (workers/wire/codec.py): sizes,
lengths, counts, and the largest weight and value a message may carry.

>>> Limits().max_message_bytes
8388608
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "DEFAULT_MAX_ENTRY_BYTES", "DEFAULT_MAX_VALUE",
           "DEFAULT_MAX_WEIGHT", "Limits"]

#: Default bound of one encoded stream entry (8 MiB): what a worker decodes at all. Mail up
#: to it arrives whole and is cut to ``--max-bytes``; ``streamnb produce`` cuts before sending.
DEFAULT_MAX_ENTRY_BYTES = 8 << 20

#: Default bound of a message's ``weight`` (``worker --max-weight``). A message adds at most
#: weight x error_weight x its count of a token (under 8.4e6 in an 8 MiB entry) to one count:
#: with 1e6 and an error weight of 2 that is below 1.7e13, still an exact integer in float64
#: (2**53 is 9.0e15), and the float64 ceiling (1.8e308) lies 1e295 such messages away; it
#: keeps what weights are for (a message standing for many, class rebalancing) and stops one
#: entry from standing for more than a million messages.
DEFAULT_MAX_WEIGHT = 1e6

#: Default bound of the magnitude of a ``features`` value or an ``x`` coordinate. The
#: Gaussian models keep weighted squares and cross products of the values: 1e100 squared,
#: times the largest weight, is about 1e206, so no count of such messages a stream can hold
#: reaches the float64 ceiling (1.8e308), where 1e200 squared already overflows.
DEFAULT_MAX_VALUE = 1e100


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what decoding one entry may cost. Defaults suit mail. (What featurizing
    it may cost is bounded by :class:`~streamnb.features.FeatureLimits`.)

    >>> Limits().max_message_bytes
    8388608
    >>> Limits(max_message_bytes=4096).max_bin_len
    8388608
    """

    #: Size of the encoded msgpack map (the ``data`` field). Raw mail under it is decoded
    #: and then cut to the featurizer's ``max_message_bytes`` (``--max-bytes``), not refused.
    max_message_bytes: int = DEFAULT_MAX_ENTRY_BYTES
    #: Longest msgpack string / bytes / array / map (checked by msgpack while decoding).
    max_str_len: int = DEFAULT_MAX_ENTRY_BYTES
    max_bin_len: int = DEFAULT_MAX_ENTRY_BYTES
    max_array_len: int = 100_000
    max_map_len: int = 100_000
    #: Items of a ``tokens`` or ``hashes`` payload.
    max_tokens: int = 50_000
    #: Entries of a ``features`` map and of an ``x`` vector.
    max_features: int = 100_000
    #: Longest label and id (characters).
    max_label_len: int = 256
    max_id_len: int = 512
    #: Largest ``weight`` (``bad_weight`` beyond it).
    max_weight: float = DEFAULT_MAX_WEIGHT
    #: Largest magnitude of a ``features`` value or ``x`` coordinate (``too_large`` beyond).
    max_value: float = DEFAULT_MAX_VALUE

    def __post_init__(self) -> None:
        for name in ("max_weight", "max_value"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")


DEFAULT_LIMITS = Limits()

"""Constants shared by the library and the daemon."""

from __future__ import annotations

#: Version of the statistics encoding written by ``to_bytes``. Readers refuse newer versions.
STATS_FORMAT_VERSION = 1
#: Version of the model file / snapshot envelope (kind + params + statistics).
MODEL_FORMAT_VERSION = 1

#: Default number of hash bits for hashed (text, token, mail) input: 2**20 buckets.
DEFAULT_HASH_BITS = 20

#: Model kinds, as accepted by ``streamnb.models.make_model`` and ``streamnb worker --kind``.
MODEL_KINDS = ("multinomial", "bernoulli", "categorical", "gaussian", "lda", "qda", "hybrid")

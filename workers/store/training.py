"""Separate rights to score and to train: a model's training stream.

A model stored with ``training: train`` (``streamnb worker --training train``) learns only
from its training stream ``{M}:train``, which only the trainer's Redis user may write
(deploy/redis/users.acl: the scorer writes ``:in`` and reads ``:out``; the trainer writes
``:train`` and reads no model's outputs). Workers move the entries of ``:train`` into
``:in`` (workers/store/scripts/forward.lua), each with the model's token, a random
string in ``{M}:traintoken`` that only workers can read; in ``:in`` a label, delayed
label or forget without the token is a dead letter ``label_not_allowed``. Learning still
goes through the one stream ``:in``, so its order, learn-once keys and exactly-once
commits are those of any model. ``training: in`` (the default, and every model stored
before the setting existed) learns labels from ``:in`` as sent.

>>> import fakeredis
>>> from streamnb_workers.store.keys import ModelKeys
>>> r, k = fakeredis.FakeRedis(), ModelKeys("doc")
>>> _ = r.xadd(train_stream(k), {"data": b"x"})
>>> n, token = forward(r, k, 10)
>>> n, r.xlen(train_stream(k)), r.xrange(k.input)[0][1] == {b"data": b"x", b"auth": token.encode()}
(1, 0, True)
>>> forward(r, k, 10) == (0, token), holds_token({b"auth": token.encode()}, token)
(True, True)
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.lua import packaged_script
from streamnb_workers.wire.replies import as_str

__all__ = ["AUTH_FIELD", "FORWARD_SCRIPT", "TRAINING_MODES", "forward", "holds_token",
           "learning_stream", "token_key", "train_stream"]

#: ``in``: labels are learnt from ``:in`` as sent; ``train``: only from ``:train``.
TRAINING_MODES = ("in", "train")
#: The field of an ``:in`` entry moved from ``:train`` that holds the model's token.
AUTH_FIELD = "auth"

FORWARD_SCRIPT = packaged_script("forward.lua")


def train_stream(keys: ModelKeys) -> str:
    """The model's training stream ``{M}:train``: labelled entries, delayed labels and
    forgets of a model stored with ``training: train``."""
    return f"{keys.prefix}:train"


def token_key(keys: ModelKeys) -> str:
    """String ``{M}:traintoken``: the token that marks the entries moved from
    ``:train`` (only workers may read it)."""
    return f"{keys.prefix}:traintoken"


def forward(client: Any, keys: ModelKeys, count: int) -> tuple[int, str]:
    """Move at most ``count`` entries of the model's ``:train`` into its ``:in`` (atomically,
    each once); (entries moved, the model's token)."""
    n, token = FORWARD_SCRIPT(client, [train_stream(keys), keys.input, token_key(keys)],
                              [int(count), secrets.token_hex(16)])
    return int(n), as_str(token)


def holds_token(fields: dict[Any, Any], token: str) -> bool:
    """Whether the stream entry ``fields`` carries ``token`` (compared in constant time)."""
    got = fields.get(AUTH_FIELD.encode(), fields.get(AUTH_FIELD))
    if got is None:
        return False
    got = got if isinstance(got, bytes) else str(got).encode()
    return hmac.compare_digest(got, token.encode())


def learning_stream(keys: ModelKeys, training: str | None) -> str:
    """Where a producer sends labelled entries, delayed labels and forgets of a model
    stored with ``training`` (its ``:train`` or its ``:in``).

    >>> learning_stream(ModelKeys("m"), "train"), learning_stream(ModelKeys("m"), "in")
    ('streamnb:{m}:train', 'streamnb:{m}:in')
    """
    return train_stream(keys) if training == "train" else keys.input

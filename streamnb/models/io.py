"""Model construction by kind, and model files: a versioned msgpack envelope, never pickle.

The envelope is ``{"type": "model", "v": MODEL_FORMAT_VERSION, "kind", "params",
"stats"}`` with ``stats`` the encoded statistics bundle; derived parameters are not
stored (they are re-derived from the statistics on load). ``params`` are the
hyper-parameters as the model uses them: the priors it validated and copied when it
started learning, not the caller's array as it may have changed since.

>>> import numpy as np
>>> model = make_model("multinomial", alpha=0.5).fit(np.array([[1, 0], [0, 2]]), ["a", "b"])
>>> clone = loads(dumps(model))
>>> clone.get_params() == model.get_params()
True
>>> bool(np.array_equal(clone.predict_log_proba([[3, 1]]), model.predict_log_proba([[3, 1]])))
True
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from streamnb.atomic_file import write_atomic
from streamnb.encoding import check_header
from streamnb.encoding import dumps as _pack
from streamnb.encoding import loads as _unpack
from streamnb.exceptions import FormatError
from streamnb.models.base import GenerativeClassifier
from streamnb.stats.bundle import StatsBundle

#: Version of the model file / snapshot envelope (kind + params + statistics).
MODEL_FORMAT_VERSION = 1

#: Model kinds, as accepted by ``streamnb.models.make_model`` and ``streamnb worker --kind``.
MODEL_KINDS = ("multinomial", "bernoulli", "categorical", "gaussian", "lda", "qda", "hybrid")


def model_class(kind: Any) -> type[GenerativeClassifier]:
    """The model class of ``kind``, one of :data:`MODEL_KINDS`.

    >>> model_class("gaussian").__name__
    'GaussianNB'
    """
    if not isinstance(kind, str) or kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {sorted(MODEL_KINDS)}")
    # deferred: the package streamnb.models imports this module before its model classes
    from streamnb import models

    return next(cls for cls in map(models.__dict__.get, models.__all__)
                if isinstance(cls, type) and getattr(cls, "kind", None) == kind)


def _check_params(cls: type[GenerativeClassifier], params: dict[str, Any]) -> None:
    valid = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(params) - set(valid))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for {cls.kind!r}; valid parameters: {valid}"
        )


def make_model(kind: str, **params: Any) -> GenerativeClassifier:
    """A new model of ``kind`` (e.g. ``"multinomial"``) with hyper-parameters ``params``,
    checked (ValueError for an unknown name or a value out of range)."""
    cls = model_class(kind)
    _check_params(cls, params)
    return cls(**params).validate_params()


def dumps(model: GenerativeClassifier) -> bytes:
    """Encode a model (kind, hyper-parameters as it uses them, statistics) as bytes;
    ValueError for a hyper-parameter out of its range."""
    if not isinstance(model, GenerativeClassifier):
        raise ValueError(f"expected a streamnb model, got {type(model).__name__}")
    return _pack(
        {
            "type": "model",
            "v": MODEL_FORMAT_VERSION,
            "kind": model.kind,
            "params": model._params_in_use(),
            "stats": model.stats.encode(),
        }
    )


def loads(data: bytes) -> GenerativeClassifier:
    """Decode bytes written by :func:`dumps`; FormatError for anything else."""
    obj = _unpack(data)
    check_header(obj, "model", MODEL_FORMAT_VERSION)
    kind, params, stats = obj.get("kind"), obj.get("params"), obj.get("stats")
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        raise FormatError("model file: params must be a map of names to values")
    try:
        cls = model_class(kind)
        _check_params(cls, params)
    except ValueError as exc:
        raise FormatError(f"model file: {exc}") from None
    bundle = StatsBundle.decode(stats)
    try:
        return cls.from_stats(bundle, **params)  # type: ignore[arg-type]
    except FormatError:
        raise
    except (TypeError, ValueError) as exc:
        raise FormatError(f"model file: statistics or parameters do not fit a {kind}: {exc}") from None


def save(model: GenerativeClassifier, path: str | os.PathLike[str]) -> None:
    """Write ``model`` to ``path`` atomically (a temporary file renamed over it)."""
    write_atomic(path, dumps(model))


def load(path: str | os.PathLike[str]) -> GenerativeClassifier:
    """Read a model written by :func:`save`."""
    return loads(Path(path).read_bytes())

"""A model's configuration, stored once in ``streamnb:{NAME}:config`` and fixed for good.

The caller (``streamnb worker``) gives a :class:`ModelSpec`; :func:`ensure_config` creates
the ``:config`` hash atomically if absent, or checks the spec against it: every field the
caller set must equal the stored one, else :class:`~streamnb.exceptions.ConfigConflict`
names each differing key with the stored and the given value. Fields the caller left as
None are taken from the stored config.

Stored hash fields (JSON text, so ``redis-cli HGETALL`` is readable): ``format`` (config
format version), ``kind``, ``model_params`` (normalised by the model's ``get_params()``),
``featurizer`` (the full featurizer config), ``decision`` (decision-rule options),
``half_life`` (forgetting half-life in learnt messages, or null), ``error_weight`` (a
labelled message whose verdict was wrong is learnt with this many times its weight; 1:
every message alike; a config stored without it means 1), ``classes`` (the declared
classes, a list of str, or null: any label is a class), ``explain`` (K: the outputs carry
the K tokens that moved each prediction, docs/worker.md; 0: none), ``training`` (``in`` or
``train``: where labels are learnt from, workers/store/training.py), ``created`` (unix
time). A config stored without ``classes`` reads as null, ``explain`` 0, ``training`` in.

Defaults filled in at creation for hashed (sparse) input: ``n_features`` = the number of
featurizer columns and ``smoothing_m = "seen"`` when the model has such parameters; for
hashed mail with a count model, alpha, and the mail decision defaults
(:data:`MAIL_DECISION_DEFAULTS`) for the options the spec leaves out and ``error_weight``
:data:`DEFAULT_ERROR_WEIGHT` (other models: 1).

>>> import fakeredis
>>> r = fakeredis.FakeRedis()
>>> cfg = ensure_config(r, ModelSpec("mail", kind="multinomial", model_params={"alpha": 0.5},
...                                  featurizer_config={"bits": 12}))
>>> cfg.kind, cfg.model_params["alpha"], cfg.model_params["n_features"]
('multinomial', 0.5, 4096)
>>> ensure_config(r, ModelSpec("mail")).model_params == cfg.model_params
True
>>> ensure_config(r, ModelSpec("mail", kind="bernoulli"))
Traceback (most recent call last):
...
streamnb.exceptions.ConfigConflict: model 'mail' is stored with a different configuration: kind: stored 'multinomial', given 'bernoulli'
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from typing import Any

import redis

from streamnb.exceptions import ConfigConflict, SettingsError
from streamnb_workers.defaults import (
    DEFAULT_ERROR_WEIGHT,
    DEFAULT_MAIL_ALPHA,
    MAIL_DECISION_DEFAULTS,
)
from streamnb_workers.store.config_checks import (
    check_classes,
    check_error_weight,
    check_training,
    stored_classes,
)
from streamnb_workers.store.keys import MAX_SHARDS, ModelKeys, check_model_name
from streamnb_workers.store.lua import LuaScript
from streamnb_workers.wire.replies import as_str

#: Version of the stored config layout.
CONFIG_FORMAT_VERSION = 1
#: ``ModelSpec(classes=ANY_CLASS)`` (``streamnb worker --classes any``): any label is a class.
ANY_CLASS = "any"
#: Model kinds that take dense ``x`` vectors (their featurizer needs input="dense", dim).
DENSE_KINDS = ("gaussian", "lda", "qda")

_CREATE = LuaScript("""
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HGETALL', KEYS[1]) end
redis.call('HSET', KEYS[1], unpack(ARGV))
return {}
""")


@dataclass
class ModelSpec:
    """What a worker is asked to serve for one model name; None means "as stored".

    ``decision``: options of :class:`streamnb.decision.DecisionRule` (``to_dict`` form).
    ``half_life``: forgetting half-life in learnt messages (None: never forget).
    ``error_weight``: the weight factor of a message learnt after a wrong verdict
    (None: :data:`DEFAULT_ERROR_WEIGHT` for a new count model of hashed mail, else 1;
    1 turns it off).
    ``classes``: the only labels the model learns (None: as stored, else
    ``default_classes``; ``"any"``: any label is a class).
    ``default_classes``: the classes a new count model of hashed mail gets when
    ``classes`` is None (``streamnb worker`` gives :data:`MAIL_CLASSES`: a mistyped label
    is a dead letter, not a class); read only when the model is created.
    ``shards``: K statistics shards (workers/replication/shards.py; None: as stored, 1 for a new model).

    >>> ModelSpec("mail", kind="multinomial").name
    'mail'
    >>> ModelSpec("mail", classes=["spam", "spam"])
    Traceback (most recent call last):
    ...
    ValueError: classes must be distinct, non-empty labels of at most 256 characters, got ['spam', 'spam']
    """

    name: str
    kind: str | None = None
    model_params: dict[str, Any] | None = None
    featurizer_config: dict[str, Any] | None = None
    decision: dict[str, Any] | None = None
    half_life: float | None = None
    error_weight: float | None = None
    classes: list[str] | str | None = None
    shards: int | None = None
    default_classes: list[str] | None = None
    explain: int | None = None
    training: str | None = None

    def __post_init__(self) -> None:
        if self.training is not None:
            check_training(self.training)
        check_model_name(self.name, shard=True)
        if self.shards is not None and (isinstance(self.shards, bool) or not isinstance(
                self.shards, int) or not 1 <= self.shards <= MAX_SHARDS):
            raise ValueError(f"shards must be an integer in 1..{MAX_SHARDS}, got {self.shards!r}")
        if self.classes is not None and self.classes != ANY_CLASS:
            self.classes = check_classes(self.classes)
        if self.explain is not None and (type(self.explain) is not int or self.explain < 0):
            raise ValueError(f"explain must be an integer >= 0, got {self.explain!r}")
        if self.default_classes is not None:
            self.default_classes = check_classes(self.default_classes)
        if self.half_life is not None and not (float(self.half_life) > 0):
            raise ValueError(f"half_life must be > 0 learnt messages, got {self.half_life}")
        if self.error_weight is not None:
            check_error_weight(self.error_weight)


@dataclass
class ModelConfig:
    """The resolved, stored configuration of one model."""

    name: str
    kind: str
    model_params: dict[str, Any]
    featurizer: dict[str, Any]
    decision: dict[str, Any] = field(default_factory=dict)
    half_life: float | None = None
    error_weight: float = 1.0
    classes: list[str] | None = None
    shards: int = 1
    explain: int = 0
    training: str = "in"
    format: int = CONFIG_FORMAT_VERSION
    created: float = 0.0

    def to_hash(self) -> dict[str, str]:
        return {
            "format": str(self.format),
            "kind": self.kind,
            "model_params": _canon(self.model_params),
            "featurizer": _canon(self.featurizer),
            "decision": _canon(self.decision),
            "half_life": _canon(self.half_life),
            "error_weight": _canon(self.error_weight),
            "classes": _canon(self.classes),
            "shards": str(self.shards),
            "explain": str(self.explain),
            "training": self.training,
            "created": repr(float(self.created)),
        }

    @classmethod
    def from_hash(cls, name: str, h: dict[Any, Any]) -> ModelConfig:
        h = {as_str(k): as_str(v) for k, v in h.items()}
        try:
            fmt = int(h["format"])
            if fmt > CONFIG_FORMAT_VERSION:
                raise ConfigConflict(
                    f"model {name!r} config format {fmt} is newer than this streamnb understands "
                    f"(<= {CONFIG_FORMAT_VERSION}); upgrade streamnb")
            return cls(name=name, kind=h["kind"], model_params=json.loads(h["model_params"]),
                       featurizer=json.loads(h["featurizer"]),
                       decision=json.loads(h.get("decision", "{}")),
                       half_life=json.loads(h.get("half_life", "null")),
                       error_weight=check_error_weight(json.loads(h.get("error_weight", "1"))),
                       classes=stored_classes(name, h.get("classes", "null")),
                       shards=int(h.get("shards", "1")), explain=int(h.get("explain", "0")), format=fmt,
                       training=check_training(h.get("training", "in")),
                       created=float(h.get("created", 0.0)))
        except (KeyError, ValueError) as exc:
            if isinstance(exc, ConfigConflict):
                raise
            raise ConfigConflict(f"model {name!r} has an unreadable stored config: {exc}") from None

    def make_featurizer(self, max_bytes: int | None = None) -> Any:
        """The model's featurizer; ``max_bytes``: raw mail read (larger mail is cut; None:
        the default, 1 MiB). A worker's setting, not the model's: what is learnt goes to
        every replica as a delta, whatever cut the mail."""
        # deferred: the feature code (streamnb.features) only where a model is served
        from streamnb.features import DEFAULT_FEATURE_LIMITS, Featurizer

        if max_bytes is None:
            return Featurizer.from_config(self.featurizer)
        limits = replace(DEFAULT_FEATURE_LIMITS, max_message_bytes=int(max_bytes))
        return Featurizer.from_config(self.featurizer, limits)

    def make_model(self) -> Any:
        from streamnb.models import make_model  # deferred: the model classes (~0.8 s)

        return make_model(self.kind, **self.model_params)

    def make_decision_rule(self) -> Any:
        from streamnb.decision import DecisionRule  # deferred: with the model classes

        return DecisionRule.from_dict(self.decision)

    @property
    def decay_every(self) -> int:
        """K: a decay event every K learnt messages (0: no forgetting)."""
        if not self.half_life:
            return 0
        return max(1, int(self.half_life // 20))

    @property
    def decay_factor(self) -> float:
        """g = 0.5 ** (K / H), so the weight halves every H learnt messages."""
        return 0.5 ** (self.decay_every / float(self.half_life)) if self.half_life else 1.0


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"))


def _model_class(kind: str) -> type:
    from streamnb.models import model_class  # deferred: the model classes (~0.8 s)

    return model_class(kind)


def resolve_spec(spec: ModelSpec) -> ModelConfig:
    """A complete config from a spec that gives at least a kind (defaults filled in)."""
    from streamnb.features import Featurizer  # deferred: the feature code, when resolved

    if spec.kind is None:
        raise ValueError(f"model {spec.name!r} has no stored config yet: give its kind")
    cls = _model_class(spec.kind)
    fcfg = spec.featurizer_config
    if fcfg is None:
        if spec.kind in DENSE_KINDS:
            raise ValueError(
                f"a {spec.kind} model needs a featurizer config with input='dense' and dim")
        fcfg = {}
    if spec.kind == "hybrid":
        if fcfg.get("meta") is False:
            raise ValueError("a hybrid model needs the mail meta features: featurizer meta=true")
        fcfg = {**fcfg, "meta": True}
    elif fcfg.get("meta"):
        raise ValueError(f"featurizer meta=true needs kind 'hybrid', not {spec.kind!r}")
    featurizer = Featurizer.from_config(fcfg)
    params = dict(spec.model_params or {})
    defaults = cls().get_params()
    if featurizer.input == "sparse":
        if "n_features" in defaults and params.get("n_features") is None:
            params["n_features"] = featurizer.n_columns
        if "smoothing_m" in defaults and "smoothing_m" not in params:
            params["smoothing_m"] = "seen"
        # Measured on the SpamAssassin replay (docs/features.md): alpha 0.1 reaches 98.5%
        # accuracy on hashed mail tokens where alpha 1.0 misses 18% of the spam.
        if "alpha" in defaults and params.get("alpha") is None:
            params["alpha"] = DEFAULT_MAIL_ALPHA
        if "n_meta" in defaults:
            params["n_meta"] = featurizer.n_meta
    model = cls(**params).validate_params()
    decision = dict(spec.decision or {})
    hashed_counts = featurizer.input == "sparse" and "alpha" in defaults
    if hashed_counts:
        # Chosen on the earlier part of the SpamAssassin replay, checked on the later part
        # (docs/features.md): a score that ranks mail of every length alike, and no
        # verdict to act on while a class has barely been seen.
        decision = {**MAIL_DECISION_DEFAULTS, **decision}
    from streamnb.decision import DecisionRule  # deferred: with the model classes

    decision = DecisionRule.from_dict(decision).to_dict()
    return ModelConfig(name=spec.name, kind=spec.kind, model_params=model.get_params(),
                       featurizer=featurizer.config, decision=decision,
                       half_life=None if spec.half_life is None else float(spec.half_life),
                       error_weight=(check_error_weight(spec.error_weight)
                                     if spec.error_weight is not None
                                     else DEFAULT_ERROR_WEIGHT if hashed_counts else 1.0),
                       classes=_new_classes(spec, hashed_counts), shards=spec.shards or 1,
                       explain=spec.explain or 0, training=spec.training or "in",
                       created=time.time())


def _new_classes(spec: ModelSpec, hashed_counts: bool) -> list[str] | None:
    """The classes a new model is stored with (see :class:`ModelSpec`)."""
    if spec.classes == ANY_CLASS:
        return None
    if spec.classes is None and hashed_counts:
        return spec.default_classes
    return spec.classes  # type: ignore[return-value]


#: The fields of a stored config (:meth:`ModelConfig.to_hash`), read with HMGET, which
#: ``streamnb-scorer`` may run on a config (deploy/redis/users.acl).
CONFIG_FIELDS = ("format", "kind", "model_params", "featurizer", "decision", "half_life",
                 "error_weight", "classes", "shards", "explain", "training", "created")


def read_config(client: Any, name: str) -> ModelConfig | None:
    """The stored config of model ``name``, or None if it has none."""
    values = client.hmget(ModelKeys(name).config, CONFIG_FIELDS)
    h = {k: v for k, v in zip(CONFIG_FIELDS, values, strict=True) if v is not None}
    return ModelConfig.from_hash(name, h) if h else None


def differences(stored: ModelConfig, spec: ModelSpec) -> list[tuple[str, Any, Any]]:
    """(key, stored, given) for every field the spec sets that differs from the stored one."""
    diffs: list[tuple[str, Any, Any]] = []
    if spec.kind is not None and spec.kind != stored.kind:
        return [("kind", stored.kind, spec.kind)]
    if spec.model_params is not None or spec.featurizer_config is not None:
        given = resolve_spec(ModelSpec(
            spec.name, stored.kind,
            spec.model_params if spec.model_params is not None else stored.model_params,
            spec.featurizer_config if spec.featurizer_config is not None else stored.featurizer))
        diffs += _dict_diff("model_params", stored.model_params, given.model_params)
        diffs += _dict_diff("featurizer", stored.featurizer, given.featurizer)
    if spec.decision is not None:
        from streamnb.decision import DecisionRule  # deferred: with the model classes

        # options a model stored without (made before they existed) are not filled in
        filled = {k: stored.decision[k] for k in MAIL_DECISION_DEFAULTS if k in stored.decision}
        given_d = DecisionRule.from_dict({**filled, **spec.decision}).to_dict()
        diffs += _dict_diff("decision", stored.decision, json.loads(_canon(given_d)))
    if spec.half_life is not None and float(spec.half_life) != stored.half_life:
        diffs.append(("half_life", stored.half_life, float(spec.half_life)))
    if spec.error_weight is not None and float(spec.error_weight) != stored.error_weight:
        diffs.append(("error_weight", stored.error_weight, float(spec.error_weight)))
    given_classes = None if spec.classes == ANY_CLASS else spec.classes
    if spec.classes is not None and given_classes != stored.classes:
        diffs.append(("classes", stored.classes, given_classes))
    if spec.shards is not None and spec.shards != stored.shards:
        diffs.append(("shards", stored.shards, spec.shards))
    for name in ("explain", "training"):
        if getattr(spec, name) is not None and getattr(spec, name) != getattr(stored, name):
            diffs.append((name, getattr(stored, name), getattr(spec, name)))
    return diffs


def _dict_diff(prefix: str, stored: dict, given: dict) -> list[tuple[str, Any, Any]]:
    out = []
    for k in sorted(set(stored) | set(given), key=str):
        a, b = stored.get(k), given.get(k)
        if json.loads(_canon(a)) != json.loads(_canon(b)):
            out.append((f"{prefix}.{k}", a, b))
    return out


def ensure_config(client: Any, spec: ModelSpec) -> ModelConfig:
    """Create ``:config`` from ``spec`` if absent, else verify ``spec`` against it."""
    key = ModelKeys(spec.name).config
    existing = client.hgetall(key)
    if not existing:
        cfg = resolve_spec(spec)
        flat: list[str] = []
        for k, v in cfg.to_hash().items():
            flat += [k, v]
        reply = _CREATE(client, [key], flat)
        if not reply:
            return cfg
        existing = dict(zip(reply[::2], reply[1::2], strict=True))  # created meanwhile
    stored = ModelConfig.from_hash(spec.name, existing)
    diffs = differences(stored, spec)
    if diffs:
        detail = "; ".join(f"{k}: stored {a!r}, given {b!r}" for k, a, b in diffs)
        exc = ConfigConflict(
            f"model {spec.name!r} is stored with a different configuration: {detail}")
        exc.differences = diffs  # type: ignore[attr-defined]
        raise exc
    return stored


#: Models named at most in the error of :func:`require_model`.
LISTED_MODELS = 20


def stored_models(client: Any) -> list[str]:
    """Names of the models with a stored config, sorted (``SCAN`` for their config keys;
    on a cluster, every primary).

    >>> import fakeredis
    >>> r = fakeredis.FakeRedis()
    >>> for name in ("news", "mail"):
    ...     _ = ensure_config(r, ModelSpec(name, kind="multinomial"))
    >>> stored_models(r)
    ['mail', 'news']
    """
    head, tail = ModelKeys("x").config.split("x")
    names = set()
    for key in client.scan_iter(match=f"{head}*{tail}", count=1000):
        name = as_str(key)[len(head):-len(tail)]
        try:
            names.add(check_model_name(name))
        except ValueError:
            continue  # not a key this package wrote
    return sorted(names)


def require_model(client: Any, name: str, hint: str = "") -> None:
    """Raise :class:`SettingsError` (one line, exit 2) naming the models that exist if
    model ``name`` has no stored config; ``hint`` ends the message.

    >>> import fakeredis
    >>> r = fakeredis.FakeRedis()
    >>> _ = ensure_config(r, ModelSpec("mail", kind="multinomial"))
    >>> require_model(r, "mail")
    >>> require_model(r, "mial")
    Traceback (most recent call last):
    ...
    streamnb.exceptions.SettingsError: model 'mial' does not exist (no worker has served it); models in this Redis database: mail
    """
    if client.exists(ModelKeys(name).config):
        return
    try:
        names = stored_models(client)
    except redis.exceptions.NoPermissionError:  # a Redis user without SCAN
        raise SettingsError(f"model {name!r} does not exist (no worker has served it); this "
                            f"Redis user may not list the others (SCAN){hint}") from None
    listed = ", ".join(names[:LISTED_MODELS]) + (
        f" and {len(names) - LISTED_MODELS} more" if len(names) > LISTED_MODELS else "")
    raise SettingsError(f"model {name!r} does not exist (no worker has served it); "
                        + (f"models in this Redis database: {listed}" if names
                           else "this Redis database holds no model") + hint)

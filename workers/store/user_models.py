"""Per-user and per-domain models of a global model: their names and their registry.

A per-user model is a model of its own (its own hash tag, streams, log, snapshot and
learn-once keys) whose name the address gives, by a template over the address's local
part and domain; the workers predict a user's mail with the global model's statistics
plus the user's own (workers/replication/user_sum.py). ``streamnb:{G}:users``, a set in
the global model ``G``'s slot, lists the per-user and per-domain models of ``G``: a model
is chosen for a mail only once it is registered there, and the workers of ``G`` started
with ``--per-user`` serve every model registered there. The set is bounded
(``max_users``: :func:`register` refuses a name past it), since every worker of ``G``
serves every model registered there.

**Names.** The templates' fields are ``{model}`` (the global model), ``{local}`` and
``{domain}``; the defaults are :data:`USER_TEMPLATE` and :data:`DOMAIN_TEMPLATE`. The
address is taken in lower case (``Alice@Example.org`` is ``alice@example.org``: a mail
system's local parts are case-insensitive in practice), then each of ``{local}`` and
``{domain}`` is escaped: letters, digits, ``.`` and ``-`` stay, every other byte of its
UTF-8 (``_`` itself, ``+``, ``@``...) becomes ``_`` and two hex digits. Escaping is
one-to-one, so two addresses never share a name, and ``_40`` (an ``@``) can only be the
one the template puts between local part and domain. A name longer than the 100
characters model names allow becomes ``{model}.uh.`` (a domain's: ``{model}.dh.``) and
32 hex digits of the address's BLAKE2b-128 hash.

>>> names = UserNames("mail")
>>> names.user("Alice@Example.org"), names.domain("example.org")
('mail.u.alice_40example.org', 'mail.d.example.org')
>>> names.user("a+tag_x@b.org"), names.user("a_2btag@b.org")
('mail.u.a_2btag_5fx_40b.org', 'mail.u.a_5f2btag_40b.org')
>>> names.user("x" * 64 + "@" + "d" * 30 + ".example.org")
'mail.uh.29dbd95235c46fd4ee0deebf751566f4'
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from streamnb_workers.store.keys import ModelKeys, check_model_name
from streamnb_workers.store.lua import LuaScript
from streamnb_workers.wire.replies import as_str

__all__ = ["DOMAIN_TEMPLATE", "USER_TEMPLATE", "UserNames", "escape_part", "register",
           "registered", "registry_key", "user_models"]

USER_TEMPLATE = "{model}.u.{local}_40{domain}"
DOMAIN_TEMPLATE = "{model}.d.{domain}"
#: What an escaped part keeps as it is.
_KEPT = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")
#: A model name's longest.
MAX_NAME = 100


def escape_part(text: str) -> str:
    """``text`` in lower case with every character but ``a-z0-9.-`` as ``_`` and the hex
    of its UTF-8 bytes (one-to-one)."""
    return "".join(c if c in _KEPT else "".join(f"_{b:02x}" for b in c.encode("utf-8"))
                   for c in text.lower())


def registry_key(model: str) -> str:
    """The set of the per-user and per-domain models of ``model`` (its slot)."""
    return f"{ModelKeys(model).prefix}:users"


class UserNames:
    """The per-user and per-domain model names of the global model ``model``."""

    def __init__(self, model: str, user_template: str = USER_TEMPLATE,
                 domain_template: str = DOMAIN_TEMPLATE) -> None:
        self.model = check_model_name(model)
        self.user_template = user_template
        self.domain_template = domain_template
        for template, fields in ((user_template, {"local": "l", "domain": "d"}),
                                 (domain_template, {"domain": "d"})):
            try:
                check_model_name(template.format(model=model, **fields))
            except (KeyError, IndexError, ValueError) as exc:
                raise ValueError(f"per-user template {template!r} does not make a model "
                                 f"name of {model!r}: {exc}") from None
        if len(model) + 36 > MAX_NAME:
            raise ValueError(f"model name {model!r} is too long for per-user models "
                             f"(at most {MAX_NAME - 36} characters)")

    def user(self, address: str) -> str:
        """The model of the address ``local@domain``."""
        local, _, domain = address.lower().rpartition("@")
        name = self.user_template.format(model=self.model, local=escape_part(local),
                                         domain=escape_part(domain))
        return self._fit(name, "uh", address.lower())

    def domain(self, domain: str) -> str:
        """The model of the domain ``domain``."""
        name = self.domain_template.format(model=self.model, domain=escape_part(domain))
        return self._fit(name, "dh", domain.lower())

    def _fit(self, name: str, kind: str, what: str) -> str:
        if len(name) <= MAX_NAME:
            return name
        digest = hashlib.blake2b(what.encode("utf-8"), digest_size=16).hexdigest()
        return f"{self.model}.{kind}.{digest}"


def registered(client: Any, model: str, names: Sequence[str]) -> list[bool]:
    """Whether each of ``names`` is a registered per-user or per-domain model of ``model``
    (one SMISMEMBER)."""
    if not names:
        return []
    return [bool(v) for v in client.smismember(registry_key(model), list(names))]


#: SADD of ARGV[1] unless the set holds ARGV[2] (> 0) members already: 1 added, 0 a
#: member already, -1 refused (full). One script: two clients registering at once cannot
#: both take the last place.
_REGISTER = LuaScript("""
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 0 end
local limit = tonumber(ARGV[2])
if limit > 0 and redis.call('SCARD', KEYS[1]) >= limit then return -1 end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
""")


def register(client: Any, model: str, name: str, limit: int = 0) -> bool | None:
    """Register ``name`` as a per-user or per-domain model of ``model``: True if it is
    new, False if it was registered, None if refused because ``limit`` models (> 0; 0:
    no bound) are registered already.

    >>> import fakeredis
    >>> r = fakeredis.FakeRedis()
    >>> [register(r, "m", n, limit=2) for n in ("m.u.a", "m.u.a", "m.u.b", "m.u.c")]
    [True, False, True, None]
    >>> register(r, "m", "m.u.c")
    True
    """
    if limit <= 0:
        return bool(client.sadd(registry_key(model), name))
    added = int(_REGISTER(client, [registry_key(model)], [name, int(limit)]))
    return None if added < 0 else bool(added)


def user_models(client: Any, model: str) -> list[str]:
    """The registered per-user and per-domain models of ``model``, sorted."""
    return sorted(as_str(v) for v in client.smembers(registry_key(model)))

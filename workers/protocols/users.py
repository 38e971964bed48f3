"""Which model answers for a user: the spamd ``User:`` header, Rspamd's ``Deliver-To``,
``Rcpt`` and ``User`` headers, the milter's recipients, pipe mode's ``--user``.

:class:`ModelChooser` is the one place that turns a user into a model. Without per-user
models (``names`` None) every user gets the global model. With them
(workers/store/user_models.py), an address ``local@domain`` gets its own model if that is
registered, else its domain's if that is, else the global model; ``@domain`` names the
domain's model. A bare name without ``@`` (spamc sends the Unix user running it: ``root``)
is not an address and always gets the global model.

What a user learns (TELL, ``/learnspam``, ``/learnham``) goes to the user's model (the
domain's for ``@domain``), which the first learning registers (SADD, a producer's right);
the workers of the global model that serve per-user models create its config from the
global model's and serve it. It goes to the global model, which the operator trains,
only once ``max_users`` models are registered and neither the user's nor its domain's
is: otherwise one user's corrections change only that user's verdicts, as with
SpamAssassin's per-user Bayes (``sa-learn -u``) and Rspamd's ``per_user`` statistics.

>>> chooser = ModelChooser("mail")
>>> chooser.model_for("alice@example.org"), chooser.model_for("root"), chooser.model_for(None)
('mail', 'mail', 'mail')
>>> address_of(" Alice <alice@Example.org> "), address_of("root"), address_of("a@b@c")
('alice@example.org', None, None)
>>> import fakeredis
>>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
>>> r = fakeredis.FakeRedis()
>>> _ = ensure_config(r, ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 4}))
>>> chooser = ModelChooser("mail", UserNames("mail"))
>>> chooser.model_for("alice@example.org", r), chooser.learning_model("alice@example.org", r)
('mail', 'mail.u.alice_40example.org')
>>> chooser.model_for("Alice@example.org", r), chooser.model_for("bob@example.org", r)
('mail.u.alice_40example.org', 'mail')
>>> chooser.learning_model("@example.org", r), chooser.model_for("bob@example.org", r)
('mail.d.example.org', 'mail.d.example.org')
>>> chooser.learning_model("root", r)
'mail'
>>> chooser.model_for_all(["<alice@example.org>", "bob@example.org"], r)
'mail'
>>> chooser.model_for_all(["<carol@example.org>", "bob@example.org"], r)
'mail.d.example.org'

Past ``max_users`` registered models, a new user learns into its domain's model, else the
global one:

>>> full = []
>>> chooser = ModelChooser("mail", UserNames("mail"), max_users=2, on_full=lambda: full.append(1))
>>> chooser.learning_model("carol@example.org", r), chooser.learning_model("dan@other.org", r)
('mail.d.example.org', 'mail')
>>> chooser.learning_model("alice@example.org", r), len(full)
('mail.u.alice_40example.org', 2)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from streamnb_workers.store.user_models import UserNames, register, registered

__all__ = ["ModelChooser", "UserNames", "address_of", "domain_of", "first_user"]

#: A user's address as far as choosing a model goes: one ``@``, no space or control.
_ADDRESS = re.compile(r"^[^\s@<>]{1,64}@[^\s@<>]{1,255}$")


def address_of(user: str | None) -> str | None:
    """The address in ``user`` (angle brackets and a display name dropped, the domain in
    lower case), or None when it holds none: a bare Unix name, nothing, or garbage."""
    if not user:
        return None
    text = user.strip()
    if "<" in text and text.endswith(">"):
        text = text[text.rindex("<") + 1:-1].strip()
    if not _ADDRESS.match(text):
        return None
    local, _, domain = text.partition("@")
    return f"{local}@{domain.lower()}"


def domain_of(user: str | None) -> str | None:
    """The domain in ``user`` when it is ``@domain`` alone (lower case), else None."""
    text = (user or "").strip()
    if text.startswith("@") and _ADDRESS.match("x" + text):
        return text[1:].lower()
    return None


def first_user(candidates: Iterable[str | None]) -> str | None:
    """The first of ``candidates`` that is given (Rspamd: ``Deliver-To``, then ``Rcpt``,
    then ``User``)."""
    return next((c for c in candidates if c), None)


class ModelChooser:
    """The model for a user: per-user, else per-domain, else ``default`` (the global
    model); only ``default`` without ``names``. The look-ups take a Redis client (none:
    the global model)."""

    def __init__(self, default: str, names: UserNames | None = None, max_users: int = 0,
                 on_full: Callable[[], Any] | None = None) -> None:
        self.default = default
        self.names = names
        #: The most per-user and per-domain models registered (0: no bound), and what is
        #: called when a user's learning is refused a model of its own for it.
        self.max_users = max_users
        self.on_full = on_full

    def candidates(self, user: str | None) -> list[str]:
        """The per-user then per-domain model names ``user`` could have, best first."""
        if self.names is None:
            return []
        domain = domain_of(user)
        if domain is not None:
            return [self.names.domain(domain)]
        address = address_of(user)
        if address is None:
            return []
        return [self.names.user(address), self.names.domain(address.rpartition("@")[2])]

    def model_for(self, user: str | None, client: Any = None) -> str:
        """The model that scores ``user``'s mail: the first registered candidate."""
        names = self.candidates(user) if client is not None else []
        found = registered(client, self.default, names)
        return next((n for n, ok in zip(names, found, strict=True) if ok), self.default)

    def model_for_all(self, users: Iterable[str | None], client: Any = None) -> str:
        """The model that scores a mail for all of ``users`` (a mail's envelope
        recipients): the one they share, else the global model. One pass gives one
        verdict; the first recipient's model would judge the others' mail by the first
        one's statistics (Rspamd's ``per_user`` takes the first; spamass-milter, like
        this, the default user for several recipients)."""
        models = {self.model_for(user, client) for user in users}
        return models.pop() if len(models) == 1 else self.default

    def learning_model(self, user: str | None, client: Any = None) -> str:
        """The model ``user``'s learning goes to: its own (registered if new), the global
        model for a user without an address. With ``max_users`` models registered, a new
        one is not: the learning goes to the user's domain model if that is registered,
        else to the global model, and ``on_full`` is called."""
        names = self.candidates(user) if client is not None else []
        if not names:
            return self.default
        if register(client, self.default, names[0], self.max_users) is not None:
            return names[0]
        if self.on_full is not None:
            self.on_full()
        rest = names[1:]
        found = registered(client, self.default, rest)
        return next((n for n, ok in zip(rest, found, strict=True) if ok), self.default)

"""Which model answers for a user: the spamd ``User:`` header, Rspamd's ``Deliver-To``,
``Rcpt`` and ``User`` headers.

Every request names (or may name) whom a mail is for. :class:`ModelChooser` is the one
place that turns that into a model name, so that per-user or per-domain models can be
chosen here later without touching the protocols. Today it maps every user to the
configured model: an address (``local@domain``) would be the one a per-user model is
chosen by; a bare name without ``@`` (spamc sends the Unix user running it: ``root``) is
not an address and always gets the global model.

>>> chooser = ModelChooser("mail")
>>> chooser.model_for("alice@example.org"), chooser.model_for("root"), chooser.model_for(None)
('mail', 'mail', 'mail')
>>> address_of(" Alice <alice@Example.org> "), address_of("root"), address_of("a@b@c")
('alice@example.org', None, None)
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["ModelChooser", "address_of", "first_user"]

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


def first_user(candidates: Iterable[str | None]) -> str | None:
    """The first of ``candidates`` that is given (Rspamd: ``Deliver-To``, then ``Rcpt``,
    then ``User``)."""
    return next((c for c in candidates if c), None)


class ModelChooser:
    """The model for a user: a per-user model once there are any, else ``default`` (the
    global model). A bare name without ``@`` always gets the global model."""

    def __init__(self, default: str) -> None:
        self.default = default

    def model_for(self, user: str | None) -> str:
        address = address_of(user)
        if address is None:
            return self.default
        return self.for_address(address)

    def for_address(self, address: str) -> str:
        """The model of ``address`` (one place for a per-user template later): the global
        model for every address today."""
        del address
        return self.default

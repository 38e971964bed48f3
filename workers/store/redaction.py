"""Secrets kept out of logs, errors and outputs: the password of every URL, and every
secret registered (a password read from a file or the environment).

>>> redact_url("redis://alice:s3cret@db:6379/0")
'redis://alice:***@db:6379/0'
>>> redact_url("rediss://:s3cret@db"), redact_url("redis://db:6379/0")
('rediss://:***@db', 'redis://db:6379/0')
>>> redact("connecting to redis://alice:s3cret@db:6379/0")
'connecting to redis://alice:***@db:6379/0'
"""

from __future__ import annotations

import logging
import re

__all__ = ["RedactingFilter", "redact", "redact_url", "register_secret"]

#: The password part of a URL: what lies between ``scheme://user:`` and the last ``@``
#: before the next white space (a password may hold an ``@`` or a ``/``).
_URL_PASSWORD = re.compile(r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<pw>\S*)(?P<at>@)")
_SECRETS: set[str] = set()


def redact_url(url: str) -> str:
    """The URL (or any text) with the password of every URL in it replaced by ``***``."""
    return _URL_PASSWORD.sub(lambda m: f"{m['pre']}***{m['at']}", url)


def register_secret(secret: str) -> None:
    """Remember a secret so :func:`redact` hides it wherever it appears."""
    if secret:
        _SECRETS.add(secret)


def redact(text: str) -> str:
    """Hide URL passwords and every registered secret in ``text``.

    >>> register_secret("hunter2")
    >>> redact("login with hunter2 at redis://u:pw@h")
    'login with *** at redis://u:***@h'
    """
    text = redact_url(text)
    for s in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(s, "***")
    return text


class RedactingFilter(logging.Filter):
    """A logging filter that redacts secrets from the formatted message of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = redact(msg)
        if clean != msg or record.args:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True

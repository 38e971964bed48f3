"""What ``streamnb produce`` refuses before sending anything, or skips: a directory that
holds no file, a file that is not mail, a label outside the model's declared classes.

>>> not_mail(b"From a@b Mon Jan  1 00:00:00 2024\\nSubject: x\\n\\nbody") is None
True
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from streamnb.exceptions import StreamnbError
from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import stored_classes
from streamnb_workers.wire.replies import as_str

__all__ = ["EmptySource", "NotMail", "check_class", "check_not_empty", "declared_classes",
           "not_mail"]

#: The first line of a mail: a header field (``Name: value``) or an mbox ``From `` line.
_FIRST_LINE = re.compile(rb"(From |[!-9;-~]+:)")


class EmptySource(StreamnbError):
    """A directory given to ``produce`` holds no file to send."""


class NotMail(StreamnbError):
    """The message read from stdin (``produce -``) is not mail: empty, binary, no header."""


def not_mail(raw: bytes) -> str | None:
    """Why ``raw`` is not a mail, or None if it looks like one.

    >>> not_mail(b"Subject: hi\\n\\nhello"), not_mail(b""), not_mail(b"\\x89PNG\\r\\n\\x1a\\n")
    (None, 'empty, not mail', 'does not start with a header line, not mail')
    """
    if not raw.strip():
        return "empty, not mail"
    start = raw.lstrip(b"\r\n")
    end = start.find(b"\n\n", 0, 65536)
    if b"\0" in start[: end if end >= 0 else 65536]:
        return "binary (NUL bytes in the headers), not mail"
    if not _FIRST_LINE.match(start):
        return "does not start with a header line, not mail"
    return None


def check_not_empty(p: Path) -> None:
    """EmptySource if ``p`` is a directory without a single file to send."""
    if not p.is_dir():
        return
    for _dirpath, dirnames, filenames in os.walk(p):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if any(not f.startswith(".") for f in filenames):
            return
    raise EmptySource(f"{str(p)!r} is an empty directory: no message to send")


def declared_classes(client: Any, model: str) -> list[str] | None:
    """The classes model ``model`` declares (None: it declares none, or has no config yet),
    read with HMGET, the one command the ``streamnb-producer`` user of
    deploy/redis/users.acl has for a model's config.

    >>> import fakeredis
    >>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
    >>> r = fakeredis.FakeRedis()
    >>> _ = ensure_config(r, ModelSpec("mail", kind="multinomial", classes=["spam", "ham"]))
    >>> declared_classes(r, "mail"), declared_classes(r, "other")
    (['spam', 'ham'], None)
    """
    text = client.hmget(ModelKeys(model).config, ["classes"])[0]
    return None if text is None else stored_classes(model, as_str(text))


def stored_training(client: Any, model: str) -> str:
    """Where model ``model`` learns labels from (``in`` or ``train``, workers/store/training.py;
    ``in`` when it has no config yet), read with HMGET as :func:`declared_classes` reads.

    >>> import fakeredis
    >>> from streamnb_workers.store.model_config import ModelSpec, ensure_config
    >>> r = fakeredis.FakeRedis()
    >>> _ = ensure_config(r, ModelSpec("mail", kind="multinomial", training="train"))
    >>> stored_training(r, "mail"), stored_training(r, "other")
    ('train', 'in')
    """
    text = client.hmget(ModelKeys(model).config, ["training"])[0]
    return "in" if text is None else as_str(text)


def check_class(label: Any, classes: list[str] | None) -> None:
    """ValueError if ``label`` is not one of the declared ``classes`` (None: any label)."""
    if classes is not None and label is not None and label not in classes:
        raise ValueError(f"label {label!r} is not one of the model's classes: {', '.join(classes)}")

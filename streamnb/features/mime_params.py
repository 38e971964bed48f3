"""The parameters of a MIME header value (``Content-Type``, ``Content-Disposition``) as
``email.message.Message.get_param`` reads them when none is RFC 2231 or escaped, memoised
(content types and dispositions repeat).

>>> header_params('text/plain; charset="UTF-8"; format=flowed')
{'text/plain': '', 'charset': 'UTF-8', 'format': 'flowed'}
>>> header_params("attachment; filename*=utf-8''x.txt") is None
True
"""

from __future__ import annotations

__all__ = ["clear_params_memo", "header_params", "unquote"]


def unquote(value: str) -> str:
    """``email.utils.unquote``: the value without its quotes or angle brackets.

    >>> unquote('"a \\\\"b\\\\""'), unquote("<id@x>")
    ('a "b"', 'id@x')
    """
    if len(value) > 1:
        if value.startswith('"') and value.endswith('"'):
            return value[1:-1].replace("\\\\", "\\").replace('\\"', '"')
        if value.startswith("<") and value.endswith(">"):
            return value[1:-1]
    return value


def _split_params(value: str) -> list[str]:
    """``email.message._parseparam``: the ``;``-separated pieces, quotes respected."""
    s = ";" + value
    pieces = []
    while s[:1] == ";":
        s = s[1:]
        end = s.find(";")
        while end > 0 and (s.count('"', 0, end) - s.count('\\"', 0, end)) % 2:
            end = s.find(";", end + 1)
        if end < 0:
            end = len(s)
        piece = s[:end]
        if "=" in piece:
            i = piece.index("=")
            piece = piece[:i].strip().lower() + "=" + piece[i + 1 :].strip()
        pieces.append(piece.strip())
        s = s[end:]
    return pieces


#: Header value -> its parameters (:func:`_params`): content types and dispositions
#: repeat. Bounded: values of at most 1000 characters, emptied at 1024 entries.
_PARAMS: dict[str, dict[str, str]] = {}
#: The parameters of a value with RFC 2231 or escaped ones (header_params gives None).
_UNSUPPORTED: dict[str, str] = {}


def _params(value: str) -> dict[str, str]:
    """The parameters of a header value: lower-case name -> unquoted value ("" without
    ``=``), the first of each name; :data:`_UNSUPPORTED` for RFC 2231 or escaped ones."""
    params: dict[str, str] = {}
    for i, piece in enumerate(_split_params(value)):
        key, sep, val = piece.partition("=")
        if i and ("*" in key or "\\" in val):
            return _UNSUPPORTED
        key = key.strip().lower()
        if key not in params:
            params[key] = unquote(val.strip()) if sep else ""
    return params


def header_params(value: str) -> dict[str, str] | None:
    """The parameters of a header value (:func:`_params`), memoised for values of at most
    1000 characters; None where one is RFC 2231 or escaped (not read here)."""
    params = _PARAMS.get(value)
    if params is None:
        params = _params(value)
        if len(value) <= 1000:
            if len(_PARAMS) >= 1024:
                _PARAMS.clear()
            _PARAMS[value] = params
    return None if params is _UNSUPPORTED else params


def clear_params_memo() -> None:
    """Empty the memo of :func:`header_params`."""
    _PARAMS.clear()

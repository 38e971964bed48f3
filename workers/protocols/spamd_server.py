"""spamd's protocol (SPAMD/1.x, as ``spamc``, Exim's ``spam =`` and amavis speak it) over
the workers: one request per connection, answered as SpamAssassin's spamd answers it.

``CHECK``, ``SYMBOLS``, ``REPORT``, ``REPORT_IFSPAM``, ``PROCESS`` and ``HEADERS`` score the
mail through the workers (:class:`~streamnb_workers.protocols.mail_service.MailService`)
and answer ``Spam: True ; 7.5 / 5.0``: True when the verdict is the positive class, the
points on the scale of docs/protocol.md. ``SYMBOLS`` lists ``STREAMNB_<VERDICT>``,
``REPORT`` adds a short text with the explanation's top tokens, ``PROCESS`` returns the
mail with the verdict headers (``X-Streamnb-*``; any it came with removed) and
``HEADERS`` its header block alone. ``TELL`` learns (``Set: local``, ``Message-class:
spam|ham``) or forgets (``Remove: local``) the mail and says so with ``DidSet: local`` or
``DidRemove: local``, which it leaves out when there was nothing to do (learnt with that
class already; not learnt); it is refused unless the server was started with
``--allow-tell``. ``PING`` answers ``PONG``; ``SKIP`` closes.

A mail the workers did not score within the timeout (or an untrained model, or Redis
away) gets ``SPAMD/1.0 69 Service Unavailable: not scored (REASON)``: spamc then passes
the mail on unchanged and prints ``0/0``, Exim defers unless told ``defer_ok``.
"""

from __future__ import annotations

import logging
import re
import socketserver
import time
from typing import Any

import redis

from streamnb.features.own_headers import strip_own_headers
from streamnb.features.truncate import cut_mail
from streamnb_workers.protocols.limits import (
    BoundedThreads,
    ClientGone,
    DeadlineReader,
    Limits,
    SlowClient,
    close_after_error,
)
from streamnb_workers.protocols.mail_service import Check, LearnRefused, MailService
from streamnb_workers.protocols.spamd_request import (
    EX_DATAERR,
    EX_PROTOCOL,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_TIMEOUT,
    EX_UNAVAILABLE,
    Request,
    SpamdError,
    protocol_error,
    read_request,
)

__all__ = ["SpamdServer", "answer", "symbol_of", "with_headers"]

log = logging.getLogger("streamnb.spamd")

OK_LINE = b"SPAMD/1.1 0 EX_OK\r\n"
TELL_REFUSED = "TELL commands are not enabled, set the --allow-tell switch."


def symbol_of(verdict: Any) -> str:
    """``STREAMNB_SPAM`` for verdict ``spam``: upper case, characters other than letters,
    digits and ``_`` as ``_``.

    >>> symbol_of("spam"), symbol_of("not sure?")
    ('STREAMNB_SPAM', 'STREAMNB_NOT_SURE_')
    """
    return "STREAMNB_" + re.sub(r"[^A-Z0-9_]", "_", str(verdict).upper())[:64]


def with_headers(raw: bytes, headers: list[tuple[str, str]] | tuple[tuple[str, str], ...]
                 ) -> bytes:
    """``raw`` without its ``X-Streamnb-*`` fields and with ``headers`` at the end of its
    header block, their lines ending as its first line does.

    >>> with_headers(b"Subject: a\\r\\nX-Streamnb-Verdict: ham\\r\\n\\r\\nbody", [("X-A", "b")])
    b'Subject: a\\r\\nX-A: b\\r\\n\\r\\nbody'
    """
    raw = strip_own_headers(raw)
    first = raw.find(b"\n")
    sep = b"\r\n" if first > 0 and raw[first - 1:first] == b"\r" else b"\n"
    lines = b"".join(f"{n}: {v}".encode() + sep for n, v in headers)
    end = raw.find(sep + sep)
    if end < 0:
        return (raw + sep if raw and not raw.endswith(sep) else raw) + lines + sep
    return raw[:end + len(sep)] + lines + raw[end + len(sep):]


def _spam_line(check: Check, service: MailService, ifspam: bool) -> str:
    yes, no = ("Yes", "No") if ifspam else ("True", "False")
    return (f"Spam: {yes if check.spam else no} ; {check.points:.1f} / "
            f"{service.scale.required:.1f}")


def report_text(check: Check, service: MailService) -> str:
    """The REPORT text: the verdict, its points and score, the explained tokens."""
    verdict = check.outcome.verdict
    lines = [f"streamnb: verdict {verdict} of model {check.model}",
             "",
             f"Content analysis details:   ({check.points:.1f} points, "
             f"{service.scale.required:.1f} required)",
             "",
             " pts rule name              description",
             "---- ---------------------- --------------------------------------------------",
             f"{check.points:4.1f} {symbol_of(verdict):<22} score {check.score:+.4f} "
             f"(X-Streamnb-Score)"]
    if check.tokens:
        lines.append("     tokens: " + " ".join(check.tokens))
    return "\r\n".join(lines) + "\r\n"


def answer(request: Request, service: MailService, allow_tell: bool) -> bytes:
    """The reply to ``request`` (SpamdError for an error answer)."""
    command, version = request.command, request.version
    if command == "PING":
        return b"SPAMD/1.5 0 PONG\r\n"
    if command == "SKIP":
        return b""
    if command == "TELL":
        return _tell(request, service, allow_tell)
    raw = request.body
    over = request.size > len(raw)
    if over and command in ("PROCESS", "HEADERS"):
        raise SpamdError(EX_DATAERR, f"Data error: message over {len(raw)} bytes; "
                                     f"{command} answers only whole messages")
    scored = cut_mail(raw, service.max_size, request.size) if over else raw
    check = service.check(scored, request.headers.user)
    if not check.scored:
        raise SpamdError(EX_UNAVAILABLE, f"Service Unavailable: not scored "
                                         f"({check.outcome.failure})")
    spam_line = _spam_line(check, service, command == "REPORT_IFSPAM")
    if command == "CHECK":
        return OK_LINE + f"{spam_line}\r\n\r\n".encode()
    if command == "SYMBOLS":
        body = symbol_of(check.outcome.verdict).encode()
    elif command == "REPORT" or (command == "REPORT_IFSPAM" and check.spam):
        body = report_text(check, service).encode("utf-8")
    elif command == "REPORT_IFSPAM":
        body = b""
    else:
        body = with_headers(raw, check.outcome.headers)
        if command == "HEADERS":
            end = body.find(b"\r\n\r\n")
            end, sep = (end, 4) if end >= 0 else (body.find(b"\n\n"), 2)
            body = body[:end + sep] if end >= 0 else body
    if version < 1.3:
        return OK_LINE + f"{spam_line}\r\n\r\n".encode() + body
    return OK_LINE + f"Content-length: {len(body)}\r\n{spam_line}\r\n\r\n".encode() + body


def _tell(request: Request, service: MailService, allow_tell: bool) -> bytes:
    h = request.headers
    if not allow_tell:
        raise SpamdError(EX_UNAVAILABLE, f"Service Unavailable: {TELL_REFUSED}")
    if h.set_local and h.remove_local:
        raise protocol_error("Unable to set local and remove local in the same operation.")
    if h.set_local and h.message_class is None:
        raise protocol_error("(Set: local needs a Message-class: spam or ham)")
    if request.size > len(request.body):
        raise SpamdError(EX_DATAERR, f"Data error: message over {len(request.body)} bytes")
    did = []
    try:
        if h.set_local and service.learn(request.body, h.message_class or "", h.user):
            did.append("DidSet: local\r\n")
        if h.remove_local and service.forget(request.body, h.user):
            did.append("DidRemove: local\r\n")
    except LearnRefused as exc:
        raise SpamdError(EX_DATAERR, f"Data error: {exc}") from None
    except redis.RedisError as exc:
        raise SpamdError(EX_UNAVAILABLE, f"Service Unavailable: Redis: "
                                         f"{type(exc).__name__}") from None
    return OK_LINE + "".join(did).encode() + b"\r\n"


class SpamdHandler(socketserver.BaseRequestHandler):
    """One connection: one request read within the limits, one answer, closed."""

    server: SpamdServer

    def handle(self) -> None:
        server = self.server
        start = time.perf_counter()
        command, status = "-", "ok"
        try:
            request = read_request(DeadlineReader(self.request, server.limits), server.limits)
            command = request.command
            reply = answer(request, server.service, server.allow_tell)
        except SpamdError as exc:
            reply, status = exc.line(), str(exc.code)
            if exc.code == EX_PROTOCOL:  # a probe that connects and closes: debug only
                level = logging.DEBUG if "(closed before headers)" in exc.message else logging.INFO
                log.log(level, "bad request from %s: %s", self.client_address[0], exc.message)
        except SlowClient as exc:
            reply, status = SpamdError(EX_TIMEOUT, f"Timeout: ({exc})").line(), str(EX_TIMEOUT)
        except ClientGone:
            reply, status = b"", "gone"
        except Exception:  # noqa: BLE001 - a bug answers one request, not the server
            log.exception("spamd request from %s failed", self.client_address[0])
            reply, status = SpamdError(EX_SOFTWARE, "Internal error").line(), str(EX_SOFTWARE)
        if reply:
            try:
                self.request.settimeout(server.limits.read_timeout_s)
                self.request.sendall(reply)
            except OSError:
                status = "gone"
        if status not in ("ok", "gone"):
            close_after_error(self.request, server.limits)
        if server.metrics is not None:
            server.metrics.observe("spamd", command, status, time.perf_counter() - start)


class SpamdServer(BoundedThreads, socketserver.TCPServer):
    """spamd's protocol on ``(host, port)``: at most ``limits.max_connections`` at once."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], service: MailService, limits: Limits, *,
                 allow_tell: bool = False, metrics: Any = None) -> None:
        self.service = service
        self.limits = limits
        self.allow_tell = allow_tell
        self.metrics = metrics
        super().__init__(address, SpamdHandler)

    def refuse(self, request: Any) -> None:
        try:
            request.settimeout(1.0)
            request.sendall(SpamdError(EX_TEMPFAIL, "Service busy: too many connections"
                                       ).line())
        except OSError:
            pass

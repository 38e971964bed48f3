"""Rspamd's HTTP protocol (``rspamc``, rspamd-proxy, webmail and IMAP learning tools) over
the workers, on the standard library's HTTP server.

``POST /checkv2`` scores the mail (the body) through the workers
(:class:`~streamnb_workers.protocols.mail_service.MailService`) and answers Rspamd's JSON:
``action`` (``--spam-action``, ``add header`` by default, for a verdict of the positive
class, else ``no action``), ``score`` and ``required_score`` in points (docs/protocol.md),
``symbols`` with one symbol, ``STREAMNB_<VERDICT>``, whose ``options`` are the top tokens
the worker explained (``token=+weight``, with ``streamnb worker --explain K``), and
``milter`` headers for rspamd-proxy's milter mode. ``POST /learnspam`` and ``/learnham``
learn the mail: 200 ``{"success": true}``, or 208 when its learn-once key was learnt with
that class already; they need the ``Password`` header to match ``--password-file`` (or
``--allow-learn``), else 403, as Rspamd's controller asks its ``enable_password``.
``GET /ping`` answers ``pong``. The user is the first of ``Deliver-To``, ``Rcpt`` and
``User`` (:class:`~streamnb_workers.protocols.users.ModelChooser`); a check with several
``Rcpt`` headers and no ``Deliver-To`` (amavis's Rspamd client sends one a recipient) is
scored with the model the recipients share, else the global one, as the milter does.

The HTTP side is :mod:`http.server`'s ThreadingHTTPServer (request line and headers
parsed by the standard library: at most 100 header lines of 64 KiB), under this layer's
limits: a read timeout and a whole-request deadline on every read
(:class:`DeadlineSocketIO`), a body of at most ``max_size`` bytes kept (the rest read and
dropped), ``Content-Length`` required, and a bounded pool of connections. One request per
connection (HTTP/1.0, as rspamc speaks).
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import socket
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis

from streamnb.features.own_headers import is_own_header
from streamnb.features.truncate import cut_mail
from streamnb_workers.protocols.limits import BoundedThreads, Limits
from streamnb_workers.protocols.mail_service import Check, LearnRefused, MailService
from streamnb_workers.protocols.spamd_server import symbol_of
from streamnb_workers.protocols.users import first_user

__all__ = ["ACTIONS", "RspamdServer", "check_reply"]

log = logging.getLogger("streamnb.rspamd")

#: Rspamd's actions a verdict of the positive class may take (rspamc prints ``Spam: true``
#: for each of them).
ACTIONS = ("add header", "rewrite subject", "soft reject", "reject")
NO_ACTION = "no action"


def check_reply(check: Check, service: MailService, spam_action: str) -> dict[str, Any]:
    """The ``/checkv2`` JSON of a scored mail."""
    verdict = check.outcome.verdict
    symbol = symbol_of(verdict)
    headers = dict(check.outcome.headers)
    return {
        "is_skipped": False,
        "score": check.points,
        "required_score": service.scale.required,
        "action": spam_action if check.spam else NO_ACTION,
        "symbols": {symbol: {
            "name": symbol, "score": check.points, "metric_score": check.points,
            "description": f"streamnb verdict {verdict} of model {check.model} "
                           f"(score {check.score:+.4f})",
            "options": list(check.tokens)}},
        "messages": {},
        "milter": {"add_headers": headers,
                   "remove_headers": {name: 0 for name in headers if is_own_header(name)}},
    }


class DeadlineSocketIO(io.RawIOBase):
    """A socket's reading side with the limits' read timeout and whole-request deadline
    (``TimeoutError`` past either, which http.server answers by closing)."""

    def __init__(self, sock: socket.socket, limits: Limits) -> None:
        super().__init__()
        self.sock = sock
        self.limits = limits
        self.deadline = time.monotonic() + limits.request_timeout_s

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request took too long to arrive")
        self.sock.settimeout(min(self.limits.read_timeout_s, left))
        try:
            return self.sock.recv_into(buffer)
        except ConnectionError:
            return 0


class RspamdHandler(BaseHTTPRequestHandler):
    """One request per connection (HTTP/1.0)."""

    server: RspamdServer
    protocol_version = "HTTP/1.0"
    #: A request without a version (or with a bad one) is answered as HTTP/1.0 too: with
    #: a status line, never HTTP/0.9's bare body.
    default_request_version = "HTTP/1.0"
    server_version = "streamnb-rspamd"
    error_content_type = "application/json"
    error_message_format = '{"error": "%(code)d %(message)s"}'

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.limits.read_timeout_s)
        self.rfile = io.BufferedReader(DeadlineSocketIO(self.connection, self.server.limits))
        self._start = time.perf_counter()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's name
        log.debug("%s %s", self.address_string(), format % args)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None
                   ) -> None:
        self._observe(str(code))
        super().send_error(code, message, explain)

    def _observe(self, status: str) -> None:
        if self.server.metrics is not None:
            path = self.path if getattr(self, "path", "") in ENDPOINTS else "-"
            self.server.metrics.observe("rspamd", path, status,
                                        time.perf_counter() - self._start)

    def _json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self._observe(str(code) if code != 200 else "ok")
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path != "/ping":
            self._json(404, {"error": f"no such path: {self.path[:100]}"})
            return
        self._observe("ok")
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "6")
        self.end_headers()
        self.wfile.write(b"pong\r\n")

    def _body(self) -> tuple[bytes, int] | None:
        """(the body's first ``max_size`` bytes, its whole size); None after an error
        answer."""
        if self.headers.get("Transfer-Encoding"):
            self._json(411, {"error": "Content-Length required (no Transfer-Encoding)"})
            return None
        text = (self.headers.get("Content-Length") or "").strip()
        if not text.isdigit() or not text.isascii() or len(text) > 15:
            self._json(411, {"error": "Content-Length required"})
            return None
        size, limit = int(text), self.server.limits.max_size
        kept = self.rfile.read(min(size, limit))
        left = size - len(kept)
        while left > 0 and len(kept) == min(size, limit):
            chunk = self.rfile.read(min(left, 65536))
            if not chunk:
                break
            left -= len(chunk)
        if len(kept) < min(size, limit) or left > 0:
            self._json(400, {"error": "the body is shorter than its Content-Length"})
            return None
        return kept, size

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        if self.path not in ENDPOINTS:
            self._json(404, {"error": f"no such path: {self.path[:100]}"})
            return
        if self.path != "/checkv2" and not self.server.may_learn(self.headers.get("Password")):
            self._json(403, {"error": "Unauthorized"})
            return
        try:
            got = self._body()
        except TimeoutError:
            self.close_connection = True
            self._observe("408")
            return
        if got is None:
            return
        raw, size = got
        user = first_user(self.headers.get(h) for h in ("Deliver-To", "Rcpt", "User"))
        rcpts = self.headers.get_all("Rcpt") or []
        if self.path == "/checkv2":
            self._check(raw if size <= len(raw) else cut_mail(raw, len(raw), size), user,
                        rcpts if len(rcpts) > 1 and not self.headers.get("Deliver-To") else None)
        else:
            self._learn(raw, size, "spam" if self.path == "/learnspam" else "ham", user)

    def _check(self, raw: bytes, user: str | None, recipients: list[str] | None) -> None:
        service = self.server.service
        check = service.check(raw, user, recipients)
        if not check.scored:
            self._json(503, {"error": f"not scored ({check.outcome.failure})"})
            return
        self._json(200, check_reply(check, service, self.server.spam_action))

    def _learn(self, raw: bytes, size: int, label: str, user: str | None) -> None:
        if size > len(raw):
            self._json(413, {"error": f"message over {len(raw)} bytes"})
            return
        try:
            learnt = self.server.service.learn(raw, label, user)
        except LearnRefused as exc:
            self._json(400, {"error": str(exc)})
            return
        except redis.RedisError as exc:
            self._json(503, {"error": f"Redis: {type(exc).__name__}"})
            return
        if learnt:
            self._json(200, {"success": True})
        else:
            self._json(208, {"error": f"the message has been already learned as {label}, "
                                      "ignore it"})


ENDPOINTS = ("/checkv2", "/learnspam", "/learnham", "/ping")


class RspamdServer(BoundedThreads, ThreadingHTTPServer):
    """Rspamd's protocol on ``(host, port)``: at most ``limits.max_connections`` at once;
    learning for the holders of ``password`` (None: for every client if ``allow_learn``,
    else for none)."""

    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], service: MailService, limits: Limits, *,
                 password: str | None = None, allow_learn: bool = False,
                 spam_action: str = "add header", metrics: Any = None) -> None:
        self.service = service
        self.limits = limits
        self.password = password
        self.allow_learn = allow_learn
        self.spam_action = spam_action
        self.metrics = metrics
        super().__init__(address, RspamdHandler)

    def may_learn(self, given: str | None) -> bool:
        if self.password is None:
            return self.allow_learn
        return given is not None and hmac.compare_digest(given.encode(), self.password.encode())

    def refuse(self, request: Any) -> None:
        body = b'{"error": "too many connections"}'
        try:
            request.settimeout(1.0)
            request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: "
                            b"application/json\r\nContent-Length: %d\r\n\r\n%s"
                            % (len(body), body))
        except OSError:
            pass

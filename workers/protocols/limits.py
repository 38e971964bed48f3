"""What one request may cost a protocol server, and the bounded pool of connections.

:class:`Limits`: the largest mail kept (the rest of a longer one is read and dropped, as
the milter keeps the first ``max_size`` bytes), the number and length of header lines, the
time a client may leave between two reads and the time a whole request may take to arrive
(a client sending a byte now and then is cut off), and the connections served at once.

:class:`BoundedThreads`: a ``socketserver`` mix-in that serves each connection in a thread
of its own, at most ``max_connections`` at a time. A connection over the bound waits for a
slot up to ``queue_s`` (the accept loop waits with it; further connections queue in the
kernel's backlog, as spamd's ``--max-children`` does), then gets the protocol's "busy"
answer (:meth:`BoundedThreads.refuse`) and is closed.

:class:`DeadlineReader`: lines and byte counts from a socket within those limits.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["BoundedThreads", "ClientGone", "DeadlineReader", "Limits", "LineTooLong",
           "SlowClient", "close_after_error"]


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds of one server (module docstring)."""

    max_size: int = 512 * 1024
    max_headers: int = 100
    max_line: int = 8192
    read_timeout_s: float = 30.0
    request_timeout_s: float = 120.0
    max_connections: int = 64
    queue_s: float = 5.0


class SlowClient(Exception):
    """The client sent nothing for ``read_timeout_s`` or not all of its request within
    ``request_timeout_s``."""


class ClientGone(Exception):
    """The client closed the connection before its request was whole."""


class LineTooLong(Exception):
    """A request or header line longer than ``max_line``."""


class DeadlineReader:
    """Reads a socket with a timeout per read and a deadline for the whole request."""

    def __init__(self, sock: socket.socket, limits: Limits) -> None:
        self.sock = sock
        self.limits = limits
        self.deadline = time.monotonic() + limits.request_timeout_s
        self._buf = bytearray()
        self._eof = False

    def _fill(self) -> bool:
        """Read more into the buffer: False at end of stream; SlowClient past a limit."""
        if self._eof:
            return False
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise SlowClient("the request took too long to arrive")
        self.sock.settimeout(min(self.limits.read_timeout_s, left))
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            if time.monotonic() >= self.deadline:
                raise SlowClient("the request took too long to arrive") from None
            raise SlowClient("no data from the client within the read timeout") from None
        except OSError as exc:
            raise ClientGone(str(exc)) from None
        if not chunk:
            self._eof = True
            return False
        self._buf += chunk
        return True

    def readline(self) -> bytes:
        """One line without its CRLF (or LF); ClientGone at end of stream before a line
        end, LineTooLong past ``max_line``."""
        start = 0
        while True:
            end = self._buf.find(b"\n", start)
            if end >= 0:
                if end > self.limits.max_line:
                    raise LineTooLong(f"a line longer than {self.limits.max_line} bytes")
                line = bytes(self._buf[:end])
                del self._buf[:end + 1]
                return line[:-1] if line.endswith(b"\r") else line
            if len(self._buf) > self.limits.max_line:
                raise LineTooLong(f"a line longer than {self.limits.max_line} bytes")
            start = len(self._buf)
            if not self._fill():
                raise ClientGone("the connection closed in the middle of a line")

    def read(self, n: int | None, keep: int) -> tuple[bytes, int]:
        """Read ``n`` bytes (None: up to the end of stream): (the first ``keep`` of them,
        how many arrived). Fewer arrive when the client closes early; the caller compares."""
        kept = bytearray()
        seen = 0
        while n is None or seen < n:
            if not self._buf and not self._fill():
                break
            take = len(self._buf) if n is None else min(len(self._buf), n - seen)
            room = keep - len(kept)
            if room > 0:
                kept += self._buf[:min(take, room)]
            del self._buf[:take]
            seen += take
        return bytes(kept), seen


def close_after_error(sock: socket.socket, limits: Limits, seconds: float = 1.0) -> None:
    """After an error answer sent before the request was read whole: close the sending
    side and read (and drop) what the client still sends, up to ``max_size`` bytes or
    ``seconds``, so that closing with unread data does not reset the connection and
    destroy the answer before the client reads it."""
    deadline = time.monotonic() + seconds
    left = limits.max_size
    try:
        sock.shutdown(socket.SHUT_WR)
        while left > 0 and (wait := deadline - time.monotonic()) > 0:
            sock.settimeout(wait)
            chunk = sock.recv(min(65536, left))
            if not chunk:
                return
            left -= len(chunk)
    except OSError:
        return


class BoundedThreads:
    """A socketserver mix-in: a thread per connection, at most ``limits.max_connections``
    at once (module docstring). Set ``limits`` on the server."""

    limits: Limits
    daemon_threads = True
    _slots: threading.BoundedSemaphore | None = None

    def _slot(self) -> threading.BoundedSemaphore:
        if self._slots is None:
            self._slots = threading.BoundedSemaphore(self.limits.max_connections)
        return self._slots

    def process_request(self, request: Any, client_address: Any) -> None:
        slots = self._slot()
        if not slots.acquire(timeout=self.limits.queue_s):
            try:
                self.refuse(request)
            finally:
                self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        thread = threading.Thread(target=self._serve_one, args=(request, client_address),
                                  daemon=True, name="streamnb-protocol-connection")
        try:
            thread.start()
        except RuntimeError:
            slots.release()
            self.shutdown_request(request)  # type: ignore[attr-defined]

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - one connection's failure is logged, not fatal
            self.handle_error(request, client_address)  # type: ignore[attr-defined]
        finally:
            self.shutdown_request(request)  # type: ignore[attr-defined]
            self._slot().release()

    def refuse(self, request: Any) -> None:
        """Tell a connection over the bound that the server is busy (protocol's own)."""
        del request

    def wait_idle(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` seconds) until no connection is being served: after
        ``shutdown``, the requests in progress finish before what they use is closed."""
        deadline = time.monotonic() + timeout
        slots, taken = self._slot(), 0
        try:
            while taken < self.limits.max_connections:
                if not slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    return False
                taken += 1
            return True
        finally:
            for _ in range(taken):
                slots.release()

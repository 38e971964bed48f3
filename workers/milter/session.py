"""The milter's SMTP sessions on libmilter, through pymilter (the optional extra
``streamnb[milter]``; this module is imported only by ``streamnb milter``).

libmilter (Sendmail's reference implementation of the milter protocol, the library the
MTAs are tested against) runs each MTA connection in a thread of its own and calls the
:class:`MailSession` of that connection: headers, end of headers and body chunks are
collected (up to ``max_size`` bytes; the MTA is told not to wait for a reply to each),
and at the end of the message the mail is scored and the outcome applied: the mail's own
``X-Streamnb-*`` headers are removed (a sender cannot forge a verdict), the verdict
headers added, and the mail accepted, quarantined, rejected or tempfailed. Connection,
HELO, envelope and unknown commands are negotiated away, so the MTA does not send them;
DATA is answered (:meth:`MailSession.data` says why). With per-user models
(``--per-user``) the sessions are :class:`RecipientSession`, which also take each mail's
envelope recipients (RCPT TO, without a reply to each) and score the mail for them.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import time
from collections.abc import Callable
from typing import Any

import Milter
import milter

from streamnb.exceptions import SettingsError
from streamnb.features.own_headers import is_own_header
from streamnb.features.truncate import cut_mail
from streamnb_workers.milter.policy import ACCEPT, QUARANTINE, REJECT, TEMPFAIL, Outcome

__all__ = ["MailSession", "RecipientSession", "run"]

log = logging.getLogger("streamnb.milter")

#: The envelope recipients kept per mail (the rest are not looked at).
MAX_RECIPIENTS = 100

_RETURN = {ACCEPT: Milter.CONTINUE, QUARANTINE: Milter.CONTINUE, REJECT: Milter.REJECT,
           TEMPFAIL: Milter.TEMPFAIL}


class MailSession(Milter.Base):
    """One MTA connection (one or more mails, one after the other).

    ``score`` (raw mail bytes, MTA queue id, envelope recipients) -> :class:`Outcome` and
    ``max_size`` are set on
    the subclass :func:`run` makes; ``observe`` (outcome, seconds) is told each mail's
    outcome and the time scoring it took.
    """

    score: Callable[[bytes, str, tuple[str, ...]], Outcome]
    observe: Callable[[Outcome, float], None] | None = None
    max_size: int = 512 * 1024

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0
        #: The mail's whole size, of which the first ``max_size`` bytes are kept.
        self._total = 0
        #: Headers of ours the mail arrived with: lower-case name -> (name, occurrences).
        self._own: dict[str, tuple[str, int]] = {}
        #: The mail's envelope recipients (:class:`RecipientSession` only).
        self._recipients: list[str] = []

    def _keep(self, data: bytes) -> None:
        self._total += len(data)
        room = self.max_size - self._size
        if room > 0:
            part = data[:room]
            self._parts.append(part)
            self._size += len(part)

    # ------------------------------------------------------------------ callbacks
    def data(self) -> int:
        # Answered, not negotiated away: over TCP, Postfix sends the mail's content on a
        # socket where its last small writes (the envelope's macros, which get no reply)
        # may not be acknowledged yet, and Nagle's algorithm on its side then holds the
        # content until this side's delayed ACK, about 40 ms. The reply to DATA carries
        # that ACK.
        return Milter.CONTINUE

    @Milter.decode("bytes")
    @Milter.noreply
    def header(self, name: str | bytes, value: bytes) -> int:
        text = name.decode("latin-1") if isinstance(name, bytes) else name
        key = text.lower()
        if is_own_header(key):
            seen = self._own.get(key)
            # MTAs match header names case-insensitively when they count occurrences
            self._own[key] = (text, 1) if seen is None else (seen[0], seen[1] + 1)
        raw_name = name if isinstance(name, bytes) else name.encode("utf-8", "surrogateescape")
        if isinstance(value, str):
            value = value.encode("utf-8", "surrogateescape")
        # Postfix hands folded lines over with bare LF; the body comes with CRLF
        value = value.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
        self._keep(raw_name + b": " + value + b"\r\n")
        return Milter.CONTINUE

    @Milter.noreply
    def eoh(self) -> int:
        self._keep(b"\r\n")
        return Milter.CONTINUE

    @Milter.noreply
    def body(self, chunk: bytes) -> int:
        self._keep(chunk)
        return Milter.CONTINUE

    def eom(self) -> int:
        start = time.perf_counter()
        queue_id = self.getsymval("i") or ""
        try:
            # a mail over max_size is cut as produce and the workers cut it (headers kept,
            # at a MIME boundary, the X-Streamnb-Truncated marker with its whole size)
            outcome = self.score(cut_mail(b"".join(self._parts), self.max_size, self._total),
                                 queue_id, tuple(self._recipients))
            # Last occurrence first: deleting one renumbers those after it.
            for name, count in self._own.values():
                for index in range(count, 0, -1):
                    self.chgheader(name, index, None)
            for name, value in outcome.headers:
                self.addheader(name, value)
            if outcome.action == QUARANTINE:
                self.quarantine(f"streamnb: {outcome.reason}")
            if outcome.reply is not None:
                r = outcome.reply
                self.setreply(r.code, r.status, r.text)
        finally:
            self._reset()
        seconds = time.perf_counter() - start
        log.debug("%s: %s, %s (%.1f ms)", queue_id or "-", outcome.reason, outcome.action,
                  seconds * 1000)
        if self.observe is not None:
            self.observe(outcome, seconds)
        return _RETURN[outcome.action]

    def abort(self) -> int:
        self._reset()
        return Milter.CONTINUE

    def close(self) -> int:
        return Milter.CONTINUE


class RecipientSession(MailSession):
    """A session that is also told each mail's envelope recipients (``RCPT TO``)."""

    @Milter.noreply
    def envrcpt(self, to: str, *params: str) -> int:
        if len(self._recipients) < MAX_RECIPIENTS:
            self._recipients.append(to)
        return Milter.CONTINUE


def run(listen: str, score: Callable[[bytes, str, tuple[str, ...]], Outcome], *,
        max_size: int, on_error: str, observe: Callable[[Outcome, float], None] | None = None,
        socket_mode: int = 0o660, name: str = "streamnb", recipients: bool = False) -> None:
    """Serve the milter on ``listen`` (libmilter's ``inet:PORT@HOST`` / ``unix:PATH``) until
    SIGTERM, SIGINT or SIGHUP (libmilter's own signal thread stops it). ``on_error``
    (accept or tempfail): the reply when a callback fails unexpectedly; ``socket_mode``:
    the permissions of a ``unix:`` socket; ``recipients``: score each mail for its
    envelope recipients (:class:`RecipientSession`)."""
    session = type("ConfiguredSession", (RecipientSession if recipients else MailSession,), {
        "score": staticmethod(score), "observe": staticmethod(observe) if observe else None,
        "max_size": max_size})
    Milter.factory = session
    Milter.set_flags(Milter.ADDHDRS | Milter.CHGHDRS | Milter.QUARANTINE)
    Milter.set_exception_policy(Milter.TEMPFAIL if on_error == TEMPFAIL else Milter.CONTINUE)
    open_socket = milter.opensocket

    def open_and_tune(rmsock: bool) -> Any:
        # Milter.runmilter opens the socket, then serves: tune it in between.
        try:
            done = open_socket(rmsock)
        except milter.error:
            raise SettingsError(f"--listen {listen}: cannot listen there ({why_not(listen)})"
                                ) from None
        tune_listener(listen, socket_mode)
        return done

    milter.opensocket = open_and_tune
    try:
        Milter.runmilter(name, listen, rmsock=True)
    finally:
        milter.opensocket = open_socket


def tune_listener(listen: str, socket_mode: int) -> None:
    """A ``unix:`` socket gets ``socket_mode``; an ``inet`` one TCP_NODELAY, which the
    connections it accepts inherit (Linux). libmilter writes each header change and the
    final reply as a packet of its own: with Nagle's algorithm the second waits for the
    MTA's delayed ACK of the first, 40 ms a mail on loopback."""
    kind, _, where = listen.partition(":")
    if kind in ("unix", "local"):
        os.chmod(where, socket_mode)
        return
    port = int(where.partition("@")[0])
    for fd in _socket_fds():
        try:
            sock = socket.fromfd(fd, socket.AF_INET6 if kind == "inet6" else socket.AF_INET,
                                 socket.SOCK_STREAM)
        except OSError:
            continue
        with sock:
            try:
                listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
                if listening and sock.getsockname()[1] == port:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return
            except OSError:
                continue
    log.warning("could not set TCP_NODELAY on the milter's socket: expect about 40 ms more "
                "per mail over TCP (a unix: socket has no such delay)")


def why_not(listen: str) -> str:
    """The system's reason a socket spec cannot be listened on (libmilter logs it only to
    syslog)."""
    kind, _, where = listen.partition(":")
    try:
        if kind in ("unix", "local"):
            folder = os.path.dirname(where) or "."
            if not os.path.isdir(folder):
                return f"no directory {folder}"
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(os.path.join(folder, f".streamnb-probe-{os.getpid()}"))
                os.unlink(s.getsockname())
        else:
            port, _, host = where.partition("@")
            family = socket.AF_INET6 if kind == "inet6" else socket.AF_INET
            with socket.socket(family) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host.strip("[]"), int(port)))
    except OSError as exc:
        return exc.strerror or str(exc)
    return "libmilter gave no reason"


def _socket_fds() -> list[int]:
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return []
    fds = []
    for n in names:
        try:
            if stat.S_ISSOCK(os.fstat(int(n)).st_mode):
                fds.append(int(n))
        except (OSError, ValueError):
            continue
    return fds

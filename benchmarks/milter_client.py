"""A milter-protocol client: the MTA's side of the protocol, for tests and benchmarks.

It speaks milter protocol version 6 as Postfix does: one negotiation per connection,
then per mail the envelope steps the milter asked for, each header, end of headers, the
body in chunks of at most 64 KiB and end of body, after which it collects the milter's
modifications (headers added, changed or removed; quarantine) and its final answer
(continue or accept, reject, tempfail, discard, or a reply code). Steps the milter
negotiated away are not sent, and no reply is awaited where it asked for none.

>>> split_message(b"Subject: hi\\r\\nX-A: 1\\r\\n  2\\r\\n\\r\\nbody\\r\\n")
([('Subject', 'hi'), ('X-A', '1\\r\\n  2')], b'body\\r\\n')
>>> packet(b"O", b"")
b'\\x00\\x00\\x00\\x01O'
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

__all__ = ["MilterClient", "MilterResult", "packet", "split_message"]

VERSION = 6
#: Every modification action (SMFIF_ADDHDRS .. SMFIF_SETSYMLIST).
ALL_ACTIONS = 0x1FF
# Protocol flags the MTA may honour: steps not sent (NO*), replies not awaited (NR_*).
P_NOCONNECT, P_NOHELO, P_NOMAIL, P_NORCPT = 0x1, 0x2, 0x4, 0x8
P_NOBODY, P_NOHDRS, P_NOEOH, P_NR_HDR = 0x10, 0x20, 0x40, 0x80
P_NOUNKNOWN, P_NODATA = 0x100, 0x200
P_NR_CONN, P_NR_HELO, P_NR_MAIL, P_NR_RCPT = 0x1000, 0x2000, 0x4000, 0x8000
P_NR_DATA, P_NR_UNKN, P_NR_EOH, P_NR_BODY = 0x10000, 0x20000, 0x40000, 0x80000
#: What this client can do without: every step and every reply but the final one.
OFFERED = (P_NOCONNECT | P_NOHELO | P_NOMAIL | P_NORCPT | P_NOBODY | P_NOHDRS | P_NOEOH
           | P_NR_HDR | P_NOUNKNOWN | P_NODATA | P_NR_CONN | P_NR_HELO | P_NR_MAIL
           | P_NR_RCPT | P_NR_DATA | P_NR_UNKN | P_NR_EOH | P_NR_BODY)
BODY_CHUNK = 65535
_FINAL = {b"c": "accept", b"a": "accept", b"r": "reject", b"t": "tempfail", b"d": "discard"}


def packet(cmd: bytes, data: bytes) -> bytes:
    """One protocol packet: 4-byte length (command + data), command byte, data."""
    return struct.pack("!I", len(data) + 1) + cmd + data


def split_message(raw: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """An RFC 822 message as the MTA hands it over: (header name, value) pairs, the
    value without the space after the colon and with its folded lines, and the body."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = raw.partition(b"\n\n")
    headers: list[tuple[str, str]] = []
    for line in head.replace(b"\r\n", b"\n").split(b"\n"):
        if line[:1] in (b" ", b"\t") and headers:
            name, value = headers[-1]
            headers[-1] = (name, value + "\r\n" + line.decode("utf-8", "surrogateescape"))
        elif b":" in line:
            name, _, value = line.partition(b":")
            headers.append((name.decode("ascii", "replace"),
                            value.lstrip(b" \t").decode("utf-8", "surrogateescape")))
    return headers, body


@dataclass
class MilterResult:
    """The milter's answer to one mail."""

    action: str = "accept"
    reply: str | None = None
    added_headers: list[tuple[str, str]] = field(default_factory=list)
    #: (index, name, value): value "" removes the index-th header of that name.
    changed_headers: list[tuple[int, str, str]] = field(default_factory=list)
    quarantine: str | None = None
    #: Seconds from the end of the mail's data (end of body sent) to the final answer.
    end_of_data_seconds: float = float("nan")

    def header(self, name: str) -> str | None:
        """The value of the added header ``name`` (case-insensitive), None if not added."""
        return next((v for n, v in self.added_headers if n.lower() == name.lower()), None)


class MilterClient:
    """One MTA connection to a milter at ``address`` (``(host, port)`` or a socket path)."""

    def __init__(self, address: tuple[str, int] | str, timeout: float = 30.0) -> None:
        family = socket.AF_UNIX if isinstance(address, str) else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        if family == socket.AF_INET:  # many small packets: no Nagle delay (as Postfix)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.connect(address)
        self.actions, self.protocol = self._negotiate()

    # ------------------------------------------------------------------ wire
    def _send(self, cmd: bytes, data: bytes = b"") -> None:
        self.sock.sendall(packet(cmd, data))

    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the milter closed the connection")
            buf += chunk
        return bytes(buf)

    def _recv(self) -> tuple[bytes, bytes]:
        (length,) = struct.unpack("!I", self._recv_exact(4))
        body = self._recv_exact(length)
        return body[:1], body[1:]

    def _negotiate(self) -> tuple[int, int]:
        self._send(b"O", struct.pack("!III", VERSION, ALL_ACTIONS, OFFERED))
        cmd, data = self._recv()
        if cmd != b"O" or len(data) < 12:
            raise ConnectionError(f"bad negotiation reply {cmd!r}")
        _version, actions, protocol = struct.unpack("!III", data[:12])
        return actions, protocol

    def _step(self, cmd: bytes, data: bytes, skip_flag: int, noreply_flag: int) -> str | None:
        """Send one step unless negotiated away; its reply when one is due: None to go on,
        else the final action the milter answered early."""
        if self.protocol & skip_flag:
            return None
        self._send(cmd, data)
        if self.protocol & noreply_flag:
            return None
        reply, _ = self._recv()
        return None if reply == b"c" else _FINAL.get(reply, "tempfail")

    # ------------------------------------------------------------------ mail
    def send_mail(self, raw: bytes, *, queue_id: str = "TESTQ1", sender: str = "<a@example.org>",
                  recipient: str = "<b@example.org>") -> MilterResult:
        """Hand one message to the milter; its answer."""
        headers, body = split_message(raw)
        self._send(b"D", b"C" + b"j\0mx.example.org\0")
        steps = [
            (b"C", b"mx.example.org\0" + b"4" + struct.pack("!H", 25) + b"127.0.0.1\0",
             P_NOCONNECT, P_NR_CONN),
            (b"H", b"client.example.org\0", P_NOHELO, P_NR_HELO),
            (b"M", sender.encode() + b"\0", P_NOMAIL, P_NR_MAIL),
            (b"R", recipient.encode() + b"\0", P_NORCPT, P_NR_RCPT),
            (b"T", b"", P_NODATA, P_NR_DATA),
        ]
        steps += [(b"L", n.encode() + b"\0" + v.encode("utf-8", "surrogateescape") + b"\0",
                   P_NOHDRS, P_NR_HDR) for n, v in headers]
        steps.append((b"N", b"", P_NOEOH, P_NR_EOH))
        steps += [(b"B", body[i:i + BODY_CHUNK], P_NOBODY, P_NR_BODY)
                  for i in range(0, len(body), BODY_CHUNK)]
        for cmd, data, skip, noreply in steps:
            early = self._step(cmd, data, skip, noreply)
            if early is not None:
                self._send(b"A")
                return MilterResult(action=early)
        self._send(b"D", b"E" + b"i\0" + queue_id.encode() + b"\0")
        start = time.perf_counter()
        self._send(b"E")
        result = self._end_of_message()
        result.end_of_data_seconds = time.perf_counter() - start
        return result

    def _end_of_message(self) -> MilterResult:
        result = MilterResult()
        while True:
            cmd, data = self._recv()
            if cmd == b"h":
                name, value = data.rstrip(b"\0").split(b"\0", 1)
                result.added_headers.append((name.decode(), value.decode()))
            elif cmd == b"i":
                name, value = data[4:].rstrip(b"\0").split(b"\0", 1)
                result.added_headers.append((name.decode(), value.decode()))
            elif cmd == b"m":
                (index,) = struct.unpack("!I", data[:4])
                name, _, value = data[4:].rstrip(b"\0").partition(b"\0")
                result.changed_headers.append((index, name.decode(), value.decode()))
            elif cmd == b"q":
                result.quarantine = data.rstrip(b"\0").decode()
            elif cmd == b"p":
                continue
            elif cmd == b"y":
                result.reply = data.rstrip(b"\0").decode()
                result.action = {"4": "tempfail", "5": "reject"}.get(result.reply[:1], "accept")
                return result
            elif cmd in _FINAL:
                result.action = _FINAL[cmd]
                return result
            # other modifications (body, recipients, sender) are not used by streamnb

    def close(self) -> None:
        try:
            self._send(b"Q")
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> MilterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

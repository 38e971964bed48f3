"""A small threaded TCP proxy on loopback, to cut the network between a worker and Redis.

``stop()`` closes the listening socket and every proxied connection (the worker sees its
connections reset and new connections refused); ``start()`` listens again on the same port.

>>> import socket, threading
>>> echo = socket.create_server(("127.0.0.1", 0))
>>> def serve():
...     conn, _ = echo.accept()
...     conn.sendall(conn.recv(10)); conn.close()
>>> t = threading.Thread(target=serve, daemon=True); t.start()
>>> proxy = TcpProxy("127.0.0.1", echo.getsockname()[1]).start()
>>> with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as c:
...     c.sendall(b"ping"); c.recv(10)
b'ping'
>>> proxy.stop(); echo.close()
"""

from __future__ import annotations

import socket
import threading

#: Bytes copied per recv().
CHUNK = 65536


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``target_host:target_port`` until stopped."""

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = port
        self._listener: socket.socket | None = None
        self._socks: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.connections = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._listener is not None

    def start(self) -> TcpProxy:
        """Listen (again) on ``port`` (a free one the first time if 0)."""
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", self.port))
        srv.listen(64)
        self.port = srv.getsockname()[1]
        self._listener = srv
        threading.Thread(target=self._accept, args=(srv,), daemon=True,
                         name=f"proxy-accept-{self.port}").start()
        return self

    def stop(self) -> None:
        """Refuse new connections and reset every open one."""
        srv, self._listener = self._listener, None
        if srv is not None:
            _close(srv)
        with self._lock:
            socks, self._socks = self._socks, set()
        for s in socks:
            _close(s)

    def _accept(self, srv: socket.socket) -> None:
        while True:
            try:
                client, _ = srv.accept()
            except OSError:
                return  # listener closed by stop()
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                if self._listener is not srv:  # stopped meanwhile
                    _close(client)
                    _close(upstream)
                    return
                self._socks.update((client, upstream))
                self.connections += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._socks.discard(src)
                self._socks.discard(dst)
            _close(src)
            _close(dst)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass

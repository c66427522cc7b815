"""A database that stops answering without refusing anything: a TCP relay in front of PostgreSQL
that can be frozen. Frozen, it keeps every connection open and accepts new ones but passes no
byte either way, as a database host that hangs or a network path that drops packets would: no
error reaches the client, and a server-side statement timeout cannot fire (the server never
sees the statement)."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections.abc import Iterator

from sqlalchemy.engine import make_url


class FreezableRelay:
    """Relays 127.0.0.1:<port> to `upstream` (host, port) until frozen; `thaw` resumes."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="relay", daemon=True)
        self._thread.start()

    def url_for(self, url: str) -> str:
        """`url` with its host and port replaced by the relay's."""
        return make_url(url).set(host="127.0.0.1", port=self.port).render_as_string(False)

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        # A connection that arrives frozen waits, unanswered, as the kernel's backlog would.
        self._flowing.wait()
        if self._closed.is_set():
            client.close()
            return
        try:
            server = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, server]
        peers = {client: server, server: client}
        with selectors.DefaultSelector() as selector:
            for s in peers:
                selector.register(s, selectors.EVENT_READ)
            while not self._closed.is_set():
                self._flowing.wait()
                for key, _ in selector.select(timeout=0.1):
                    if not self._flowing.is_set():
                        break  # frozen while waiting: this byte stays unread
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = source.recv(65536)
                        if not data:
                            raise OSError("closed")
                        peers[source].sendall(data)
                    except OSError:
                        for s in peers:
                            with contextlib.suppress(OSError):
                                s.close()
                        return


@contextlib.contextmanager
def relay_to(url: str) -> Iterator[FreezableRelay]:
    """A relay in front of `url`'s server, closed afterwards."""
    parsed = make_url(url)
    relay = FreezableRelay((parsed.host or "127.0.0.1", parsed.port or 5432))
    try:
        yield relay
    finally:
        relay.close()

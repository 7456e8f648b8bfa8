"""A TCP proxy on loopback that loses the reply to an insert the server did write.

Between the worker and clickhouse-server it passes every byte, until it is armed: then, once a client
has sent a query holding ``marker`` (``INSERT INTO db.table``), had the server's answer to it (the
table's structure, in the native protocol) and sent its data, the server's replies are dropped and,
``hold_s`` later, when the server has long written the block, both connections are closed. The
client sees its connection break while waiting for the insert's end; the rows are stored.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time


class ReplyCutter:
    def __init__(self, upstream_port: int, marker: bytes, hold_s: float = 2.0) -> None:
        self._upstream = upstream_port
        self._marker = marker
        self._hold_s = hold_s
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.armed = threading.Event()
        self.cuts = 0  # replies lost
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> ReplyCutter:
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        for t in self._threads:
            t.join(5)

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._pipe, args=(client,), daemon=True)
            t.start()
            self._threads.append(t)

    def _pipe(self, client: socket.socket) -> None:
        try:
            server = socket.create_connection(("127.0.0.1", self._upstream), timeout=5)
        except OSError:
            client.close()
            return
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ)
        sel.register(server, selectors.EVENT_READ)
        phase, answered, cut_at = 0, False, 0.0
        try:
            while not self._stop.is_set():
                events = sel.select(0.2)
                if phase == 2 and time.monotonic() >= cut_at:
                    self.cuts += 1
                    return
                for key, _ in events:
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    data = sock.recv(1 << 16)
                    if not data:
                        return
                    if sock is client:
                        if phase == 0 and self.armed.is_set() and self._marker in data:
                            phase, answered = 1, False
                        elif phase == 1 and answered:  # the insert's data, after the table's structure
                            phase, cut_at = 2, time.monotonic() + self._hold_s
                            self.armed.clear()
                        server.sendall(data)
                    elif phase != 2:  # in phase 2 the reply is lost
                        answered = True
                        client.sendall(data)
        except OSError:
            pass
        finally:
            sel.close()
            for s in (client, server):
                with contextlib.suppress(OSError):
                    s.close()

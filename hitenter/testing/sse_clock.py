"""An outside clock for streamed responses: a loopback TCP proxy in front of a server that forwards every byte
unchanged and timestamps, for each response, when its request was sent and when each server-sent output event
carrying tokens went past (how many token ids it held). A browser pointed at the proxy is timed by neither its own
code nor the server's: what a client on the wire sees."""

from __future__ import annotations

import re
import socket
import threading
import time
from dataclasses import dataclass, field

OUTPUT = re.compile(rb'"type": "output", "token_ids": \[([0-9, ]*)\]')


@dataclass
class Exchange:
    """One request through the proxy: its first line, when it was sent, and (time, token count) per output event."""
    line: str
    sent: float
    outs: list[tuple[float, int]] = field(default_factory=list)
    done: bool = False


class SSEClock:
    """``SSEClock(port)`` proxies 127.0.0.1:<self.port> to 127.0.0.1:<port>; ``exchanges`` in order of sending."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.exchanges: list[Exchange] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            s = socket.create_connection(("127.0.0.1", self.target))
            pending: list[Exchange] = []
            threading.Thread(target=self._up, args=(c, s, pending), daemon=True).start()
            threading.Thread(target=self._down, args=(s, c, pending), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket, pending: list[Exchange]) -> None:
        """Client to server: a request's first line starts an exchange, timed as its bytes arrive."""
        while data := _recv(src):
            head = data.split(b"\r\n", 1)[0]
            if re.match(rb"(GET|POST|PUT|DELETE|HEAD|OPTIONS) ", head):
                ex = Exchange(head.decode("latin-1"), time.monotonic())
                self.exchanges.append(ex)
                pending.append(ex)
            dst.sendall(data)
        _close(dst)

    def _down(self, src: socket.socket, dst: socket.socket, pending: list[Exchange]) -> None:
        """Server to client: every output event's token count (output events carry all the ids so far), timed as
        it passes; forwarded unchanged. A response's status line hands the bytes after it to the oldest request."""
        buf, ex = b"", None
        while data := _recv(src):
            t = time.monotonic()
            dst.sendall(data)
            if data.startswith(b"HTTP/1.1 ") and pending:
                if ex is not None:
                    ex.done = True
                ex, buf = pending.pop(0), b""
            if ex is None:
                continue
            buf = buf[-8192:] + data
            for m in OUTPUT.finditer(buf):
                n = len([x for x in m.group(1).split(b",") if x.strip()])
                if n > (ex.outs[-1][1] if ex.outs else 0):
                    ex.outs.append((t, n))
            if b'"type": "done"' in data:
                ex.done = True
        _close(dst)

    def close(self) -> None:
        _close(self.sock)


def _recv(s: socket.socket) -> bytes:
    try:
        return s.recv(65536)
    except OSError:
        return b""


def _close(s: socket.socket) -> None:
    try:
        s.close()
    except OSError:
        pass

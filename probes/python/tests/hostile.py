"""Collectors that misbehave, for the tests that the probe never holds up its host: each
listens on 127.0.0.1 and does one wrong thing to every connection. The in-test collector
that behaves is fake_collector.py."""

import socket
import threading
import time
from typing import List, Optional

from hoptrace_probe import protocol

# What a hostile collector does with each connection.
SILENT = "silent"  # accepts, never reads, never answers
WELCOME_THEN_DEAF = "welcome_then_deaf"  # answers Welcome, then never reads: the buffers fill
GARBAGE = "garbage"  # answers Hello with bytes that are no frame
WELCOME_THEN_GARBAGE = "welcome_then_garbage"  # Welcome, then bytes that are no frame
CLOSE_AFTER_HELLO = "close_after_hello"  # reads Hello and closes
SLOW_WELCOME = "slow_welcome"  # answers Welcome `delay_s` after Hello, then behaves
NEVER_ACCEPT = "never_accept"  # listens with a backlog of one and never accepts

# A frame header that claims the largest frame, then junk: no decoder may take it as a frame.
_GARBAGE = b"\xff\xff\xff\x7f" + bytes(range(256)) * 4


class HostileCollector:
    def __init__(self, mode: str, delay_s: float = 0.0, port: int = 0) -> None:
        self.mode = mode
        self.delay_s = delay_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(1 if mode == NEVER_ACCEPT else 64)
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.accepted = 0
        self.hellos = 0
        self._conns: List[socket.socket] = []
        self._stop = threading.Event()
        if mode != NEVER_ACCEPT:
            threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read_hello(self, conn: socket.socket) -> Optional[protocol.Hello]:
        buf = b""
        while True:
            got = protocol.split_frame(buf)
            if got is not None:
                ty, body, _ = got
                self.hellos += 1
                return protocol.decode(ty, body)
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk

    def _serve(self, conn: socket.socket) -> None:
        try:
            if self.mode == SILENT:
                self._stop.wait()
                return
            hello = self._read_hello(conn)
            if hello is None:
                return
            welcome = protocol.encode(protocol.Welcome("hostile-run", hello.version, 0))
            if self.mode == CLOSE_AFTER_HELLO:
                return
            if self.mode == GARBAGE:
                conn.sendall(_GARBAGE)
                self._stop.wait()
                return
            if self.mode == SLOW_WELCOME:
                if self._stop.wait(self.delay_s):
                    return
                conn.sendall(welcome)
                # Then a collector that reads everything and acknowledges nothing.
                while conn.recv(1 << 16):
                    pass
                return
            conn.sendall(welcome)
            if self.mode == WELCOME_THEN_GARBAGE:
                conn.sendall(_GARBAGE)
            # WELCOME_THEN_DEAF (and after the garbage): read nothing more.
            self._stop.wait()
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        """Stops listening and closes every connection; the port is free again."""
        self._stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass


class Restarter:
    """Drops every connection of a FakeCollector every `every_s` (a collector that restarts
    again and again, keeping what it holds), until stopped."""

    def __init__(self, collector, every_s: float = 0.2) -> None:
        self.collector = collector
        self.every_s = every_s
        self.drops = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # The period is what is tested: a restart every `every_s`.
        while not self._stop.wait(self.every_s):
            self.collector.drop_connections()
            self.drops += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_for(predicate, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)

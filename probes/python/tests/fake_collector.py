"""An in-test collector for unit tests of framing, reconnects and backoff: it speaks the
protocol with the package's own decoder. End-to-end tests use the real `hoptrace collect`."""

import socket
import threading
import time
from typing import List, Optional

from hoptrace_probe import protocol


class Connection:
    def __init__(self) -> None:
        self.hello: Optional[protocol.Hello] = None
        self.frames: List[protocol.Frame] = []
        self.closed = threading.Event()

    def of(self, kind):
        return [f for f in self.frames if isinstance(f, kind)]

    def records(self):
        return [r for f in self.frames if isinstance(f, (protocol.Records, protocol.SeqRecords))
                for r in f.records]

    def counters(self) -> dict:
        """Every counter of the connection's Counters frames, the latest value of each id:
        what a collector holds, since a host's own Counters frames (a store tap's ids) come
        between the exporter's."""
        merged = {}
        for f in self.of(protocol.Counters):
            merged.update(f.values)
        return merged

    def seqs(self):
        """The numbers of the SeqRecords frames received, in order."""
        return [f.seq for f in self.of(protocol.SeqRecords)]


class FakeCollector:
    """Accepts probes on 127.0.0.1; `reject` answers Hello with Reject; `close_after`
    closes each connection after that many frames following Hello.

    `version` is the highest protocol version it speaks: 2 answers a version 2 Hello with
    a version 2 Welcome whose `resume_seq` is `held` (the highest frame number it keeps
    of that instance, from earlier connections, unless set) and acknowledges every
    SeqRecords frame at once unless `ack` is False; 1 refuses a version 2 Hello with Reject
    code 1, as a version 1 collector does."""

    def __init__(self, port: int = 0, reject: Optional[protocol.Reject] = None,
                 close_after: Optional[int] = None, version: int = 2, ack: bool = True) -> None:
        self.reject = reject
        self.close_after = close_after
        self.version = version
        self.ack = ack
        self.held = {}  # instance id -> highest SeqRecords number received
        self._live: List[socket.socket] = []
        self.connections: List[Connection] = []
        self.accept_times: List[float] = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.address = "127.0.0.1:%d" % self.sock.getsockname()[1]
        self._stop = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            if self._stop:
                # Accepted while close() was under way: the probe must see it closed.
                conn.close()
                return
            self.accept_times.append(time.monotonic())
            self._live.append(conn)
            c = Connection()
            self.connections.append(c)
            threading.Thread(target=self._serve, args=(conn, c), daemon=True).start()

    def _serve(self, conn: socket.socket, c: Connection) -> None:
        buf = b""
        try:
            while True:
                got = protocol.split_frame(buf)
                if got is None:
                    chunk = conn.recv(1 << 16)
                    if not chunk:
                        return
                    buf += chunk
                    continue
                ty, body, used = got
                buf = buf[used:]
                frame = protocol.decode(ty, body)
                if c.hello is None:
                    c.hello = frame
                    answer = self.reject
                    if answer is None and frame.version > self.version:
                        answer = protocol.Reject(protocol.RejectCode.VERSION,
                                                 f"unsupported version {frame.version}")
                    if answer is None:
                        version = min(frame.version, self.version)
                        answer = protocol.Welcome("fake-run", version,
                                                  self.held.get(frame.instance_id, 0) if version >= 2 else 0)
                    conn.sendall(protocol.encode(answer))
                    if isinstance(answer, protocol.Reject):
                        return
                    continue
                c.frames.append(frame)
                if isinstance(frame, protocol.SeqRecords):
                    iid = c.hello.instance_id
                    self.held[iid] = max(self.held.get(iid, 0), frame.seq)
                    if self.ack:
                        conn.sendall(protocol.encode(protocol.Ack(self.held[iid])))
                if isinstance(frame, protocol.Goodbye):
                    if c.hello.version >= 2 and self.version >= 2 and self.ack:
                        conn.sendall(protocol.encode(protocol.Ack(self.held.get(c.hello.instance_id, 0))))
                    return
                if self.close_after is not None and len(c.frames) >= self.close_after:
                    return
        except OSError:
            # The connection was dropped (drop_connections, or the probe went away): the
            # end of this connection, as for a collector.
            return
        finally:
            conn.close()
            c.closed.set()

    def wait(self, predicate, timeout=10.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, "timed out waiting for the fake collector"
            time.sleep(0.01)

    def drop_connections(self) -> None:
        """Closes every open connection at once (a collector that died), keeping the
        listener."""
        for conn in self._live:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._live.clear()

    def close(self) -> None:
        self._stop = True
        try:
            # Wakes the accept() of the other thread; close() alone leaves it listening.
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        # What the acceptor took before it saw the stop is in _live once it has left.
        self._acceptor.join(5)
        self.drop_connections()


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port

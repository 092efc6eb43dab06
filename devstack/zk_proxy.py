"""A TCP proxy between ZooKeeper clients and one server that produces the faults a network
does: a request that reaches the server while its reply is lost, and replies that stall on a
connection that stays up.

It parses just enough of ZooKeeper's framing (a 4-byte length before every packet; after the
connect handshake a request starts with `xid, type` and a reply with `xid, zxid, err`) to
recognise one request (by type, and for single-path requests by a part of the path) and
the reply to it:

- `drop_reply_to(op)`: the next request of that type is forwarded; once the server's reply
  arrives, it is thrown away and the client's connection is closed. The server applied the
  request, the client saw a connection loss: an operation whose outcome is unknown.
- `lose_request_to(op)`: the next request of that type never reaches the server, and the
  client's connection is closed: the client cannot tell this from the case above.
- `stall_next_connection(seconds)`: the next connection's replies (after its handshake) are
  held back for `seconds`, then delivered. Reads time out while the connection lives.

With several upstream members, each new connection goes to the first that accepts, starting
after the one the previous connection used (as a client walks its connect string).

It binds 127.0.0.1 only and runs daemon threads (an accept loop, two pumps per connection);
`close()` ends them all. For tests and the chaos run; shipped code never imports it.
"""

from __future__ import annotations

import contextlib
import enum
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from devstack.process import LOOPBACK

_FRAME = struct.Struct(">i")
_REQUEST = struct.Struct(">ii")  # xid, type
_REPLY_XID = struct.Struct(">i")
ACCEPT_POLL_S = 0.2


class Fault(enum.Enum):
    LOSE_REQUEST = "lose_request"
    LOSE_REPLY = "lose_reply"


class Op(enum.IntEnum):
    """ZooKeeper request types (OpCode in the server's sources) the tests aim faults at."""

    CREATE = 1
    DELETE = 2
    EXISTS = 3
    GET_DATA = 4
    SET_DATA = 5
    GET_CHILDREN2 = 12
    MULTI = 14


def _read_exact(sock: socket.socket, count: int) -> bytes | None:
    chunks: list[bytes] = []
    while count:
        try:
            chunk = sock.recv(count)
        except OSError:
            return None
        if not chunk:
            return None
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _read_exact(sock, _FRAME.size)
    if head is None:
        return None
    (length,) = _FRAME.unpack(head)
    body = _read_exact(sock, length) if length > 0 else b""
    return None if body is None else head + body


@dataclass(frozen=True)
class _Armed:
    op: Op
    fault: Fault
    path: str | None  # a part of the request's path; None: any (multi-ops have no one path)

    def matches(self, kind: int, frame: bytes) -> bool:
        if kind != self.op:
            return False
        if self.path is None:
            return True
        at = _FRAME.size + _REQUEST.size
        if len(frame) < at + _FRAME.size:
            return False
        (length,) = _FRAME.unpack_from(frame, at)
        path = frame[at + _FRAME.size : at + _FRAME.size + max(length, 0)]
        return self.path in path.decode("utf-8", errors="replace")


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    stall_s: float = 0.0
    drop_xids: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class ZkProxy:
    """Forwards `127.0.0.1:port` to the ZooKeeper members at `upstreams` (host, port)."""

    def __init__(self, *upstreams: tuple[str, int]) -> None:
        if not upstreams:
            raise ValueError("a proxy needs at least one upstream")
        self.upstreams = upstreams
        self._next = 0
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((LOOPBACK, 0))
        self._listener.listen(16)
        self._listener.settimeout(ACCEPT_POLL_S)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._links: list[_Link] = []
        self._armed: list[_Armed] = []
        self._stall_next_s = 0.0
        self._closed = threading.Event()
        self.dropped: list[tuple[Op, Fault, int]] = []
        """(type, fault, xid) of every request or reply thrown away, in order."""
        self.dropped_event = threading.Event()
        self._accepter = threading.Thread(target=self._accept, name="zk-proxy", daemon=True)
        self._accepter.start()

    @property
    def hosts(self) -> str:
        """The connect string clients use instead of the server's."""
        return f"{LOOPBACK}:{self.port}"

    def drop_reply_to(self, op: Op, path: str | None = None) -> None:
        """Lose the reply to the next request of type `op` (whose path contains `path`, if
        given), and that client's connection."""
        self._arm(_Armed(op, Fault.LOSE_REPLY, path))

    def lose_request_to(self, op: Op, path: str | None = None) -> None:
        """Lose the next request of type `op` (and `path`) before the server, and that
        client's connection."""
        self._arm(_Armed(op, Fault.LOSE_REQUEST, path))

    def _arm(self, armed: _Armed) -> None:
        with self._lock:
            self._armed.append(armed)
            self.dropped_event.clear()

    def stall_next_connection(self, seconds: float) -> None:
        """Hold back the replies of the next connection, after its handshake, for `seconds`."""
        with self._lock:
            self._stall_next_s = seconds

    def cut(self) -> None:
        """Close every current connection (clients see a connection loss and reconnect)."""
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._accepter.join(timeout=2 * ACCEPT_POLL_S + 1)
        self._listener.close()

    def __enter__(self) -> ZkProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = self._connect_upstream()
            if server is None:
                client.close()
                continue
            server.settimeout(None)
            client.settimeout(None)
            with self._lock:
                stall, self._stall_next_s = self._stall_next_s, 0.0
                link = _Link(client, server, stall_s=stall)
                self._links.append(link)
            for target, name in ((self._requests, "up"), (self._replies, "down")):
                threading.Thread(
                    target=target, args=(link,), name=f"zk-proxy-{name}", daemon=True
                ).start()

    def _connect_upstream(self) -> socket.socket | None:
        for attempt in range(len(self.upstreams)):
            upstream = self.upstreams[(self._next + attempt) % len(self.upstreams)]
            try:
                server = socket.create_connection(upstream, timeout=2)
            except OSError:
                continue
            self._next = (self._next + attempt + 1) % len(self.upstreams)
            return server
        return None

    def disarm(self) -> None:
        """Forget faults armed and not triggered yet."""
        with self._lock:
            self._armed.clear()

    def _requests(self, link: _Link) -> None:
        """Client to server: the connect request, then requests (watching for armed ops)."""
        first = True
        while (frame := _read_frame(link.client)) is not None:
            if not first and len(frame) >= _FRAME.size + _REQUEST.size:
                xid, kind = _REQUEST.unpack_from(frame, _FRAME.size)
                with self._lock:
                    armed = next((a for a in self._armed if a.matches(kind, frame)), None)
                    if armed is not None:
                        self._armed.remove(armed)
                        self.dropped.append((armed.op, armed.fault, xid))
                if armed is not None and armed.fault is Fault.LOSE_REQUEST:
                    link.close()
                    self.dropped_event.set()
                    return
                if armed is not None:
                    with link.lock:
                        link.drop_xids.add(xid)
            first = False
            try:
                link.server.sendall(frame)
            except OSError:
                break
        link.close()

    def _replies(self, link: _Link) -> None:
        """Server to client: the connect response, then replies (dropping marked ones)."""
        first, stall_until = True, 0.0
        while (frame := _read_frame(link.server)) is not None:
            if first:
                first = False
                stall_until = time.monotonic() + link.stall_s
            else:
                if time.monotonic() < stall_until:
                    time.sleep(max(0.0, stall_until - time.monotonic()))
                (xid,) = _REPLY_XID.unpack_from(frame, _FRAME.size)
                with link.lock:
                    drop = xid in link.drop_xids
                if drop:
                    link.close()  # the reply dies with the connection
                    self.dropped_event.set()
                    return
            try:
                link.client.sendall(frame)
            except OSError:
                break
        link.close()

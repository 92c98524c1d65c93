"""Host-side services inside a trial's network namespace: relays and the attempt recorder.

A trial's network namespace has only a loopback interface. holedger (as root) configures
it from the host, in a thread that has entered the namespace for the moment (bwrap: the
trial's own thread, or the thread that made the namespace ahead; docker: a short-lived
one), and binds every socket there before the harness starts; the sockets stay in that
namespace while a host thread serves them. The candidate therefore cannot kill, replace
or reconfigure any of it (it runs as uid 65534 with no capabilities over this namespace,
which the host owns).

* **Relays**: ``127.0.0.1:PORT`` inside forwards each connection to one host unix socket
  (the gateway, the server API). Nothing else is reachable.
* **Recorder**: a ``local 0.0.0.0/0 dev lo`` route makes every IPv4 address local inside
  the namespace, and listeners on common service ports (plus DNS on UDP 53) record who
  tried to reach what: ``tcp connect to 93.184.216.34:443``, ``dns query for example.com``.
  The connection is then closed and DNS is answered NXDOMAIN. Attempts on other ports,
  IPv6 and raw sockets fail (refused, unreachable or denied) without being recorded; see
  docs/SANDBOXES.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from holedger.errors import SandboxError
from holedger.sandboxes.spec import Observation

CLONE_NEWNET = 0x40000000
RECORDED_TCP_PORTS = (
    21,
    22,
    23,
    25,
    53,
    80,
    110,
    143,
    443,
    465,
    587,
    993,
    995,
    1080,
    2375,
    2376,
    3128,
    3306,
    5000,
    5432,
    6379,
    8000,
    8008,
    8080,
    8443,
    8888,
    9000,
    9200,
    11211,
    11434,
    18080,
    27017,
)
MAX_OBSERVATIONS = 50
# Relayed connections open at once, per trial. Each costs the host two sockets and two
# threads (and the target a connection): without a cap one trial could exhaust the host
# process's file descriptors and so break every other trial and the ledger.
MAX_RELAY_CONNECTIONS = 32

T = TypeVar("T")

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"{what} failed: {os.strerror(err)}", hint="run holedger as root")


def _in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a fresh thread (namespace changes die with it) and return its result."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=target, name="holedger-netns")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


# ----------------------------------------------------------------------------- netlink

NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400
NLMSG_ERROR, RTM_NEWLINK, RTM_NEWROUTE = 2, 16, 24
IFF_UP, LOOPBACK_IFINDEX = 0x1, 1
RT_TABLE_LOCAL, RTPROT_BOOT, RT_SCOPE_HOST, RTN_LOCAL, RTA_OIF = 255, 3, 254, 2, 4


def _netlink(sock: socket.socket, msg_type: int, flags: int, body: bytes, seq: int) -> int:
    """Send one request; return the kernel's errno (0 on success)."""
    header = struct.pack(
        "=IHHII", 16 + len(body), msg_type, flags | NLM_F_REQUEST | NLM_F_ACK, seq, 0
    )
    sock.send(header + body)
    while True:
        data = sock.recv(65536)
        offset = 0
        while offset + 16 <= len(data):
            length, kind, _, rseq, _ = struct.unpack_from("=IHHII", data, offset)
            if kind == NLMSG_ERROR and rseq == seq:
                (error,) = struct.unpack_from("=i", data, offset + 16)
                return -int(error)
            offset += max(16, (length + 3) & ~3)


def configure_loopback() -> None:
    """Bring lo up and make every IPv4 address local (in the calling thread's netns)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as nl:
        link = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, LOOPBACK_IFINDEX, IFF_UP, IFF_UP)
        err = _netlink(nl, RTM_NEWLINK, 0, link, 1)
        if err:
            raise SandboxError(f"cannot bring up loopback: {os.strerror(err)}")
        route = struct.pack(
            "=BBBBBBBBI",
            socket.AF_INET,
            0,
            0,
            0,
            RT_TABLE_LOCAL,
            RTPROT_BOOT,
            RT_SCOPE_HOST,
            RTN_LOCAL,
            0,
        )
        route += struct.pack("=HHi", 8, RTA_OIF, LOOPBACK_IFINDEX)
        err = _netlink(nl, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, route, 2)
        if err and err != 17:  # EEXIST
            raise SandboxError(f"cannot add the catch-all local route: {os.strerror(err)}")


# ----------------------------------------------------------------------------- services


def _dns_question(packet: bytes) -> tuple[str, bytes] | None:
    """(query name, question section) of a DNS query, or None when malformed."""
    if len(packet) < 12:
        return None
    labels: list[str] = []
    offset = 12
    while offset < len(packet):
        n = packet[offset]
        if n == 0:
            end = offset + 5
            if end > len(packet):
                return None
            return ".".join(labels) or ".", packet[12:end]
        if n & 0xC0 or offset + 1 + n > len(packet):
            return None
        labels.append(packet[offset + 1 : offset + 1 + n].decode("ascii", "replace"))
        offset += 1 + n
    return None


def _nxdomain(query: bytes, question: bytes) -> bytes:
    (qid, qflags) = struct.unpack_from("!HH", query)
    flags = 0x8000 | (qflags & 0x0100) | 0x0080 | 3  # QR, RD copied, RA, NXDOMAIN
    return struct.pack("!HHHHHH", qid, flags, 1, 0, 0, 0) + question


class NetnsServices:
    """Relays and recorder for one trial, bound inside its network namespace."""

    def __init__(self, relays: dict[int, Path], record: bool = True) -> None:
        self.relays = dict(relays)
        self.record = record
        self.observations: list[Observation] = []
        self._dropped = 0
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._sockets: list[socket.socket] = []
        self._conns: set[socket.socket] = set()
        self._relaying = 0
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        self._closed = False  # serving stopped
        self._released = False  # sockets closed
        self._configured = False  # loopback up, recorder bound
        self._recorders: dict[int, socket.socket] = {}
        self._netns: int | None = None  # held from prepare or entered until close

    # -- setup (runs in a thread that is inside the trial's netns) --

    def _bind_all(self) -> None:
        configure_loopback()
        self._bind_recorder()
        self._bind_relays()

    def _bind_recorder(self) -> None:
        self._configured = True
        if not self.record:
            return
        for port in RECORDED_TCP_PORTS:
            if port in self.relays:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("0.0.0.0", port))
            s.listen(16)
            self._add(s, ("tcp", port))
            self._recorders[port] = s
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("0.0.0.0", 53))
        self._add(udp, ("dns", 53))

    def _bind_relays(self) -> None:
        for port in sorted(self.relays):
            recorder = self._recorders.pop(port, None)
            if recorder is not None:  # bound ahead (prepare): the relay takes the port
                self._selector.unregister(recorder)
                self._sockets.remove(recorder)
                recorder.close()
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", port))
            s.listen(64)
            self._add(s, ("relay", port))

    def _add(self, s: socket.socket, data: tuple[str, int]) -> None:
        s.setblocking(False)
        self._sockets.append(s)
        self._selector.register(s, selectors.EVENT_READ, data)

    def prepare(self) -> None:
        """Make the namespace now, ahead of its trial: the calling thread enters a new one,
        configures it and binds the recorder there, and is moved back. :meth:`entered`
        then uses it, and :meth:`bind` adds only the relays."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
            try:
                self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                configure_loopback()
                self._bind_recorder()
            finally:
                _check(_libc.setns(home, CLONE_NEWNET), "setns(net) back to the host's")
        finally:
            os.close(home)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Move the calling thread into this trial's network namespace (made now unless
        :meth:`prepare` made it) for the ``with`` block.

        Children spawned in the block inherit the namespace; call :meth:`bind` there (after
        spawning, so it overlaps the child's own start) and :meth:`start` after the block.
        The thread is moved back on leaving. Only this thread changes namespace."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            try:
                if self._netns is None:
                    _check(_libc.unshare(CLONE_NEWNET), "unshare(CLONE_NEWNET)")
                    self._netns = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
                else:
                    _check(_libc.setns(self._netns, CLONE_NEWNET), "setns(net)")
                yield
            finally:
                # Should this fail, the thread would stay cut off from the network.
                _check(_libc.setns(home, CLONE_NEWNET), "setns(net) back to the host's")
        finally:
            os.close(home)

    def bind(self) -> None:
        """Configure the namespace and bind every socket in it not bound yet (call inside
        :meth:`entered`)."""
        if not self._configured:
            configure_loopback()
            self._bind_recorder()
        self._bind_relays()

    def start(self) -> None:
        """Serve the bound sockets from a host thread."""
        self._start()

    def setup_enter(self, pid: int) -> None:
        """Enter the netns of ``pid`` (e.g. a container's init) and configure it."""

        def inside() -> None:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
            try:
                _check(_libc.setns(fd, CLONE_NEWNET), "setns(net)")
            finally:
                os.close(fd)
            self._bind_all()

        try:
            _in_thread(inside)
        finally:
            self._start()

    # -- serving (a host thread; the sockets already live in the trial's netns) --

    def _start(self) -> None:
        self._selector.register(self._wake_r, selectors.EVENT_READ, ("wake", 0))
        self._thread = threading.Thread(target=self._serve, name="holedger-netns-serve")
        self._thread.daemon = True
        self._thread.start()

    def _observe(self, detail: str) -> None:
        with self._lock:
            if any(o.detail == detail for o in self.observations):
                return
            if len(self.observations) >= MAX_OBSERVATIONS:
                self._dropped += 1
                return
            self.observations.append(Observation("network_attempt", detail))

    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=1.0):
                kind, port = key.data
                if kind == "wake":
                    return
                s: socket.socket = key.fileobj  # type: ignore[assignment]
                with contextlib.suppress(OSError):
                    if kind == "dns":
                        self._on_dns(s)
                        continue
                    conn, _ = s.accept()
                    if kind == "relay":
                        if not self._admit():
                            conn.close()
                            self._observe(
                                f"more than {MAX_RELAY_CONNECTIONS} relayed connections at once"
                            )
                            continue
                        conn.setblocking(True)
                        threading.Thread(
                            target=self._relay, args=(conn, self.relays[port]), daemon=True
                        ).start()
                    else:
                        ip, dport = conn.getsockname()[:2]
                        self._observe(f"tcp connect to {ip}:{dport}")
                        conn.close()

    def _on_dns(self, s: socket.socket) -> None:
        packet, peer = s.recvfrom(4096)
        parsed = _dns_question(packet)
        if parsed is None:
            self._observe("udp datagram to port 53")
            return
        name, question = parsed
        self._observe(f"dns query for {name}")
        s.sendto(_nxdomain(packet, question), peer)

    def _admit(self) -> bool:
        with self._lock:
            if self._relaying >= MAX_RELAY_CONNECTIONS:
                return False
            self._relaying += 1
            return True

    def _relay(self, client: socket.socket, target: Path) -> None:
        try:
            self._relay_one(client, target)
        finally:
            with self._lock:
                self._relaying -= 1

    def _relay_one(self, client: socket.socket, target: Path) -> None:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(str(target))
        except OSError:
            client.close()
            upstream.close()
            return
        with self._lock:
            self._conns.update((client, upstream))
        back = threading.Thread(target=self._pump, args=(upstream, client), daemon=True)
        back.start()
        self._pump(client, upstream)
        back.join()
        with self._lock:
            self._conns.difference_update((client, upstream))
        client.close()
        upstream.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def stop(self) -> list[Observation]:
        """Stop serving and return the observations; the sockets stay open until close."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"x")
            if self._thread is not None:
                self._thread.join(timeout=5)
        out = list(self.observations)
        if self._dropped:
            out.append(Observation("network_attempt", f"{self._dropped} more attempts"))
        return out

    def close(self) -> list[Observation]:
        """Stop serving, close every socket; return the observations."""
        out = self.stop()
        if not self._released:
            self._released = True
            with self._lock:
                conns = list(self._conns)
            for s in [*self._sockets, *conns]:
                with contextlib.suppress(OSError):
                    s.close()
            self._selector.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            if self._netns is not None:
                os.close(self._netns)
        return out


def host_relays(relays: dict[int, Path]) -> NetnsServices:
    """Relays bound on the host's own 127.0.0.1 (the unisolated process backend)."""
    services = NetnsServices(relays, record=False)
    for port in sorted(relays):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            s.close()
            services.close()
            raise SandboxError(
                f"cannot relay 127.0.0.1:{port} on the host: {exc}",
                hint="the process backend shares the host network; pick a free port",
            ) from exc
        s.listen(64)
        services._add(s, ("relay", port))
    services._start()
    return services

"""A TCP proxy that makes a network worse on demand: a one-way delay each direction (a round trip
gains twice it), a bandwidth cap, and modes switched at run time.  For tests/test_remote.py and
benchmarks/edge_cloud.py (which loads it by path).

    proxy = DelayProxy("127.0.0.1:50051", delay_ms=20).start()   # listens on 127.0.0.1:<proxy.port>
    drv = RemoteDriver(proxy.address, model)
    proxy.set_delay(40); proxy.set_bandwidth(1_000_000); proxy.set_mode("blackhole"); proxy.stop()

Modes: "forward" (the default), "drop" (every connection closed, new ones closed at once),
"blackhole" (connections accepted, nothing forwarded either way: the caller's deadline must fire),
"garbage" (the client gets random bytes instead of the server's, and random bytes back for what
it sends; each burst starts with 0xff, an impossible HTTP/2 frame length, so it fails at once).
The setters are thread-safe and apply to the bytes read from then on; going back to "forward"
closes the connections the other modes broke, so that clients reconnect.
"""
import os
import queue
import socket
import threading
import time

MODES = ("forward", "drop", "blackhole", "garbage")


class DelayProxy:
    def __init__(self, target, *, delay_ms=0.0, bandwidth=None, host="127.0.0.1"):
        if isinstance(target, str):
            h, _, p = target.rpartition(":")
            target = (h.strip("[]"), int(p))
        self.target, self.host = target, host
        self.delay, self.bandwidth, self.mode = delay_ms / 1000, bandwidth, "forward"
        self.lock = threading.Lock()
        self.links = set()
        self.listener = None
        self.connections = 0       # accepted so far
        self.bytes = [0, 0]        # forwarded to the server, to the client

    # ------------------------------------------------------------------ control

    def start(self):
        self.listener = socket.create_server((self.host, 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.address = f"{self.host}:{self.port}"
        self.running = True
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()
        return self

    def stop(self):
        self.running = False
        if self.listener is not None:
            self.listener.close()
        for link in list(self.links):
            link.close()

    def __enter__(self):
        return self.start() if self.listener is None else self

    def __exit__(self, *exc):
        self.stop()

    def set_delay(self, ms):
        with self.lock:
            self.delay = ms / 1000

    def set_bandwidth(self, bytes_per_s):
        """None: no cap.  Each direction of each connection is paced to it separately."""
        with self.lock:
            self.bandwidth = bytes_per_s

    def set_mode(self, mode):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        with self.lock:
            before, self.mode = self.mode, mode
        if mode == "drop" or (mode == "forward" and before != "forward"):
            for link in list(self.links):   # back to forward: the connections it broke close, clients reconnect
                link.close()

    # ------------------------------------------------------------------ work

    def _accept(self):
        while self.running:
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.connections += 1
            with self.lock:
                mode = self.mode
            if mode == "drop":
                client.close()
                continue
            server = None
            if mode == "forward":
                try:
                    server = socket.create_connection(self.target, timeout=5)
                except OSError:
                    client.close()
                    continue
            _Link(self, client, server)


class _Link:
    """One proxied connection: two directions, each a reader stamping what it reads and a writer
    sending it when due."""

    def __init__(self, proxy, client, server):
        self.proxy, self.client, self.server = proxy, client, server
        for s in (client, server):
            if s is not None:   # no Nagle: a small write waits for nothing (gRPC's own sockets do the same)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.closed = False
        proxy.links.add(self)
        for source, up in ((client, True), (server, False)):
            if source is None:
                continue
            q = queue.Queue()
            threading.Thread(target=self._read, args=(source, q), daemon=True).start()
            threading.Thread(target=self._write, args=(q, up), daemon=True).start()

    def close(self):
        if self.closed:
            return
        self.closed = True
        self.proxy.links.discard(self)
        for s in (self.client, self.server):
            if s is not None:
                try:
                    s.shutdown(socket.SHUT_RDWR)   # wakes a thread blocked in recv
                except OSError:
                    pass
                s.close()

    def _read(self, source, q):
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                q.put(None)
                return
            with self.proxy.lock:
                q.put((time.monotonic() + self.proxy.delay, data))

    def _write(self, q, up):
        proxy, free_at = self.proxy, 0.0
        while True:
            item = q.get()
            if item is None or self.closed:
                self.close()
                return
            due, data = item
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with proxy.lock:
                mode, bandwidth = proxy.mode, proxy.bandwidth
            if mode == "blackhole":
                continue
            if mode == "garbage":
                # random, but for a first byte that makes an HTTP/2 frame longer than any peer takes: the
                # client fails at once instead of waiting for a frame's end (waiting is blackhole's case)
                dest, data = self.client, b"\xff" + os.urandom(max(len(data), 64) - 1)
            else:
                dest = self.server if up else self.client
            if dest is None:
                continue
            for i in range(0, len(data), 16384):
                piece = data[i:i + 16384]
                if bandwidth:
                    start = max(time.monotonic(), free_at)
                    time.sleep(max(start - time.monotonic(), 0))
                    free_at = start + len(piece) / bandwidth
                try:
                    dest.sendall(piece)
                except OSError:
                    self.close()
                    return
                proxy.bytes[0 if up and mode == "forward" else 1] += len(piece)

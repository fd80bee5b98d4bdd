"""etcd, the control plane's store: a client of its v3 API through the JSON gateway (docs/DEVICES.md).

    store = Etcd("10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379")
    lease = store.grant(5)                          # seconds; keep it with store.keepalive(lease)
    store.put("/colibri/edges/kiosk-3", b"{...}", lease=lease)
    ok = store.create("/colibri/x", b"1")           # compare-and-swap: only where the key is absent
    with store.watch("/colibri/placement/kiosk-3") as w:
        for event in w.events(timeout=1.0): ...

Why the gateway and not gRPC: every call is one HTTP POST of JSON with the standard library, so no
code is generated from etcd's protos (which pull in gogoproto and Google's HTTP annotations) and no
version of them is pinned beside colibri's own; the calls are the ones an operator types with curl
to look at the control plane; and the traffic is metadata (a lease refresh a second, a placement
now and then) where JSON's cost does not show.  Watches are the gateway's streamed responses, one
JSON object a line.

Several endpoints are members of one cluster: a call goes to the member that answered last and, on
a connection error, to the next; only when none answers does it raise EtcdError naming them all.
"""
import base64
import http.client
import json
import socket
import threading
import queue

DEFAULT_TIMEOUT = 2.0   # seconds a unary call may take on one member


class EtcdError(RuntimeError):
    """etcd refused a call or could not be reached; the message names the members and the cause."""


class LeaseExpired(EtcdError):
    """The lease is gone: its TTL passed without a refresh, or it was revoked."""


def parse_endpoints(text):
    """[(host, port)] of "HOST:PORT[,HOST:PORT...]"; ValueError naming the malformed one."""
    endpoints = []
    for part in (text.split(",") if isinstance(text, str) else text):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"--etcd {part.strip()!r}: an etcd member is HOST:PORT")
        endpoints.append((host.strip("[]"), int(port)))
    if not endpoints:
        raise ValueError("--etcd names no member: HOST:PORT[,HOST:PORT...]")
    return endpoints


def b64(data):
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def unb64(text):
    return base64.b64decode(text) if text else b""


def prefix_end(prefix):
    """The range end that makes `prefix` a prefix query (etcd's convention: the last byte plus one)."""
    p = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return b"\0"
    p[-1] += 1
    return bytes(p)


def kv_of(d):
    """A key-value of a response, as a dict of bytes and ints."""
    return {"key": unb64(d.get("key")), "value": unb64(d.get("value")),
            "create_revision": int(d.get("create_revision", 0)), "mod_revision": int(d.get("mod_revision", 0)),
            "version": int(d.get("version", 0)), "lease": int(d.get("lease", 0))}


class Etcd:
    """A client of one etcd cluster at `endpoints` ("HOST:PORT,..." or [(host, port)]).  Thread-safe:
    each call opens its own connection (a call a second or so; watches hold theirs)."""

    def __init__(self, endpoints, *, timeout_s=DEFAULT_TIMEOUT):
        self.endpoints = parse_endpoints(endpoints) if isinstance(endpoints, str) else list(endpoints)
        self.timeout_s = timeout_s
        self.current = 0
        self.lock = threading.Lock()

    def __repr__(self):
        return f"Etcd({self.names()})"

    def names(self):
        return ",".join(f"{h}:{p}" for h, p in self.endpoints)

    # ---- the gateway ------------------------------------------------------------------------------

    def _members(self):
        """The members in the order to try them: the one that answered last first."""
        with self.lock:
            first = self.current
        return [(first + i) % len(self.endpoints) for i in range(len(self.endpoints))]

    def call(self, path, body, *, timeout_s=None):
        """The JSON answer of POST /v3/<path> on the first member that answers.  EtcdError for
        etcd's own refusal (its message) or when no member answers."""
        errors = []
        for i in self._members():
            host, port = self.endpoints[i]
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s or self.timeout_s)
            try:
                conn.request("POST", f"/v3/{path}", json.dumps(body), {"Content-Type": "application/json"})
                response = conn.getresponse()
                text = response.read()
            except (OSError, http.client.HTTPException) as e:
                errors.append(f"{host}:{port}: {e or type(e).__name__}")
                continue
            finally:
                conn.close()
            with self.lock:
                self.current = i
            try:
                answer = json.loads(text)
            except ValueError:
                raise EtcdError(f"etcd at {host}:{port}: /v3/{path} answered HTTP {response.status} with "
                                f"{text[:80]!r}, not JSON (is it etcd's client port?)") from None
            if "error" in answer:
                message = answer.get("message") or answer["error"]
                raise (LeaseExpired if "lease not found" in message else EtcdError)(
                    f"etcd at {host}:{port}: /v3/{path}: {message}")
            return answer
        raise EtcdError(f"no etcd member answers ({'; '.join(errors)})")

    # ---- keys ---------------------------------------------------------------------------------------

    def get(self, key):
        """The key's key-value (kv_of) or None."""
        kvs = self.call("kv/range", {"key": b64(key)}).get("kvs", [])
        return kv_of(kvs[0]) if kvs else None

    def get_prefix(self, prefix):
        """(the key-values under `prefix` in key order, the store's revision)."""
        answer = self.call("kv/range", {"key": b64(prefix), "range_end": b64(prefix_end(prefix))})
        return [kv_of(d) for d in answer.get("kvs", [])], int(answer["header"]["revision"])

    def put(self, key, value, *, lease=0):
        """The store's revision after the write."""
        body = {"key": b64(key), "value": b64(value)}
        if lease:
            body["lease"] = str(lease)
        return int(self.call("kv/put", body)["header"]["revision"])

    def delete(self, key, *, prefix=False):
        body = {"key": b64(key)}
        if prefix:
            body["range_end"] = b64(prefix_end(key))
        return int(self.call("kv/deleterange", body).get("deleted", 0))

    def txn(self, compare, success, failure=()):
        """(succeeded, the answer): etcd's transaction.  `compare`, `success`, `failure`: the
        gateway's JSON (keys already base64: see put_op and the compares below)."""
        answer = self.call("kv/txn", {"compare": list(compare), "success": list(success), "failure": list(failure)})
        return bool(answer.get("succeeded")), answer

    @staticmethod
    def put_op(key, value, lease=0):
        op = {"key": b64(key), "value": b64(value)}
        if lease:
            op["lease"] = str(lease)
        return {"request_put": op}

    @staticmethod
    def compare_mod(key, revision):
        """The key was last written at `revision` (0: it does not exist)."""
        return {"target": "MOD", "key": b64(key), "result": "EQUAL", "mod_revision": str(revision)}

    @staticmethod
    def compare_create(key, revision):
        """The key was created at `revision` (0: it does not exist)."""
        return {"target": "CREATE", "key": b64(key), "result": "EQUAL", "create_revision": str(revision)}

    def create(self, key, value, *, lease=0):
        """Writes the key only where it does not exist: True when written."""
        return self.txn([self.compare_create(key, 0)], [self.put_op(key, value, lease)])[0]

    # ---- leases -------------------------------------------------------------------------------------

    def grant(self, ttl_s):
        """A new lease of `ttl_s` seconds (an integer, at least 1): its id."""
        return int(self.call("lease/grant", {"TTL": str(max(1, int(ttl_s)))})["ID"])

    def keepalive(self, lease):
        """Refreshes the lease: its TTL again, in seconds.  LeaseExpired when it is gone."""
        answer = self.call("lease/keepalive", {"ID": str(lease)}).get("result", {})
        ttl = int(answer.get("TTL", 0))
        if ttl <= 0:
            raise LeaseExpired(f"etcd lease {lease:x} has expired")
        return ttl

    def revoke(self, lease):
        """Ends the lease now: its keys go at once."""
        try:
            self.call("lease/revoke", {"ID": str(lease)})
        except LeaseExpired:
            pass

    # ---- election: etcd's own (v3election), over a lease ---------------------------------------------

    def campaign(self, name, value, lease, *, timeout_s=None):
        """Waits until this lease's holder leads election `name` (etcd's election API), or
        `timeout_s` passes (EtcdError).  The leader key: {name, key, rev, lease}, what resign()
        and writes guarded by leadership need."""
        answer = self.call("election/campaign", {"name": b64(name), "lease": str(lease), "value": b64(value)},
                           timeout_s=timeout_s or 3600)
        return answer["leader"]

    def leader(self, name):
        """The leading value of election `name`, or None while nobody leads."""
        try:
            kv = self.call("election/leader", {"name": b64(name)})["kv"]
        except EtcdError as e:
            if "no leader" in str(e):
                return None
            raise
        return kv_of(kv)

    def resign(self, leader_key):
        self.call("election/resign", {"leader": leader_key})

    # ---- watches ------------------------------------------------------------------------------------

    def watch(self, key, *, prefix=False, start_revision=0):
        """A Watch of `key` (every key under it when `prefix`) from `start_revision` (0: from now)."""
        return Watch(self, key, prefix, start_revision)


class Watch:
    """Changes of a key or a prefix, read by a thread from the gateway's stream: events() yields
    (type, kv) with type "PUT" or "DELETE".  A member that goes away is replaced by the next one,
    resuming after the last revision seen, so no change is lost while any member answers."""

    def __init__(self, etcd, key, prefix, start_revision):
        self.etcd, self.key, self.prefix = etcd, key, prefix
        self.next_revision = start_revision
        self.queue = queue.Queue()
        self.closed = threading.Event()
        self.created = threading.Event()
        self.conn = None
        self.error = None
        self.thread = threading.Thread(target=self._run, name=f"etcd-watch {key}", daemon=True)
        self.thread.start()
        if not self.created.wait(etcd.timeout_s * (len(etcd.endpoints) + 1)):
            self.close()
            raise EtcdError(f"no etcd member of {etcd.names()} started a watch of {key!r}: {self.error}")

    def _run(self):
        while not self.closed.is_set():
            for i in self.etcd._members():
                if self.closed.is_set():
                    return
                try:
                    self._stream(*self.etcd.endpoints[i])
                except (OSError, http.client.HTTPException, ValueError) as e:
                    self.error = f"{self.etcd.endpoints[i][0]}:{self.etcd.endpoints[i][1]}: {e}"
            self.closed.wait(0.2)   # every member refused: try them again soon

    def _stream(self, host, port):
        request = {"key": b64(self.key)}
        if self.prefix:
            request["range_end"] = b64(prefix_end(self.key))
        if self.next_revision:
            request["start_revision"] = str(self.next_revision)
        conn = http.client.HTTPConnection(host, port, timeout=self.etcd.timeout_s)
        self.conn = conn
        try:
            conn.request("POST", "/v3/watch", json.dumps({"create_request": request}),
                         {"Content-Type": "application/json"})
            response = conn.getresponse()
            conn.sock.settimeout(None)   # a watch waits for changes as long as they take
            while not self.closed.is_set():
                line = response.readline()
                if not line:
                    raise OSError("the watch stream ended")
                result = json.loads(line).get("result")
                if result is None:
                    raise OSError(f"the watch was refused: {line[:120]!r}")
                if result.get("created"):
                    self.created.set()
                for event in result.get("events", []):
                    kv = kv_of(event["kv"])
                    self.next_revision = kv["mod_revision"] + 1
                    self.queue.put((event.get("type", "PUT"), kv))
        finally:
            conn.close()

    def events(self, timeout=None):
        """The changes queued so far, waiting up to `timeout` seconds for the first one."""
        try:
            yield self.queue.get(timeout=timeout)
        except queue.Empty:
            return
        while True:
            try:
                yield self.queue.get_nowait()
            except queue.Empty:
                return

    def close(self):
        self.closed.set()
        conn = self.conn
        if conn is not None and conn.sock is not None:
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)   # wakes the reader blocked on the stream
            except OSError:
                pass
        self.thread.join(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

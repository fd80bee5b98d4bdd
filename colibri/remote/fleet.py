"""A fleet of expert servers found in etcd: each server announces the experts it holds, and an edge's
remote device computes on all of them (docs/DEVICES.md, "Fleet of expert servers").

    colibri serve-experts --model out/model --listen 10.0.0.5:50051 --etcd 10.0.0.1:2379 --hold 0-31 ...
    colibri serve-experts --model out/model --listen 10.0.0.6:50051 --etcd 10.0.0.1:2379 --hold 32-63 ...

    fleet = FleetDriver(Etcd("10.0.0.1:2379"), model)
    table = placement_table(model, local, holds=fleet.holds(n_layers, n_experts))   # colibri.remote.edge
    s = model.session(devices=[fleet], placement=table)

A server is the key <prefix>/servers/<host:port> (Announcer), its value the JSON
{"address", "model_hash" (hex), "experts" (the ids held in every MoE layer, null: all), "max_rows",
"kernels"}, bound to an etcd lease the server keeps alive: the key goes when the server stops, or
within a lease TTL of its death.
"""
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from colibri.remote import colibri_remote_pb2 as pb
from colibri.remote import model_hash
from colibri.remote.driver import RemoteDriver, RemoteError, WrongModel
from colibri.remote.control import KeptLease
from colibri.remote.etcd import Etcd, EtcdError

PROBE_DOUBLINGS = 6   # a down server's probe back-off doubles up to 64 times the first, as the session's
TICK_S = 0.1          # the fleet thread's wait for etcd's changes between two looks at the probes due
WILDCARDS = ("0.0.0.0", "::", "")


def servers_prefix(prefix):
    """Where the servers are announced: <prefix>/servers/."""
    return prefix.rstrip("/") + "/servers/"


def advertised_address(host, port, advertise=None):
    """The "host:port" a server announces: `advertise` (HOST:PORT) when given, else the address it
    listens on, `host` and `port`, which must then be one another machine can reach (not 0.0.0.0 or
    ::).  ValueError otherwise."""
    if advertise is None:
        if host in WILDCARDS:
            raise ValueError(f"--listen {host or '*'}:{port} is every address of this machine: give --advertise "
                             f"HOST:PORT, the one edges reach this server at")
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    name, sep, number = advertise.rpartition(":")
    if not sep or name.strip("[]") in WILDCARDS or not number.isdigit() or not 0 < int(number) < 65536:
        raise ValueError(f"--advertise {advertise}: give HOST:PORT, the address edges reach this server at")
    return advertise


class Announcer:
    """Keeps `key` = `value` in etcd, bound to a lease of `ttl_s` seconds that a thread refreshes every
    ttl_s / 3: the key lives while the process does and goes within a TTL of its death (kill -9, a
    lost machine).  A lease that expired anyway (etcd unreachable for a TTL, the process paused) is
    replaced and the key put again.  close(revoke=True) at a clean stop: the key goes at once.
    Construction puts the key or raises EtcdError."""

    def __init__(self, etcd, key, value, ttl_s):
        self.etcd, self.key, self.value, self.ttl_s = etcd, key, value, ttl_s
        self.renewals = 0          # leases replaced after one expired
        self.last_error = None     # the last refresh's failure, None once one succeeds
        self.stopped = threading.Event()
        self._announce()
        self.thread = threading.Thread(target=self._run, name="colibri-announce", daemon=True)
        self.thread.start()

    @classmethod
    def for_service(cls, etcd, prefix, address, service, ttl_s):
        """The announcement of `colibri serve-experts`' ExpertsService at `address`."""
        value = {"address": address, "model_hash": service.hash.hex(), "experts": service.held,
                 "max_rows": service.max_rows, "kernels": service.session.kernels}
        return cls(etcd, servers_prefix(prefix) + address, json.dumps(value).encode(), ttl_s)

    def _announce(self):
        self.lease = KeptLease(self.etcd, self.ttl_s)
        self.etcd.put(self.key, self.value, lease=self.lease.id)

    def _run(self):
        while not self.stopped.wait(self.ttl_s / 3):
            try:
                if not self.lease.refresh():
                    if not self.lease.lost.is_set():   # etcd unreachable: the next refresh tries again
                        raise EtcdError(f"no etcd member answered a refresh of lease {self.lease.id:x}")
                    self._announce()
                    self.renewals += 1
                self.last_error = None
            except EtcdError as e:
                self.last_error = str(e)

    def close(self, revoke=True):
        """Stops the refreshes; `revoke`: ends the lease now, so the key goes at once (EtcdError when
        etcd cannot be reached: the key then goes when the lease expires)."""
        self.stopped.set()
        self.thread.join(timeout=self.etcd.timeout_s * (len(self.etcd.endpoints) + 1) * 2)
        if revoke:
            self.etcd.revoke(self.lease.id)


def parse_announcement(value):
    """(address, model hash hex, held ids or None) of a server's announcement; ValueError naming what
    is wrong with it."""
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        raise ValueError(f"not JSON: {bytes(value[:40])!r}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object: {bytes(value[:40])!r}")
    address, digest, held = doc.get("address"), doc.get("model_hash"), doc.get("experts")
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"address {address!r} is not HOST:PORT")
    if not isinstance(digest, str):
        raise ValueError(f"model_hash {digest!r} is not the hex of a SHA-256")
    if held is not None and (not isinstance(held, list) or not held
                             or not all(isinstance(e, int) and not isinstance(e, bool) for e in held)):
        raise ValueError(f"experts {held!r} is not a list of expert ids or null")
    return address, digest, held


class Member:
    """An announced server as the fleet sees it: where it is, what it holds, its RemoteDriver once
    connected, and whether it is down (its last call failed) and when to probe it again."""

    def __init__(self, key, address, held):
        self.key, self.address = key, address
        self.held = None if held is None else frozenset(held)
        self.driver = None
        self.down = True           # until connected
        self.busy = False          # a connection or probe on its way
        self.tried = False         # the first connection was tried
        self.misses = 0            # failures since its last answered call: each doubles the back-off
        self.next_probe = 0.0
        self.why = "connecting"
        self.sent = self.failures = 0

    def holds(self, expert):
        return self.held is None or expert in self.held

    def state(self, forgotten=False):
        if forgotten:
            return "gone"
        return "up" if not self.down else ("connecting" if self.driver is None and not self.tried
                                           else f"down: {self.why}")


class FleetDriver:
    """A device driver (docs/DEVICES.md) over every expert server of this model announced in etcd
    under `prefix` (colibri serve-experts --etcd).

    `etcd`: an Etcd or its endpoints ("HOST:PORT,..."); `model`: the local colibri.Model (or its
    directory); `token`, `tls_ca`, `deadline_ms`, `threshold_ms`, `bandwidth_mbit`,
    `connect_timeout_s`: as RemoteDriver's, for every server; `probe_ms`: a down server's first probe
    back-off (the session's device_probe_ms, 250); `wait_s`: how long construction waits for a
    server of this model.

    What the fleet guarantees:
    - Discovery.  Construction reads <prefix>/servers/, connects to each server (Info: the model's
      hash, the token, TLS) and waits up to `wait_s` for at least one of this model, else RemoteError
      naming what it found.  A watch then follows the prefix: a server that joins is connected in the
      background and used from its first answer; a key that goes (a stop, an expired lease) drops
      its server, which gets no call after that.  An announcement of another model, or malformed,
      is never used: `ignored` names it with the reason.
    - Holds.  holds() is the union of what the servers up hold, read once by the session at its
      creation: an expert no server held then stays on the cpu for that session.
    - One round per layer.  compute() gives each expert of the task to one server up that holds it
      (the holders in address order, expert e to holder e % their number, so replicas share the
      load the same way every time), sends each server's part as one Compute, all in parallel, and
      returns; the session's local experts run meanwhile; sync() waits for them and writes each
      reply's rows into y at the task's rows.  Rows and experts travel unchanged, so with the same
      kernels the bits are those of one server (and of the cpu).
    - Failover.  A server whose call fails (its deadline, UNAVAILABLE, a reply of the wrong size) is
      marked down, and its experts are sent again within the same sync() to another server up that
      holds them; only when none does (or all fail) sync() raises RemoteError, and the session
      computes the task's experts on the cpu from the same rows (its fallback: the same tokens).  An
      expert no server up holds makes compute() raise at once, without a call.
    - Return.  A down server is probed in the background (Info, never a token's Compute) after
      `probe_ms`, doubling with each failure up to 64 times, and used again once it answers; a
      server that etcd shows joining again is probed at once.

    Counters: round_trips, failures, bytes_sent, bytes_received, server_ns, fetched_bytes (summed
    over every server, as RemoteDriver's), rounds (compute() calls that sent), retries (calls sent
    again to a replica), per_server() (address -> counters and state), ignored (key -> why)."""

    def __init__(self, etcd, model, *, prefix="/colibri", name="remote", token=None, tls_ca=None, deadline_ms=1000,
                 threshold_ms=None, probe_ms=250, connect_timeout_s=5.0, wait_s=10.0, bandwidth_mbit=None,
                 max_message_mb=64):
        import colibri

        if not isinstance(model, colibri.Model):
            model = colibri.Model(model)
        self.model, self.name, self.threshold_ms = model, name, threshold_ms
        self.etcd = etcd if isinstance(etcd, Etcd) else Etcd(etcd)
        self.prefix = servers_prefix(prefix)
        self.hash = model_hash(model.directory)
        self.n_experts = model.config["num_experts"]
        self.options = dict(name=name, token=token, tls_ca=tls_ca, deadline_ms=deadline_ms,
                            connect_timeout_s=connect_timeout_s, bandwidth_mbit=bandwidth_mbit,
                            max_message_mb=max_message_mb)
        self.probe_s, self.connect_timeout_s = probe_ms / 1000, connect_timeout_s
        self.cv = threading.Condition()
        self.members = {}          # key -> Member: the servers announced now
        self.everyone = []         # every Member ever, for the counters
        self.retired = []          # Members forgotten: closed at the next compute(), when no call of theirs is out
        self.ignored = {}          # key -> why it is not used
        self.rounds = self.retries = 0
        self._pending = None
        self.closed = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="colibri-fleet")
        kvs, revision = self.etcd.get_prefix(self.prefix)
        self.watch = self.etcd.watch(self.prefix, prefix=True, start_revision=revision + 1)
        with self.cv:
            for kv in kvs:
                self._put(kv)
            first = list(self.members.values())
        self.thread = threading.Thread(target=self._run, name="colibri-fleet", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + wait_s
        with self.cv:   # every server announced now tried once (holds() sees them all), then one of them up
            self.cv.wait_for(lambda: all(m.tried for m in first), timeout=max(deadline - time.monotonic(), 0))
            self.cv.wait_for(self._live, timeout=max(deadline - time.monotonic(), 0))
            found = bool(self._live())
        if not found:
            seen = [f"{m.address}: {m.state()}" for m in self.members.values()]
            seen += [f"{key}: {why}" for key, why in self.ignored.items()]
            self.close()
            raise RemoteError(f"no expert server of model {self.hash[:6].hex()} ({model.directory}) is up under "
                              f"{self.prefix} in etcd {self.etcd.names()} after {wait_s:g} s: "
                              f"{'; '.join(seen) or 'none announced (start colibri serve-experts --etcd)'}")

    # ---- the servers: etcd's view, connections and probes (the fleet thread and its pool) --------------

    def _live(self):
        """The servers up, in address order (under the lock)."""
        return sorted((m for m in self.members.values() if not m.down), key=lambda m: m.address)

    def _run(self):
        while not self.closed.is_set():
            for kind, kv in self.watch.events(timeout=TICK_S):
                with self.cv:
                    if kind == "PUT":
                        self._put(kv)
                    else:
                        self._forget(kv["key"].decode(errors="replace"))
            now = time.monotonic()
            with self.cv:
                for m in self.members.values():
                    if m.down and not m.busy and now >= m.next_probe:
                        self._try(m)

    def _put(self, kv):
        """A server announced, or announced again (under the lock)."""
        key = kv["key"].decode(errors="replace")
        try:
            address, digest, held = parse_announcement(kv["value"])
            if digest != self.hash.hex():
                raise ValueError(f"serves model {digest[:12]}, not this one ({self.hash[:6].hex()}, "
                                 f"{self.model.directory})")
            bad = [e for e in held or () if not 0 <= e < self.n_experts]
            if bad:
                raise ValueError(f"holds expert {bad[0]}, past this model's {self.n_experts} experts per layer")
        except ValueError as e:
            self._forget(key)
            self.ignored[key] = str(e)
            self.cv.notify_all()
            return
        self.ignored.pop(key, None)
        old = self.members.get(key)
        if old is not None and old.address == address and old.held == (None if held is None else frozenset(held)):
            old.next_probe, old.misses = 0.0, 0   # the same server again (restarted, its lease replaced): probe now
            return
        self._forget(key)
        m = self.members[key] = Member(key, address, held)
        self.everyone.append(m)
        self._try(m)

    def _forget(self, key):
        """The server's key went (or changed): no call goes to it from now on (under the lock)."""
        self.ignored.pop(key, None)
        m = self.members.pop(key, None)
        if m is not None:
            m.down, m.why = True, "gone"
            self.retired.append(m)
            self.cv.notify_all()

    def _try(self, m):
        """Connects to a server, or probes one that is down, in the pool (under the lock)."""
        m.busy = True
        self.pool.submit(self._connect, m)

    def _connect(self, m):
        drv, error, wrong = m.driver, None, False
        try:
            if drv is None:
                drv = RemoteDriver(m.address, self.model, **self.options)
            else:
                info = drv.stub.Info(pb.InfoRequest(), timeout=self.connect_timeout_s, metadata=drv.metadata,
                                     wait_for_ready=True)
                if info.model_hash != self.hash:
                    raise WrongModel(f"the expert server at {m.address} serves model {info.model_hash[:6].hex()} "
                                     f"now, not this one ({self.hash[:6].hex()})")
        except WrongModel as e:
            error, wrong = str(e), True
        except RemoteError as e:
            error = str(e)
        except grpc.RpcError as e:
            error = f"{m.address}: {e.code().name}: {e.details()}"
        except ValueError as e:   # its channel closed meanwhile
            error = f"{m.address}: {e}"
        with self.cv:
            m.busy, m.tried = False, True
            current = self.members.get(m.key) is m
            if drv is not None and m.driver is None:
                if current and error is None:
                    m.driver = drv
                else:
                    drv.close()
            if not current:
                pass
            elif wrong:
                self._forget(m.key)
                self.ignored[m.key] = error
            elif error is not None:
                self._down(m, error, count=False)
            else:
                m.down, m.why = False, None
            self.cv.notify_all()

    def _down(self, m, why, count=True):
        """Marks a server down until a probe after its back-off answers (under the lock)."""
        m.down, m.why = True, why
        m.failures += count
        m.misses += 1
        m.next_probe = time.monotonic() + self.probe_s * 2 ** min(m.misses - 1, PROBE_DOUBLINGS)
        self.cv.notify_all()

    # ---- the driver interface (the session's thread) --------------------------------------------------

    def holds(self, n_layers, n_experts):
        """The union of what the servers up hold: None when one of them holds every expert."""
        with self.cv:
            live = self._live()
        if any(m.held is None for m in live):
            return None
        table = np.zeros((n_layers, n_experts), dtype=bool)
        for m in live:
            table[:, sorted(m.held)] = True
        return table

    def _plan(self, layer, experts, indices, live):
        """{server: [task indices]}: each expert to one of the servers in `live` that hold it.
        RemoteError when one has no holder there, naming the holders that are down."""
        plan = {}
        for i in indices:
            e = int(experts[i])
            holders = [m for m in live if m.holds(e)]
            if not holders:
                with self.cv:
                    down = [m.state() for m in self.members.values() if m.holds(e)]
                raise RemoteError(f"layer {layer}: no expert server up holds expert {e}"
                                  f"{' (' + '; '.join(down) + ')' if down else ''}")
            plan.setdefault(holders[e % len(holders)], []).append(i)
        return plan

    def _send(self, layer, plan, experts, rows, x):
        """Starts one Compute per server of `plan` (all before any reply is waited for): [(server,
        task indices, their rows in x, when sent, the error of a call that could not start)]."""
        parts = []
        for m, idx in plan.items():
            idx = np.asarray(idx, dtype=np.int64)
            counts = rows[idx + 1] - rows[idx]
            if counts.sum() > m.driver.info.max_rows:
                raise RemoteError(f"{m.address}: {counts.sum()} rows in one call, the server takes at most "
                                  f"{m.driver.info.max_rows} (serve-experts --batch)")
            parts.append((m, idx, counts))
        calls = []
        for m, idx, counts in parts:
            at = np.concatenate([np.arange(rows[i], rows[i + 1]) for i in idx])
            sub_rows = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
            sent, error = time.perf_counter(), None
            try:
                m.driver.compute(layer, experts[idx], sub_rows, None, x[at])
            except RemoteError as e:
                error = str(e)
            except (ValueError, grpc.RpcError) as e:   # ValueError: its channel closed under it
                error = f"{m.address}, layer {layer}: {e}"
            m.sent += 1
            calls.append((m, idx, at, sent, error))
        return calls

    def compute(self, layer, experts, rows, gates, x):
        self._pending = None
        with self.cv:
            retired, self.retired = self.retired, []
            live = self._live()
        for m in retired:
            if m.driver is not None:
                m.driver.close()
        experts = np.array(experts, dtype=np.int32)
        rows = np.array(rows, dtype=np.int64)
        x = np.array(x, dtype=np.float32)   # the session's buffer lives for the call only; retries need it
        plan = self._plan(layer, experts, range(len(experts)), live)
        start = time.perf_counter()
        calls = self._send(layer, plan, experts, rows, x)
        self.rounds += 1
        self._pending = (layer, experts, rows, x, start, calls)

    def sync(self, y):
        if self._pending is None:
            raise RemoteError("sync() without compute()")
        layer, experts, rows, x, start, calls = self._pending
        self._pending = None
        latency, failed = 0.0, []   # failed: (server, why) of this sync's failures
        while calls:
            again = []
            for m, idx, at, sent, error in calls:
                if error is None:
                    part = np.empty((len(at), y.shape[1]), dtype=np.float32)
                    try:
                        took = m.driver.sync(part)
                    except RemoteError as e:
                        error = str(e)
                    except (ValueError, grpc.FutureCancelledError) as e:   # its channel closed under it
                        error = f"{m.address}, layer {layer}: {e or type(e).__name__}"
                    else:
                        y[at] = part
                        latency = max(latency, sent - start + took)
                        m.misses = 0
                        continue
                with self.cv:
                    self._down(m, error)
                failed.append((m, error))
                again.extend(idx)
            if not again:
                break
            with self.cv:
                live = [m for m in self._live() if all(m is not f for f, _ in failed)]
            try:
                plan = self._plan(layer, experts, sorted(again), live)
            except RemoteError as e:
                raise RemoteError(f"{'; '.join(why for _, why in failed)}; {e}") from None
            calls = self._send(layer, plan, experts, rows, x)
            self.retries += len(calls)
        return latency

    def fetch_expert(self, layer, expert, *, timeout_s=None):
        """An expert's bytes (RemoteDriver.fetch_expert) from a server up that serves them, its
        holders first; RemoteError when none does."""
        with self.cv:
            live = sorted(self._live(), key=lambda m: not m.holds(expert))
        errors = []
        for m in live:
            try:
                return m.driver.fetch_expert(layer, expert, timeout_s=timeout_s)
            except RemoteError as e:
                errors.append(str(e))
        raise RemoteError(f"layer {layer} expert {expert}: no expert server up serves it"
                          f"{': ' + '; '.join(errors) if errors else ''}")

    # ---- counters ------------------------------------------------------------------------------------

    def _sum(self, name):
        return sum(getattr(m.driver, name) for m in self.everyone if m.driver is not None)

    round_trips = property(lambda self: self._sum("round_trips"))
    bytes_sent = property(lambda self: self._sum("bytes_sent"))
    bytes_received = property(lambda self: self._sum("bytes_received"))
    server_ns = property(lambda self: self._sum("server_ns"))
    fetched_bytes = property(lambda self: self._sum("fetched_bytes"))
    failures = property(lambda self: sum(m.failures for m in self.everyone))

    def per_server(self):
        """{address: {state, sent, round_trips, failures, bytes_sent, bytes_received, server_ns}}: each
        server's calls (summed over its announcements), state "up", "down: why", "connecting" or "gone"."""
        with self.cv:
            current = {id(m) for m in self.members.values()}
            out = {}
            for m in self.everyone:
                c = out.setdefault(m.address, dict(sent=0, round_trips=0, failures=0, bytes_sent=0,
                                                   bytes_received=0, server_ns=0))
                c["state"] = m.state(forgotten=id(m) not in current)
                c["sent"] += m.sent
                c["failures"] += m.failures
                for name in ("round_trips", "bytes_sent", "bytes_received", "server_ns"):
                    c[name] += getattr(m.driver, name) if m.driver is not None else 0
            return out

    def wait(self, predicate, timeout):
        """Waits until predicate(per_server()) is true, looking again at each change the fleet sees
        (a server joining, going down, up or away), at most `timeout` seconds: its last value."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while not (ok := predicate(self.per_server())) and (left := deadline - time.monotonic()) > 0:
                self.cv.wait(left)
        return ok

    def counters_line(self):
        """One line for --verbose: the servers and their calls."""
        servers = "; ".join(f"{a} {c['state']}, {c['round_trips']} calls, {c['failures']} failed"
                            for a, c in self.per_server().items())
        ignored = f"; ignored: {'; '.join(f'{k} ({why})' for k, why in self.ignored.items())}" if self.ignored else ""
        return (f"[fleet {self.prefix}: {self.rounds} rounds, {self.retries} retried calls; {servers or 'no server'}"
                f"{ignored}]")

    def close(self):
        self.closed.set()
        self.watch.close()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.cv:
            drivers = [m.driver for m in self.everyone if m.driver is not None]
        for drv in drivers:
            drv.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

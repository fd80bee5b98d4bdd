"""The control plane on etcd: orchestrators elect a leader, edges hold leased records, placements
are written by compare-and-swap and watched by their edges (docs/DEVICES.md, "Control plane on etcd").

    colibri orchestrate --etcd 127.0.0.1:2379 --listen 127.0.0.1:50061    # and more, each its own port
    colibri generate ... --etcd 127.0.0.1:2379 --orchestrator 127.0.0.1:50061,127.0.0.1:50062

The keys, under a prefix (default /colibri):

    <prefix>/orchestrator/<lease>   etcd's election (v3election): the leader's value is its HOST:PORT
    <prefix>/placement/<edge>       {"version", "model_hash", "local"}: written only by the leader
    <prefix>/edges/<edge>           the edge's record, bound to its lease: gone when the edge is
    <prefix>/servers/               the expert servers' (colibri serve-experts --etcd), not written here

EtcdStore is an Orchestrator's store (the file store's counterpart): it campaigns, and while it
leads it writes each placement in one transaction that compares its own election key's create
revision (a deposed leader's write fails) and the placement key's mod revision (nobody wrote it
since it was read), so no version is handed out twice even while two orchestrators both think they
lead.  Loads stay in the leader's memory: they change at every heartbeat and a new leader learns
them again from the next ones.  EdgePlane is the edge's side: its lease and record, the leader's
address, and the watch of its placement.
"""
import json
import sys
import threading
import time

from colibri.remote.etcd import DEFAULT_TIMEOUT, Etcd, EtcdError, LeaseExpired, b64, kv_of, unb64
from colibri.remote.orchestrator import LEASE_TTL, PREFIX, U32, EdgeState, NotLeader, check_option


def check_prefix(prefix):
    if not isinstance(prefix, str) or not prefix.startswith("/") or prefix.endswith("/") or not prefix.isprintable():
        raise ValueError(f"--etcd-prefix {prefix!r}: a key prefix starts with / and does not end with one "
                         f"(default {PREFIX})")
    return prefix


class Keys:
    """The control plane's keys under `prefix`."""

    def __init__(self, prefix=PREFIX):
        self.prefix = check_prefix(prefix)
        self.election = prefix + "/orchestrator"
        self.placements = prefix + "/placement/"
        self.edges = prefix + "/edges/"

    def placement(self, edge):
        return self.placements + edge

    def edge(self, edge):
        return self.edges + edge

    @staticmethod
    def name(kv, under):
        """The edge a key under `under` (placements or edges) is of."""
        return kv["key"][len(under.encode()):].decode(errors="replace")


def read_placement(kv):
    """(version, model_hash, local) of a placement key's value; ValueError naming the key."""
    try:
        d = json.loads(kv["value"])
        version, model, local = d["version"], d["model_hash"], d["local"]
        if not (type(version) is int and 1 <= version <= U32 and isinstance(model, str) and isinstance(local, list)
                and len(set(local)) == len(local) and all(type(i) is int and 0 <= i <= U32 for i in local)):
            raise ValueError("not {version: 1..2^32-1, model_hash: hex, local: [distinct expert ids]}")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"etcd key {kv['key'].decode(errors='replace')}: {e}") from None
    return version, model, sorted(local)


class KeptLease:
    """An etcd lease and its refreshes.  `lost` is set once a refresh finds it expired (or revoked),
    or when no member has answered one for longer than its TTL: it may have expired unseen."""

    def __init__(self, etcd, ttl_s):
        self.etcd, self.ttl_s = etcd, ttl_s
        sent = time.monotonic()
        self.id = etcd.grant(ttl_s)
        self.refreshed_at = self.tried_at = sent   # when the last refresh etcd answered, and the last one, were sent
        self.lost = threading.Event()
        self.reason = None

    def refresh(self):
        """One refresh now; False when it failed (and `lost` when that means the lease is gone)."""
        if self.lost.is_set():
            return False
        sent = self.tried_at = time.monotonic()
        try:
            self.etcd.keepalive(self.id)
        except LeaseExpired as e:
            self.lose(str(e))
            return False
        except EtcdError as e:
            if time.monotonic() - self.refreshed_at > self.ttl_s:
                self.lose(f"no etcd member answered a refresh of the lease for {self.ttl_s} s ({e})")
            return False
        self.refreshed_at = sent
        return True

    def due(self):
        """Seconds until the next refresh is due (TTL/3 after the last one tried)."""
        return max(0.0, self.tried_at + self.ttl_s / 3 - time.monotonic())

    def keep(self, stop):
        """Refreshes every TTL/3 until the lease is lost or `stop` (an Event) is set: a thread's loop."""
        while not self.lost.is_set() and not stop.is_set():
            self.refresh()
            stop.wait(self.ttl_s / 3)

    def lose(self, reason):
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()

    def revoke(self):
        """Ends the lease (its keys go at once), as far as a member answers."""
        self.lose("revoked")
        try:
            self.etcd.revoke(self.id)
        except EtcdError:
            pass   # it expires within its TTL anyway


def client(endpoints, ttl_s):
    """An Etcd client whose calls give up on a member in time to try another within the TTL."""
    return Etcd(endpoints, timeout_s=min(DEFAULT_TIMEOUT, ttl_s / 2))


class EtcdStore:
    """An Orchestrator's store in etcd (FileStore's counterpart, same calls).  start() grants a
    lease and campaigns in a thread; while it leads, heartbeats are served and placements written
    by compare-and-swap; when its lease is lost (a refresh finds it expired, no member answers for
    longer than the TTL) or its election key is gone (a failed compare) it steps down at once and
    campaigns again with a new lease.  Elsewhere heartbeats raise NotLeader.  The edges' records
    are watched: an edge whose record goes is forgotten."""

    def __init__(self, endpoints, *, prefix=PREFIX, lease_ttl=LEASE_TTL, advertise=None, log=True):
        self.keys = Keys(prefix)
        self.ttl_s = check_option("lease_ttl", lease_ttl)
        self.etcd = client(endpoints, self.ttl_s)
        self.advertise, self.address, self.log = advertise, None, log
        self.orch = None
        self.lock = threading.Lock()   # leading, leader_key, lease
        self.leading = threading.Event()
        self.leader_key = None         # etcd's answer to the campaign that won, while leading
        self.lease = None              # the KeptLease of this term
        self.terms = 0                 # how often this orchestrator came to lead
        self.closed = threading.Event()
        self.threads = []
        self.edge_watch = None

    def attach(self, orch):
        self.orch = orch

    def describe(self):
        state = "leading" if self.leading.is_set() else "campaigning"
        return f"etcd {self.etcd.names()} under {self.keys.prefix}, {state} as {self.address}"

    def _say(self, text):
        if self.log:
            print(f"colibri orchestrate: {text}", file=sys.stderr, flush=True)

    # ---- election ---------------------------------------------------------------------------------

    def start(self, address):
        """Campaigns as `address` (the heartbeat listener; --advertise replaces it).  EtcdError
        when no member answers, now rather than in a thread."""
        from colibri.remote.server import parse_listen

        host = parse_listen(self.advertise or address)[0]
        if host in ("0.0.0.0", "::"):
            raise ValueError(f"listening on {address}: edges cannot reach a wildcard address; give --advertise "
                             f"HOST:PORT, the address the election publishes")
        self.address = self.advertise or address
        lease = KeptLease(self.etcd, self.ttl_s)
        self.edge_watch = self.etcd.watch(self.keys.edges, prefix=True)
        for target, name in ((self._elect, "orchestrator-election"), (self._watch_edges, "orchestrator-edges")):
            t = threading.Thread(target=target, args=(lease,) if target == self._elect else (), name=name,
                                 daemon=True)
            t.start()
            self.threads.append(t)

    def _elect(self, lease):
        while not self.closed.is_set():
            if lease is None:
                try:
                    lease = KeptLease(self.etcd, self.ttl_s)
                except EtcdError as e:
                    self._say(f"cannot take a lease: {e}")
                    self.closed.wait(self.ttl_s / 3)
                    continue
            with self.lock:
                if self.closed.is_set():
                    lease.revoke()
                    return
                self.lease = lease
            keeper = threading.Thread(target=lease.keep, args=(self.closed,), name="orchestrator-lease", daemon=True)
            keeper.start()
            leader = self._campaign(lease)
            if leader is not None:
                self._lead(lease, leader)
                while not lease.lost.wait(self.ttl_s / 3):   # close() sets it too
                    self._check_key(lease, leader)
            self._step_down(lease.reason)
            lease.revoke()      # a lease lost by a failed compare may live on: its election key goes now
            lease = None

    def _campaign(self, lease):
        """etcd's leader key once this lease's holder leads, None when the lease is lost first.  A
        campaign waits at most a TTL on a member (then again): a lease that expires meanwhile is noticed."""
        while not lease.lost.is_set() and not self.closed.is_set():
            try:
                leader = self.etcd.campaign(self.keys.election, self.address, lease.id, timeout_s=self.ttl_s)
                mine = self.etcd.get(unb64(leader["key"]))
            except LeaseExpired as e:
                lease.lose(str(e))
                return None
            except EtcdError:   # still waiting behind the leader, or no member answers: again
                self.closed.wait(0.1)
                continue
            if mine is not None and mine["lease"] == lease.id and mine["create_revision"] == int(leader["rev"]):
                return leader
        return None

    def _check_key(self, lease, leader):
        """Loses the lease when the election key is gone while it lives (a campaign cancelled on a
        member that went away resigns it): the key, not the lease, is what makes the leader."""
        try:
            mine = self.etcd.get(unb64(leader["key"]))
        except EtcdError:
            return   # the lease's refreshes judge an etcd that does not answer
        if mine is None or mine["create_revision"] != int(leader["rev"]):
            lease.lose("its election key is gone")

    def _lead(self, lease, leader):
        """Reads every placement of a live edge (versions continue from etcd's) and starts serving."""
        try:
            placements, _ = self.etcd.get_prefix(self.keys.placements)
            records, _ = self.etcd.get_prefix(self.keys.edges)
        except EtcdError as e:
            lease.lose(f"cannot read the placements: {e}")
            return
        live = {Keys.name(kv, self.keys.edges) for kv in records}
        edges = {}
        for kv in placements:
            name = Keys.name(kv, self.keys.placements)
            if name not in live:
                continue
            st = edges[name] = EdgeState()
            st.revision = kv["mod_revision"]
            try:
                st.placement_version, st.model_hash, st.local = read_placement(kv)
            except ValueError as e:   # overwritten at the next change, numbered past every write it had
                self._say(f"{e}: taken as version {kv['version']}")
                st.placement_version = kv["version"]
        with self.lock:
            if lease.lost.is_set():
                return
            self.orch.reset(edges)
            self.leader_key = leader
            self.terms += 1
            self.leading.set()
        self._say(f"leads as {self.address} (term {self.terms} here), {len(edges)} placements read")

    def _step_down(self, reason):
        with self.lock:
            if not self.leading.is_set():
                return
            self.leading.clear()
            self.leader_key = None
            self.orch.reset({})
        self._say(f"steps down: {reason}")

    def leader(self):
        """The leading orchestrator's address as etcd has it, or None (nobody leads, or etcd does not answer)."""
        try:
            kv = self.etcd.leader(self.keys.election)
        except EtcdError:
            return None
        return kv["value"].decode(errors="replace") if kv else None

    def _not_leading(self):
        leader = self.leader()
        return (f"the orchestrator at {self.address} does not lead: "
                + (f"the leader is {leader}" if leader and leader != self.address else "no orchestrator leads now"))

    # ---- what heartbeats call ---------------------------------------------------------------------

    def check_lead(self):
        if not self.leading.is_set():
            raise NotLeader(self._not_leading())

    def change(self, name, st, local):
        """A placement change proposed (under orch.lock): commit() writes it, and applies it once
        etcd took it; meanwhile the edge gets no other."""
        st.committing = True
        return name, st, st.model_hash, st.placement_version + 1, local

    def touched(self, name, now):
        pass

    def commit(self, change):
        """Writes a proposed change (after orch.lock, before the reply): True once etcd took it."""
        if change is None:
            return False
        try:
            return self._write(*change)
        finally:
            with self.orch.lock:
                change[1].committing = False

    def _write(self, name, st, model, version, local):
        """The compare-and-swap of one placement: NotLeader when this orchestrator's election key is
        gone (it steps down); etcd's newer placement taken when someone wrote it since it was read."""
        with self.lock:
            leader = self.leader_key
        if leader is None:
            raise NotLeader(self._not_leading())
        mine, rev, key = unb64(leader["key"]), int(leader["rev"]), self.keys.placement(name)
        value = json.dumps({"version": version, "model_hash": model, "local": local}, separators=(",", ":"))
        try:
            ok, answer = self.etcd.txn([Etcd.compare_create(mine, rev), Etcd.compare_mod(key, st.revision)],
                                       [Etcd.put_op(key, value)],
                                       [{"request_range": {"key": b64(mine)}}, {"request_range": {"key": b64(key)}}])
        except EtcdError as e:   # written or not: the next change compares with what etcd has
            self._say(f"placement version {version} of edge {name!r} not written: {e}")
            return False
        if ok:
            with self.orch.lock:
                st.placement_version, st.local, st.revision = version, local, int(answer["header"]["revision"])
            return True
        held, current = (r["response_range"].get("kvs", []) for r in answer["responses"])
        if not held or int(held[0]["create_revision"]) != rev:
            with self.lock:
                lease = self.lease
            self._step_down("its election key is gone: another orchestrator leads")
            lease.lose("its election key is gone")
            raise NotLeader(self._not_leading())
        # someone wrote the placement since it was read (a write of ours whose answer was lost, a
        # deposed leader's that went in first) or deleted it: etcd's it is, and the edge is placed again
        version, model, local, revision = st.placement_version, None, None, 0
        if current:
            kv = kv_of(current[0])
            revision = kv["mod_revision"]
            try:
                version, model, local = read_placement(kv)
            except ValueError:
                version = kv["version"]
        with self.orch.lock:
            st.placement_version, st.revision, st.changed_at = version, revision, -float("inf")
            st.local = local if model == st.model_hash else None
        return True

    # ---- the edges' records -----------------------------------------------------------------------

    def _watch_edges(self):
        while not self.closed.is_set():
            for kind, kv in self.edge_watch.events(timeout=0.5):
                if kind == "DELETE":
                    self.orch.forget(Keys.name(kv, self.keys.edges))

    def close(self):
        """Stops campaigning; a leader resigns (its lease revoked: another leads at once)."""
        with self.lock:
            self.closed.set()
            lease = self.lease
        if lease is not None:
            lease.lose("stopped")
            lease.revoke()
        self._step_down("stopped")
        if self.edge_watch is not None:
            self.edge_watch.close()
        for t in self.threads:
            t.join(timeout=1)


class EdgePlane:
    """An edge's part of the control plane: its lease, its record (`<prefix>/edges/<edge>`, bound
    to the lease), the leader's address, and the watch of its placement.  refresh() is called by
    the heartbeat thread (after each heartbeat, and every TTL/3 without one): the token loop only
    reads what the watch queued (placements()) and updates the record's fields (update())."""

    def __init__(self, endpoints, name, record, *, prefix=PREFIX, lease_ttl=LEASE_TTL):
        self.keys = Keys(prefix)
        self.ttl_s = check_option("lease_ttl", lease_ttl)
        self.etcd = client(endpoints, self.ttl_s)
        self.name, self.record = name, dict(record)
        self.lock = threading.Lock()   # record, dirty
        self.dirty = True              # the record is to be written again
        self.renewals = 0              # leases replaced after one expired
        self.error = None              # the last etcd error
        self.cached_leader = None
        self.lease = KeptLease(self.etcd, self.ttl_s)
        self.etcd.put(self.keys.edge(name), json.dumps(self.record, separators=(",", ":")), lease=self.lease.id)
        self.dirty = False
        key = self.keys.placement(name)
        self.watch = self.etcd.watch(key)   # before the read: nothing written in between is missed
        kv = self.etcd.get(key)
        self.pending = [("PUT", kv)] if kv else []

    def update(self, **fields):
        """Record fields from the token loop; a new placement version is written at the next refresh."""
        with self.lock:
            if fields.get("placement_version", self.record["placement_version"]) != self.record["placement_version"]:
                self.dirty = True
            self.record.update(fields)

    def _put(self):
        with self.lock:
            value, self.dirty = json.dumps(self.record, separators=(",", ":")), False
        try:
            self.etcd.put(self.keys.edge(self.name), value, lease=self.lease.id)
        except EtcdError as e:
            self.error = str(e)
            with self.lock:
                self.dirty = True
            if isinstance(e, LeaseExpired):
                self.lease.lose(str(e))

    def refresh(self):
        """Keeps the lease alive, replacing an expired one (and writing the record again)."""
        if not self.lease.refresh() and self.lease.lost.is_set():
            try:
                self.lease = KeptLease(self.etcd, self.ttl_s)
            except EtcdError as e:
                self.error = str(e)
                return
            self.renewals += 1
            with self.lock:
                self.dirty = True
        if self.dirty:
            self._put()

    def due(self):
        return self.lease.due()

    def leader(self):
        """The leading orchestrator's address: etcd's, kept until forget_leader()."""
        if self.cached_leader is None:
            try:
                kv = self.etcd.leader(self.keys.election)
            except EtcdError as e:
                self.error = str(e)
                return None
            self.cached_leader = kv["value"].decode(errors="replace") if kv else None
        return self.cached_leader

    def forget_leader(self):
        self.cached_leader = None

    def placements(self):
        """[(version, model_hash, local)] of the placements written since the last call (read at
        start, then watched); a malformed one is left out (kept in `error`)."""
        events, self.pending = self.pending, []
        events += list(self.watch.events(timeout=0))
        out = []
        for kind, kv in events:
            if kind == "PUT":
                try:
                    out.append(read_placement(kv))
                except ValueError as e:
                    self.error = str(e)
        return out

    def close(self, revoke=True):
        """Stops the watch; `revoke` ends the lease, so the record goes now rather than within the TTL."""
        self.watch.close()
        if revoke:
            self.lease.revoke()

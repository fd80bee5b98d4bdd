"""The orchestrator: edges report what their experts do; it decides which experts each edge keeps.

    colibri orchestrate --listen 127.0.0.1:50061 --state orchestrator.json            # one machine
    colibri orchestrate --listen 127.0.0.1:50062 --etcd 127.0.0.1:2379,127.0.0.1:22379  # several, one leads

Every edge (named) sends a heartbeat every few tokens (colibri.remote.edge): its model's hash, each
device's P90 latency, its expert cache's hit rate, the tokens routed to its hottest experts since
the last heartbeat, the placement it runs and its expert memory budget.  Per edge the orchestrator
keeps the load of each expert, decayed by half every `half_life` heartbeats, and a placement: the
set of experts the edge computes itself (all others go to its remote device), at most
budget_bytes // expert_bytes of them, the hottest.  Experts do not flap: a remote expert is
promoted in place of the coldest local one only when its load passes that one's by `margin`
(25%) plus `min_gain` tokens, and an edge's placement changes at most once per `interval`
seconds.  Each change raises the edge's placement version; the reply to a heartbeat from an edge
that runs another version carries the new set.

The state is bounded: at most `max_edges` edges, expert ids below `max_experts` (n_layers x
n_experts), MAX_PAIRS load pairs a heartbeat.  Where it is kept is the store's business, behind a
few calls (attach, start, check_lead, change, touched, commit, close):

- FileStore (--state), one orchestrator: a snapshot (JSON written atomically, a temporary file
  renamed over it) that one writer thread rewrites at most every `interval` seconds, outside the
  lock heartbeats take, and a journal (`<state>.journal`, a JSON line per placement change) that a
  change is appended and synced to before its reply, so that a version is never handed out twice.
  A heartbeat's latency therefore does not grow with the number of edges.  A restarted
  orchestrator resumes from the snapshot and the journal.
- EtcdStore (--etcd; colibri.remote.control): several orchestrators campaign in etcd's election
  and one leads; each placement is written by compare-and-swap before its reply, and the others
  answer FAILED_PRECONDITION.  Loads stay in the leader's memory.
"""
import argparse
import collections
import json
import math
import os
import signal
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

HALF_LIFE = 8.0     # heartbeats
MARGIN = 0.25       # a remote expert's load must pass the coldest local one's by this share ...
MIN_GAIN = 1.0      # ... plus this many tokens
WARMUP = 2          # heartbeats with load before an edge's first placement
INTERVAL = 2.0      # seconds between two placement changes of an edge, and between state saves
MAX_EDGES = 1024    # edges kept; a new one past them is refused (RESOURCE_EXHAUSTED)
MAX_EXPERTS = 16384     # expert ids are below this (n_layers x n_experts: DeepSeek-V3's 61 x 256 fits)
MAX_PAIRS = 256     # load pairs in one heartbeat (edges keep a heartbeat under 200 bytes: under 100 pairs)
MAX_DEVICES = 8     # P90s in one heartbeat (COLIBRI_MAX_DEVICES)
MAX_MESSAGE = 1024  # bytes a heartbeat may take (5x the 200 edges send)
STATE_FORMAT = "colibri-orchestrator"
PREFIX = "/colibri"   # etcd keys of the control plane (colibri.remote.control)
LEASE_TTL = 5         # seconds of an etcd lease: a dead leader's (or edge's) keys go within it
U32, U64 = 2**32 - 1, 2**64 - 1

# The orchestrator's options: (type, lowest, highest, lowest excluded), checked by Orchestrator and
# by the command line's parser alike.
OPTIONS = {
    "half_life": (float, 0.0, 10_000.0, True),   # heartbeats; 0 would divide by zero
    "margin": (float, 0.0, 100.0, False),        # a negative margin would swap in colder experts
    "min_gain": (float, 0.0, 1e9, False),
    "warmup": (int, 0, 10_000, False),
    "interval": (float, 0.0, 3600.0, False),     # seconds; beyond an hour a crash loses too much
    "max_edges": (int, 1, 1 << 20, False),
    "max_experts": (int, 1, 1 << 20, False),
    "lease_ttl": (int, 1, 3600, False),          # seconds (etcd's leases are whole seconds)
}


def option_range(name):
    """What an option must be, in words: "a finite number in (0, 10000]"."""
    kind, lo, hi, lo_excluded = OPTIONS[name]
    what, shown = ("an integer", "{:,}") if kind is int else ("a finite number", "{:g}")
    return f"{what} in {'(' if lo_excluded else '['}{shown.format(lo)}, {shown.format(hi)}]"


def check_option(name, value):
    """`value` as the option's type if it is finite and within the option's range; ValueError
    naming the option and the range otherwise."""
    kind, lo, hi, lo_excluded = OPTIONS[name]
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
          and (kind is float or float(value).is_integer()) and (value > lo if lo_excluded else value >= lo)
          and value <= hi)
    if not ok:
        raise ValueError(f"{name} must be {option_range(name)}, not {value!r}")
    return kind(value)


def place(load, local, slots, margin=MARGIN, min_gain=MIN_GAIN):
    """The local set after `local` (a set of expert ids) given `load` ({id: tokens}) and room for
    `slots` experts: over budget the coldest go; with room the hottest experts that routed
    anything come in; then the hottest remote expert takes the coldest local one's place while its
    load passes that one's by `margin` plus `min_gain` (hysteresis: two near-equal experts do not
    swap back and forth).  Ties go to the lower id."""
    from colibri.experts import hottest

    local = set(hottest(load, slots, among=local))   # over budget the coldest go
    remote = [i for i in hottest(load, len(load)) if i not in local]
    room = slots - len(local)
    local.update(remote[:room])
    remote = remote[room:]
    cold = hottest(load, len(local), among=local)[::-1]
    for promoted, demoted in zip(remote, cold):
        if load[promoted] <= load.get(demoted, 0.0) * (1 + margin) + min_gain:
            break   # remote descends, cold ascends: no later pair passes either
        local.remove(demoted)
        local.add(promoted)
    return local


def _uint(top):
    return (lambda x: type(x) is int and 0 <= x <= top), f"an integer in [0, {top}]"


def _finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_edge_name(name):
    if not isinstance(name, str) or not name or len(name.encode()) > 32:
        raise ValueError(f"an edge's name is 1 to 32 bytes, not {name!r:.60}")


class EdgeState:
    """What the orchestrator keeps of one edge (the fields of its state file entry)."""
    FIELDS = ("model_hash", "seq", "heartbeats", "device_p90_us", "cache_hit_permille", "budget_bytes",
              "expert_bytes", "placement_version", "edge_version", "local", "load", "last_seen")
    CHECKS = {   # field: (check of its value in a state file, what it must be); local and load in from_json
        "model_hash": (lambda x: isinstance(x, str) and len(x) <= 16 and len(x) % 2 == 0
                       and all(c in "0123456789abcdef" for c in x), "the hex of at most 8 bytes"),
        "seq": _uint(U32),
        "heartbeats": _uint(2**63 - 1),
        "device_p90_us": ((lambda x: isinstance(x, list) and len(x) <= MAX_DEVICES
                           and all(type(v) is int and 0 <= v <= U32 for v in x)),
                          f"a list of at most {MAX_DEVICES} integers in [0, {U32}]"),
        "cache_hit_permille": _uint(U32),
        "budget_bytes": _uint(U64),
        "expert_bytes": _uint(U64),
        "placement_version": _uint(U32),
        "edge_version": _uint(U32),
        "last_seen": (_finite, "a finite number"),
    }

    def __init__(self):
        self.model_hash = ""          # hex of the 8 bytes the edge sends
        self.seq = 0
        self.heartbeats = 0           # heartbeats counted into the load
        self.device_p90_us = []
        self.cache_hit_permille = 0
        self.budget_bytes = 0
        self.expert_bytes = 0
        self.placement_version = 0    # the last version handed out (0: none yet)
        self.edge_version = 0         # the version the edge said it runs
        self.local = None             # sorted expert ids of that version (None: none yet)
        self.load = {}                # id -> decayed tokens
        self.last_seen = 0.0          # wall clock
        self.changed_at = -math.inf   # monotonic clock of the last placement change (not saved)
        self.committing = False       # a placement change is on its way to the store (not saved)
        self.revision = 0             # etcd's revision of the edge's placement key (EtcdStore; not saved)

    @property
    def slots(self):
        return self.budget_bytes // self.expert_bytes if self.expert_bytes else 0

    def copy(self):
        """A copy the writer can serialize while heartbeats go on (they replace `local` and the
        P90s, and change `load` in place)."""
        st = EdgeState.__new__(EdgeState)
        st.__dict__.update(self.__dict__, load=dict(self.load))
        return st

    def to_json(self):
        d = {k: getattr(self, k) for k in self.FIELDS}
        d["load"] = {str(i): round(x, 4) for i, x in sorted(self.load.items())}
        return d

    @classmethod
    def from_json(cls, d, max_experts):
        """The state of a state file's entry; ValueError naming the first field that is not what
        it must be (a mistyped one would otherwise fail every heartbeat of the edge)."""
        if not isinstance(d, dict):
            raise ValueError(f"an edge's entry is an object, not {d!r:.40}")
        checks = dict(cls.CHECKS)
        checks["local"] = ((lambda x: x is None or (isinstance(x, list) and len(set(x)) == len(x)
                                                    and all(type(i) is int and 0 <= i < max_experts for i in x))),
                           f"null or a list of distinct expert ids in [0, {max_experts})")
        checks["load"] = ((lambda x: isinstance(x, dict) and all(
                               k.isascii() and k.isdigit() and int(k) < max_experts and _finite(v) and v >= 0
                               for k, v in x.items())),
                          f"an object of expert ids in [0, {max_experts}) to finite loads >= 0")
        st = cls()
        for k, (ok, what) in checks.items():
            if k in d:
                if not ok(d[k]):
                    raise ValueError(f"field {k!r} must be {what}, not {d[k]!r:.60}")
                setattr(st, k, d[k])
        st.load = {int(i): float(x) for i, x in st.load.items()}
        st.local = None if st.local is None else sorted(st.local)
        return st


class Full(Exception):
    """A heartbeat from a new edge when the orchestrator keeps `max_edges` already."""


class NotLeader(Exception):
    """A heartbeat to an orchestrator that does not lead (EtcdStore): the edge tries another."""


class Orchestrator:
    """The placement logic and its edges' state, without the network (serve() puts it on gRPC) and
    without the storage: `store` is a state file's path (FileStore: one machine) or an EtcdStore
    (colibri.remote.control: several orchestrators, one leading).  start() starts the store:
    heartbeats need it; close() stops it."""

    def __init__(self, store, *, half_life=HALF_LIFE, margin=MARGIN, min_gain=MIN_GAIN, warmup=WARMUP,
                 interval=INTERVAL, max_edges=MAX_EDGES, max_experts=MAX_EXPERTS, clock=time.monotonic):
        self.decay = 0.5 ** (1.0 / check_option("half_life", half_life))
        self.margin, self.min_gain = check_option("margin", margin), check_option("min_gain", min_gain)
        self.warmup, self.interval = check_option("warmup", warmup), check_option("interval", interval)
        self.max_edges = check_option("max_edges", max_edges)
        self.max_experts = check_option("max_experts", max_experts)
        self.clock = clock
        self.lock = threading.Lock()          # edges (and what the store keeps beside them)
        self.edges = {}
        self.started = False
        self.store = FileStore(store) if isinstance(store, (str, os.PathLike)) else store
        self.store.attach(self)

    def start(self, address=None):
        """Starts the store; `address` (HOST:PORT) is where edges reach this orchestrator."""
        if not self.started:
            self.store.start(address)
            self.started = True

    def close(self):
        if self.started:
            self.store.close()

    # ---- heartbeats -------------------------------------------------------------------------------

    def check(self, req):
        """ValueError for a heartbeat that is malformed or would grow the state past its bounds."""
        check_edge_name(req.edge)
        if len(req.model_hash) > 8:
            raise ValueError(f"model_hash is the first 8 bytes of the model's SHA-256, not {len(req.model_hash)}")
        if len(req.device_p90_us) > MAX_DEVICES:
            raise ValueError(f"{len(req.device_p90_us)} device P90s: an edge has at most {MAX_DEVICES} devices")
        pairs = list(req.load_delta)
        if len(pairs) % 2:
            raise ValueError("load_delta holds (expert, tokens) pairs: its length must be even")
        if len(pairs) > 2 * MAX_PAIRS:
            raise ValueError(f"{len(pairs) // 2} load pairs: a heartbeat carries at most {MAX_PAIRS}")
        bad = next((i for i in pairs[::2] if i >= self.max_experts), None)
        if bad is not None:
            raise ValueError(f"expert id {bad} in load_delta: ids (layer * n_experts + expert) are below "
                             f"{self.max_experts} (--max-experts)")

    def heartbeat(self, req):
        """The reply (a colibri_remote_pb2.HeartbeatReply) to one HeartbeatRequest.  ValueError
        for a malformed one, Full for a new edge past `max_edges`, the store's NotLeader where
        another orchestrator leads."""
        if not self.started:
            raise RuntimeError("Orchestrator.start() first: heartbeats change the state it keeps")
        self.store.check_lead()
        self.check(req)
        change = None
        with self.lock:
            now = self.clock()
            st = self.edges.get(req.edge)
            if st is None:
                if len(self.edges) >= self.max_edges:
                    raise Full(f"the orchestrator keeps at most {self.max_edges} edges (--max-edges), all "
                               f"taken: edge {req.edge!r} is one too many")
                st = self.edges[req.edge] = EdgeState()
            model = req.model_hash.hex()
            if model != st.model_hash:   # a new edge, or one that runs another model: start over
                st.model_hash, st.load, st.local, st.heartbeats = model, {}, None, 0
            st.device_p90_us = list(req.device_p90_us)
            st.cache_hit_permille = req.cache_hit_permille
            st.budget_bytes, st.expert_bytes = req.budget_bytes, getattr(req, "expert_bytes", 0)
            st.edge_version = req.placement_version
            st.last_seen = time.time()
            if req.seq != st.seq:   # the same seq again is a retried heartbeat: counted once
                st.seq = req.seq
                self._add_load(st, req.load_delta)
            if (st.expert_bytes and st.heartbeats >= self.warmup and now - st.changed_at >= self.interval
                    and not st.committing):
                new = sorted(place(st.load, st.local or (), st.slots, self.margin, self.min_gain))
                if new != st.local:
                    st.changed_at = now
                    change = self.store.change(req.edge, st, new)
            self.store.touched(req.edge, now)
            reply = self._reply(st, req.placement_version)
        if self.store.commit(change):   # before the reply: a version handed out is never handed out again
            with self.lock:   # a change the store applies once written (etcd): the reply carries it
                reply = self._reply(st, req.placement_version)
        return reply

    @staticmethod
    def _reply(st, running):
        """The reply to an edge that runs version `running`: the version, and the set when it is another."""
        from colibri.remote import colibri_remote_pb2 as pb

        reply = pb.HeartbeatReply(placement_version=st.placement_version if st.local is not None else 0)
        if st.local is not None and running != st.placement_version:
            reply.local.extend(st.local)
        return reply

    def _add_load(self, st, pairs):
        for i in list(st.load):
            x = st.load[i] * self.decay
            if x < 1e-3:
                del st.load[i]
            else:
                st.load[i] = x
        for i in range(0, len(pairs), 2):
            st.load[pairs[i]] = st.load.get(pairs[i], 0.0) + pairs[i + 1]
        if pairs:
            st.heartbeats += 1

    def snapshot(self):
        """{edge: its state as the state file holds it}."""
        with self.lock:
            return {n: st.to_json() for n, st in self.edges.items()}

    def reset(self, edges):
        """Replaces every edge's state (a store that comes to lead, or steps down)."""
        with self.lock:
            self.edges = edges

    def forget(self, name):
        """Drops an edge's state (its load, its placement: a store whose edge has gone)."""
        with self.lock:
            self.edges.pop(name, None)


class FileStore:
    """The state of one orchestrator in two files: a snapshot (loads, placements, versions; JSON
    written atomically, a temporary file renamed over it) that one writer thread rewrites at most
    every `interval` seconds, outside the lock heartbeats take, and beside it a journal
    (`<state>.journal`, a JSON line per placement change) that a placement change is appended and
    synced to before its reply, so that a version is never handed out twice.  A restarted
    orchestrator resumes from the snapshot and the journal."""

    def __init__(self, state_path):
        self.state_path = Path(state_path)
        self.journal_path = self.state_path.with_name(self.state_path.name + ".journal")
        self.turned_path = self.state_path.with_name(self.state_path.name + ".journal.old")
        self.orch = None
        self.saved_at = -math.inf             # when the last snapshot was taken (under orch.lock, as dirty)
        self.records = collections.deque()    # journal lines of placement changes not yet synced
        self.journal_lock = threading.Lock()  # the journal file; a snapshot takes it before orch.lock
        self.journal = None
        self.texts = {}                       # edge -> its entry in the last snapshot, as JSON (the writer's)
        self.due = threading.Event()          # wakes the writer
        self.writer, self.closed = None, False

    def attach(self, orch):
        """Loads the state into `orch`'s edges."""
        self.orch = orch
        self._load_state()
        self.dirty = set(orch.edges)          # edges changed since the last snapshot was taken

    def describe(self):
        return f"{len(self.orch.edges)} edges resumed from {self.state_path}"

    # ---- what heartbeats call: the file store always leads ------------------------------------------

    def check_lead(self):
        pass

    def change(self, name, st, local):
        """A placement change, applied at once (under orch.lock) and journaled; commit() syncs it."""
        st.local = local
        st.placement_version += 1
        self.records.append(json.dumps({"edge": name, "model_hash": st.model_hash, "local": local,
                                        "placement_version": st.placement_version}).encode() + b"\n")
        return name

    def touched(self, name, now):
        """An edge's state changed (under orch.lock): the writer snapshots it within `interval`."""
        self.dirty.add(name)
        if now - self.saved_at >= self.orch.interval:
            self.due.set()

    def commit(self, change):
        """Syncs the placement changes journaled so far (after orch.lock, before the reply).  The
        change is in the edge's state already: False."""
        self._sync_journal()
        return False

    # ---- the state on disk: a snapshot, and a journal of the placement changes since ------------

    def _load_state(self):
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            doc = None
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.state_path}: cannot read the orchestrator's state: {e}") from None
        if doc is not None:
            if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT or doc.get("version") != 1:
                raise ValueError(f"{self.state_path}: not an orchestrator state file (format {STATE_FORMAT!r}, "
                                 f"version 1)")
            edges = doc.get("edges")
            if not isinstance(edges, dict):
                raise ValueError(f"{self.state_path}: field 'edges' must be an object, not {edges!r:.40}")
            if len(edges) > self.orch.max_edges:
                raise ValueError(f"{self.state_path}: {len(edges)} edges, more than --max-edges "
                                 f"{self.orch.max_edges}")
            for name, d in edges.items():
                try:
                    check_edge_name(name)
                    self.orch.edges[name] = EdgeState.from_json(d, self.orch.max_experts)
                except ValueError as e:
                    raise ValueError(f"{self.state_path}: edge {name!r:.40}: {e}") from None
        for path in (self.turned_path, self.journal_path):
            self._replay(path)

    def _replay(self, path):
        """Applies a journal's placement changes newer than the snapshot's.  A last line cut short
        (a stop during its write, before its reply went out) is left out."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as e:
            raise ValueError(f"{path}: cannot read the orchestrator's journal: {e}") from None
        lines = data.split(b"\n")
        for n, line in enumerate(lines[:-1], 1):
            try:
                rec = json.loads(line)
                if not isinstance(rec, dict) or set(rec) != {"edge", "model_hash", "placement_version", "local"}:
                    raise ValueError("a line is an object of edge, model_hash, placement_version and local")
                check_edge_name(rec["edge"])
                change = EdgeState.from_json(rec, self.orch.max_experts)
            except ValueError as e:
                raise ValueError(f"{path}, line {n}: {e}") from None
            st = self.orch.edges.get(rec["edge"])
            if st is None:
                if len(self.orch.edges) >= self.orch.max_edges:
                    raise ValueError(f"{path}, line {n}: more edges than --max-edges {self.orch.max_edges}")
                st = self.orch.edges[rec["edge"]] = EdgeState()
            if change.placement_version > st.placement_version:
                if change.model_hash != st.model_hash:
                    st.model_hash, st.load, st.heartbeats = change.model_hash, {}, 0
                st.placement_version, st.local = change.placement_version, change.local

    def start(self, address=None):
        """Writes the state once (an unwritable folder is found now, not at the first heartbeat)
        and starts the writer that saves it every `interval` seconds from then on."""
        if self.writer is not None:
            return
        try:
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            self._save()
        except OSError as e:
            raise ValueError(f"{self.state_path}: cannot write the orchestrator's state: {e}") from None
        self.writer = threading.Thread(target=self._write_loop, name="orchestrator-state", daemon=True)
        self.writer.start()

    def close(self):
        """Stops the writer and writes a last snapshot."""
        if self.writer is None or self.closed:
            return
        self.closed = True
        self.due.set()
        self.writer.join()
        self._save()
        self.journal.close()

    def _write_loop(self):
        while True:
            self.due.wait()
            if self.closed:
                return
            self.due.clear()
            try:
                self._save()
            except OSError as e:   # tried again at the next heartbeat `interval` later; the journal keeps the versions
                print(f"colibri orchestrate: cannot save the state: {e}", file=sys.stderr, flush=True)

    def _save(self):
        """A snapshot: copies of the edges changed since the last one, taken under the lock, then
        serialized and written outside it (a temporary file beside the state, synced, renamed over
        it).  One writer at a time: start(), then the writer thread, then close()."""
        with self.journal_lock:   # no journal line goes in while the journal turns
            with self.orch.lock:
                changed = {name: self.orch.edges[name].copy() for name in self.dirty}
                self.dirty.clear()
                self.saved_at = self.orch.clock()
            self._turn_journal()
        for name, st in changed.items():
            self.texts[name] = json.dumps(st.to_json(), separators=(",", ":"))
        edges = ",".join(f"{json.dumps(name)}:{text}" for name, text in sorted(self.texts.items()))
        fd, tmp = tempfile.mkstemp(prefix=self.state_path.name + ".", dir=self.state_path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f'{{"format":"{STATE_FORMAT}","version":1,"edges":{{{edges}}}}}')
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)
        except BaseException:
            os.unlink(tmp)
            raise
        self.turned_path.unlink(missing_ok=True)   # its changes are in the snapshot now

    def _turn_journal(self):
        """Changes after the snapshot being taken go to a new journal; the last one's lines wait
        in <state>.journal.old until the snapshot is written.  After a snapshot that failed they
        are still waiting there: the journal goes on as it is."""
        if self.journal is None and self.journal_path.exists():   # at start: a line cut short goes, as at load
            whole = self.journal_path.read_bytes().rpartition(b"\n")
            os.truncate(self.journal_path, len(whole[0]) + len(whole[1]))
        if self.turned_path.exists():
            if self.journal is None:
                self.journal = open(self.journal_path, "ab")
            return
        if self.journal is not None:
            self.journal.close()
        if self.journal_path.exists():
            os.replace(self.journal_path, self.turned_path)
        self.journal = open(self.journal_path, "ab")

    def _sync_journal(self):
        """Appends the placement changes made so far to the journal and syncs it."""
        with self.journal_lock:
            lines = []
            while self.records:
                lines.append(self.records.popleft())
            if not lines:
                return
            at = self.journal.tell()
            try:
                self.journal.write(b"".join(lines))
                self.journal.flush()
                os.fsync(self.journal.fileno())
            except BaseException:
                self.records.extendleft(reversed(lines))   # the next heartbeat's reply waits for them
                self.journal.truncate(at)
                raise


# ---- the network side ----------------------------------------------------------------------------

def check_exposure(host, token, tls, insecure=False):
    """The expert server's rule: off loopback a listener needs a token and TLS both, unless
    `insecure`.  ValueError otherwise."""
    from colibri.remote.server import is_loopback

    if not is_loopback(host) and not (token and tls) and not insecure:
        raise ValueError(f"listening on {host} (not loopback) needs both a token (--token or --token-file) and "
                         f"TLS (--tls-cert, --tls-key): heartbeats would otherwise be read and forged by anyone on "
                         f"the network; --insecure listens without them")


def serve(orchestrator, listen, *, token=None, tls_cert=None, tls_key=None, insecure=False, workers=4):
    """A started gRPC server answering Orchestrator.Heartbeat at `listen` (HOST:PORT; port 0 picks
    one), the port its own, and the orchestrator started; returns (server, port).  Off loopback
    it needs `token` and TLS (check_exposure)."""
    import grpc

    from colibri.remote import colibri_remote_pb2_grpc as pbg
    from colibri.remote.server import TokenCheck, bind, check_listen, parse_listen

    host, port = parse_listen(listen)
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    check_exposure(host, token, bool(tls_cert), insecure)
    creds = check_listen(host, port, tls_cert, tls_key)   # before the gRPC server exists (server.probe_port says why)

    class Servicer(pbg.OrchestratorServicer):
        def Heartbeat(self, request, context):
            try:
                return orchestrator.heartbeat(request)
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            except Full as e:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
            except NotLeader as e:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
            except OSError as e:   # the journal could not be synced: no version handed out
                context.abort(grpc.StatusCode.UNAVAILABLE, f"the orchestrator cannot write its journal: {e}")

    options = [("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", MAX_MESSAGE)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=options,
                         interceptors=[TokenCheck(token)] if token else [])
    pbg.add_OrchestratorServicer_to_server(Servicer(), server)
    _, port = bind(server, host, port, creds)   # the port its own: grpc.so_reuseport 0
    # after the bind: an orchestrator that cannot have the port leaves the state alone (and does not campaign)
    orchestrator.start(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    server.start()
    return server, port


def option_type(name):
    """An argparse type for an option of OPTIONS: its error names the range (argparse adds the option)."""
    def parse(text):
        try:
            return check_option(name, OPTIONS[name][0](text))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {option_range(name)}") from None
    return parse


def add_arguments(p):
    p.add_argument("--listen", default="127.0.0.1:50061", metavar="HOST:PORT",
                   help="where edges send heartbeats (default 127.0.0.1:50061; off loopback it needs "
                        "--token and --tls-cert/--tls-key)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--state", metavar="FILE",
                       help="the JSON file loads, placements and versions are kept in (resumed at start): one "
                            "orchestrator")
    where.add_argument("--etcd", metavar="HOST:PORT[,HOST:PORT...]",
                       help="keep placements in this etcd cluster: several orchestrators campaign, one leads "
                            "(docs/DEVICES.md, \"Control plane on etcd\")")
    p.add_argument("--etcd-prefix", default=PREFIX, metavar="KEY",
                   help=f"the keys under which the control plane lives in etcd (default {PREFIX})")
    p.add_argument("--lease-ttl", type=option_type("lease_ttl"), default=LEASE_TTL, metavar="S",
                   help=f"seconds of the leader's etcd lease: the bound on a hand-over after its death "
                        f"(default {LEASE_TTL})")
    p.add_argument("--advertise", metavar="HOST:PORT",
                   help="with --etcd: the address edges reach this orchestrator at, as the election publishes "
                        "it (default: --listen's; needed when that is a wildcard such as 0.0.0.0)")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--token", default=os.environ.get("COLIBRI_TOKEN"),
                     help="the shared secret edges send as \"authorization: Bearer TOKEN\" (default: $COLIBRI_TOKEN; "
                          "visible to other local users in the process list: prefer --token-file)")
    tok.add_argument("--token-file", metavar="FILE", help="read the token from FILE")
    p.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback address without a token and TLS")
    p.add_argument("--interval", type=option_type("interval"), default=INTERVAL, metavar="S",
                   help=f"seconds between two placement changes of one edge, and between state saves "
                        f"(default {INTERVAL:g})")
    p.add_argument("--half-life", type=option_type("half_life"), default=HALF_LIFE, metavar="N",
                   help=f"heartbeats over which an expert's load halves (default {HALF_LIFE:g})")
    p.add_argument("--margin", type=option_type("margin"), default=MARGIN, metavar="F",
                   help=f"share by which a remote expert's load must pass the coldest local one's to take its "
                        f"place (default {MARGIN:g})")
    p.add_argument("--warmup", type=option_type("warmup"), default=WARMUP, metavar="N",
                   help=f"heartbeats with load before an edge's first placement (default {WARMUP})")
    p.add_argument("--max-edges", type=option_type("max_edges"), default=MAX_EDGES, metavar="N",
                   help=f"edges kept; heartbeats of more are refused (default {MAX_EDGES})")
    p.add_argument("--max-experts", type=option_type("max_experts"), default=MAX_EXPERTS, metavar="N",
                   help=f"n_layers x n_experts of the edges' models: expert ids at or above it are refused "
                        f"(default {MAX_EXPERTS})")


def run(args):
    """`colibri orchestrate`: serves until interrupted, then saves the state."""
    from colibri.remote import read_token_file
    from colibri.remote.server import parse_listen

    from colibri.remote.control import EtcdStore
    from colibri.remote.etcd import EtcdError

    try:
        token = read_token_file(args.token_file) if args.token_file else args.token
        store = args.state
        if args.etcd is not None:
            store = EtcdStore(args.etcd, prefix=args.etcd_prefix, lease_ttl=args.lease_ttl, advertise=args.advertise)
        orch = Orchestrator(store, half_life=args.half_life, margin=args.margin, warmup=args.warmup,
                            interval=args.interval, max_edges=args.max_edges, max_experts=args.max_experts)
        server, port = serve(orch, args.listen, token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
                             insecure=args.insecure)
    except (ValueError, OSError, EtcdError) as e:
        raise SystemExit(f"colibri orchestrate: {e}")
    host = parse_listen(args.listen)[0]
    print(f"colibri orchestrate: listening on {host}:{port}, {orch.store.describe()}"
          f"{', TLS' if args.tls_cert else ''}{', token' if token else ''}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # a stop saves the state, as ^C does
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(grace=1.0).wait()
        orch.close()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="colibri orchestrate")
    add_arguments(p)
    return run(p.parse_args(argv))

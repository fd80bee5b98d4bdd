"""The edge: a session whose routed experts run here or on a server, placed by measured load.

    edge = colibri.remote.Edge("out/model", remote="gpu-box:50051", expert_budget=512 << 20,
                               orchestrator="orchestrator:50061", name="kiosk-3")
    # or, with the control plane on etcd: etcd="10.0.0.1:2379,...", orchestrator="o1:50061,o2:50061"
    for token in edge.stream(ids, max_tokens=64):
        ...

The session gets one device besides the cpu: a RemoteDriver ("remote") computing on the server
that `colibri serve-experts` runs, or a FleetDriver computing on every server announced in etcd
(fleet=, colibri.remote.fleet).  The placement says which experts are local (cpu) and which are
remote.  Local experts come through the session's expert cache when there is an `expert_budget`:
read from the edge's own weights.bin, or, for a model directory without its routed experts
(experts_elsewhere=True), fetched from the server (FetchExpert, at most `fetch_mbit` Mbit/s).

The first placement (placement="auto"): the `budget` hottest experts of a `colibri stats
--save-load` file when one is given (`load`), else the first budget // n_moe_layers experts of
each MoE layer.  Without a measurement no expert is known to be hotter than another, and an even
share per layer makes every layer equally likely to need the network; the orchestrator soon
replaces it by measured load.  A budget is so many experts: the cache's slots when streaming (as
the core counts them: colibri.experts.slot_count), every routed expert when resident.

Generation runs token by token.  Between two tokens (never during a forward pass) the loop hands a
heartbeat to a background thread every `heartbeat_tokens` tokens or `heartbeat_s` seconds, and
applies a placement the orchestrator pushed (Session.set_placement): a token is computed wholly
under one placement, so none is lost or repeated, and with the same kernels on both sides the
tokens are those of an all-local run.

With etcd (etcd="h:p,...": colibri.remote.control's EdgePlane) the edge holds a lease, which the
heartbeat thread refreshes, and under it a record of itself; its heartbeats go to the orchestrator
that leads as etcd has it, else to the `orchestrator` addresses in turn; and its placement comes
through a watch of its etcd key instead of the replies, applied between tokens all the same.
"""
import socket
import threading
import time
from pathlib import Path

import numpy as np

from colibri import experts
from colibri.remote import model_hash
from colibri.remote.orchestrator import LEASE_TTL, PREFIX

HEARTBEAT_LIMIT = 200      # bytes on the wire: the message and gRPC's 5-byte frame header
GRPC_FRAME = 5
REMOTE = "remote"


def strip_experts(src, out):
    """Writes OUT: SRC's colibri_model.json and its weights.bin cut where the routed experts begin,
    for an edge that fetches its experts from the server (Model(OUT, experts_elsewhere=True)).
    Needs a model whose routed experts lie after every other tensor (colibri convert --layout
    interleaved writes them so); returns (bytes kept, bytes left out)."""
    import shutil

    import colibri

    src, out = Path(src), Path(out)
    model = colibri.Model(src)
    routed = experts.tensor_names(model)
    if not routed:
        raise ValueError(f"{src}: the model has no routed experts to leave out")
    first = min(offset for parts in experts.layout(model).values() for offset, _, _ in parts)
    after = [t["name"] for t in model.tensors()
             if t["name"] not in routed and t["file_offset"] + t["file_size"] > first]
    if after:
        raise ValueError(f"{src}: {after[0]} (and {len(after) - 1} more) lies after the first routed expert: "
                         f"convert the model with --layout interleaved, which writes the experts last")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "colibri_model.json", out / "colibri_model.json")
    with open(src / "weights.bin", "rb") as f, open(out / "weights.bin", "wb") as g:
        left = first
        while left:
            chunk = f.read(min(left, 16 << 20))
            if not chunk:
                raise ValueError(f"{src}/weights.bin ends before its first routed expert at byte {first}")
            g.write(chunk)
            left -= len(chunk)
    return first, (src / "weights.bin").stat().st_size - first


def initial_local(model, slots, load=None):
    """The expert ids (layer * n_experts + expert) placement="auto" keeps local: the `slots`
    most loaded of `load` ((n_layers, n_experts), from colibri stats --save-load; ties to the
    lower id), else the first slots // n_moe_layers experts of each MoE layer (the first layers one
    more while slots remain)."""
    n_experts = model.config["num_experts"]
    layers = experts.moe_layers(model)
    candidates = [layer * n_experts + e for layer in layers for e in range(n_experts)]
    if load is not None:
        return sorted(experts.hottest(load, slots, among=candidates))
    share, extra = divmod(min(slots, len(candidates)), max(len(layers), 1))
    return sorted(layer * n_experts + e for j, layer in enumerate(layers) for e in range(share + (j < extra)))


def placement_table(model, local, remote_device=1, holds=None):
    """uint8 (n_layers, n_experts): the remote device everywhere it holds a routed expert, the cpu
    (0) for the `local` ids, the dense layers and what it does not hold."""
    cfg = model.config
    table = np.zeros((cfg["num_layers"], cfg["num_experts"]), dtype=np.uint8)
    table[experts.moe_layers(model)] = remote_device
    if holds is not None:
        table[~np.asarray(holds, dtype=bool)] = 0
    flat = table.reshape(-1)
    local = np.asarray(sorted(local), dtype=np.int64)
    flat[local[(local >= 0) & (local < flat.size)]] = 0
    return table


def heartbeat_message(edge, hash8, seq, p90_us, hit_permille, version, budget_bytes, slot_bytes, pending,
                      limit=HEARTBEAT_LIMIT):
    """(HeartbeatRequest, ids, counts): the message, and the load pairs it carries (int64 arrays),
    the hottest of `pending` (int64 flat per-expert tokens not yet reported) while the serialized
    message plus gRPC's frame header stays under `limit` bytes."""
    from colibri.remote import colibri_remote_pb2 as pb

    msg = pb.HeartbeatRequest(edge=edge, model_hash=hash8, seq=seq, device_p90_us=p90_us,
                              cache_hit_permille=hit_permille, placement_version=version, budget_bytes=budget_bytes,
                              expert_bytes=slot_bytes)
    ids, counts = [], []
    if len(msg.SerializeToString()) + GRPC_FRAME >= limit:
        raise ValueError(f"a heartbeat without loads is {len(msg.SerializeToString()) + GRPC_FRAME} bytes: "
                         f"the edge's name is too long")
    for i in experts.hottest(pending, len(pending)):
        n = int(min(pending[i], 2**32 - 1))
        msg.load_delta.extend((int(i), n))
        if len(msg.SerializeToString()) + GRPC_FRAME >= limit:
            del msg.load_delta[-2:]
            break
        ids.append(int(i))
        counts.append(n)
    return msg, np.array(ids, dtype=np.int64), np.array(counts, dtype=np.int64)


class Heartbeats:
    """The background thread that sends heartbeats: submit() hands it a message (none while one is
    on its way), take_reply() returns the newest reply not yet taken.  A message goes to the
    orchestrator that leads as etcd has it (with `plane`, an EdgePlane), else to the `targets`
    (HOST:PORT, comma-separated) in turn: one that does not lead, is not there or does not answer
    in `timeout_s` passes it to the next.  With `plane` the thread also keeps the edge's lease,
    after each heartbeat and every TTL/3 without one.  Failures are counted; the loop goes on
    without the orchestrator."""

    MOVE_ON = ("FAILED_PRECONDITION", "UNAVAILABLE", "DEADLINE_EXCEEDED")

    def __init__(self, targets, *, token=None, tls_ca=None, timeout_s=2.0, plane=None):
        import grpc

        self.targets = [t.strip() for t in targets.split(",")] if isinstance(targets, str) else list(targets)
        self.credentials = None
        if tls_ca is not None:
            ca = tls_ca if isinstance(tls_ca, bytes) else Path(tls_ca).read_bytes()
            self.credentials = grpc.ssl_channel_credentials(root_certificates=ca)
        self.channels, self.stubs = {}, {}
        self.answered_by = None          # the orchestrator that answered last
        self.metadata = [("authorization", f"Bearer {token}")] if token else []
        self.timeout_s, self.plane = timeout_s, plane
        self.cv = threading.Condition()
        self.message = self.reply = None
        self.busy = self.closed = False
        self.sent = self.failed = 0
        self.last_error = None
        self.thread = threading.Thread(target=self._run, name="colibri-heartbeat", daemon=True)
        self.thread.start()

    def submit(self, message):
        with self.cv:
            if self.busy or self.closed:
                return False
            self.message, self.busy = message, True
            self.cv.notify_all()
            return True

    def take_reply(self):
        with self.cv:
            reply, self.reply = self.reply, None
            return reply

    def wait(self, timeout=None):
        """Until the message on its way is answered (or failed)."""
        with self.cv:
            return self.cv.wait_for(lambda: not self.busy, timeout)

    def _stub(self, target):
        import grpc

        from colibri.remote import colibri_remote_pb2_grpc as pbg

        if target not in self.stubs:
            self.channels[target] = (grpc.insecure_channel(target) if self.credentials is None
                                     else grpc.secure_channel(target, self.credentials))
            self.stubs[target] = pbg.OrchestratorStub(self.channels[target])
        return self.stubs[target]

    def _send(self, message):
        """(reply, None) from the first orchestrator that answers, or (None, the last error)."""
        import grpc

        leader = self.plane.leader() if self.plane is not None else None
        error = "no orchestrator to send it to: none leads in etcd, and none was given"
        for target in dict.fromkeys(t for t in (leader, self.answered_by, *self.targets) if t):
            try:
                reply = self._stub(target).Heartbeat(message, timeout=self.timeout_s, metadata=self.metadata)
            except grpc.RpcError as e:
                error = f"{e.code().name}: {e.details()} ({target})"
                if target == leader:
                    self.plane.forget_leader()   # asked again at the next heartbeat
                if e.code().name not in self.MOVE_ON:
                    break
                continue
            self.answered_by = target
            return reply, None
        return None, error

    def _run(self):
        while True:
            with self.cv:
                self.cv.wait_for(lambda: self.message is not None or self.closed,
                                 None if self.plane is None else self.plane.due())
                if self.message is None and self.closed:   # a message already handed over is still sent
                    return
                message, self.message = self.message, None
            if message is not None:
                reply, error = self._send(message)
                with self.cv:
                    if reply is None:
                        self.failed += 1
                        self.last_error = error
                    else:
                        self.sent += 1
                        self.reply = reply
                    self.busy = False
                    self.cv.notify_all()
            if self.plane is not None and (message is not None or self.plane.due() == 0):
                self.plane.refresh()

    def close(self):
        """Stops the thread once the message handed over is sent (a short run's only heartbeat
        would otherwise be lost when the thread had not taken it yet), waiting at most its timeout
        on each orchestrator."""
        with self.cv:
            self.closed = True
            self.cv.notify_all()
        self.thread.join(timeout=self.timeout_s * max(1, len(self.targets)) + 1)
        for channel in self.channels.values():
            channel.close()


class ExpertFetcher:
    """A session's expert_read for a model directory without its routed experts: each read is
    served from its expert's bytes, fetched from the server by the driver (FetchExpert: the parts
    colibri.experts.layout names, joined in its order; the driver's bandwidth_mbit caps it); the
    last `keep` experts are kept for the reads that follow (a stacked layout reads an expert in
    several parts)."""

    def __init__(self, model, driver, keep=4):
        self.parts = []   # (offset, size, step, layer, where the part starts in the expert's bytes)
        for layer, parts in experts.layout(model).items():
            at = 0
            for offset, size, step in parts:
                self.parts.append((offset, size, step, layer, at))
                at += size
        self.n_experts, self.driver, self.keep = model.config["num_experts"], driver, keep
        self.cache = {}
        self.fetches = self.bytes = 0

    def __call__(self, offset, dst):
        n = len(dst)
        for start, size, step, layer, at in self.parts:
            expert, within = divmod(offset - start, step)
            if 0 <= expert < self.n_experts and within + n <= size:
                data = self._expert(layer, int(expert))
                dst[:] = data[at + within:at + within + n]
                return n
        raise ValueError(f"a read of {n} bytes at {offset} of weights.bin is not within one routed expert")

    def _expert(self, layer, expert):
        key = (layer, expert)
        if key not in self.cache:
            if len(self.cache) >= self.keep:
                self.cache.pop(next(iter(self.cache)))
            self.cache[key] = self.driver.fetch_expert(layer, expert)
            self.fetches += 1
            self.bytes += len(self.cache[key])
        return self.cache[key]


class Edge:
    """A session with a remote device and its placement, kept by an orchestrator when given one.

    ``model``: a model directory or colibri.Model; ``remote``: the expert server's HOST:PORT, or
    ``fleet``: an etcd (colibri.remote.etcd.Etcd or its "HOST:PORT,..." members) where expert servers
    announce themselves under ``etcd_prefix``, all used through one FleetDriver (colibri.remote.fleet);
    ``placement``: "auto" (the module's doc says which), a placement JSON file or text, or a
    (n_layers, n_experts) uint8 table; ``load``: a colibri stats --save-load file or array for
    "auto"; ``orchestrator``: its HOST:PORT (several, comma-separated: tried in turn) or None;
    ``etcd``: the control plane's etcd members (HOST:PORT,...; keys under ``etcd_prefix``, the
    edge's lease of ``lease_ttl`` seconds), or None; ``name``: the edge's name (default: the host
    name); ``expert_budget``: bytes of expert cache (None: resident); ``experts_elsewhere``: the
    model directory lacks the routed experts, fetched from the server at most ``fetch_mbit``
    Mbit/s; ``deadline_ms``, ``device_threshold_ms``, ``strict``: the driver's deadline and the
    session's fallback threshold and strictness; other keywords go to Model.session."""

    def __init__(self, model, remote=None, *, fleet=None, placement="auto", load=None,
                 orchestrator=None, etcd=None, etcd_prefix=PREFIX, lease_ttl=LEASE_TTL, name=None,
                 expert_budget=None, experts_elsewhere=False, fetch_mbit=None, token=None, tls_ca=None,
                 deadline_ms=1000, device_threshold_ms=5.0, strict=False, heartbeat_tokens=16, heartbeat_s=1.0,
                 driver=None, **session_options):
        import colibri
        from colibri._core import STREAMING_OPTIONS
        from colibri.remote.driver import RemoteDriver

        if not isinstance(model, colibri.Model):
            model = colibri.Model(model, experts_elsewhere=experts_elsewhere)
        self.model = model
        cfg = model.config
        self.n_experts = cfg["num_experts"]
        self.name = name or socket.gethostname().encode()[:32].decode(errors="ignore") or "edge"
        if len(self.name.encode()) > 32:
            raise ValueError(f"an edge's name is at most 32 bytes: {self.name!r}")
        if driver is None and (remote is None) == (fleet is None):
            raise ValueError("an edge computes on one expert server (remote=HOST:PORT) or on the fleet announced "
                             "in etcd (fleet=HOST:PORT,...): give one of them")
        if driver is None and fleet is not None:
            from colibri.remote.fleet import FleetDriver
            driver = FleetDriver(fleet, model, prefix=etcd_prefix, name=REMOTE, token=token, tls_ca=tls_ca,
                                 deadline_ms=deadline_ms, bandwidth_mbit=fetch_mbit,
                                 probe_ms=session_options.get("device_probe_ms", 250))
        self.driver = driver if driver is not None else RemoteDriver(
            remote, model, name=REMOTE, token=token, tls_ca=tls_ca, deadline_ms=deadline_ms,
            bandwidth_mbit=fetch_mbit)
        self.fetcher = None
        stream = dict(expert_budget=expert_budget or 0)
        if experts_elsewhere:
            if not expert_budget:
                raise ValueError("a model without its experts streams them: give an expert_budget")
            self.fetcher = ExpertFetcher(model, self.driver)
            stream["expert_read"] = self.fetcher
        streaming = {k: session_options[k] for k in STREAMING_OPTIONS if k in session_options}
        self.expert_bytes = model.expert_slots(**streaming)[0]   # one expert: a slot of the expert cache
        routed = experts.routed_count(model)
        self.slots = experts.slot_count(model, expert_budget, **streaming) if expert_budget else routed
        self.budget_bytes = expert_budget or routed * self.expert_bytes

        holds = getattr(self.driver, "holds", None)
        self.holds = holds(cfg["num_layers"], self.n_experts) if holds is not None else None
        if isinstance(placement, str) and placement == "auto":
            if isinstance(load, (str, Path)):
                load = experts.read_load(load, model)
            placement = placement_table(model, initial_local(model, self.slots, load), holds=self.holds)
        self.session = model.session(devices=[self.driver], placement=placement,
                                     device_threshold_ms=device_threshold_ms, strict=strict,
                                     **stream, **session_options)
        self.remote_device = self.session.devices.index(self.driver.name)

        self.hash8 = model_hash(model.directory)[:8]
        self.version = 0                 # the orchestrator's placement version this edge runs (0: its own)
        self.applied = []                # (tokens generated so far, version) of each placement applied
        self.generated = 0
        self.heartbeat_tokens, self.heartbeat_s = heartbeat_tokens, heartbeat_s
        self.seq = 0
        self.pending = np.zeros(cfg["num_layers"] * self.n_experts, dtype=np.int64)
        self.last_load = self.session.expert_load().reshape(-1)
        self.last_cache = self._cache_counts()
        self.last_beat_at, self.last_beat_token = time.monotonic(), 0
        self.last_message_bytes = 0
        self.placement_error = None
        self.heartbeats = self.plane = None
        if etcd is not None:
            from colibri.remote.control import EdgePlane

            try:
                self.plane = EdgePlane(etcd, self.name, self.record(), prefix=etcd_prefix, lease_ttl=lease_ttl)
            except BaseException:
                self.close()
                raise
        if orchestrator is not None or self.plane is not None:
            self.heartbeats = Heartbeats(orchestrator or (), token=token, tls_ca=tls_ca, plane=self.plane)

    # ---- the placement --------------------------------------------------------------------------

    def local_experts(self):
        """Sorted ids (layer * n_experts + expert) of the routed experts placed on the cpu."""
        table = self.session.placement
        routed = np.zeros(table.shape, dtype=bool)
        routed[experts.moe_layers(self.model)] = True
        return [int(i) for i in np.flatnonzero((table == 0) & routed)]

    def set_local(self, local):
        """Places the `local` ids on the cpu and every other routed expert the server holds on it
        (call between tokens)."""
        self.session.set_placement(placement_table(self.model, local, self.remote_device, self.holds))

    # ---- heartbeats -----------------------------------------------------------------------------

    def _cache_counts(self):
        if not self.session.expert_budget:
            return (0, 0)
        s = self.session.expert_cache_stats()
        return (s["hits"], s["misses"])

    def build_heartbeat(self):
        """The next HeartbeatRequest, from the counters since the last one (between tokens)."""
        load = self.session.expert_load().reshape(-1)
        self.pending += load - self.last_load
        self.last_load = load
        hits, misses = self._cache_counts()
        d_hits, d_misses = hits - self.last_cache[0], misses - self.last_cache[1]
        self.last_cache = (hits, misses)
        permille = 1000 * d_hits // (d_hits + d_misses) if d_hits + d_misses else 0
        p90_us = [int(d["p90_ns"] // 1000) for d in self.session.device_stats()]
        self.seq += 1
        msg, ids, counts = heartbeat_message(self.name, self.hash8, self.seq, p90_us, permille, self.version,
                                             self.budget_bytes, self.expert_bytes, self.pending)
        self.pending[ids] -= counts   # what did not fit waits for the next heartbeat
        if self.plane is not None:
            self.plane.update(device_p90_us=p90_us, cache_hit_permille=permille)
        self.last_message_bytes = len(msg.SerializeToString()) + GRPC_FRAME
        return msg

    def record(self):
        """The edge's record in etcd (EdgePlane keeps it up to date)."""
        import colibri

        return {"model_hash": self.hash8.hex(), "budget_bytes": self.budget_bytes, "expert_bytes": self.expert_bytes,
                "device_p90_us": [], "cache_hit_permille": 0, "placement_version": self.version,
                "colibri_version": colibri.__version__}

    def apply_reply(self, reply):
        """Applies the placement a heartbeat's reply pushed (call between tokens); True when the
        placement changed.  A reply without a new version changes nothing."""
        if reply is None or reply.placement_version in (0, self.version):
            return False
        return self.apply_placement(reply.placement_version, reply.local)

    def apply_watched(self):
        """Applies the newest placement etcd's watch brought, when it is for this model and newer
        than the one the edge runs (call between tokens); True when the placement changed."""
        newest = None
        for version, model, local in self.plane.placements():
            if model == self.hash8.hex() and version > max(self.version, newest[0] if newest else 0):
                newest = version, local
        return newest is not None and self.apply_placement(*newest)

    def apply_placement(self, version, local):
        """Runs placement `version` from the next token on; True when the placement changed.  The
        orchestrator's set is local; in the room it leaves (it knows only the experts that routed
        tokens) the edge keeps the local experts it has used most.  A set the session refuses is
        kept in placement_error and the edge stays on its version (a reply brings it again; etcd
        brings the next version)."""
        local = set(local)
        room = self.slots - len(local)
        if room > 0:
            used = self.session.expert_load().reshape(-1)
            kept = sorted((i for i in self.local_experts() if i not in local), key=lambda i: (-used[i], i))
            local.update(kept[:room])
        try:
            self.set_local(local)
        except ValueError as e:
            self.placement_error = f"placement version {version}: {e}"
            return False
        self.version = version
        self.applied.append((self.generated, self.version))
        if self.plane is not None:
            self.plane.update(placement_version=version)
        return True

    def take_placement(self):
        """Applies a placement the orchestrator pushed: through etcd's watch with an EdgePlane,
        else in a heartbeat's reply."""
        if self.plane is not None:
            return self.apply_watched()
        return self.apply_reply(self.heartbeats.take_reply())

    def between_tokens(self):
        """What the generate loop does between two tokens: apply a pushed placement, and hand a
        heartbeat to the background thread when one is due."""
        if self.heartbeats is None:
            return
        self.take_placement()
        due = (self.generated - self.last_beat_token >= self.heartbeat_tokens
               or time.monotonic() - self.last_beat_at >= self.heartbeat_s)
        if due and not self.heartbeats.busy:
            self.heartbeats.submit(self.build_heartbeat())
            self.last_beat_at, self.last_beat_token = time.monotonic(), self.generated

    def heartbeat(self, timeout=5.0):
        """A heartbeat now, waiting for its reply, and the placement it pushes applied (between
        tokens).  True when the placement changed."""
        if self.heartbeats is None:
            raise ValueError("this edge has no orchestrator")
        self.heartbeats.wait(timeout)
        self.take_placement()
        if not self.heartbeats.submit(self.build_heartbeat()):
            raise RuntimeError("a heartbeat is still on its way")
        self.last_beat_at, self.last_beat_token = time.monotonic(), self.generated
        if not self.heartbeats.wait(timeout):
            raise TimeoutError(f"the orchestrator did not answer in {timeout} s")
        return self.take_placement()

    # ---- generation -----------------------------------------------------------------------------

    def stream(self, prompt, max_tokens=16, temperature=0.0, top_k=0, top_p=1.0, seed=None, stop_at_eos=True,
               **sampling):
        """Session.stream's tokens (and its keyword-only sampling options), with the placement kept
        between tokens."""
        self.between_tokens()
        for token in self.session.stream(prompt, max_tokens, temperature, top_k, top_p, seed, stop_at_eos,
                                         between_tokens=self.between_tokens, **sampling):
            self.generated += 1
            yield token

    def stream_text(self, prompt, stop=(), **options):
        """Session.stream_text's pieces, with the placement kept between tokens."""
        def step():
            self.generated += 1
            self.between_tokens()
        before, held = self.generated, len(self.session.tokens) + len(prompt)
        self.between_tokens()
        yield from self.session.stream_text(prompt, stop, between_tokens=step, **options)
        self.generated = before + len(self.session.tokens) - held

    def generate(self, prompt, max_tokens=16, temperature=0.0, top_k=0, top_p=1.0, seed=None, stop_at_eos=True,
                 **sampling):
        return list(self.stream(prompt, max_tokens, temperature, top_k, top_p, seed, stop_at_eos, **sampling))

    def counters(self):
        """Lines of the devices' counters (and the heartbeats'), for --verbose."""
        lines = [device_line(d) for d in self.session.device_stats()]
        if hasattr(self.driver, "counters_line"):
            lines.append(self.driver.counters_line())
        if self.heartbeats is not None:
            h = self.heartbeats
            h.wait(h.timeout_s)   # the answer to a heartbeat still on its way (a short run ends before it)
            lines.append(f"[orchestrator: {h.sent} heartbeats answered, {h.failed} failed"
                         f"{f' (last: {h.last_error})' if h.last_error else ''}; placement version {self.version}, "
                         f"{len(self.applied)} applied; last heartbeat {self.last_message_bytes} B on the wire"
                         f"{f'; refused: {self.placement_error}' if self.placement_error else ''}]")
        if self.plane is not None:
            p = self.plane
            lines.append(f"[etcd {p.etcd.names()}: lease {p.lease.id:x}, {p.renewals} renewed after expiring"
                         f"{f'; last error: {p.error}' if p.error else ''}]")
        if self.fetcher is not None:
            lines.append(f"[experts fetched: {self.fetcher.fetches}, {self.fetcher.bytes / 1e6:.2f} MB]")
        return lines

    def close(self, revoke=True):
        """Stops the heartbeats and the driver; with etcd, `revoke` ends the edge's lease (its record
        goes now; without, it goes when the lease expires, as a dead edge's does)."""
        if self.heartbeats is not None:
            self.heartbeats.close()
            self.heartbeats = None
        if self.plane is not None:
            self.plane.close(revoke)
            self.plane = None
        close = getattr(self.driver, "close", None)
        if close is not None:
            close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def device_line(d):
    """One device's counters: calls, fallbacks, errors, P90."""
    state = ", bypassed now" if d["bypassed_now"] else ""
    return (f"[device {d['name']}: {d['calls']} calls, {d['experts']} experts, {d['rows']} rows; "
            f"{d['fallbacks']} fallbacks, {d['errors']} errors, {d['slow']} slow, {d['probes']} probes{state}; "
            f"P90 {d['p90_ns'] / 1e6:.2f} ms of {d['samples']} (threshold {d['threshold_ns'] / 1e6:.1f} ms)]")

"""The orchestrator: edges report what their experts do; it decides which experts each edge keeps.

    colibri orchestrate --listen 127.0.0.1:50061 --state orchestrator.json

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

The state (loads, placements, versions) is a JSON file written atomically (a temporary file
renamed over it): at once when a placement changes, so that a version is never handed out twice,
and otherwise at most every `interval` seconds.  A restarted orchestrator resumes from it.
"""
import argparse
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
STATE_FORMAT = "colibri-orchestrator"


def place(load, local, slots, margin=MARGIN, min_gain=MIN_GAIN):
    """The local set after `local` (a set of expert ids) given `load` ({id: tokens}) and room for
    `slots` experts: over budget the coldest go; with room the hottest experts that routed
    anything come in; then the hottest remote expert takes the coldest local one's place while its
    load passes that one's by `margin` plus `min_gain` (hysteresis: two near-equal experts do not
    swap back and forth).  Ties go to the lower id."""
    local = set(local)

    def coldest_first(i):
        return (load.get(i, 0.0), -i)

    while len(local) > slots:
        local.remove(min(local, key=coldest_first))
    hot = sorted((i for i, x in load.items() if x > 0), key=lambda i: (-load[i], i))
    remote = [i for i in hot if i not in local]
    room = slots - len(local)
    local.update(remote[:room])
    remote = remote[room:]
    cold = sorted(local, key=coldest_first)
    for promoted, demoted in zip(remote, cold):
        if load[promoted] <= load.get(demoted, 0.0) * (1 + margin) + min_gain:
            break   # remote descends, cold ascends: no later pair passes either
        local.remove(demoted)
        local.add(promoted)
    return local


class EdgeState:
    """What the orchestrator keeps of one edge (the fields of its state file entry)."""
    FIELDS = ("model_hash", "seq", "heartbeats", "device_p90_us", "cache_hit_permille", "budget_bytes",
              "expert_bytes", "placement_version", "edge_version", "local", "load", "last_seen")

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

    @property
    def slots(self):
        return self.budget_bytes // self.expert_bytes if self.expert_bytes else 0

    def to_json(self):
        d = {k: getattr(self, k) for k in self.FIELDS}
        d["load"] = {str(i): round(x, 4) for i, x in sorted(self.load.items())}
        return d

    @classmethod
    def from_json(cls, d):
        st = cls()
        for k in cls.FIELDS:
            if k in d:
                setattr(st, k, d[k])
        st.load = {int(i): float(x) for i, x in d.get("load", {}).items()}
        st.local = None if st.local is None else sorted(int(i) for i in st.local)
        return st


class Orchestrator:
    """The placement logic and its state, without the network (serve() puts it on gRPC)."""

    def __init__(self, state_path, *, half_life=HALF_LIFE, margin=MARGIN, min_gain=MIN_GAIN, warmup=WARMUP,
                 interval=INTERVAL, clock=time.monotonic):
        if half_life <= 0:
            raise ValueError(f"half_life must be > 0 heartbeats, not {half_life}")
        self.state_path = Path(state_path)
        self.decay = 0.5 ** (1.0 / half_life)
        self.margin, self.min_gain, self.warmup, self.interval = margin, min_gain, warmup, interval
        self.clock = clock
        self.lock = threading.Lock()
        self.edges = {}
        self.saved_at = -math.inf
        self._load_state()

    def _load_state(self):
        try:
            doc = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.state_path}: cannot read the orchestrator's state: {e}") from None
        if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT or doc.get("version") != 1:
            raise ValueError(f"{self.state_path}: not an orchestrator state file (format {STATE_FORMAT!r}, version 1)")
        try:
            self.edges = {name: EdgeState.from_json(d) for name, d in doc["edges"].items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{self.state_path}: a damaged edge entry ({e})") from None

    def save(self):
        """Writes the state: a temporary file beside it, synced, renamed over it."""
        with self.lock:
            self._save()

    def _save(self):
        doc = {"format": STATE_FORMAT, "version": 1, "edges": {n: st.to_json() for n, st in sorted(self.edges.items())}}
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.state_path.name + ".", dir=self.state_path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state_path)
        except BaseException:
            os.unlink(tmp)
            raise
        self.saved_at = self.clock()

    def heartbeat(self, req):
        """The reply (a colibri_remote_pb2.HeartbeatReply) to one HeartbeatRequest."""
        from colibri.remote import colibri_remote_pb2 as pb

        if not req.edge or len(req.edge.encode()) > 32:
            raise ValueError("an edge's name is 1 to 32 bytes")
        if len(req.load_delta) % 2:
            raise ValueError("load_delta holds (expert, tokens) pairs: its length must be even")
        with self.lock:
            now = self.clock()
            st = self.edges.setdefault(req.edge, EdgeState())
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
            changed = False
            if st.expert_bytes and st.heartbeats >= self.warmup and now - st.changed_at >= self.interval:
                new = sorted(place(st.load, st.local or (), st.slots, self.margin, self.min_gain))
                if new != st.local:
                    st.local, st.changed_at = new, now
                    st.placement_version += 1
                    changed = True
            if changed or now - self.saved_at >= self.interval:
                self._save()   # before the reply: a version handed out survives a restart
            reply = pb.HeartbeatReply(placement_version=st.placement_version if st.local is not None else 0)
            if st.local is not None and req.placement_version != st.placement_version:
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
    one); returns (server, port).  Off loopback it needs `token` and TLS (check_exposure)."""
    import grpc

    from colibri.remote import colibri_remote_pb2_grpc as pbg
    from colibri.remote.server import TokenCheck, bind, parse_listen

    host, port = parse_listen(listen)
    if bool(tls_cert) != bool(tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    check_exposure(host, token, bool(tls_cert), insecure)

    class Servicer(pbg.OrchestratorServicer):
        def Heartbeat(self, request, context):
            try:
                return orchestrator.heartbeat(request)
            except ValueError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         interceptors=[TokenCheck(token)] if token else [])
    pbg.add_OrchestratorServicer_to_server(Servicer(), server)
    _, port = bind(server, host, port, tls_cert, tls_key)
    server.start()
    return server, port


def add_arguments(p):
    p.add_argument("--listen", default="127.0.0.1:50061", metavar="HOST:PORT",
                   help="where edges send heartbeats (default 127.0.0.1:50061; off loopback it needs "
                        "--token and --tls-cert/--tls-key)")
    p.add_argument("--state", required=True, metavar="FILE",
                   help="the JSON file loads, placements and versions are kept in (resumed at start)")
    tok = p.add_mutually_exclusive_group()
    tok.add_argument("--token", default=os.environ.get("COLIBRI_TOKEN"),
                     help="the shared secret edges send as \"authorization: Bearer TOKEN\" (default: $COLIBRI_TOKEN; "
                          "visible to other local users in the process list: prefer --token-file)")
    tok.add_argument("--token-file", metavar="FILE", help="read the token from FILE")
    p.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    p.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback address without a token and TLS")
    p.add_argument("--interval", type=float, default=INTERVAL, metavar="S",
                   help=f"seconds between two placement changes of one edge, and between state saves "
                        f"(default {INTERVAL:g})")
    p.add_argument("--half-life", type=float, default=HALF_LIFE, metavar="N",
                   help=f"heartbeats over which an expert's load halves (default {HALF_LIFE:g})")
    p.add_argument("--margin", type=float, default=MARGIN, metavar="F",
                   help=f"share by which a remote expert's load must pass the coldest local one's to take its "
                        f"place (default {MARGIN:g})")
    p.add_argument("--warmup", type=int, default=WARMUP, metavar="N",
                   help=f"heartbeats with load before an edge's first placement (default {WARMUP})")


def run(args):
    """`colibri orchestrate`: serves until interrupted, then saves the state."""
    from colibri.remote import read_token_file
    from colibri.remote.server import parse_listen

    try:
        token = read_token_file(args.token_file) if args.token_file else args.token
        orch = Orchestrator(args.state, half_life=args.half_life, margin=args.margin, warmup=args.warmup,
                            interval=args.interval)
        server, port = serve(orch, args.listen, token=token, tls_cert=args.tls_cert, tls_key=args.tls_key,
                             insecure=args.insecure)
    except (ValueError, OSError) as e:
        raise SystemExit(f"colibri orchestrate: {e}")
    host = parse_listen(args.listen)[0]
    print(f"colibri orchestrate: listening on {host}:{port}, {len(orch.edges)} edges resumed from {args.state}"
          f"{', TLS' if args.tls_cert else ''}{', token' if token else ''}", file=sys.stderr, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))   # a stop saves the state, as ^C does
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(grace=1.0).wait()
        orch.save()
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(prog="colibri orchestrate")
    add_arguments(p)
    return run(p.parse_args(argv))

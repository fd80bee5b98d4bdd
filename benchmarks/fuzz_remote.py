"""Fuzz targets for the remote surfaces: `colibri serve-experts` and `colibri orchestrate`.

  experts      protobuf: an Experts request (Info, Compute, FetchExpert) is the input, given to
               the servicer in process (the bundled model); its reply or a gRPC status through
               context.abort are the only allowed outcomes, and a Compute reply must carry
               exactly the rows asked for
  orchestrate  protobuf: a run of HeartbeatRequests is the input, given to the Orchestrator in
               process (a state file on /dev/shm, at most 4 edges and 64 experts); a reply,
               INVALID_ARGUMENT or RESOURCE_EXHAUSTED are the only outcomes, a placement names
               only experts the edge reported, the state stays in its bounds, and the state
               file (snapshot and journal) reloads to what the orchestrator holds
  http2        a grammar of HTTP/2 connections (hyperframe frames, hpack headers, gRPC framing
               around mutated requests: SETTINGS with any window, streams left open, a window
               never opened, CONTINUATION without end, RST, GOAWAY, garbage) against both
               servers running as processes; after every connection, while up to HOLD of the
               attacker's connections stay open unread, a well-behaved client's Info and
               Heartbeat must answer within 2 s, and neither process may exit

    python benchmarks/fuzz_remote.py experts|orchestrate [libFuzzer flags] [corpus dirs]   # needs atheris
    python benchmarks/fuzz_remote.py http2 -max_total_time=S -artifact_prefix=DIR/          # needs h2
    python benchmarks/fuzz_remote.py http2 FILE...        # replay a finding: exit 1 while it still stalls or kills
    python benchmarks/fuzz_remote.py http2 -minimize_crash=1 FILE   # fewer connections, the same finding
    python benchmarks/fuzz_remote.py --make-seeds         # rewrite benchmarks/fuzz_corpus/{experts,orchestrate}/

benchmarks/fuzz.py runs all three with the other targets; the http2 target prints libFuzzer's
final-stats line and "Test unit written to" for a finding (a JSON list of the connections' bytes,
hex), so the same table counts it.  The target functions (TARGETS) import without atheris:
tests/test_fuzz_regressions.py replays their seeds and findings.
"""
import asyncio
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "fuzz_corpus"
HOLD = 4             # attacker connections the http2 target keeps open, unread, at once
PROBE_DEADLINE = 2.0  # seconds: an edge's deadline
MAX_MESSAGE = 1 << 20  # bytes of one mutated request, before its framing


# ---- protobuf targets, in process -----------------------------------------------------------------

class Aborted(Exception):
    """What grpc's context.abort raises: the call ends with this status."""


class Context:
    """The part of grpc.aio.ServicerContext the servicers use."""

    async def abort(self, code, details):
        raise Aborted(code, details)

    def is_active(self):
        return True

    def time_remaining(self):
        return None   # no deadline

    def invocation_metadata(self):
        return ()


_experts = None
_event_loop = None


def _loop():
    global _event_loop
    if _event_loop is None:
        _event_loop = asyncio.new_event_loop()
    return _event_loop


def _service():
    global _experts
    if _experts is None:
        from colibri.demo import MODEL_DIR
        from colibri.remote.server import ExpertsService
        _experts = ExpertsService(MODEL_DIR, threads=1)
    return _experts


def target_experts(data):
    """data[0] % 3: Info, Compute or FetchExpert; data[1] odd: the request carries the served
    model's hash (so that mutants get past the check); the rest: the request, serialized."""
    from colibri.remote import colibri_remote_pb2 as pb
    from google.protobuf.message import DecodeError

    if len(data) < 2:
        return
    method = ("Info", "Compute", "FetchExpert")[data[0] % 3]
    request_type = {"Info": pb.InfoRequest, "Compute": pb.ComputeRequest, "FetchExpert": pb.FetchRequest}[method]
    try:
        request = request_type.FromString(bytes(data[2:]))
    except DecodeError:
        return   # what gRPC answers before the servicer: not this target's
    service = _service()
    if data[1] & 1 and method != "Info":
        request.model_hash = service.hash
    async def call():   # the servicer's coroutine (or async generator), as grpc.aio runs it
        answer = getattr(service, method)(request, Context())
        return [chunk async for chunk in answer] if method == "FetchExpert" else await answer

    try:
        reply = _loop().run_until_complete(call())
    except Aborted:
        return
    if method == "Compute":
        rows = request.rows[-1] if request.rows else 0
        assert len(reply.y) == rows * service.hidden * 4, (len(reply.y), rows)


def target_orchestrate(data):
    """data: (2-byte length, HeartbeatRequest) records, given in order to one Orchestrator."""
    from colibri.remote import colibri_remote_pb2 as pb
    from colibri.remote.orchestrator import Full, Orchestrator
    from google.protobuf.message import DecodeError

    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as tmp:
        state = Path(tmp) / "state.json"
        orch = Orchestrator(state, warmup=1, interval=0.0, max_edges=4, max_experts=64)
        orch.start()
        reported = {}
        at = 0
        try:
            while at + 2 <= len(data):
                n = int.from_bytes(data[at:at + 2], "little")
                record, at = bytes(data[at + 2:at + 2 + n]), at + 2 + n
                try:
                    req = pb.HeartbeatRequest.FromString(record)
                except DecodeError:
                    continue
                try:
                    reply = orch.heartbeat(req)
                except (ValueError, Full):   # INVALID_ARGUMENT, RESOURCE_EXHAUSTED
                    continue
                reported.setdefault(req.edge, set()).update(req.load_delta[0::2])
                assert set(reply.local) <= reported[req.edge], "a placement names an expert the edge never reported"
        finally:
            orch.close()
        assert len(orch.edges) <= 4 and all(max(st.load, default=0) < 64 for st in orch.edges.values())
        again = Orchestrator(state, max_edges=4, max_experts=64)
        assert again.snapshot() == orch.snapshot(), "the state file does not reload to the state"


TARGETS = {"experts": target_experts, "orchestrate": target_orchestrate}


def _experts_seeds():
    from colibri.remote import colibri_remote_pb2 as pb

    service = _service()
    moe = sorted(service.layout)
    layer, hidden = moe[0], service.hidden
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, hidden)).astype("<f4").tobytes()
    seeds = {"info": bytes([0, 0]),
             "compute": bytes([1, 1]) + pb.ComputeRequest(layer=layer, experts=[0, 2], rows=[0, 2, 3], x=x)
             .SerializeToString(),
             "compute-one": bytes([1, 1]) + pb.ComputeRequest(layer=moe[-1], experts=[1], rows=[0, 1], x=x[:hidden * 4])
             .SerializeToString(),
             "compute-wrong-model": bytes([1, 0]) + pb.ComputeRequest(layer=layer, experts=[0], rows=[0, 1],
                                                                      x=x[:hidden * 4]).SerializeToString(),
             "fetch": bytes([2, 1]) + pb.FetchRequest(layer=layer, expert=1).SerializeToString(),
             "fetch-outside": bytes([2, 1]) + pb.FetchRequest(layer=layer, expert=1 << 20).SerializeToString()}
    return seeds


def _orchestrate_seeds():
    from colibri.remote import colibri_remote_pb2 as pb

    def records(*reqs):
        out = b""
        for r in reqs:
            s = r.SerializeToString()
            out += len(s).to_bytes(2, "little") + s
        return out

    def beat(edge, seq, pairs, version=0, budget=4096, expert=1024):
        return pb.HeartbeatRequest(edge=edge, model_hash=bytes(8), seq=seq, device_p90_us=[120, 900],
                                   cache_hit_permille=700, load_delta=pairs, placement_version=version,
                                   budget_bytes=budget, expert_bytes=expert)

    return {"one-edge": records(beat("a", 1, [0, 5, 3, 2]), beat("a", 2, [0, 4, 7, 9]), beat("a", 3, [7, 1], 1)),
            "two-edges": records(beat("a", 1, [1, 1]), beat("b", 1, [2, 8, 9, 9]), beat("a", 2, [1, 3, 4, 4])),
            "no-budget": records(beat("c", 1, [1, 2], budget=0, expert=0), beat("c", 2, [1, 2], budget=10, expert=0))}


def make_seeds():
    for target, seeds in (("experts", _experts_seeds()), ("orchestrate", _orchestrate_seeds())):
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        for name, data in seeds.items():
            (folder / name).write_bytes(data)
        print(f"{folder.relative_to(ROOT)}: {len(seeds)} seeds")


# ---- the http2 grammar target, against processes ----------------------------------------------------

EXPERTS_PATHS = ["/colibri.remote.v1.Experts/Info", "/colibri.remote.v1.Experts/Compute",
                 "/colibri.remote.v1.Experts/FetchExpert"]
ORCH_PATH = "/colibri.remote.v1.Orchestrator/Heartbeat"


class Servers:
    """`colibri serve-experts` (the bundled model) and `colibri orchestrate`, on loopback."""

    def __init__(self, workdir):
        self.workdir = Path(workdir)
        self.procs = {}
        self.ports = {}
        for name, argv in (("experts", ["serve-experts", "--model", str(self._model()), "--threads", "1"]),
                           ("orchestrate", ["orchestrate", "--state", str(self.workdir / "state.json")])):
            port = _free_port()
            p = subprocess.Popen([sys.executable, "-m", "colibri", *argv, "--listen", f"127.0.0.1:{port}"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=self.workdir)
            self.procs[name], self.ports[name] = p, port
        for name in self.procs:
            self._wait_ready(name)

    @staticmethod
    def _model():
        from colibri.demo import MODEL_DIR
        return MODEL_DIR

    def _wait_ready(self, name):
        end = time.monotonic() + 60
        while time.monotonic() < end:
            if self.procs[name].poll() is not None:
                raise RuntimeError(f"{name} did not start: {self.procs[name].stderr.read().decode(errors='replace')}")
            if self.probe(name, deadline=1.0) is None:
                return
            time.sleep(0.2)
        raise RuntimeError(f"{name} did not answer within 60 s")

    def probe(self, name, deadline=PROBE_DEADLINE):
        """None when the server answers a well-behaved call within `deadline`, else why not."""
        import grpc

        from colibri.remote import colibri_remote_pb2 as pb
        from colibri.remote import colibri_remote_pb2_grpc as pbg

        with grpc.insecure_channel(f"127.0.0.1:{self.ports[name]}") as channel:
            try:
                if name == "experts":
                    pbg.ExpertsStub(channel).Info(pb.InfoRequest(), timeout=deadline)
                else:
                    pbg.OrchestratorStub(channel).Heartbeat(
                        pb.HeartbeatRequest(edge="probe", model_hash=bytes(8), seq=int(time.monotonic() * 1e3)),
                        timeout=deadline)
            except grpc.RpcError as e:
                return f"{name}: a well-behaved call got {e.code().name}: {e.details()}"
        return None

    def dead(self):
        for name, p in self.procs.items():
            if p.poll() is not None:
                return f"{name} exited with status {p.returncode}"
        return None

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Grammar:
    """Random HTTP/2 connections to a gRPC server: mostly well-formed frames carrying ill-formed
    or hostile content, and now and then frames that break the protocol."""

    def __init__(self, rng, requests):
        self.rng = rng
        self.requests = requests   # {path: [serialized requests]}: the mutation's starting points

    def connection(self, target):
        """The bytes one attacker connection sends to `target` ("experts" or "orchestrate")."""
        r = self.rng
        out = bytearray()
        if r.random() < 0.97:
            out += b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        else:
            out += bytes(r.getrandbits(8) for _ in range(r.randrange(1, 40)))
        encoder = _hpack_encoder()
        stream = 1
        if r.random() < 0.25:   # a slow reader: no window for the replies, then many valid calls
            out += self.settings(target, encoder, stream, window=0)
            path = r.choice(EXPERTS_PATHS if target == "experts" else [ORCH_PATH])
            for _ in range(r.randrange(4, 24)):
                out += self.request(target, encoder, stream, path=path, mutate=False)
                stream += 2
            return bytes(out)
        else:
            kinds = r.choices(["settings", "request", "window", "rst", "ping", "goaway", "priority", "garbage",
                               "continuation"], weights=[3, 10, 2, 1, 1, 1, 1, 1, 1], k=r.randrange(1, 14))
        for kind in kinds:
            frame = getattr(self, kind)(target, encoder, stream)
            if kind == "request":
                stream += 2 if r.random() < 0.9 else r.choice([0, 1, -2, 1 << 20])
                stream = max(0, min(stream, (1 << 31) - 1))
            out += frame
        return bytes(out)

    def settings(self, target, encoder, stream, window=None):
        from hyperframe.frame import SettingsFrame
        r = self.rng
        f = SettingsFrame(0)
        if window is not None:
            f.settings[SettingsFrame.INITIAL_WINDOW_SIZE] = window
            return f.serialize()
        if r.random() < 0.1:
            f.flags.add("ACK")
            return f.serialize()
        for _ in range(r.randrange(0, 5)):
            key = r.choice([1, 2, 3, 4, 5, 6, 8, r.randrange(0, 65536)])
            value = r.choice([0, 1, 16383, 16384, 65535, (1 << 24) - 1, (1 << 31) - 1, (1 << 32) - 1, r.getrandbits(32)])
            f.settings[key] = value
        return f.serialize()

    def request(self, target, encoder, stream, path=None, mutate=True):
        """HEADERS (and CONTINUATION) of a gRPC call, then DATA frames with a length-prefixed message."""
        from hyperframe.frame import ContinuationFrame, DataFrame, HeadersFrame
        r = self.rng
        path = path or r.choice(EXPERTS_PATHS if target == "experts" else [ORCH_PATH]) if r.random() < 0.9 else \
            r.choice(["/", "/colibri.remote.v1.Experts/Nope", "/" + "x" * r.randrange(1, 9000)])
        headers = [(":method", r.choice(["POST"] * 9 + ["GET"])), (":scheme", "http"), (":path", path),
                   (":authority", "127.0.0.1"), ("content-type", r.choice(["application/grpc"] * 9 + ["text/html"])),
                   ("te", "trailers")]
        if r.random() < 0.3:
            headers.append(("grpc-timeout", r.choice(["1n", "99999999H", "1S", "0m", "x"])))
        if r.random() < 0.1:
            headers.append(("authorization", "Bearer " + "a" * r.randrange(0, 20000)))
        if r.random() < 0.05:
            headers += [("x-pad", "y" * 1000)] * r.randrange(1, 100)
        if not mutate:
            headers = headers[:6]
            headers[0], headers[4] = (":method", "POST"), ("content-type", "application/grpc")
        block = encoder.encode(headers)
        body = self._message(path, mutate)
        end_stream = r.random() < 0.8 or not mutate
        frames = bytearray()
        split = r.random() < 0.1 and mutate
        f = HeadersFrame(1, data=block[:len(block) // 2] if split else block)
        if not split:
            f.flags.add("END_HEADERS")
        frames += _on_stream(f, stream)
        if split and r.random() < 0.8:   # else a header block never ended
            c = ContinuationFrame(1, data=block[len(block) // 2:])
            c.flags.add("END_HEADERS")
            frames += _on_stream(c, stream)
        pieces = [body] if r.random() < 0.8 or not mutate else [body[i:i + 7] for i in range(0, len(body), 7)] or [b""]
        for i, piece in enumerate(pieces):
            d = DataFrame(1, data=piece)
            if end_stream and i == len(pieces) - 1:
                d.flags.add("END_STREAM")
            frames += _on_stream(d, stream)
        return bytes(frames)

    def _message(self, path, mutate=True):
        """A gRPC length-prefixed message: a seed request, mutated, sometimes with a lying length."""
        r = self.rng
        base = bytearray(r.choice(self.requests.get(path, [b""])))
        if not mutate:
            return bytes([0]) + len(base).to_bytes(4, "big") + bytes(base)
        for _ in range(r.choice([0, 0, 1, 2, 8])):
            op = r.random()
            if op < 0.4 and base:
                base[r.randrange(len(base))] = r.getrandbits(8)
            elif op < 0.6:
                base[r.randrange(len(base) + 1):r.randrange(len(base) + 1)] = bytes(r.getrandbits(8) for _ in range(r.randrange(1, 16)))
            elif op < 0.8 and base:
                del base[r.randrange(len(base)):]
            else:
                base = (base * r.choice([2, 16, 200]))[:MAX_MESSAGE]
        length = len(base) if r.random() < 0.9 else r.choice([0, len(base) + 1, (1 << 32) - 1, 1 << 26])
        flag = 0 if r.random() < 0.95 else r.choice([1, 2, 255])
        return bytes([flag]) + length.to_bytes(4, "big") + bytes(base)

    def window(self, target, encoder, stream):
        from hyperframe.frame import WindowUpdateFrame
        r = self.rng
        return WindowUpdateFrame(r.choice([0, stream, 1]), window_increment=r.choice([1, 65535, (1 << 31) - 1])).serialize()

    def rst(self, target, encoder, stream):
        from hyperframe.frame import RstStreamFrame
        return _on_stream(RstStreamFrame(1, error_code=self.rng.randrange(0, 14)), max(0, stream - 2))

    def ping(self, target, encoder, stream):
        from hyperframe.frame import PingFrame
        return PingFrame(0, opaque_data=bytes(8)).serialize()

    def goaway(self, target, encoder, stream):
        from hyperframe.frame import GoAwayFrame
        return GoAwayFrame(0, last_stream_id=stream, error_code=self.rng.randrange(0, 14)).serialize()

    def priority(self, target, encoder, stream):
        from hyperframe.frame import PriorityFrame
        return _on_stream(PriorityFrame(1, depends_on=self.rng.choice([0, stream]), stream_weight=255), stream)

    def continuation(self, target, encoder, stream):
        from hyperframe.frame import ContinuationFrame
        data = bytes(self.rng.getrandbits(8) for _ in range(self.rng.randrange(0, 64)))
        return _on_stream(ContinuationFrame(1, data=data), stream)

    def garbage(self, target, encoder, stream):
        r = self.rng
        n = r.randrange(0, 64)
        header = min(n if r.random() < 0.7 else r.getrandbits(24), (1 << 24) - 1).to_bytes(3, "big")
        return header + bytes([r.getrandbits(8), r.getrandbits(8)]) + r.getrandbits(31).to_bytes(4, "big") + \
            bytes(r.getrandbits(8) for _ in range(n))


def _on_stream(frame, stream):
    """The frame's bytes on `stream`, 0 included (which hyperframe refuses to make for most types)."""
    raw = bytearray(frame.serialize())
    raw[5:9] = stream.to_bytes(4, "big")
    return bytes(raw)


def _hpack_encoder():
    from hpack import Encoder
    return Encoder()


def _requests():
    """{path: [serialized requests]}: the grammar's seeds."""
    from colibri.demo import MODEL_DIR
    from colibri.remote import colibri_remote_pb2 as pb
    from colibri.remote import model_hash

    seeds = _experts_seeds()
    digest = model_hash(MODEL_DIR)
    by_method = {0: EXPERTS_PATHS[0], 1: EXPERTS_PATHS[1], 2: EXPERTS_PATHS[2]}
    out = {}
    for data in seeds.values():
        kind = {0: pb.InfoRequest, 1: pb.ComputeRequest, 2: pb.FetchRequest}[data[0]]
        req = kind.FromString(data[2:])
        if data[1] & 1 and data[0]:
            req.model_hash = digest
        out.setdefault(by_method[data[0]], []).append(req.SerializeToString())
    out[ORCH_PATH] = []
    for data in _orchestrate_seeds().values():
        at = 0
        while at < len(data):
            n = int.from_bytes(data[at:at + 2], "little")
            out[ORCH_PATH].append(data[at + 2:at + 2 + n])
            at += 2 + n
    return out


def _send(port, data, hold, held, rng):
    """Opens a connection, sends `data`, and keeps it open unread (held) or reads what comes for
    a moment and closes it."""
    s = _connect(port)
    try:
        s.sendall(data)
    except OSError:
        s.close()
        return
    if hold:
        held.append((time.monotonic() + rng.uniform(0.5, 4.0), s))
        return
    s.settimeout(0.05)
    try:
        while s.recv(65536):
            pass
    except OSError:
        pass
    s.close()


def _connect(port):
    """A connection with a small receive buffer: what the server sends and it never reads fills
    it soon, so the server's flow control and send paths meet a reader that stopped."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(2)
    s.connect(("127.0.0.1", port))
    return s


def _release(held, everything=False):
    now = time.monotonic()
    for item in [h for h in held if everything or h[0] <= now]:
        held.remove(item)
        item[1].close()


def run_http2(seconds, artifact_prefix, seed=None):
    """The http2 target for `seconds`; 0 when nothing was found, 1 after the first finding."""
    rng = random.Random(seed if seed is not None else int.from_bytes(os.urandom(8), "little"))
    grammar = Grammar(rng, _requests())
    executions, sent_bytes, start, finding = 0, 0, time.monotonic(), None
    recent = []   # the connections that may have led to a finding: (target, hex)
    with tempfile.TemporaryDirectory() as tmp:
        servers = Servers(tmp)
        held = []
        try:
            while time.monotonic() - start < seconds and finding is None:
                target = rng.choice(["experts", "orchestrate"])
                data = grammar.connection(target)
                recent = (recent + [(target, data.hex())])[-2 * HOLD - 2:]
                _release(held)
                _send(servers.ports[target], data, hold=len(held) < HOLD and rng.random() < 0.3, held=held, rng=rng)
                executions += 1
                sent_bytes += len(data)
                finding = servers.dead() or servers.probe("experts") or servers.probe("orchestrate")
                if executions % 200 == 0:
                    print(f"#{executions}\tconnections: {executions} bytes: {sent_bytes} "
                          f"held: {len(held)} elapsed: {time.monotonic() - start:.0f}s", flush=True)
        finally:
            _release(held, everything=True)
            servers.close()
    print(f"stat::number_of_executed_units: {executions}")
    print(f"stat::bytes_sent: {sent_bytes}")
    if finding is None:
        return 0
    path = Path(f"{artifact_prefix}crash-{hashlib.sha1(json.dumps(recent).encode()).hexdigest()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"finding": finding, "connections": recent}, indent=1))
    print(f"==finding== {finding}")
    print(f"Test unit written to {path}")
    return 1


def minimize_http2(path):
    """Drops the finding's connections one by one while the rest still finds it; writes
    minimized-<sha1> beside it and returns its path."""
    connections = json.loads(Path(path).read_text())["connections"]
    finding = replay_http2(connections)
    if finding is None:
        raise SystemExit(f"{path}: both servers answer: nothing to minimize")
    i = 0
    while i < len(connections):
        fewer = connections[:i] + connections[i + 1:]
        why = replay_http2(fewer)
        if why is not None:
            connections, finding = fewer, why
        else:
            i += 1
    doc = {"finding": finding, "connections": connections}
    out = Path(path).with_name(f"minimized-{hashlib.sha1(json.dumps(connections).encode()).hexdigest()}")
    out.write_text(json.dumps(doc, indent=1))
    return out


def replay_http2(connections):
    """Sends a finding's connections (target, hex) again, all held open: None when both servers
    still answer and live, else what is wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        servers = Servers(tmp)
        held = []
        try:
            for target, data in connections:
                s = _connect(servers.ports[target])
                try:
                    s.sendall(bytes.fromhex(data))
                except OSError:
                    pass
                held.append((0, s))
            time.sleep(0.5)
            return servers.dead() or servers.probe("experts") or servers.probe("orchestrate")
        finally:
            _release(held, everything=True)
            servers.close()


def main(argv):
    if argv[1:2] == ["--make-seeds"]:
        return make_seeds()
    if len(argv) < 2 or argv[1] not in (*TARGETS, "http2"):
        raise SystemExit(f"usage: {argv[0]} {{{','.join(TARGETS)},http2}} [libFuzzer flags] [corpus dirs] | --make-seeds")
    target = argv.pop(1)
    if target == "http2":
        flags = dict(a[1:].split("=", 1) for a in argv[1:] if a.startswith("-") and "=" in a)
        files = [a for a in argv[1:] if not a.startswith("-") and Path(a).is_file()]
        if files and flags.get("minimize_crash") == "1":
            for f in files:
                print(f"{f}: minimized to {minimize_http2(f)}")
            return 0
        if files:
            found = [(f, replay_http2(json.loads(Path(f).read_text())["connections"])) for f in files]
            for f, why in found:
                print(f"{f}: {why or 'both servers answer'}")
            return 1 if any(why for _, why in found) else 0
        return run_http2(float(flags.get("max_total_time", 60)), flags.get("artifact_prefix", "./"),
                         seed=int(flags["seed"]) if "seed" in flags else None)
    import atheris

    with atheris.instrument_imports(include=["colibri.remote"]):
        import colibri.remote.orchestrator   # noqa: F401
        import colibri.remote.server   # noqa: F401
    atheris.Setup(argv, TARGETS[target])
    atheris.Fuzz()


if __name__ == "__main__":
    sys.exit(main(sys.argv))

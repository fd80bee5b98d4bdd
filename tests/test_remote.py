"""Remote experts over gRPC (colibri.remote, `colibri serve-experts`), on loopback: the same bits as
computing locally, one round trip per layer, the fallback when the server dies, slows down, answers
garbage or nothing, and its return; the server's refusals (arguments, model, token, message size);
TLS; FetchExpert's bytes and checks.  tests/delay_proxy.py makes the network worse on demand."""
import re
import subprocess
import sys
import threading
import time
import zlib
from concurrent import futures

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import colibri  # noqa: E402
from colibri.experts import moe_layers  # noqa: E402
from colibri.remote import colibri_remote_pb2 as pb  # noqa: E402
from colibri.remote import colibri_remote_pb2_grpc as rpc  # noqa: E402
from colibri.remote import model_hash  # noqa: E402
from colibri.remote.driver import RemoteDriver, RemoteError, collect_extent  # noqa: E402
from colibri.remote.server import ExpertsService  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402
from support import FIXTURES, TESTS, self_signed  # noqa: E402

MIXTRAL = FIXTURES / "tiny-mixtral.colibri"   # stacked, top-2 of 4, 2 MoE layers
PROMPT = [1, 17, 42, 99, 5, 63, 200, 7, 31, 12]


# ------------------------------------------------------------------------------- helpers

class Server:
    """`colibri serve-experts` in a subprocess, ready when it has printed its line."""

    def __init__(self, model, *args, port=0):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "colibri", "serve-experts", "--model", str(model), "--listen", f"127.0.0.1:{port}",
             "--threads", "1", *map(str, args)], cwd=TESTS, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, ready = [], threading.Event()

        def drain():
            for line in self.proc.stdout:
                self.lines.append(line)
                if "serving" in line:
                    ready.set()
            ready.set()
        threading.Thread(target=drain, daemon=True).start()
        ready.wait(60)
        found = [m for line in self.lines if (m := re.search(r"serve-experts: (\S+) serving", line))]
        if not found:
            self.proc.kill()
            raise AssertionError("serve-experts did not start:\n" + "".join(self.lines))
        self.address = found[0].group(1)
        self.port = int(self.address.rsplit(":", 1)[1])

    def kill(self):
        self.proc.kill()
        self.proc.wait(10)

    def stop(self):
        self.proc.terminate()
        return self.proc.wait(10)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """family(name) -> model dir: "mixtral" (the committed tiny-mixtral), or a family of other
    routing and experts, converted once: "qwen3_moe" (top-3 of 8, a dense layer, interleaved
    experts), "gpt_oss" (expert biases, clamped SwiGLU)."""
    made = {"mixtral": MIXTRAL}

    def get(name):
        if name not in made:
            from support import build, require_reference

            from colibri.convert import convert

            require_reference()
            root = tmp_path_factory.mktemp(name)
            build(name).save_pretrained(root / "hf")
            made[name] = convert(root / "hf", root / "model", progress=False,
                                 layout="interleaved" if name == "qwen3_moe" else "stacked")
        return made[name]
    return get


@pytest.fixture(scope="module")
def serve():
    """serve(model, *args): a server shared by the module's tests (one per model and arguments)."""
    running = {}

    def get(model, *args):
        key = (str(model), args)
        if key not in running:
            running[key] = Server(model, *args)
        return running[key]
    yield get
    for server in running.values():
        assert server.stop() == 0, "".join(server.lines)   # SIGTERM: a clean exit


def placement(model, kind):
    """uint8 (n_layers, n_experts): every routed expert on device 1, or every other one."""
    cfg = model.config
    table = np.zeros((cfg["num_layers"], cfg["num_experts"]), np.uint8)
    for layer in moe_layers(model):
        table[layer] = 1 if kind == "all" else (np.arange(cfg["num_experts"]) + layer) % 2
    return table


def generate(session, prompt):
    """The greedy tokens after the prompt, one step at a time."""
    session.prefill(prompt[:-1])
    token = prompt[-1]
    while True:
        token = session.step(token)
        yield token


def greedy(session, prompt, n):
    tokens = generate(session, prompt)
    return [next(tokens) for _ in range(n)]


def remote_stats(session):
    return session.device_stats()[1]


def same_bits(a, b):
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


# ------------------------------------------------------------------------------- the same bits

@pytest.mark.parametrize("kind", ["all", "mixed"])
@pytest.mark.parametrize("kernels", ["reference", "auto"])
@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe", "gpt_oss"])
def test_remote_experts_compute_the_same_bits(family, serve, name, kernels, kind):
    """Prefill in chunks of 4 then decode: every logit equal to the all-local run's, and one
    Compute per MoE layer that has a hit remote expert, none for the others (strict: no call may
    fail or be slow, with a threshold no loaded machine reaches)."""
    model = colibri.Model(family(name))
    server = serve(model.path, "--kernels", kernels, "--batch", 4)
    table = placement(model, kind)
    drv = RemoteDriver(server.address, model, threshold_ms=10000)
    local = model.session(ctx=64, batch=4, kernels=kernels)
    edge = model.session(ctx=64, batch=4, kernels=kernels, devices=[drv], placement=table, strict=True)
    tokens = [t % model.vocab_size for t in PROMPT]
    chunks = [tokens[i:i + 4] for i in range(0, len(tokens), 4)]
    for step in range(len(chunks) + 6):
        chunk = chunks[step] if step < len(chunks) else [tokens[-1]]
        calls = drv.round_trips
        want, got = local.forward(chunk), edge.forward(chunk)
        assert same_bits(want, got), (name, kernels, kind, step)
        hit = edge.expert_load(clear=True) > 0
        assert drv.round_trips - calls == int(((table == 1) & hit).any(axis=1).sum()), step
        if step >= len(chunks) - 1:
            tokens.append(int(np.argmax(want[-1])))
    stats = remote_stats(edge)
    assert stats["errors"] == stats["fallbacks"] == 0 and stats["calls"] == drv.round_trips > 0
    assert drv.bytes_sent > 0 and drv.bytes_received > 0 and drv.server_ns > 0


# ------------------------------------------------------------------------------- failures

def test_a_killed_server_is_survived_and_used_again_once_restarted():
    model = colibri.Model(MIXTRAL)
    want = greedy(model.session(ctx=256), PROMPT, 200)
    server = Server(MIXTRAL)
    drv = RemoteDriver(server.address, model, deadline_ms=500, threshold_ms=1000)
    edge = model.session(ctx=256, devices=[drv], placement=placement(model, "all"), device_probe_ms=100)
    tokens = generate(edge, PROMPT)
    got = [next(tokens) for _ in range(10)]
    killer = threading.Thread(target=server.kill)   # kill -9 while tokens are made: most likely inside a call
    killer.start()
    while len(got) < 20:
        got.append(next(tokens))
    killer.join()   # a slow kill on a loaded machine must not use up the tokens the reconnection needs
    down = remote_stats(edge)
    assert down["errors"] > 0 and down["fallbacks"] > 0 and down["bypassed_now"]
    server = Server(MIXTRAL, port=server.port)
    try:
        deadline = time.monotonic() + 20
        while len(got) < len(want) and time.monotonic() < deadline:
            got.append(next(tokens))
            up = remote_stats(edge)
            if not up["bypassed_now"] and up["calls"] > down["calls"] + 4:
                break
            time.sleep(0.05)
        assert up["probes"] > down["probes"] and not up["bypassed_now"] and up["calls"] > down["calls"], up
        while len(got) < min(len(want), 160):
            got.append(next(tokens))
        assert got == want[:len(got)]
    finally:
        server.stop()


def test_a_slow_server_is_bypassed_and_comes_back(serve):
    """Through a proxy adding 30 ms each way (threshold 40 ms): with 32 fast calls in the ring, the
    4th slow call takes its P90 (the 29th smallest of 32) over the threshold and the next token's
    experts run locally; once fast again, the first probe after the back-off brings it back."""
    model = colibri.Model(MIXTRAL)
    server = serve(MIXTRAL)
    with DelayProxy(server.address) as proxy:
        drv = RemoteDriver(proxy.address, model, threshold_ms=40, deadline_ms=2000)
        edge = model.session(ctx=256, devices=[drv], placement=placement(model, "all"), device_probe_ms=200)
        tokens, want = generate(edge, PROMPT), generate(model.session(ctx=256), PROMPT)

        def step():
            assert next(tokens) == next(want)
            return remote_stats(edge)

        while (s := step())["samples"] < 32 or s["bypassed_now"]:   # a full ring of fast calls
            time.sleep(0.05 if s["bypassed_now"] else 0)   # (a busy machine's slow start: the probe clears it)
        fast_slow = s["slow"]   # loopback calls over 40 ms on a busy machine: rare, each takes one slow call less
        proxy.set_delay(30)
        n = 0
        while not (s := step())["bypassed_now"]:
            n += 1
            assert n < 2, s   # 2 MoE layers: the 4 slow calls in 2 tokens
        assert s["slow"] - fast_slow == 4 if fast_slow == 0 else s["slow"] - fast_slow <= 4, s
        after = step()   # the next token: computed locally, no call
        assert after["calls"] == s["calls"] and after["fallbacks"] > s["fallbacks"], after
        proxy.set_delay(0)
        deadline = time.monotonic() + 10
        while (s := step())["bypassed_now"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not s["bypassed_now"] and s["probes"] >= 1, s
        back = step()
        assert back["calls"] > s["calls"], back


@pytest.mark.parametrize("mode", ["garbage", "blackhole", "drop"])
def test_a_broken_network_falls_back_and_never_hangs(serve, mode):
    model = colibri.Model(MIXTRAL)
    server = serve(MIXTRAL)
    want = greedy(model.session(ctx=128), PROMPT, 24)
    with DelayProxy(server.address) as proxy:
        drv = RemoteDriver(proxy.address, model, deadline_ms=300, threshold_ms=1000)
        edge = model.session(ctx=128, devices=[drv], placement=placement(model, "all"), device_probe_ms=100)
        tokens = generate(edge, PROMPT)
        got = [next(tokens) for _ in range(8)]
        proxy.set_mode(mode)
        while len(got) < len(want):
            start = time.monotonic()
            got.append(next(tokens))
            assert time.monotonic() - start < 2, "a step waited past the deadline"
        assert got == want
        s = remote_stats(edge)
        assert s["errors"] > 0 and s["fallbacks"] > 0, s
        start = time.monotonic()
        with pytest.raises(RemoteError, match=proxy.address):
            RemoteDriver(proxy.address, model, connect_timeout_s=1)
        assert time.monotonic() - start < 3


class ShortReplies(rpc.ExpertsServicer):
    """A server that answers Compute one float short."""

    def __init__(self, model):
        self.hash = model_hash(model.path)

    def Info(self, request, context):
        return pb.InfoReply(model_hash=self.hash, n_layers=2, n_experts=4, hidden_size=64, max_rows=1024)

    def Compute(self, request, context):
        return pb.ComputeReply(y=request.x[:-4])


def test_a_truncated_reply_is_refused():
    model = colibri.Model(MIXTRAL)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc.add_ExpertsServicer_to_server(ShortReplies(model), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        drv = RemoteDriver(f"127.0.0.1:{port}", model)
        local = model.session(ctx=32).forward(PROMPT)
        edge = model.session(ctx=32, devices=[drv], placement=placement(model, "all"))
        assert same_bits(edge.forward(PROMPT), local)   # computed locally instead
        assert remote_stats(edge)["errors"] > 0 and drv.round_trips == 0
        strict = model.session(ctx=32, devices=[drv], placement=placement(model, "all"), strict=True)
        with pytest.raises(colibri.Error, match=r"a reply of \d+ bytes"):
            strict.forward(PROMPT)
    finally:
        server.stop(0)


def test_another_model_is_refused(family, serve):
    model = colibri.Model(MIXTRAL)
    other = serve(family("qwen3_moe"))
    mine, theirs = model_hash(MIXTRAL)[:6].hex(), model_hash(family("qwen3_moe"))[:6].hex()
    with pytest.raises(RemoteError, match=f"serves model {theirs}.*{mine}"):
        RemoteDriver(other.address, model)
    stub = rpc.ExpertsStub(grpc.insecure_channel(other.address))
    with pytest.raises(grpc.RpcError) as e:
        stub.Compute(pb.ComputeRequest(model_hash=model_hash(MIXTRAL), layer=0, experts=[0], rows=[0, 1],
                                       x=bytes(64 * 4)), timeout=5)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and mine in e.value.details() \
        and theirs in e.value.details()


def test_no_server_fails_at_construction():
    import socket

    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(RemoteError, match=f"127.0.0.1:{port}.*UNAVAILABLE"):
        RemoteDriver(f"127.0.0.1:{port}", colibri.Model(MIXTRAL))
    assert time.monotonic() - start < 5


def compute(layer=0, experts=(0,), rows=(0, 1), x=None):
    """A Compute request for tiny-mixtral (hidden 64), x zeros of rows[-1] rows unless given."""
    return pb.ComputeRequest(model_hash=model_hash(MIXTRAL), layer=layer, experts=list(experts), rows=list(rows),
                             x=bytes(max(rows[-1], 0) * 64 * 4) if x is None else x)


@pytest.mark.parametrize("request_, match", [
    (compute(layer=2), "layer 2 out of range"),
    (compute(layer=-1), "out of range"),
    (compute(experts=[4]), r"experts\[0\] = 4"),
    (compute(experts=[-1]), r"experts\[0\] = -1"),
    (compute(experts=[1, 0], rows=[0, 1, 2]), "ascending"),
    (compute(experts=[0, 1], rows=[0, 2, 1]), "each expert needs at least one row"),
    (compute(rows=[1, 2]), "rows must run from 0"),
    (compute(experts=[0, 1], rows=[0, 1]), "need 3 row offsets"),
    (compute(experts=[], rows=[0]), "no experts"),
    (compute(rows=(0, 1), x=bytes(100)), "x is 100 bytes"),
    (compute(rows=(0, 129)), "1 to 128 rows"),
    (compute(rows=(0, 0)), "1 to 128 rows"),
])
def test_bad_requests_are_invalid_arguments(serve, request_, match):
    server = serve(MIXTRAL)
    stub = rpc.ExpertsStub(grpc.insecure_channel(server.address))
    with pytest.raises(grpc.RpcError) as e:
        stub.Compute(request_, timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and re.search(match, e.value.details()), e.value
    assert stub.Info(pb.InfoRequest(), timeout=5).n_layers == 2   # still serving


def test_a_dense_layer_and_a_message_too_big(family, serve):
    """A dense layer is refused by the core; a message over the server's bound by gRPC."""
    qwen = serve(family("qwen3_moe"))
    stub = rpc.ExpertsStub(grpc.insecure_channel(qwen.address))
    digest = model_hash(family("qwen3_moe"))
    with pytest.raises(grpc.RpcError) as e:
        stub.Compute(pb.ComputeRequest(model_hash=digest, layer=1, experts=[0], rows=[0, 1], x=bytes(64 * 4)), timeout=5)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "dense" in e.value.details()
    mixtral = rpc.ExpertsStub(grpc.insecure_channel(serve(MIXTRAL).address))
    with pytest.raises(grpc.RpcError) as e:
        mixtral.Compute(compute(rows=(0, 1), x=bytes(1 << 20)), timeout=5)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_a_token_is_required(serve, tmp_path):
    (tmp_path / "token").write_text("s3cret\n")
    server = serve(MIXTRAL, "--token-file", tmp_path / "token")
    stub = rpc.ExpertsStub(grpc.insecure_channel(server.address))
    for metadata in ((), (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)):
        for call in (lambda: stub.Info(pb.InfoRequest(), timeout=5, metadata=metadata),
                     lambda: stub.Compute(compute(), timeout=5, metadata=metadata),
                     lambda: list(stub.FetchExpert(pb.FetchRequest(model_hash=model_hash(MIXTRAL)), timeout=5,
                                                   metadata=metadata))):
            with pytest.raises(grpc.RpcError) as e:
                call()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(RemoteError, match="UNAUTHENTICATED"):
        RemoteDriver(server.address, colibri.Model(MIXTRAL))
    drv = RemoteDriver(server.address, colibri.Model(MIXTRAL), token="s3cret")
    assert len(drv.fetch_expert(0, 0)) == drv.info.expert_bytes


def test_an_exposed_address_needs_a_token_and_tls():
    for extra in ([], ["--token", "t"]):
        r = subprocess.run([sys.executable, "-m", "colibri", "serve-experts", "--model", str(MIXTRAL),
                            "--listen", "0.0.0.0:0", *extra], cwd=TESTS, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "--insecure" in r.stderr and "TLS" in r.stderr, r.stderr


def test_tls(serve, tmp_path):
    cert, key = self_signed(tmp_path)
    server = serve(MIXTRAL, "--tls-cert", cert, "--tls-key", key, "--token", "t")
    model = colibri.Model(MIXTRAL)
    drv = RemoteDriver(f"localhost:{server.port}", model, tls_ca=cert, token="t", threshold_ms=10000)
    edge = model.session(ctx=32, devices=[drv], placement=placement(model, "all"))
    assert same_bits(edge.forward(PROMPT), model.session(ctx=32).forward(PROMPT)) and drv.round_trips > 0
    with pytest.raises(RemoteError):   # plain text to a TLS port
        RemoteDriver(f"localhost:{server.port}", model, token="t", connect_timeout_s=2)


# ------------------------------------------------------------------------------- FetchExpert

def extent_bytes(model_dir, layer, expert):
    """An expert's bytes read from weights.bin by the format's rules (docs/FORMAT.md), not colibri's code."""
    import json

    doc = json.loads((model_dir / "colibri_model.json").read_text())
    data = (model_dir / "weights.bin").read_bytes()
    tensors = [t for t in doc["tensors"] if t["name"].startswith(f"layers.{layer}.experts.")]
    n = doc["experts"]["count"]
    if doc["experts"]["weight_layout"] == "interleaved":
        base, stride = min(t["file_offset"] for t in tensors), tensors[0]["expert_stride"]
        extent = data[base + expert * stride:base + (expert + 1) * stride]
        sums = [t["extent_checksums"] for t in tensors if "extent_checksums" in t]
        assert not sums or f"crc32:{zlib.crc32(extent):08x}" == sums[0][expert]
        return extent
    part = lambda t: t["file_size"] // n  # noqa: E731
    return b"".join(data[t["file_offset"] + expert * part(t):t["file_offset"] + (expert + 1) * part(t)] for t in tensors)


@pytest.mark.parametrize("name", ["mixtral", "qwen3_moe"])   # stacked, interleaved
def test_fetch_expert_returns_the_experts_bytes(family, serve, name):
    model = colibri.Model(family(name))
    drv = RemoteDriver(serve(model.path).address, model)
    for layer in moe_layers(model):
        for expert in (0, model.config["num_experts"] - 1):
            assert drv.fetch_expert(layer, expert) == extent_bytes(family(name), layer, expert)
    no_experts = 1 if name == "qwen3_moe" else 9   # a dense layer, a layer past the end
    with pytest.raises(RemoteError, match=f"INVALID_ARGUMENT: no expert 0 in layer {no_experts}"):
        drv.fetch_expert(no_experts, 0)
    with pytest.raises(RemoteError, match="INVALID_ARGUMENT"):
        drv.fetch_expert(moe_layers(model)[0], model.config["num_experts"])


def test_fetch_expert_detects_corruption_and_paces(serve):
    model = colibri.Model(MIXTRAL)
    server = serve(MIXTRAL)
    stub = rpc.ExpertsStub(grpc.insecure_channel(server.address))
    chunks = list(stub.FetchExpert(pb.FetchRequest(model_hash=model_hash(MIXTRAL), layer=1, expert=2), timeout=5))
    assert collect_extent(chunks, "x") == extent_bytes(MIXTRAL, 1, 2)

    def tampered(i, **fields):
        out = [pb.WeightChunk() for _ in chunks]
        for a, b in zip(out, chunks):
            a.CopyFrom(b)
        for k, v in fields.items():
            setattr(out[i], k, v)
        return out
    flipped = bytes([chunks[0].data[0] ^ 1]) + chunks[0].data[1:]
    for bad, match in ((tampered(0, data=flipped), "fails its CRC-32"),
                       (tampered(0, data=flipped, crc32=zlib.crc32(flipped)), "the extent fails its CRC-32"),
                       (tampered(-1, extent_crc32=0), "the extent fails"),
                       (chunks[:-1], "ended at"),
                       (tampered(-1, offset=1), "expected offset")):
        with pytest.raises(RemoteError, match=match):
            collect_extent(bad, "layer 1 expert 2")
    with DelayProxy(server.address) as proxy:
        drv = RemoteDriver(proxy.address, model, bandwidth_mbit=4)
        start = time.monotonic()
        assert drv.fetch_expert(1, 2) == extent_bytes(MIXTRAL, 1, 2)
        assert time.monotonic() - start >= 0.8 * drv.info.expert_bytes * 8 / 4e6   # paced to 4 Mbit/s
        proxy.set_mode("garbage")
        with pytest.raises(RemoteError, match="layer 1 expert 2"):
            drv.fetch_expert(1, 2)


def test_the_service_in_process():
    """The service object itself: Info's fields, and max_message shrinking the rows a call takes."""
    service = ExpertsService(MIXTRAL, batch=8, max_message=(64 << 10) + 10 * 64 * 4)
    try:
        assert service.max_rows == 10 and service.expert_bytes == 3 * 96 * 64 * 4 and service.fetch
    finally:
        service.close()
    with pytest.raises(ValueError, match="raise --max-message"):
        ExpertsService(MIXTRAL, max_message=1000)

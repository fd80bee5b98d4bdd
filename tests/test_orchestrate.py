"""The orchestrator and the edge (colibri.remote.orchestrator, colibri.remote.edge), on loopback:
heartbeats fit in 200 bytes on the wire, placements keep each edge's hottest experts under its
budget without flapping, the state survives a restart, and placements applied between tokens
leave the tokens those of an all-local run."""
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

import colibri
from colibri.convert import convert
from support import build

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("colibri.remote.colibri_remote_pb2")
pbg = pytest.importorskip("colibri.remote.colibri_remote_pb2_grpc")

from colibri.remote.edge import GRPC_FRAME, Edge, heartbeat_message, moe_layers   # noqa: E402
from colibri.remote.orchestrator import MARGIN, MIN_GAIN, Orchestrator, place, serve   # noqa: E402
from colibri.remote.server import start as start_server   # noqa: E402

N_IDS = 32   # 2 layers of 16 experts
EXPERT_BYTES = 1 << 20


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def skewed(order, total=1000):
    """int64 (N_IDS) tokens routed: total // 2**rank to the ids in `order`, hottest first (each
    rank past the next by more than the hysteresis margin)."""
    out = np.zeros(N_IDS, dtype=np.int64)
    out[np.asarray(order)] = total // 2 ** np.arange(len(order))
    return out


class SimEdge:
    """An edge's heartbeats without a model: loads from a distribution, the pending counts and
    the 200-byte limit as colibri.remote.edge sends them."""

    def __init__(self, stub, name, slots):
        self.stub, self.name, self.slots = stub, name, slots
        self.seq = self.version = 0
        self.pending = np.zeros(N_IDS, dtype=np.int64)
        self.local = None
        self.sizes = []

    def beat(self, routed):
        self.pending += routed
        self.seq += 1
        msg, ids, counts = heartbeat_message(self.name, b"\x01" * 8, self.seq, [12, 3400], 875, self.version,
                                             self.slots * EXPERT_BYTES, EXPERT_BYTES, self.pending)
        self.pending[ids] -= counts
        self.sizes.append(len(msg.SerializeToString()) + GRPC_FRAME)
        reply = self.stub.Heartbeat(msg, timeout=5)
        if reply.placement_version not in (0, self.version):
            self.version, self.local = reply.placement_version, sorted(reply.local)
        return reply


@pytest.fixture
def orchestrator(tmp_path):
    orch = Orchestrator(tmp_path / "state.json", warmup=2, interval=0)
    server, port = serve(orch, "127.0.0.1:0")
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield orch, pbg.OrchestratorStub(channel)
    channel.close()
    server.stop(0)


# ---- the message --------------------------------------------------------------------------------

def test_a_heartbeat_stays_under_200_bytes_on_the_wire():
    """The largest fields there can be (a 32-byte name, 8 devices at a minute of P90, every
    counter near its top, every expert of a big model routed) still fit: the loads carried are
    the hottest, and what is left waits for the next heartbeat."""
    pending = np.arange(60 * 128, dtype=np.int64) * 1000 + 1
    msg, ids, counts = heartbeat_message("e" * 32, b"\xff" * 8, 2**32 - 1, [60_000_000] * 8, 1000, 2**32 - 1,
                                         2**40, 2**26, pending)
    wire = len(msg.SerializeToString()) + GRPC_FRAME
    assert wire < 200 and len(ids) >= 4
    assert ids.tolist() == sorted(range(pending.size), key=lambda i: -pending[i])[:len(ids)]
    assert list(msg.load_delta) == [x for pair in zip(ids.tolist(), counts.tolist()) for x in pair]
    # a typical one: two devices, a short name, a small model's deltas
    msg, ids, _ = heartbeat_message("kiosk-3", b"\x01" * 8, 17, [40, 2100], 912, 3, 512 << 20, 3 << 20,
                                    skewed(range(N_IDS), 1 << 20))
    assert len(msg.SerializeToString()) + GRPC_FRAME < 200 and len(ids) >= 16


def test_a_name_too_long_for_the_message_is_refused():
    with pytest.raises(ValueError, match="too long"):
        heartbeat_message("e" * 180, b"\x01" * 8, 1, [1, 1], 0, 0, 1, 1, np.zeros(4, dtype=np.int64))


# ---- placements ---------------------------------------------------------------------------------

def test_place_promotes_only_past_the_margin():
    assert place({1: 10, 2: 5, 3: 1}, set(), 2) == {1, 2}
    assert place({1: 10, 2: 5, 3: 6}, {1, 2}, 2) == {1, 2}                          # 6 < 5 * 1.25 + 1
    assert place({1: 10, 2: 5, 3: 8}, {1, 2}, 2) == {1, 3}
    assert place({1: 10, 2: 5, 3: 8}, {1, 2, 3}, 1) == {1}                          # a budget cut: the coldest go
    assert place({1: 0.0, 2: 3}, {7}, 3) == {2, 7}                                  # room: what routed anything


def test_two_edges_keep_their_hottest_experts_under_their_budgets(orchestrator):
    orch, stub = orchestrator
    rng = np.random.default_rng(0)
    a, b = SimEdge(stub, "edge-a", 4), SimEdge(stub, "edge-b", 10)
    order_a, order_b = rng.permutation(N_IDS), rng.permutation(N_IDS)
    for _ in range(12):
        for edge, order in ((a, order_a), (b, order_b)):
            edge.beat(skewed(order))
            assert edge.local is None or len(edge.local) <= edge.slots
    assert a.local == sorted(order_a[:4]) and b.local == sorted(order_b[:10])
    assert max(a.sizes + b.sizes) < 200
    settled = a.version, b.version
    for _ in range(6):   # the same load: nothing moves
        a.beat(skewed(order_a))
        b.beat(skewed(order_b))
    assert (a.version, b.version) == settled

    # edge a's load moves to other experts: they come in (each passing the margin), b stays
    new_a = rng.permutation(N_IDS)
    for _ in range(60):
        a.beat(skewed(new_a))
        b.beat(skewed(order_b))
        assert len(a.local) <= 4
    assert a.local == sorted(new_a[:4]) and a.version > settled[0] and b.version == settled[1]
    state = orch.snapshot()
    for edge in (a, b):   # the hysteresis bound holds between every remote and every local expert
        load = {int(i): x for i, x in state[edge.name]["load"].items()}
        remote = [x for i, x in load.items() if i not in edge.local]
        assert max(remote, default=0) <= min(load.get(i, 0) for i in edge.local) * (1 + MARGIN) + MIN_GAIN


def test_near_equal_experts_do_not_flap(orchestrator):
    """Two experts whose loads alternate just around each other: the first placement stays."""
    _, stub = orchestrator
    edge = SimEdge(stub, "edge-c", 1)
    for i in range(20):
        routed = np.zeros(N_IDS, dtype=np.int64)
        routed[[3, 9]] = (10, 11) if i % 2 else (11, 10)
        edge.beat(routed)
    assert edge.version == 1 and edge.local in ([3], [9])


def test_an_edge_that_restarts_gets_its_placement_again(orchestrator):
    _, stub = orchestrator
    edge = SimEdge(stub, "edge-d", 2)
    for _ in range(3):
        edge.beat(skewed([5, 6, 7]))
    version, local = edge.version, edge.local
    assert version == 1 and local == [5, 6]
    again = SimEdge(stub, "edge-d", 2)   # a new process: version 0, seq from 1
    reply = again.beat(skewed([5, 6, 7]))
    assert reply.placement_version == version and sorted(reply.local) == local
    reply = again.beat(skewed([5, 6, 7]))
    assert reply.placement_version == version and not reply.local   # it runs it now: no list


def test_a_token_is_required_when_set(tmp_path):
    orch = Orchestrator(tmp_path / "state.json")
    server, port = serve(orch, "127.0.0.1:0", token="s3cret")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pbg.OrchestratorStub(channel)
            msg = pb.HeartbeatRequest(edge="e", model_hash=b"\x01" * 8, seq=1)
            for metadata in ([], [("authorization", "Bearer wrong")]):
                with pytest.raises(grpc.RpcError) as e:
                    stub.Heartbeat(msg, timeout=5, metadata=metadata)
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stub.Heartbeat(msg, timeout=5, metadata=[("authorization", "Bearer s3cret")])
    finally:
        server.stop(0)
    with pytest.raises(ValueError, match="not loopback"):
        serve(orch, "0.0.0.0:0", token="s3cret")   # no TLS


def test_heartbeats_over_tls_with_a_token(tmp_path):
    from colibri.remote.edge import Heartbeats
    from support import self_signed

    cert, key = self_signed(tmp_path)
    orch = Orchestrator(tmp_path / "state.json", warmup=1, interval=0)
    server, port = serve(orch, "127.0.0.1:0", token="s3cret", tls_cert=cert, tls_key=key)
    beats = [Heartbeats(f"localhost:{port}", token=token, tls_ca=cert) for token in ("s3cret", "wrong")]
    try:
        for h in beats:
            h.submit(heartbeat_message("tls", b"\x01" * 8, 1, [1, 2], 0, 0, 2 * EXPERT_BYTES, EXPERT_BYTES,
                                       skewed([4, 5, 6]))[0])
            assert h.wait(10)
        assert beats[0].sent == 1 and list(beats[0].take_reply().local) == [4, 5]
        assert beats[1].failed == 1 and beats[1].last_error.startswith("UNAUTHENTICATED")
    finally:
        for h in beats:
            h.close()
        server.stop(0)


def test_a_heartbeat_handed_over_just_before_close_is_still_sent(orchestrator_address):
    """A message the thread has not taken yet when close() comes (here held back by its lock, as a
    thread scheduled late leaves it) is sent: a short `colibri generate` has one heartbeat, last."""
    from colibri.remote.edge import Heartbeats

    orch, address = orchestrator_address
    h = Heartbeats(address)
    with h.cv:   # the thread cannot take the message before close() has begun
        assert h.submit(heartbeat_message("short", b"\x01" * 8, 1, [1, 2], 0, 0, 2 * EXPERT_BYTES, EXPERT_BYTES,
                                          skewed([4, 5, 6]))[0])
        h.closed = True   # close()'s first step, taken under the same lock
    h.close()
    assert h.sent == 1 and orch.snapshot()["short"]["heartbeats"] == 1


# ---- the state across restarts ------------------------------------------------------------------

def test_a_restarted_orchestrator_keeps_versions_and_loads(tmp_path):
    """`colibri orchestrate` stopped (SIGTERM) and started again on the same state file: the
    version does not go back, the loads are kept, the next change is the next version."""
    state, port = tmp_path / "state.json", free_port()

    def start():
        p = subprocess.Popen([sys.executable, "-m", "colibri", "orchestrate", "--listen", f"127.0.0.1:{port}",
                              "--state", str(state), "--interval", "0", "--warmup", "1"],
                             stderr=subprocess.PIPE, text=True)
        assert "listening" in p.stderr.readline()
        return p

    def stop(p):
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=20) == 0

    p = start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            edge = SimEdge(pbg.OrchestratorStub(channel), "edge-e", 2)
            edge.beat(skewed([1, 2, 3]))
            edge.beat(skewed([4, 5, 6], 5000))
            assert edge.version == 2 and edge.local == [4, 5]
    finally:
        stop(p)
    before = Orchestrator(state).snapshot()["edge-e"]
    assert before["placement_version"] == 2 and before["seq"] == 2 and before["local"] == [4, 5]

    p = start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            edge.stub = pbg.OrchestratorStub(channel)
            reply = edge.beat(np.zeros(N_IDS, dtype=np.int64))
            assert reply.placement_version == 2 and not reply.local   # resumed: nothing new for it
            edge.beat(skewed([7, 8], 50000))
            assert edge.version == 3 and edge.local == [7, 8]
    finally:
        stop(p)
    after = Orchestrator(state).snapshot()["edge-e"]
    assert after["placement_version"] == 3
    assert after["load"]["4"] >= before["load"]["4"] * 0.5 ** (2 / 8) * 0.999   # kept, decayed two heartbeats


# ---- edges with a model: placements applied between tokens --------------------------------------

PROMPT, N_TOKENS = [1, 5, 9, 20, 33, 7], 40


@pytest.fixture(scope="module")
def moe_model(tmp_path_factory):
    """A mixtral of 3 layers, 8 experts, top-2, interleaved (one extent per expert)."""
    root = tmp_path_factory.mktemp("orchestrate")
    build("mixtral", seed=7, num_local_experts=8, num_hidden_layers=3).save_pretrained(root / "hf")
    return convert(root / "hf", root / "interleaved", progress=False, layout="interleaved")


@pytest.fixture(scope="module")
def expert_server(moe_model):
    """The model's expert server on loopback, computing with the reference kernels."""
    server, service, address = start_server(moe_model, "127.0.0.1:0", kernels="reference")
    yield address
    server.stop(0)
    service.close()


@pytest.fixture
def orchestrator_address(tmp_path):
    orch = Orchestrator(tmp_path / "state.json", warmup=1, interval=0)
    server, port = serve(orch, "127.0.0.1:0")
    yield orch, f"127.0.0.1:{port}"
    server.stop(0)


def all_local(path, **options):
    return colibri.Model(path, **options).session(kernels="reference").generate(PROMPT, max_tokens=N_TOKENS)


def edge(path, server, orchestrator, name, slots, **options):
    """An edge of `slots` expert slots, strict (a slow or failed remote call fails the test
    instead of falling back), heartbeats every 2 tokens."""
    model = colibri.Model(path, **options)
    return Edge(model, server, orchestrator=orchestrator, name=name, expert_budget=slots * model.expert_slots()[0],
                kernels="reference", strict=True, device_threshold_ms=2000, deadline_ms=5000, heartbeat_tokens=2,
                heartbeat_s=60, experts_elsewhere=options.get("experts_elsewhere", False))


def check_settled(e, orch):
    """After a last heartbeat the edge runs the orchestrator's version: its set on the cpu, at
    most the edge's slots there (the room the set leaves filled with experts the edge had local),
    every other routed expert remote."""
    e.heartbeat()
    state = orch.snapshot()[e.name]
    local = e.local_experts()
    assert state["local"] and e.version == state["placement_version"] and e.placement_error is None
    assert set(state["local"]) <= set(local) and len(local) == e.slots
    table = e.session.placement
    assert (table[moe_layers(e.model)] <= 1).all() and (table == 1).sum() == len(moe_layers(e.model)) * 8 - len(local)


def answered_each_token(e):
    """e.generate's tokens, waiting after each for the heartbeat on its way to be answered: on a
    loaded machine the replies could otherwise all come after the last token, and nothing would be
    applied mid-run (the placement still goes in between tokens, where the edge takes the reply)."""
    tokens = []
    for token in e.stream(PROMPT, max_tokens=N_TOKENS):
        tokens.append(token)
        assert e.heartbeats.wait(10), "the orchestrator did not answer a heartbeat in 10 s"
    return tokens


def test_placements_between_tokens_keep_the_all_local_tokens(moe_model, expert_server, orchestrator_address):
    """Two edges of different budgets generate while the orchestrator moves their experts: the
    placements change between tokens, mid-run, and every token is the all-local run's (strict:
    remote results are bit-identical), none lost or repeated."""
    orch, address = orchestrator_address
    expected = all_local(moe_model)
    edges = [edge(moe_model, expert_server, address, "small", 4), edge(moe_model, expert_server, address, "large", 12)]
    try:
        for e in edges:
            assert answered_each_token(e) == expected
            assert any(0 < at < N_TOKENS for at, _ in e.applied), "no placement was applied mid-run"
            assert [v for _, v in e.applied] == sorted({v for _, v in e.applied})   # versions only grow
            assert e.driver.round_trips > 0 and e.session.device_stats()[1]["fallbacks"] == 0
            assert e.last_message_bytes < 200
            check_settled(e, orch)
        # the same edge again: a second sequence, from the placement it has
        again = edges[0]
        again.session.reset()
        assert again.generate(PROMPT, max_tokens=N_TOKENS) == expected
    finally:
        for e in edges:
            e.close()


def test_an_edge_without_the_experts_fetches_its_local_ones(moe_model, expert_server, orchestrator_address,
                                                           tmp_path):
    """A model directory whose weights.bin stops before the routed experts (the interleaved layout
    writes them last): local experts come from the server's FetchExpert, the tokens are the same."""
    orch, address = orchestrator_address
    expected = all_local(moe_model)
    path = tmp_path / "no-experts"
    r = subprocess.run([sys.executable, "-m", "colibri", "strip-experts", str(moe_model), str(path)],
                       capture_output=True, text=True, check=True)
    first = min(t["file_offset"] for t in colibri.Model(moe_model).tensors() if ".experts." in t["name"])
    assert (path / "weights.bin").read_bytes() == (moe_model / "weights.bin").read_bytes()[:first]
    assert f"keeps {first:,} B" in r.stdout
    e = edge(path, expert_server, address, "bare", 6, experts_elsewhere=True)
    try:
        assert e.generate(PROMPT, max_tokens=N_TOKENS) == expected
        assert e.fetcher.fetches > 0 and e.driver.fetched_bytes == e.fetcher.bytes
        check_settled(e, orch)
    finally:
        e.close()


def test_colibri_generate_remote_prints_the_local_tokens(moe_model, expert_server, orchestrator_address):
    """`colibri generate --remote --orchestrator` (the native kernels on both sides: the same bits on
    one machine) prints the ids of the local run, and --verbose the devices' counters."""
    orch, address = orchestrator_address
    args = ["--model", str(moe_model), "--tokens", ",".join(map(str, PROMPT)), "--max-tokens", "24",
            "--temperature", "0", "--ignore-eos"]
    local = subprocess.run([sys.executable, "-m", "colibri", "generate", *args], capture_output=True, text=True,
                           check=True)
    server, service, remote = start_server(moe_model, "127.0.0.1:0")
    try:
        out = subprocess.run([sys.executable, "-m", "colibri", "generate", *args, "--remote", remote,
                              "--orchestrator", address, "--edge-name", "cli", "--expert-budget", "50%",
                              "--device-threshold-ms", "2000", "--strict", "--verbose"],
                             capture_output=True, text=True, timeout=120)
    finally:
        server.stop(0)
        service.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout == local.stdout
    assert "[device remote:" in out.stderr and "0 fallbacks, 0 errors" in out.stderr
    assert "[orchestrator:" in out.stderr and orch.snapshot()["cli"]["heartbeats"] > 0


def test_an_edge_goes_on_without_its_orchestrator(moe_model, expert_server):
    """Heartbeats to an orchestrator that is not there fail, counted; the tokens are the same."""
    e = edge(moe_model, expert_server, f"127.0.0.1:{free_port()}", "alone", 6)
    try:
        assert e.generate(PROMPT, max_tokens=N_TOKENS) == all_local(moe_model)
        e.heartbeats.wait(10)
        assert e.heartbeats.failed > 0 and e.heartbeats.sent == 0 and e.version == 0 and not e.applied
        assert any(line.startswith("[orchestrator:") and "failed" in line for line in e.counters())
    finally:
        e.close()


def test_strip_experts_refuses_a_stacked_model(tmp_path):
    """Stacked experts lie between other tensors: no prefix of weights.bin leaves them all out."""
    from support import FIXTURES
    r = subprocess.run([sys.executable, "-m", "colibri", "strip-experts", str(FIXTURES / "tiny-mixtral.colibri"),
                        str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 1 and "lies after the first routed expert" in r.stderr and "--layout interleaved" in r.stderr
    assert not (tmp_path / "out").exists()

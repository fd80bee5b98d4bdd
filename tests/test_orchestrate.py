"""The orchestrator and the edge (colibri.remote.orchestrator, colibri.remote.edge), on loopback:
heartbeats fit in 200 bytes on the wire, placements keep each edge's hottest experts under its
budget without flapping, the state survives a restart, and placements applied between tokens
leave the tokens those of an all-local run; its state and options are bounded and checked, and
its port is its own."""
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading

import numpy as np
import pytest

import colibri
from colibri.convert import convert
from colibri.experts import moe_layers
from support import build

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("colibri.remote.colibri_remote_pb2")
pbg = pytest.importorskip("colibri.remote.colibri_remote_pb2_grpc")

from colibri.remote.edge import GRPC_FRAME, Edge, heartbeat_message   # noqa: E402
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
    orch.close()


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
        orch.close()
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
        orch.close()


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


# ---- bounds: edges, expert ids, the state's writes ----------------------------------------------

def heartbeat(edge, pairs=(), seq=1, devices=(12, 3400)):
    return pb.HeartbeatRequest(edge=edge, model_hash=b"\x01" * 8, seq=seq, device_p90_us=devices,
                               load_delta=pairs, budget_bytes=2 * EXPERT_BYTES, expert_bytes=EXPERT_BYTES)


def refused(stub, msg):
    """The status and message of a heartbeat that must be refused."""
    with pytest.raises(grpc.RpcError) as e:
        stub.Heartbeat(msg, timeout=5)
    return e.value.code(), e.value.details()


def test_edges_past_the_bound_are_refused(tmp_path):
    orch = Orchestrator(tmp_path / "state.json", max_edges=3)
    server, port = serve(orch, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pbg.OrchestratorStub(channel)
            for i in range(3):
                stub.Heartbeat(heartbeat(f"edge-{i}"), timeout=5)
            code, details = refused(stub, heartbeat("edge-3"))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "at most 3 edges" in details and "edge-3" in details
            stub.Heartbeat(heartbeat("edge-1", seq=2), timeout=5)   # the edges it keeps go on
    finally:
        server.stop(0)
        orch.close()
    assert sorted(orch.snapshot()) == ["edge-0", "edge-1", "edge-2"]


def test_out_of_range_ids_and_oversized_heartbeats_are_refused(orchestrator, tmp_path):
    """An expert id at or past n_layers x n_experts (--max-experts), more load pairs or devices
    than a heartbeat carries: INVALID_ARGUMENT (a message past MAX_MESSAGE: RESOURCE_EXHAUSTED),
    and nothing of the heartbeat kept."""
    orch, stub = orchestrator
    for pairs in ([300_000, 5], [1, 5, 2**32 - 1, 5]):
        code, details = refused(stub, heartbeat("e", pairs))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and f"expert id {pairs[-2]}" in details
    code, details = refused(stub, heartbeat("e", [i % N_IDS for i in range(2 * 300)]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "300 load pairs" in details
    code, details = refused(stub, heartbeat("e", devices=[1] * 9))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "9 device P90s" in details
    code, _ = refused(stub, heartbeat("e", [i % N_IDS for i in range(2 * 255)] * 3))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED   # gRPC's limit on the message's size
    assert orch.snapshot() == {}

    bounded = Orchestrator(tmp_path / "bounded.json", max_experts=N_IDS)   # ids of the tests' 2 x 16 experts
    server, port = serve(bounded, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pbg.OrchestratorStub(channel)
            code, details = refused(stub, heartbeat("e", [N_IDS, 5]))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and f"below {N_IDS}" in details
            stub.Heartbeat(heartbeat("e", [N_IDS - 1, 5]), timeout=5)
    finally:
        server.stop(0)
        bounded.close()
    assert bounded.snapshot()["e"]["load"] == {str(N_IDS - 1): 5.0}


def test_a_heartbeat_does_not_wait_for_the_state_being_saved(tmp_path, monkeypatch):
    """The snapshot of the state (the larger, the longer) is written outside the heartbeats' lock:
    with its fsync held up (a slow disk, a large state), heartbeats are answered, a placement
    change among them (synced to the journal), and the journal alone brings it back."""
    state = tmp_path / "state.json"
    orch = Orchestrator(state, warmup=1, interval=0)
    server, port = serve(orch, "127.0.0.1:0")   # its first snapshot written
    held, release, fsync = threading.Event(), threading.Event(), os.fsync

    def slow_fsync(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith("state.json.") and not name.startswith("state.json.journal"):   # a snapshot's temp file
            held.set()
            release.wait(60)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            edge = SimEdge(pbg.OrchestratorStub(channel), "edge-f", 2)
            edge.beat(skewed([1, 2, 3]))
            assert held.wait(10), "no snapshot was begun"
            edge.beat(skewed([4, 5, 6], 5000))   # answered while the snapshot is still held
            assert edge.version == 2 and edge.local == [4, 5] and not release.is_set()
        resumed = Orchestrator(state).snapshot()["edge-f"]   # as a restart after a stop here finds it
        assert resumed["placement_version"] == 2 and resumed["local"] == [4, 5]
    finally:
        release.set()
        server.stop(0)
        orch.close()


def test_a_second_orchestrator_on_a_taken_port_fails(tmp_path):
    """Two on one port would share it (SO_REUSEPORT), the kernel splitting the edges between two
    states that diverge: the second exits at once, naming the address, its state untouched."""
    port = free_port()
    orch = Orchestrator(tmp_path / "first.json")
    server, _ = serve(orch, f"127.0.0.1:{port}")
    try:
        r = subprocess.run([sys.executable, "-m", "colibri", "orchestrate", "--listen", f"127.0.0.1:{port}",
                            "--state", str(tmp_path / "second.json")], capture_output=True, text=True, timeout=60)
    finally:
        server.stop(0)
        orch.close()
    assert r.returncode == 1, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr
    assert not (tmp_path / "second.json").exists()


# ---- options and state files that are not what they must be -------------------------------------

@pytest.mark.parametrize("option, value", [
    ("--half-life", "nan"), ("--half-life", "0"), ("--half-life", "inf"), ("--interval", "nan"),
    ("--interval", "-1"), ("--margin", "nan"), ("--margin", "-10"), ("--warmup", "-3"), ("--warmup", "2.5"),
    ("--max-edges", "0"), ("--max-experts", "-1")])
def test_an_option_out_of_its_range_is_refused(option, value, capsys, tmp_path):
    import argparse

    from colibri.remote.orchestrator import add_arguments

    p = argparse.ArgumentParser(prog="colibri orchestrate")
    add_arguments(p)
    with pytest.raises(SystemExit):
        p.parse_args(["--state", str(tmp_path / "state.json"), option, value])
    err = capsys.readouterr().err
    assert f"argument {option}: {value!r} is not " in err and (" in [" in err or " in (" in err)


@pytest.mark.parametrize("name, value", [("half_life", math.nan), ("half_life", 0), ("interval", math.nan),
                                         ("interval", math.inf), ("margin", -10), ("warmup", -3),
                                         ("min_gain", math.nan)])
def test_an_orchestrator_out_of_range_is_refused(name, value, tmp_path):
    with pytest.raises(ValueError, match=f"^{name} must be"):
        Orchestrator(tmp_path / "state.json", **{name: value})


def state_entry():
    """A state file's entry of an edge that runs version 2, experts 4 and 5 local."""
    return {"model_hash": "01" * 8, "seq": 3, "heartbeats": 3, "device_p90_us": [12, 3400], "cache_hit_permille": 875,
            "budget_bytes": 2 * EXPERT_BYTES, "expert_bytes": EXPERT_BYTES, "placement_version": 2, "edge_version": 2,
            "local": [4, 5], "load": {"4": 50.0, "5": 40.0, "6": 1.0}, "last_seen": 1.7e9}


@pytest.mark.parametrize("field, value", [
    ("placement_version", "2"), ("heartbeats", None), ("placement_version", 2**40), ("seq", -1),
    ("budget_bytes", True), ("device_p90_us", [1.5]), ("model_hash", 5), ("local", [4, 4]),
    ("local", [300_000]), ("load", {"x": 1.0}), ("load", {"4": math.nan}), ("load", [1]), ("last_seen", "now")])
def test_a_mistyped_state_field_is_refused_at_load(field, value, tmp_path):
    """A state file whose edge entry has a field of the wrong type or range: the load fails naming
    the file, the edge and the field (it would otherwise fail every heartbeat of that edge)."""
    state, entry = tmp_path / "state.json", state_entry()
    doc = {"format": "colibri-orchestrator", "version": 1, "edges": {"edge-g": entry}}
    state.write_text(json.dumps(doc))
    assert Orchestrator(state).snapshot() == {"edge-g": entry}   # as it is, it loads
    entry[field] = value
    state.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as e:
        Orchestrator(state)
    assert str(e.value).startswith(f"{state}: edge 'edge-g': field {field!r} must be")


def test_an_unwritable_state_folder_is_refused_at_start(tmp_path):
    """Found at start, not at the first heartbeat (whose reply would then fail)."""
    if os.geteuid() == 0:
        folder = "/proc"   # no new files there, even for root
    else:
        folder = tmp_path / "read-only"
        folder.mkdir(mode=0o555)
    orch = Orchestrator(f"{folder}/state.json")
    with pytest.raises(ValueError, match=f"^{folder}/state.json: cannot write the orchestrator's state"):
        serve(orch, "127.0.0.1:0")


# ---- the state across restarts ------------------------------------------------------------------

def test_the_journal_brings_back_the_versions_a_stop_left_out_of_the_snapshot(tmp_path):
    """A stop while a snapshot was being written: the journal it turned (.journal.old) and the new
    one, whose last line was cut short mid-write, hold versions 3 and 4; the restarted
    orchestrator hands out 4 (and its set), never 3 or 4 again for another set."""
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"format": "colibri-orchestrator", "version": 1, "edges": {"edge-h": state_entry()}}))

    def line(version, local):
        return json.dumps({"edge": "edge-h", "model_hash": "01" * 8, "placement_version": version, "local": local})
    (tmp_path / "state.json.journal.old").write_text(line(3, [6, 7]) + "\n")
    (tmp_path / "state.json.journal").write_text(line(4, [7, 8]) + "\n" + line(5, [8, 9])[:30])
    orch = Orchestrator(state, warmup=4, interval=0)   # the entry's 3 heartbeats, and the next: no new set before
    server, port = serve(orch, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            edge = SimEdge(pbg.OrchestratorStub(channel), "edge-h", 2)   # a restarted edge too: version 0
            reply = edge.beat(np.zeros(N_IDS, dtype=np.int64))
            assert reply.placement_version == 4 and sorted(reply.local) == [7, 8]
            edge.beat(skewed([1, 2], 50000))
            assert edge.version == 5 and edge.local == [1, 2]
    finally:
        server.stop(0)
        orch.close()
    assert Orchestrator(state).snapshot()["edge-h"]["placement_version"] == 5
    assert not (tmp_path / "state.json.journal.old").exists()


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
    orch.close()


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

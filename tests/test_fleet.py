"""A fleet of expert servers announced in etcd (colibri.remote.fleet, `colibri serve-experts --etcd`):
an edge computes on every server of its model, each expert on one that holds it, all of a layer's
calls in flight together; the text stays the all-local one when a replica dies (kill -9: retried on
the other within the same layer), when the only holder dies (the session computes those experts),
and when a server joins later; the announcement's lease, its renewal and its revocation; what is
refused or ignored.  Real etcd on loopback (tests/etcd_cluster.py), the bundled model, the
reference kernels everywhere (the same bits)."""
import json
import re
import subprocess
import sys
import threading
import time
from concurrent import futures

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import colibri  # noqa: E402
from colibri.demo import MODEL_DIR  # noqa: E402
from colibri.experts import moe_layers  # noqa: E402
from colibri.remote import colibri_remote_pb2 as pb  # noqa: E402
from colibri.remote import colibri_remote_pb2_grpc as rpc  # noqa: E402
from colibri.remote import model_hash  # noqa: E402
from colibri.remote.driver import RemoteError  # noqa: E402
from colibri.remote.edge import Edge, initial_local, placement_table  # noqa: E402
from colibri.remote.etcd import Etcd  # noqa: E402
from colibri.remote.fleet import Announcer, FleetDriver, servers_prefix  # noqa: E402
from colibri.remote.server import parse_hold, start  # noqa: E402
from delay_proxy import DelayProxy  # noqa: E402
from etcd_cluster import ETCD, MISSING, EtcdCluster  # noqa: E402
from support import FIXTURES, TESTS  # noqa: E402
from test_remote import Server  # noqa: E402

pytestmark = [pytest.mark.skipif(ETCD is None, reason=MISSING), pytest.mark.xdist_group("etcd")]

TTL = 2          # seconds: the servers' leases in these tests
SLACK = 3        # seconds past a TTL that etcd may take to expire a lease on a loaded machine
PROMPT = [1, 591, 47, 39, 49, 28]   # "ROMEO:" in the bundled model's vocabulary


# ------------------------------------------------------------------------------- helpers

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), members=1) as c:
        yield c


@pytest.fixture
def prefix(request):
    """A prefix of the test's own, so that no test sees another's servers."""
    return f"/fleet-test/{request.node.name}"


@pytest.fixture(scope="module")
def model():
    return colibri.Model(MODEL_DIR)


@pytest.fixture(scope="module")
def want(model):
    """The all-local greedy tokens, the reference every edge's text must equal."""
    return model.session(ctx=256, kernels="reference").generate(PROMPT, max_tokens=120)


class InProcess:
    """`colibri serve-experts` in this process (colibri.remote.server.start) and its announcement."""

    def __init__(self, cluster, prefix, hold=None, model_dir=MODEL_DIR, kernels="reference"):
        self.served, self.service, self.address = start(model_dir, "127.0.0.1:0", kernels=kernels, hold=hold)
        self.announcer = Announcer.for_service(Etcd(cluster.endpoints), prefix, self.address, self.service, TTL)
        self.key = self.announcer.key

    def stop(self):
        self.announcer.close(revoke=True)
        self.served.stop(0).wait(10)
        self.service.close()


class Process(Server):
    """`colibri serve-experts --etcd` in a subprocess (for kill -9), ready once it has printed its line."""

    def __init__(self, cluster, prefix, *args):
        super().__init__(MODEL_DIR, "--kernels", "reference", "--etcd", cluster.endpoints, "--etcd-prefix", prefix,
                         "--lease-ttl", TTL, *args)
        found = [m for line in self.lines if (m := re.search(r"announced as (\S+)", line))]
        if not found:
            self.proc.kill()
            raise AssertionError("serve-experts did not announce itself:\n" + "".join(self.lines))
        self.key = found[0].group(1)


@pytest.fixture
def servers(cluster, prefix):
    """servers(hold=None, process=False, model_dir=...): a server announced under the test's prefix,
    stopped at the end."""
    made = []

    def make(hold=None, process=False, model_dir=MODEL_DIR, kernels="reference"):
        if process:
            s = Process(cluster, prefix, *(("--hold", hold) if hold else ()))
        else:
            s = InProcess(cluster, prefix, hold, model_dir, kernels)
        made.append(s)
        return s
    yield make
    for s in made:
        if isinstance(s, Process):
            if s.proc.poll() is None:
                s.kill()
        else:
            s.stop()


def make_edge(cluster, prefix, model, **options):
    """An edge on the fleet, every routed expert placed remote, the reference kernels, a threshold no
    loaded machine reaches (only failures bypass)."""
    options.setdefault("placement", placement_table(model, []))
    return Edge(model, fleet=cluster.endpoints, etcd_prefix=prefix, kernels="reference", ctx=256,
                device_threshold_ms=10000, deadline_ms=2000, **options)


def key_deleted(cluster, key, timeout):
    """Seconds until `key` is deleted (watched), or None when it is still there after `timeout`."""
    store = Etcd(cluster.endpoints)
    start = time.monotonic()
    with store.watch(key) as w:
        if store.get(key) is None:
            return 0.0
        deadline = start + timeout
        while (left := deadline - time.monotonic()) > 0:
            if any(kind == "DELETE" for kind, _ in w.events(timeout=left)):
                return time.monotonic() - start
    return None


# ------------------------------------------------------------------------------- the fleet computes

def test_two_halves_give_the_local_text_in_one_round_per_layer(cluster, prefix, servers, model, want):
    """Experts 0-3 on one server, 4-7 on another: every token equals the all-local run's; both
    servers compute; a token makes at most one round per MoE layer, each server at most one call
    per round, and nothing is retried (strict: no call may fail)."""
    n = model.config["num_experts"]
    low, high = servers(f"0-{n // 2 - 1}"), servers(f"{n // 2}-{n - 1}")
    with make_edge(cluster, prefix, model, strict=True) as edge:
        fleet = edge.driver
        assert fleet.holds(model.config["num_layers"], n) is not None and not fleet.ignored
        got = []
        before = (fleet.rounds, fleet.per_server())
        for token in edge.stream(PROMPT, max_tokens=40):
            got.append(token)
            after = (fleet.rounds, fleet.per_server())
            rounds = after[0] - before[0]
            if len(got) > 1:   # a decode step (the first token's forward is the prompt's): every layer remote
                assert rounds == len(moe_layers(model)), rounds
            for address in (low.address, high.address):
                assert after[1][address]["sent"] - before[1][address]["sent"] <= rounds
            before = after
        assert got == want[:40]
        stats = fleet.per_server()
        assert stats[low.address]["round_trips"] > 0 and stats[high.address]["round_trips"] > 0, stats
        assert fleet.retries == 0 and fleet.failures == 0
        assert fleet.round_trips == stats[low.address]["round_trips"] + stats[high.address]["round_trips"]
        assert edge.session.device_stats()[1]["calls"] == fleet.rounds


class Barrier(rpc.ExpertsServicer):
    """An expert server whose Compute waits until the other server of the pair has a call too (a
    shared barrier): a layer's calls sent one after the other would never both arrive."""

    def __init__(self, model, barrier):
        self.session, self.barrier = model.session(ctx=64, kernels="reference"), barrier
        self.hash, self.cfg = model_hash(model.directory), model.config
        self.calls = 0

    def Info(self, request, context):
        return pb.InfoReply(model_hash=self.hash, n_layers=self.cfg["num_layers"], n_experts=self.cfg["num_experts"],
                            hidden_size=self.cfg["hidden_size"], kernels="reference", max_rows=1024)

    def Compute(self, request, context):
        self.barrier.wait()   # BrokenBarrierError after its timeout: the call fails, and so does the strict edge
        self.calls += 1
        x = np.frombuffer(request.x, dtype="<f4").reshape(request.rows[-1], -1).copy()
        y = self.session.compute_experts(request.layer, np.array(request.experts, np.int32),
                                         np.array(request.rows, np.int32), x)
        return pb.ComputeReply(y=y.astype("<f4").tobytes())


def test_a_layer_s_calls_to_two_servers_are_in_flight_together(cluster, prefix, model):
    """The prompt routes to both halves in every MoE layer (checked on a local session first), so
    each layer's round has a call to each server, and each call is held until the other's arrives."""
    local = model.session(ctx=64, kernels="reference")
    want_logits = local.forward(PROMPT)
    load = local.expert_load()[moe_layers(model)]
    n = model.config["num_experts"]
    assert ((load[:, :n // 2] > 0).any(axis=1) & (load[:, n // 2:] > 0).any(axis=1)).all()
    barrier = threading.Barrier(2, timeout=10)
    store, made = Etcd(cluster.endpoints), []
    try:
        for hold in (list(range(n // 2)), list(range(n // 2, n))):
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            service = Barrier(model, barrier)
            rpc.add_ExpertsServicer_to_server(service, server)
            address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
            server.start()
            value = {"address": address, "model_hash": service.hash.hex(), "experts": hold, "max_rows": 1024,
                     "kernels": "reference"}
            made.append((server, service, Announcer(store, servers_prefix(prefix) + address,
                                                    json.dumps(value).encode(), TTL)))
        with FleetDriver(cluster.endpoints, model, prefix=prefix, threshold_ms=10000) as fleet:
            edge = model.session(ctx=64, kernels="reference", devices=[fleet], placement=placement_table(model, []),
                                 strict=True)
            assert np.array_equal(edge.forward(PROMPT).view(np.uint32), want_logits.view(np.uint32))
            assert fleet.rounds == len(moe_layers(model)) and [s.calls for _, s, _ in made] == [fleet.rounds] * 2
    finally:
        for server, _, announcer in made:
            announcer.close()
            server.stop(0)


def test_a_server_that_joins_later_gets_calls(cluster, prefix, servers, model, want):
    first = servers()
    with make_edge(cluster, prefix, model, strict=True) as edge:
        fleet = edge.driver
        tokens = edge.stream(PROMPT, max_tokens=60)
        got = [next(tokens) for _ in range(20)]
        assert list(fleet.per_server()) == [first.address]
        later = servers()
        assert fleet.wait(lambda s: s.get(later.address, {}).get("state") == "up", 10), fleet.per_server()
        got += list(tokens)
        assert got == want[:60]
        stats = fleet.per_server()
        assert stats[later.address]["round_trips"] > 0 and stats[first.address]["round_trips"] > 0, stats


def test_auto_placement_puts_remote_what_some_server_holds(cluster, prefix, servers, model, want):
    """Servers holding 0-3 and 2-5 (2 and 3 on both), an edge whose cache keeps a few experts:
    the first placement puts remote every expert some server holds and is not kept local, 6 and 7
    (held by none) on the cpu; both servers compute; the text is the all-local one."""
    a, b = servers("0-3"), servers("2-5")
    with make_edge(cluster, prefix, model, placement="auto", expert_budget=4 * model.expert_slots()[0],
                   strict=True) as edge:
        n = model.config["num_experts"]
        kept = set(initial_local(model, edge.slots))
        assert 0 < len(kept) < len(moe_layers(model)) * n
        table = edge.session.placement
        for layer in moe_layers(model):
            for e in range(n):
                assert table[layer, e] == (e < 6 and layer * n + e not in kept), (layer, e, table[layer])
        assert edge.generate(PROMPT, max_tokens=40) == want[:40]
        stats = edge.driver.per_server()
        assert stats[a.address]["round_trips"] > 0 and stats[b.address]["round_trips"] > 0, stats


def test_generate_fleet_prints_the_local_text(cluster, prefix, servers, tmp_path):
    """`colibri generate --fleet --etcd`: every expert placed on the fleet of two halves (the
    servers with the edge's default kernels), the text of the local run, both servers called."""
    low, high = servers("0-3", kernels="auto"), servers("4-7", kernels="auto")
    (tmp_path / "placement.json").write_text('{"format": "colibri-placement", "version": 1, "default": "remote"}')
    args = [sys.executable, "-m", "colibri", "generate", "--model", str(MODEL_DIR), "--prompt", "ROMEO:",
            "--max-tokens", "24", "--temperature", "0", "--ignore-eos"]
    local = subprocess.run(args, capture_output=True, timeout=120, check=True)
    edge = subprocess.run([*args, "--fleet", "--etcd", cluster.endpoints, "--etcd-prefix", prefix, "--placement",
                           str(tmp_path / "placement.json"), "--device-threshold-ms", "10000", "--strict",
                           "--verbose"], capture_output=True, timeout=120)
    assert edge.returncode == 0, edge.stderr.decode(errors="replace")
    assert edge.stdout == local.stdout
    line = next(x for x in edge.stderr.decode().splitlines() if x.startswith("[fleet"))
    for server in (low, high):
        assert re.search(rf"{server.address} up, [1-9]\d* calls, 0 failed", line), line
    missing = subprocess.run([*args, "--fleet"], capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "--fleet finds the expert servers in etcd: give --etcd" in missing.stderr


# ------------------------------------------------------------------------------- servers that die

def test_a_replica_killed_mid_generation_changes_nothing(cluster, prefix, servers, model, want):
    """Two servers holding every expert; kill -9 one while tokens are made: the strict edge keeps
    going (the dead one's experts retried on the other within the same layer), its key goes within a
    TTL and slack, no call goes to it after that, and the text is the all-local one.  A SIGTERM at
    the end revokes the other's key at once."""
    a, b = servers(process=True), servers(process=True)
    with make_edge(cluster, prefix, model, strict=True) as edge:
        fleet = edge.driver
        tokens = edge.stream(PROMPT, max_tokens=80)
        got = [next(tokens) for _ in range(10)]
        stats = fleet.per_server()
        assert stats[a.address]["round_trips"] > 0 and stats[b.address]["round_trips"] > 0, stats
        killed_at = []
        killer = threading.Thread(target=lambda: (b.kill(), killed_at.append(time.monotonic())))
        killer.start()
        stamps = []
        while len(got) < 30 or not killed_at or stamps[-1] <= killed_at[0]:
            got.append(next(tokens))
            stamps.append(time.monotonic())
        killer.join()
        recovery = min((t for t in stamps if t > killed_at[0]), default=None)
        assert recovery is not None, "no token after the kill"
        gone = key_deleted(cluster, b.key, TTL + SLACK)
        assert gone is not None, f"{b.key} stayed past the lease's TTL"
        assert fleet.wait(lambda s: s[b.address]["state"] == "gone", 5), fleet.per_server()
        sent = fleet.per_server()[b.address]["sent"]
        got += list(tokens)
        assert got == want[:80]
        stats = fleet.per_server()
        assert stats[b.address]["sent"] == sent and stats[b.address]["failures"] >= 1 and fleet.retries >= 1, stats
        assert edge.session.device_stats()[1]["errors"] == 0
        print(f"\n[replica killed: first token {1e3 * (recovery - killed_at[0]):.1f} ms after the kill; key gone "
              f"{gone:.2f} s after the tokens; {fleet.retries} calls retried]")
    assert a.stop() == 0 and Etcd(cluster.endpoints).get(a.key) is None   # revoked at SIGTERM


def test_the_only_holder_killed_falls_back_to_the_cpu(cluster, prefix, servers, model, want):
    """Experts 4-7 only on a server that is killed: the session computes them (its fallback), the
    text stays the all-local one, and once the key is gone the server is forgotten."""
    n = model.config["num_experts"]
    servers(f"0-{n // 2 - 1}")
    high = servers(f"{n // 2}-{n - 1}", process=True)
    with make_edge(cluster, prefix, model, device_probe_ms=50) as edge:
        fleet = edge.driver
        tokens = edge.stream(PROMPT, max_tokens=80)
        got = [next(tokens) for _ in range(10)]
        high.kill()
        got += [next(tokens) for _ in range(20)]
        stats = edge.session.device_stats()[1]
        assert stats["errors"] > 0 and stats["fallbacks"] > 0, stats
        assert key_deleted(cluster, high.key, TTL + SLACK) is not None
        assert fleet.wait(lambda s: s[high.address]["state"] == "gone", 5), fleet.per_server()
        got += list(tokens)
        assert got == want[:80]


def test_a_server_down_for_a_while_is_probed_and_used_again(cluster, prefix, servers, model, want):
    """Two replicas, one announced behind a proxy that then closes every connection: its calls are
    retried on the other, it gets no Compute while down (probes are Info calls), and once the
    network is back a probe brings it back and it computes again; the text never changes."""
    servers()
    served, service, address = start(MODEL_DIR, "127.0.0.1:0", kernels="reference")
    with DelayProxy(address) as proxy:
        announcer = Announcer.for_service(Etcd(cluster.endpoints), prefix, proxy.address, service, TTL)
        try:
            with make_edge(cluster, prefix, model, strict=True, device_probe_ms=100) as edge:
                fleet = edge.driver
                tokens = edge.stream(PROMPT, max_tokens=60)
                got = [next(tokens) for _ in range(10)]
                assert fleet.per_server()[proxy.address]["round_trips"] > 0
                proxy.set_mode("drop")
                while not fleet.per_server()[proxy.address]["state"].startswith("down"):
                    got.append(next(tokens))
                    assert len(got) < 40, "no call went to the proxied server"
                sent = fleet.per_server()[proxy.address]["sent"]
                got += [next(tokens) for _ in range(5)]
                assert fleet.per_server()[proxy.address]["sent"] == sent and fleet.retries >= 1
                proxy.set_mode("forward")
                assert fleet.wait(lambda s: s[proxy.address]["state"] == "up", 10), fleet.per_server()
                calls = fleet.per_server()[proxy.address]["round_trips"]
                got += list(tokens)
                assert got == want[:60] and fleet.per_server()[proxy.address]["round_trips"] > calls
        finally:
            announcer.close()
            served.stop(0).wait(10)
            service.close()


# ------------------------------------------------------------------------------- the announcement

def test_an_expired_lease_is_replaced_and_the_edge_finds_the_server_again(cluster, prefix, servers, model, want):
    server = servers()
    store = Etcd(cluster.endpoints)
    with make_edge(cluster, prefix, model, strict=True) as edge:
        fleet = edge.driver
        tokens = edge.stream(PROMPT, max_tokens=40)
        got = [next(tokens) for _ in range(10)]
        with store.watch(server.key) as w:
            store.revoke(server.announcer.lease.id)   # as if the lease had expired: the key goes
            kinds, deadline = [], time.monotonic() + TTL + SLACK
            while "PUT" not in kinds and time.monotonic() < deadline:
                kinds += [kind for kind, _ in w.events(timeout=0.5)]
        assert kinds[:1] == ["DELETE"] and "PUT" in kinds, kinds
        assert fleet.wait(lambda s: s[server.address]["state"] == "up", 10), fleet.per_server()
        assert server.announcer.renewals == 1 and store.get(server.key)["lease"] == server.announcer.lease.id
        calls = fleet.per_server()[server.address]["round_trips"]
        got += list(tokens)
        assert got == want[:40] and fleet.per_server()[server.address]["round_trips"] > calls


# ------------------------------------------------------------------------------- refused or ignored

@pytest.mark.parametrize("spec, match", [
    ("0-8", "expert 8 is past the model's 8 experts per layer"),
    ("9", "expert 9 is past"),
    ("5-2", "the range 5-2 runs backwards"),
    ("0-x", "'0-x' is not an expert id or a range"),
    ("1,,2", "'' is not an expert id"),
    ("-1", "'-1' is not an expert id"),
])
def test_a_bad_hold_is_refused(spec, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        parse_hold(spec, 8)


def test_hold_specs_and_the_command_line():
    assert parse_hold("0-3,6", 8) == [0, 1, 2, 3, 6] and parse_hold(" 7 , 0-1", 8) == [0, 1, 7]
    r = subprocess.run([sys.executable, "-m", "colibri", "serve-experts", "--model", str(MODEL_DIR), "--listen",
                        "127.0.0.1:0", "--hold", "4-8"], cwd=TESTS, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "--hold 4-8: expert 8 is past the model's 8 experts per layer" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "colibri", "serve-experts", "--model", str(MODEL_DIR), "--listen",
                        "0.0.0.0:0", "--insecure", "--etcd", "127.0.0.1:1"], cwd=TESTS, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "give --advertise" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "colibri", "serve-experts", "--model", str(MODEL_DIR), "--listen",
                        "127.0.0.1:0", "--etcd", "127.0.0.1:1"], cwd=TESTS, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cannot announce this server in etcd: no etcd member answers" in r.stderr, r.stderr


def test_a_compute_for_an_expert_not_held_is_an_invalid_argument(model):
    served, service, address = start(MODEL_DIR, "127.0.0.1:0", kernels="reference", hold="0-3")
    try:
        stub = rpc.ExpertsStub(grpc.insecure_channel(address))
        digest, hidden = model_hash(MODEL_DIR), model.config["hidden_size"]
        x = np.random.default_rng(0).standard_normal((3, hidden)).astype(np.float32)
        with pytest.raises(grpc.RpcError) as e:
            stub.Compute(pb.ComputeRequest(model_hash=digest, layer=0, experts=[1, 5, 6], rows=[0, 1, 2, 3],
                                           x=x.tobytes()), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "experts 5, 6 not held by this server (--hold 0-3)" in e.value.details(), e.value.details()
        reply = stub.Compute(pb.ComputeRequest(model_hash=digest, layer=0, experts=[1, 3], rows=[0, 1, 3],
                                               x=x.tobytes()), timeout=10)
        local = model.session(ctx=8, kernels="reference").compute_experts(0, np.array([1, 3], np.int32),
                                                                          np.array([0, 1, 3], np.int32), x)
        assert np.array_equal(np.frombuffer(reply.y, "<f4").reshape(3, hidden), local)
    finally:
        served.stop(0).wait(10)
        service.close()


def test_another_model_and_garbage_under_the_prefix_are_ignored(cluster, prefix, servers, model, want):
    """A server of another model, an announcement that is not JSON and one holding an expert past
    the model's: each ignored with its reason, never called; the edge runs on its own model's server."""
    mine = servers()
    other = servers(model_dir=FIXTURES / "tiny-mixtral.colibri")
    store = Etcd(cluster.endpoints)
    garbage, past = servers_prefix(prefix) + "127.0.0.1:9", servers_prefix(prefix) + "127.0.0.1:10"
    store.put(garbage, b"{not json")
    store.put(past, json.dumps({"address": "127.0.0.1:10", "model_hash": model_hash(MODEL_DIR).hex(),
                                "experts": [0, 8], "max_rows": 1, "kernels": "reference"}))
    with make_edge(cluster, prefix, model, strict=True) as edge:
        fleet = edge.driver
        assert list(fleet.per_server()) == [mine.address]
        why = fleet.ignored[other.key]
        assert "serves model" in why and model_hash(MODEL_DIR)[:6].hex() in why, why
        assert "not JSON" in fleet.ignored[garbage] and "holds expert 8" in fleet.ignored[past]
        assert edge.generate(PROMPT, max_tokens=20) == want[:20]
        assert other.key in "\n".join(edge.counters())
    alone = prefix + "-other-only"   # the other model's announcement and nothing else
    store.put(servers_prefix(alone) + other.address, store.get(other.key)["value"])
    with pytest.raises(RemoteError, match="no expert server of model .* is up under .*serves model"):
        FleetDriver(cluster.endpoints, model, prefix=alone, wait_s=0.2)


def test_no_server_and_no_etcd_fail_at_once(cluster, prefix, model):
    start_ = time.monotonic()
    with pytest.raises(RemoteError, match=r"none announced \(start colibri serve-experts --etcd\)"):
        FleetDriver(cluster.endpoints, model, prefix=prefix, wait_s=0.5)
    assert time.monotonic() - start_ < 5
    with pytest.raises(ValueError, match="give one of them"):
        Edge(model, "127.0.0.1:1", fleet=cluster.endpoints)

"""The control plane on etcd (colibri.remote.control), on a 3-member etcd cluster on loopback with
the bundled model and an expert server computing with the reference kernels: edges' records live
with their leases, placements are written by compare-and-swap (a deposed leader never hands out a
version twice), a killed leader is replaced within its lease's TTL while an edge generates, the
edge applies the placements its watch brings between tokens, a killed etcd member changes nothing,
and bad --etcd input is refused clearly.  Every edge's text is the all-local run's."""
import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

import colibri
from colibri.demo import MODEL_DIR
from etcd_cluster import ETCD, MISSING, EtcdCluster, free_ports

grpc = pytest.importorskip("grpc")
pbg = pytest.importorskip("colibri.remote.colibri_remote_pb2_grpc")

from colibri.remote.control import EtcdStore, Keys, read_placement   # noqa: E402
from colibri.remote.edge import Edge, heartbeat_message   # noqa: E402
from colibri.remote.etcd import Etcd   # noqa: E402
from colibri.remote.orchestrator import Orchestrator, serve   # noqa: E402
from colibri.remote.server import start as start_server   # noqa: E402

pytestmark = [pytest.mark.skipif(ETCD is None, reason=MISSING), pytest.mark.xdist_group("etcd")]

TTL = 2   # seconds of every lease here
# A lease runs out at most TTL after the last refresh its holder made; past that: etcd looks for
# expired leases every 500 ms and revokes them through Raft, a waiting campaign then returns and the
# new leader reads the placements (a few etcd calls), and our polls are 50 ms apart.  That is well
# under a second; the rest is headroom for a loaded 2-core machine.
SLACK = 2.0
PROMPT, N_TOKENS = [1, 5, 9, 20, 33, 7], 40
EXPERT_BYTES = 1 << 20
prefixes = itertools.count()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with EtcdCluster(tmp_path_factory.mktemp("etcd"), members=3) as c:
        yield c


@pytest.fixture
def keys():
    """Keys under a prefix of the test's own: no test sees another's."""
    return Keys(f"/cp{next(prefixes)}")


@pytest.fixture(scope="module")
def expert_server():
    server, service, address = start_server(MODEL_DIR, "127.0.0.1:0", kernels="reference")
    yield address
    server.stop(0)
    service.close()


@pytest.fixture(scope="module")
def expected():
    return colibri.Model(MODEL_DIR).session(kernels="reference").generate(PROMPT, max_tokens=N_TOKENS)


def until(probe, timeout, what):
    """probe()'s first true value, polled every 50 ms; fails naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)


@contextmanager
def orchestrator(endpoints, keys, **options):
    """An orchestrator on etcd in this process, serving heartbeats on loopback."""
    orch = Orchestrator(EtcdStore(endpoints, prefix=keys.prefix, lease_ttl=TTL, log=False), warmup=1, interval=0,
                        **options)
    server, port = serve(orch, "127.0.0.1:0")
    try:
        yield orch, f"127.0.0.1:{port}"
    finally:
        server.stop(0)
        orch.close()


def edge(endpoints, keys, server, name, orchestrator=None, slots=8):
    """An edge on etcd of `slots` expert slots, strict (a failed remote call fails the test instead
    of falling back), a heartbeat every 2 tokens."""
    model = colibri.Model(MODEL_DIR)
    return Edge(model, server, orchestrator=orchestrator, etcd=endpoints, etcd_prefix=keys.prefix, lease_ttl=TTL,
                name=name, expert_budget=slots * model.expert_slots()[0], kernels="reference", strict=True,
                device_threshold_ms=2000, deadline_ms=5000, heartbeat_tokens=2, heartbeat_s=60)


def beat(address, name, seq):
    """One heartbeat of a 2-slot edge without a model, its load on experts 2k and 2k+1 (k = seq % 4),
    each heartbeat's four times the last: the orchestrator moves both to the new pair every time."""
    routed = np.zeros(8, dtype=np.int64)
    routed[[2 * (seq % 4), 2 * (seq % 4) + 1]] = (100 * 4 ** seq, 50 * 4 ** seq)
    msg, _, _ = heartbeat_message(name, b"\x01" * 8, seq, [1, 2], 0, 0, 2 * EXPERT_BYTES, EXPERT_BYTES, routed)
    with grpc.insecure_channel(address) as channel:
        return pbg.OrchestratorStub(channel).Heartbeat(msg, timeout=5)


def versions(watch, n, timeout=5):
    """The placement versions the next `n` writes the watch sees carry."""
    seen, deadline = [], time.monotonic() + timeout
    while len(seen) < n and time.monotonic() < deadline:
        seen += [read_placement(kv)[0] for kind, kv in watch.events(timeout=0.2) if kind == "PUT"]
    return seen


def answered_each_token(e):
    """e.generate's tokens, waiting after each for the heartbeat on its way to be answered (else, on a
    loaded machine, every reply could come after the last token)."""
    tokens = []
    for token in e.stream(PROMPT, max_tokens=N_TOKENS):
        tokens.append(token)
        assert e.heartbeats.wait(10), "no orchestrator answered a heartbeat in 10 s"
    return tokens


# ---- leases ---------------------------------------------------------------------------------------

def test_an_edge_s_record_lives_with_its_lease(cluster, keys, expert_server, expected):
    """An edge's record exists while it runs; one that stops heartbeating without revoking (closed,
    or killed) loses it within TTL + slack, and the orchestrator forgets it.  A process that only
    holds the lease (no heartbeat due) keeps it alive by its TTL/3 refreshes."""
    store = Etcd(cluster.endpoints)
    with orchestrator(cluster.endpoints, keys) as (orch, address):
        until(orch.store.leading.is_set, 10, "the orchestrator leads")
        e = edge(cluster.endpoints, keys, expert_server, "kiosk", address)
        assert answered_each_token(e) == expected
        kv = store.get(keys.edge("kiosk"))
        record = json.loads(kv["value"])
        assert kv["lease"] == e.plane.lease.id and record["model_hash"] == e.hash8.hex()
        assert (record["budget_bytes"], record["expert_bytes"]) == (e.budget_bytes, e.expert_bytes)
        assert record["colibri_version"] == colibri.__version__ and len(record["device_p90_us"]) == 2
        assert "kiosk" in orch.snapshot() and e.heartbeats.failed == 0
        e.close(revoke=False)   # stops heartbeating; the lease is left to expire
        stopped = time.monotonic()
        until(lambda: store.get(keys.edge("kiosk")) is None, TTL + SLACK, "the closed edge's record goes")
        until(lambda: "kiosk" not in orch.snapshot(), 1, "the orchestrator forgets the edge")
        print(f"record gone {time.monotonic() - stopped:.2f} s after the edge stopped")

    script = (f"import time; from colibri.remote.edge import Edge; "
              f"Edge({str(MODEL_DIR)!r}, {expert_server!r}, etcd={cluster.endpoints!r}, etcd_prefix={keys.prefix!r}, "
              f"lease_ttl={TTL}, name='doomed', kernels='reference'); print('ready', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        lease = store.get(keys.edge("doomed"))["lease"]
        held = time.monotonic() + 2 * TTL
        while time.monotonic() < held:   # no heartbeat: the refreshes alone keep it
            kv = store.get(keys.edge("doomed"))
            assert kv is not None and kv["lease"] == lease, "an idle edge's record went"
            time.sleep(0.2)
        p.kill()
        killed = time.monotonic()
        until(lambda: store.get(keys.edge("doomed")) is None, TTL + SLACK, "the killed edge's record goes")
        print(f"record gone {time.monotonic() - killed:.2f} s after kill -9")
    finally:
        p.kill()
        p.wait(10)


def test_an_expired_lease_is_replaced_and_the_record_written_again(cluster, keys, expert_server):
    """A lease that expired anyway (revoked here, as a long partition ends it): the edge takes a new
    one at its next refresh and puts its record again."""
    store = Etcd(cluster.endpoints)
    e = edge(cluster.endpoints, keys, expert_server, "partitioned")
    try:
        first = e.plane.lease.id
        store.revoke(first)
        assert store.get(keys.edge("partitioned")) is None
        kv = until(lambda: store.get(keys.edge("partitioned")), TTL, "the record is written again")
        assert kv["lease"] != first and e.plane.renewals == 1
    finally:
        e.close()
    assert store.get(keys.edge("partitioned")) is None   # closed: revoked, gone at once


# ---- compare-and-swap ---------------------------------------------------------------------------

def test_a_deposed_leader_never_hands_out_a_version_twice(cluster, keys):
    """The first leader's lease is revoked while its refreshes and checks are held back (it still
    thinks it leads); a second leads and writes on.  The first's next write fails on its election key: it
    steps down and answers FAILED_PRECONDITION naming the leader.  The versions a watch sees go up
    by one, none twice."""
    store = Etcd(cluster.endpoints)
    store.put(keys.edge("racer"), b"{}")   # a live edge (its record), whose placement a new leader reads
    with store.watch(keys.placement("racer")) as w, orchestrator(cluster.endpoints, keys) as (first, one):
        until(first.store.leading.is_set, 10, "the first orchestrator leads")
        for seq in (1, 2):
            assert beat(one, "racer", seq).placement_version == seq
        # as cut off from etcd until its next write: neither its refreshes nor its checks of its election
        # key see the lease go
        first.store.lease.refresh = lambda: True
        first.store._check_key = lambda lease, leader: None
        store.revoke(first.store.lease.id)
        with orchestrator(cluster.endpoints, keys) as (second, two):
            until(second.store.leading.is_set, 10, "the second orchestrator leads")
            assert first.store.leading.is_set()   # two orchestrators that both think they lead
            for seq in (3, 4):
                assert beat(two, "racer", seq).placement_version == seq
            with pytest.raises(grpc.RpcError) as e:   # its version 3 would be the second one
                beat(one, "racer", 5)
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION and f"the leader is {two}" in e.value.details()
            assert not first.store.leading.is_set() and first.snapshot() == {}
            assert beat(two, "racer", 6).placement_version == 5
        assert versions(w, 5) == [1, 2, 3, 4, 5]
        kv = store.get(keys.placement("racer"))
        assert read_placement(kv)[0] == 5 and kv["version"] == 5   # five writes in all


# ---- hand-over ------------------------------------------------------------------------------------

def test_a_killed_leader_is_replaced_within_the_lease_ttl(cluster, keys, expert_server, expected, tmp_path):
    """Three `colibri orchestrate --etcd`; kill -9 the leader while an edge generates: another leads
    within TTL + slack, the versions go on from etcd's (none repeated, none skipped), and the edge's
    every run gives the all-local text."""
    store = Etcd(cluster.endpoints)
    store.put(keys.edge("probe"), b"{}")
    ports = free_ports(3)
    addresses = [f"127.0.0.1:{p}" for p in ports]
    procs = [subprocess.Popen([sys.executable, "-m", "colibri", "orchestrate", "--etcd", cluster.endpoints,
                               "--etcd-prefix", keys.prefix, "--lease-ttl", str(TTL), "--listen", a,
                               "--interval", "0", "--warmup", "1"],
                              stderr=open(tmp_path / f"orchestrate-{i}.log", "w"))
             for i, a in enumerate(addresses)]

    def leader():
        kv = store.leader(keys.election)
        return kv and kv["value"].decode()

    e = None
    try:
        old = until(leader, 20, "an orchestrator leads")
        e = edge(cluster.endpoints, keys, expert_server, "through", ",".join(addresses))
        for seq in (1, 2):   # the probe's versions 1 and 2 from the first leader
            until(lambda: _answered(old, "probe", seq), 5, "the leader answers")
        assert answered_each_token(e) == expected and e.heartbeats.answered_by == old

        times = {}

        def hand_over():
            procs[addresses.index(old)].send_signal(signal.SIGKILL)
            killed = time.monotonic()
            new = until(lambda: (v := leader()) != old and v, TTL + SLACK, "another orchestrator is elected")
            times["elected"] = time.monotonic() - killed
            until(lambda: _answered(new, "probe", 3), TTL + SLACK, "the new leader serves")
            times["serving"] = time.monotonic() - killed
            times["new"] = new

        with store.watch(keys.placement("probe")) as w:
            t = threading.Thread(target=hand_over)
            t.start()
            runs = 0
            while t.is_alive() or runs < 2:   # generating throughout, and on after
                e.session.reset()
                assert e.generate(PROMPT, max_tokens=N_TOKENS) == expected
                runs += 1
                t.join(timeout=0)
            t.join()
            assert "serving" in times, "the hand-over failed"
            assert _answered(times["new"], "probe", 4)
            assert versions(w, 2) == [3, 4]   # on from the first leader's 2
        print(f"hand-over after kill -9: elected in {times['elected']:.2f} s, serving in {times['serving']:.2f} s "
              f"(TTL {TTL} s); {runs} runs meanwhile")
        assert times["serving"] <= TTL + SLACK
        sent = e.heartbeats.sent
        e.session.reset()
        assert answered_each_token(e) == expected
        assert e.heartbeats.sent > sent and e.heartbeats.answered_by == times["new"]
        assert [v for _, v in e.applied] == sorted(set(v for _, v in e.applied))
    finally:
        if e is not None:
            e.close()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(20)
    assert store.leader(keys.election) is None   # stopped: each resigned (its lease revoked)


def _answered(address, name, seq):
    """Whether `address` answered the probe's heartbeat `seq` with version `seq` (one that does not
    lead, or is not there: False)."""
    try:
        return beat(address, name, seq).placement_version == seq
    except grpc.RpcError:
        return False


# ---- placements through the watch ---------------------------------------------------------------

def test_the_watch_brings_placements_applied_between_tokens(cluster, keys, expert_server, expected):
    """The leader's placements reach the edge through its watch of etcd (the replies' are not
    used) and are applied between tokens, mid-run; the text is the all-local run's."""
    with orchestrator(cluster.endpoints, keys) as (orch, address):
        until(orch.store.leading.is_set, 10, "the orchestrator leads")
        e = edge(cluster.endpoints, keys, expert_server, "watcher", address, slots=6)
        e.apply_reply = lambda reply: pytest.fail("a reply's placement was applied: etcd's watch carries them")
        try:
            assert answered_each_token(e) == expected
            assert any(0 < at < N_TOKENS for at, _ in e.applied), "no placement was applied mid-run"
            assert [v for _, v in e.applied] == sorted(set(v for _, v in e.applied))
            state = orch.snapshot()["watcher"]
            until(lambda: e.apply_watched() or e.version == state["placement_version"], 5,
                  "the edge runs the leader's last version")
            assert set(state["local"]) <= set(e.local_experts()) and len(e.local_experts()) == e.slots
            assert read_placement(Etcd(cluster.endpoints).get(keys.placement("watcher")))[0] == e.version
            assert e.session.device_stats()[1]["fallbacks"] == 0 and e.placement_error is None
        finally:
            e.close()


def test_colibri_generate_on_etcd(cluster, keys, expert_server):
    """`colibri generate --etcd` without --orchestrator: heartbeats go to the leader etcd names; the
    ids are the local run's; its record goes when it exits."""
    args = ["--model", str(MODEL_DIR), "--tokens", ",".join(map(str, PROMPT)), "--max-tokens", "24",
            "--temperature", "0", "--ignore-eos"]
    local = subprocess.run([sys.executable, "-m", "colibri", "generate", *args], capture_output=True, text=True,
                           check=True, timeout=60)
    with orchestrator(cluster.endpoints, keys) as (orch, address):
        until(orch.store.leading.is_set, 10, "the orchestrator leads")
        out = subprocess.run([sys.executable, "-m", "colibri", "generate", *args, "--remote", expert_server,
                              "--etcd", cluster.endpoints, "--etcd-prefix", keys.prefix, "--lease-ttl", str(TTL),
                              "--edge-name", "cli", "--expert-budget", "50%", "--device-threshold-ms", "2000",
                              "--strict", "--verbose"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == local.stdout
    assert "[etcd " in out.stderr and "0 renewed" in out.stderr
    line = next(x for x in out.stderr.splitlines() if x.startswith("[orchestrator:"))
    assert " 0 heartbeats answered" not in line and ", 0 failed" in line
    assert Etcd(cluster.endpoints).get(keys.edge("cli")) is None


# ---- a killed etcd member -------------------------------------------------------------------------

def test_a_killed_etcd_member_changes_nothing(tmp_path, expert_server, expected):
    """One member of three killed mid-run (the one every client tries first): the edge's tokens are
    the same, every heartbeat is answered, the orchestrator keeps leading and the edge its lease."""
    keys = Keys("/cp-kill")
    with EtcdCluster(tmp_path, members=3) as c, orchestrator(c.endpoints, keys) as (orch, address):
        until(orch.store.leading.is_set, 10, "the orchestrator leads")
        e = edge(c.endpoints, keys, expert_server, "steady", address)
        try:
            lease, tokens = e.plane.lease.id, []
            for token in e.stream(PROMPT, max_tokens=N_TOKENS):
                tokens.append(token)
                if len(tokens) == N_TOKENS // 2:
                    c.kill(0)
                assert e.heartbeats.wait(10), "no orchestrator answered a heartbeat in 10 s"
            assert tokens == expected
            after = time.monotonic() + 2 * TTL   # past the refreshes' TTL/3 and a whole lease
            while time.monotonic() < after:
                e.session.reset()
                assert answered_each_token(e) == expected
            assert e.heartbeats.failed == 0 and e.heartbeats.sent > 0
            assert orch.store.terms == 1 and orch.store.leading.is_set()
            assert e.plane.lease.id == lease and e.plane.renewals == 0
            assert Etcd(c.endpoints).get(keys.edge("steady"))["lease"] == lease
        finally:
            e.close()


# ---- bad input ------------------------------------------------------------------------------------

def test_bad_etcd_input_is_refused_clearly(expert_server, tmp_path):
    """A malformed --etcd, one no member of answers, a bad prefix, --etcd with --state: one line
    naming what is wrong (the members, when none answers), no traceback."""
    dead = ",".join(f"127.0.0.1:{p}" for p in free_ports(2))
    orch = ["orchestrate", "--listen", "127.0.0.1:0"]
    gen = ["generate", "--tokens", "1,2", "--max-tokens", "2", "--remote", expert_server]
    cases = [
        ([*orch, "--etcd", "etcd-host"], "--etcd 'etcd-host': an etcd member is HOST:PORT"),
        ([*orch, "--etcd", dead], "no etcd member answers"),
        ([*orch, "--etcd", dead, "--etcd-prefix", "colibri/"], "a key prefix starts with /"),
        ([*orch, "--etcd", dead, "--state", str(tmp_path / "s.json")], "not allowed with argument"),
        ([*gen, "--etcd", "h:99999"], "--etcd 'h:99999': an etcd member is HOST:PORT"),
        ([*gen, "--etcd", dead], "no etcd member answers"),
    ]
    for argv, message in cases:
        r = subprocess.run([sys.executable, "-m", "colibri", *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, (argv, r.stderr)
        if "no etcd member" in message:
            assert all(member in r.stderr for member in dead.split(","))

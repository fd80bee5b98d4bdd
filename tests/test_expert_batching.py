"""`colibri serve-experts` batching: Computes queued and merged into rounds, one compute_experts per
round over every call of the oldest call's layer that fits max_rows.  Each reply is checked bit for
bit against a local session's compute_experts of that call alone (reference kernels).  The service's
session is wrapped by a gate that holds the compute thread at the start of a round, so that which
calls wait together, and so which rounds happen, is decided by the test, not by timing."""
import asyncio
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")

import colibri  # noqa: E402
from colibri.demo import MODEL_DIR  # noqa: E402
from colibri.experts import moe_layers  # noqa: E402
from colibri.remote import colibri_remote_pb2 as pb  # noqa: E402
from colibri.remote import colibri_remote_pb2_grpc as rpc  # noqa: E402
from colibri.remote import model_hash  # noqa: E402
from colibri.remote import server  # noqa: E402
from colibri.remote.driver import RemoteDriver  # noqa: E402
from support import TESTS  # noqa: E402
from test_remote import greedy, placement, remote_stats, same_bits  # noqa: E402

WAIT_S = 30   # bound on any wait: a loaded machine is slow, a hung one fails instead of hanging the suite
PROMPT = [1, 413, 308, 14, 532, 326, 292, 308]   # "To be, or not to be"


class Gate:
    """The service's session, with compute_experts held at the start of each round until the test
    lets it pass (as a long round holds the compute thread), and every round recorded: (layer,
    experts, rows).  Everything else is the session's."""

    def __init__(self, session):
        self.session = session
        self.passes = threading.Semaphore(0)    # rounds the test lets through
        self.arrived = threading.Semaphore(0)   # rounds that reached the gate
        self.rounds = []
        self.fail = False   # a round passing while set asks the core for a layer past the model's: its error

    def __getattr__(self, name):
        return getattr(self.session, name)

    def let(self, n=1):
        self.passes.release(n)

    def open(self):
        self.let(1 << 20)

    def reached(self):
        """Waits until a round (its calls taken out of the queue) waits at the gate."""
        assert self.arrived.acquire(timeout=WAIT_S), "no round reached the gate"

    def compute_experts(self, layer, experts, rows, x):
        self.arrived.release()
        if not self.passes.acquire(timeout=WAIT_S):
            raise RuntimeError("the test never let the round pass")
        self.rounds.append((layer, experts.tolist(), rows.tolist()))
        return self.session.compute_experts(layer + 100 * self.fail, experts, rows, x)


class Served:
    """An in-process expert server of the bundled model (reference kernels) behind a Gate."""

    def __init__(self, kernels="reference", **options):
        self.server, self.service, self.address = server.start(MODEL_DIR, "127.0.0.1:0", kernels=kernels, **options)
        self.gate = self.service.session = Gate(self.service.session)
        self.channels = []
        self.closed = False

    def stub(self):
        """A stub on a connection of its own (a connection carries at most 16 calls at once)."""
        channel = grpc.insecure_channel(self.address, options=[("grpc.use_local_subchannel_pool", 1)])
        self.channels.append(channel)
        return rpc.ExpertsStub(channel)

    def queued(self, n):
        """Waits until n calls wait in the queue."""
        deadline = time.monotonic() + WAIT_S
        while self.service.stats()["queued"] != n:
            assert time.monotonic() < deadline, f"{self.service.stats()}: expected {n} queued"
            time.sleep(0.005)

    def hold(self, request):
        """Sends `request` and waits until its round waits at the shut gate: the compute thread held."""
        call = self.stub().Compute.future(request, timeout=WAIT_S)
        self.gate.reached()
        return call

    def enqueue(self, request, timeout=WAIT_S):
        """Sends `request` once the calls before it are queued: arrival order is sending order."""
        n = self.service.stats()["queued"]
        call = self.stub().Compute.future(request, timeout=timeout)
        self.queued(n + 1)
        return call

    def close_service(self):
        """service.close(), which must return (the compute thread ended) within WAIT_S."""
        closing = threading.Thread(target=self.service.close)
        closing.start()
        closing.join(WAIT_S)
        assert not closing.is_alive(), "close() hangs"
        self.closed = True

    def close(self):
        self.gate.open()
        for channel in self.channels:
            channel.close()
        assert self.server.stop(0).wait(WAIT_S)
        if not self.closed:
            self.close_service()


@pytest.fixture
def served():
    made = []

    def make(**options):
        made.append(Served(**options))
        return made[-1]
    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="module")
def local():
    """A local session with the reference kernels: what each call alone must give."""
    return colibri.Model(MODEL_DIR).session(ctx=8, kernels="reference")


@pytest.fixture(scope="module")
def local_auto():
    return colibri.Model(MODEL_DIR).session(ctx=8, kernels="auto")


def request(layer, experts, counts, seed):
    """A Compute of `counts[i]` rows for experts[i] (ascending), x drawn from `seed`."""
    rows = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    x = np.random.default_rng(seed).standard_normal((int(rows[-1]), 128)).astype(np.float32)
    return pb.ComputeRequest(model_hash=model_hash(MODEL_DIR), layer=layer, experts=list(experts),
                             rows=rows.tolist(), x=x.astype("<f4").tobytes())


def alone(local, r):
    """y of the request computed by itself, locally."""
    x = np.frombuffer(r.x, dtype="<f4").reshape(r.rows[-1], 128).astype(np.float32)
    return local.compute_experts(r.layer, np.array(r.experts, np.int32), np.array(r.rows, np.int32), x)


def answered(local, r, call):
    """The call's reply, checked bit for bit against the request computed alone."""
    reply = call.result(timeout=WAIT_S)
    got = np.frombuffer(reply.y, dtype="<f4").reshape(r.rows[-1], 128).astype(np.float32)
    assert same_bits(got, alone(local, r)), (r.layer, list(r.experts), list(r.rows))
    return reply


def overlapping(layer, n, seed):
    """n requests of `layer`, each 1 to 4 experts of 8 with 1 to 2 rows each: overlapping experts."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        experts = np.sort(rng.choice(8, size=rng.integers(1, 5), replace=False))
        out.append(request(layer, experts, rng.integers(1, 3, size=len(experts)), seed * 1000 + i))
    return out


# ------------------------------------------------------------------------------- rounds

@pytest.mark.parametrize("kernels", ["reference", "auto"])
def test_calls_queued_together_are_one_round_and_each_gets_its_own_rows(served, local, local_auto, kernels):
    """16 calls of one layer queued while a first round holds the compute thread: one round merges
    them (each expert once, its rows in call order), and every reply equals its call computed alone
    (with the server's kernels: the reference ones, and this machine's best)."""
    s = served(kernels=kernels)
    local = local if kernels == "reference" else local_auto
    first = request(2, [0, 3], [2, 1], seed=1)
    held = s.hold(first)
    requests = overlapping(2, 16, seed=2)
    calls = [s.stub().Compute.future(r, timeout=WAIT_S) for r in requests]   # at once, from 16 connections
    s.queued(16)
    s.gate.open()
    answered(local, first, held)
    replies = [answered(local, r, c) for r, c in zip(requests, calls)]
    stats = s.service.stats()
    assert stats["rounds"] == 2 < stats["calls"] == 17 and stats["largest_round"] == 16, stats
    assert stats["rows"] == sum(r.rows[-1] for r in [first, *requests]) and stats["queued"] == 0
    layer, experts, rows = s.gate.rounds[1]
    assert layer == 2 and experts == sorted({e for r in requests for e in r.experts})
    for j, e in enumerate(experts):   # each expert's rows: those of every call routing to it
        assert rows[j + 1] - rows[j] == sum(r.rows[i + 1] - r.rows[i] for r in requests
                                            for i, f in enumerate(r.experts) if f == e)
    assert all(reply.compute_ns == replies[0].compute_ns > 0 for reply in replies)   # the round's time


def test_interleaved_layers_are_answered_a_round_per_layer(served, local):
    """Calls of layers 0 and 1 queued alternately: a round for each layer (the oldest call's first),
    every reply its own."""
    s = served()
    first = request(3, [5], [1], seed=3)
    held = s.hold(first)
    requests = [r for pair in zip(overlapping(0, 5, seed=4), overlapping(1, 5, seed=5)) for r in pair]
    calls = [s.enqueue(r) for r in requests]
    s.gate.open()
    answered(local, first, held)
    for r, c in zip(requests, calls):
        answered(local, r, c)
    assert [layer for layer, _, _ in s.gate.rounds] == [3, 0, 1]
    assert s.service.stats()["calls"] == 11


def test_a_busy_layer_does_not_starve_another(served, local):
    """Layer 0's calls of 100 rows (one a round: max_rows is 128) queued before and after one call
    of layer 1, and one more sent before each round runs (a steady stream): layer 1's call is the
    round after the layer-0 calls that came before it, and every call is answered its own rows."""
    s = served()
    assert s.service.max_rows == 128
    first = request(0, [1], [1], seed=6)
    held = s.hold(first)
    big = [request(0, [0, 4], [60, 40], seed=10 + i) for i in range(6)]
    requests, calls = big[:3], [s.enqueue(r) for r in big[:3]]
    other = request(1, [2, 7], [1, 2], seed=7)
    waiting = s.enqueue(other)
    requests += big[3:]
    calls += [s.enqueue(r) for r in big[3:]]
    for i in range(5):   # round i passes, round i + 1 takes its calls and waits; then another layer-0 call
        s.gate.let()
        s.gate.reached()
        requests.append(request(0, [3], [100], seed=100 + i))
        calls.append(s.enqueue(requests[-1]))
    assert [layer for layer, _, _ in s.gate.rounds] == [0, 0, 0, 0, 1]   # the held round, the 3 before, layer 1
    s.gate.open()
    answered(local, first, held)
    answered(local, other, waiting)
    for r, c in zip(requests, calls):
        answered(local, r, c)
    stats = s.service.stats()
    assert stats["largest_round"] == 1 and stats["rounds"] == stats["calls"] == 1 + 1 + 6 + 5, stats


# ------------------------------------------------------------------------------- bounds and deadlines

def test_a_full_queue_answers_resource_exhausted_at_once(served, local):
    s = served(queue=2)
    first = request(1, [0], [1], seed=8)
    held = s.hold(first)
    requests = overlapping(1, 2, seed=9)
    calls = [s.enqueue(r) for r in requests]
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as e:
        s.stub().Compute(request(1, [2], [1], seed=10), timeout=WAIT_S)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "--queue 2" in e.value.details(), e.value
    assert time.monotonic() - start < WAIT_S / 2   # not once the gate opens: it never does meanwhile
    s.gate.open()
    for r, c in zip([first, *requests], [held, *calls]):
        answered(local, r, c)
    stats = s.service.stats()
    assert stats["refused"] == 1 and stats["calls"] == 3, stats


def test_a_call_whose_deadline_passes_in_the_queue_is_not_computed(served, local):
    s = served()
    first = request(2, [4], [2], seed=11)
    held = s.hold(first)
    late, timely = request(2, [1, 6], [3, 1], seed=12), request(2, [6], [2], seed=13)
    doomed = s.enqueue(late, timeout=0.5)
    waiting = s.enqueue(timely)
    assert doomed.exception(timeout=WAIT_S).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    s.gate.open()
    answered(local, first, held)
    answered(local, timely, waiting)
    assert [rows[-1] for _, _, rows in s.gate.rounds] == [2, 2]   # the late call's 4 rows in no round
    stats = s.service.stats()
    assert stats["dropped"] == 1 and stats["calls"] == 2, stats


class Aborted(Exception):
    pass


class Context:
    """The part of grpc.aio.ServicerContext that Compute uses, with a deadline gRPC does not enforce
    (gRPC cancels a call at its deadline, mostly before its round: this is the round's own check)."""

    def __init__(self, remaining):
        self.remaining = remaining

    def time_remaining(self):
        return self.remaining

    async def abort(self, code, details):
        raise Aborted(code, details)


def test_a_deadline_passed_when_its_round_starts_is_answered_uncomputed(served):
    s = served()
    held = s.hold(request(1, [3], [1], seed=23))
    late = asyncio.run_coroutine_threadsafe(s.service.Compute(request(1, [3], [2], seed=24), Context(0.0)),
                                            server.event_loop())
    s.queued(1)
    s.gate.let()
    with pytest.raises(Aborted) as e:
        late.result(timeout=WAIT_S)
    assert e.value.args[0] == grpc.StatusCode.DEADLINE_EXCEEDED and "layer 1" in e.value.args[1], e.value
    held.result(timeout=WAIT_S)
    assert len(s.gate.rounds) == 1 and s.service.stats()["dropped"] == 1


def test_a_server_stopped_with_calls_queued_stops_within_its_grace(served):
    s = served()
    held = s.hold(request(0, [0], [1], seed=14))
    calls = [s.enqueue(r) for r in overlapping(0, 3, seed=15)]
    start = time.monotonic()
    assert s.server.stop(0.5).wait(WAIT_S)
    assert time.monotonic() - start < 5
    for call in [held, *calls]:   # every client answered (cancelled), none left waiting
        assert call.exception(timeout=WAIT_S) is not None
    assert s.service.stats()["dropped"] == 3
    s.gate.open()
    s.close_service()


def test_close_answers_the_queued_calls_unavailable(served, local):
    """close() while calls wait: the round running finishes, the rest are refused, the thread exits."""
    s = served()
    first = request(3, [2], [1], seed=16)
    held = s.hold(first)
    queued = s.enqueue(request(3, [1], [1], seed=17))
    closing = threading.Thread(target=s.close_service)
    closing.start()
    deadline = time.monotonic() + WAIT_S
    while not s.service._closing:   # close() has begun before the round ends: the queued call is not taken
        assert time.monotonic() < deadline
        time.sleep(0.005)
    s.gate.let()   # close() waits for the round running
    closing.join(WAIT_S)
    assert s.closed
    answered(local, first, held)
    assert queued.exception(timeout=WAIT_S).code() == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(grpc.RpcError) as e:   # and any later call
        s.stub().Compute(request(3, [1], [1], seed=18), timeout=WAIT_S)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    assert s.service.stats()["failed"] == 1


def test_a_malformed_call_is_refused_before_the_queue(served, local):
    """What the core would refuse (an expert out of range, not ascending) is INVALID_ARGUMENT at
    once, naming the call's own fields; the calls queued with it are computed."""
    s = served()
    first = request(0, [0], [1], seed=19)
    held = s.hold(first)
    good = request(0, [1], [2], seed=20)
    waiting = s.enqueue(good)
    for experts, match in (([8], r"experts\[0\] = 8"), ([3, 2], r"experts\[1\] = 2.*ascending")):
        with pytest.raises(grpc.RpcError) as e:
            s.stub().Compute(request(0, experts, [1] * len(experts), seed=21), timeout=WAIT_S)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
        assert re.search(match, e.value.details()), e.value.details()
    assert s.service.stats()["queued"] == 1
    s.gate.open()
    answered(local, first, held)
    answered(local, good, waiting)


def test_an_error_of_a_round_is_every_calls_answer_and_the_next_round_runs(served, local):
    """The core failing a merged call (COLIBRI_E_ARG): each call of that round is INVALID_ARGUMENT
    with the core's message, as a call alone was before batching; the thread goes on."""
    s = served()
    first = request(0, [2], [1], seed=25)
    held = s.hold(first)
    doomed = [s.enqueue(r) for r in overlapping(0, 2, seed=26)]
    s.gate.let()
    s.gate.reached()   # the two queued calls wait at the gate, as one round
    s.gate.fail = True
    s.gate.let()
    for call in doomed:
        e = call.exception(timeout=WAIT_S)
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "layer 100 out of range" in e.details(), e
    s.gate.fail = False
    s.gate.open()
    answered(local, first, held)
    after = request(0, [5], [1], seed=27)
    answered(local, after, s.stub().Compute.future(after, timeout=WAIT_S))
    stats = s.service.stats()
    assert stats["failed"] == 2 and stats["calls"] == 2, stats


# ------------------------------------------------------------------------------- edges

def test_edges_generating_against_the_batching_server_give_the_local_tokens(served):
    """One edge, then two at once, every routed expert remote (strict: no call may fail): the tokens
    of an all-local run."""
    s = served()
    s.gate.open()
    model = colibri.Model(MODEL_DIR)
    want = greedy(model.session(ctx=64, kernels="reference"), PROMPT, 24)
    table = placement(model, "all")
    assert (table[moe_layers(model)] == 1).all()

    def edge():
        drv = RemoteDriver(s.address, model, threshold_ms=60000, deadline_ms=WAIT_S * 1000)
        return drv, model.session(ctx=64, kernels="reference", devices=[drv], placement=table, strict=True)
    drv, session = edge()
    assert greedy(session, PROMPT, 24) == want and drv.round_trips > 0
    edges, got = [edge(), edge()], [None, None]

    def run(i):
        got[i] = greedy(edges[i][1], PROMPT, 24)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 4)
    assert got == [want, want]
    for d, e in [(drv, session), *edges]:
        st = remote_stats(e)
        assert st["errors"] == st["fallbacks"] == 0 and st["calls"] == d.round_trips > 0, st
    stats = s.service.stats()
    assert stats["calls"] == sum(d.round_trips for d, _ in [(drv, session), *edges]) >= stats["rounds"], stats
    for d, _ in [(drv, session), *edges]:
        d.close()


def test_the_command_takes_its_queue_bound_and_reports_its_counts():
    """--queue N is in the ready line; the counts are in the line it prints when stopped (SIGTERM)."""
    proc = subprocess.Popen([sys.executable, "-m", "colibri", "serve-experts", "--listen", "127.0.0.1:0",
                             "--queue", "3", "--threads", "1"], cwd=TESTS, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        ready = proc.stdout.readline()
        assert "queue 3" in ready, ready
        address = re.search(r"serve-experts: (\S+) serving", ready).group(1)
        with grpc.insecure_channel(address) as channel:
            rpc.ExpertsStub(channel).Compute(request(1, [2, 5], [2, 1], seed=22), timeout=WAIT_S)
        proc.terminate()
        out = proc.communicate(timeout=WAIT_S)[0]
    finally:
        proc.kill()
        proc.wait(WAIT_S)
    assert proc.returncode == 0 and "calls 1, rounds 1, rows 3," in out, out

"""A soak of the remote surfaces: `colibri serve-experts` and `colibri orchestrate` under many edges.

    python benchmarks/soak_remote.py [--edges 100] [--minutes 30] [--window 5] [--out FILE]

Both servers run as processes on loopback (the bundled model; the orchestrator's state in a
temporary folder).  Each edge is a client of its own (a gRPC channel to each server, as
colibri.remote.Edge holds) that, paced with jitter, every second asks serve-experts for one
Compute of 1 to 4 experts of a random MoE layer (4 rows each), every 20 s for a FetchExpert, and
every 2 s sends the orchestrator a heartbeat built by the edges' own colibri.remote.edge.
heartbeat_message: its tokens per expert drawn from a popularity that drifts, so placements
change all along (the orchestrator's journal and snapshots are exercised), its budget a quarter of
the experts.  A wrong answer (a Compute's bytes against the same computation in this process, a
FetchExpert's CRCs) or an error is counted.

Per window: calls and latency (client side: the call's wall time, median and 99th percentile) of
each kind, errors, each server's RSS (VmRSS) and threads at the window's end, and the load average.
Prints a markdown table and writes it, with the machine, date and commit, to --out.
"""
import argparse
import asyncio
import datetime
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fuzz_remote import _free_port   # noqa: E402
from soak import commit, rss_kib       # noqa: E402
import vs_llamacpp                      # noqa: E402  (machine())

COMPUTE_EVERY, HEARTBEAT_EVERY, FETCH_EVERY = 1.0, 2.0, 20.0   # seconds, per edge
ROWS = 4                                                        # per expert of a Compute
DEADLINE = 10.0


def start(argv, ready, cwd):
    """A colibri command as a process, once it says `ready` on stdout or stderr (run in `cwd`, not
    in a checkout, whose colibri/ would shadow the installed one)."""
    p = subprocess.Popen([sys.executable, "-m", "colibri", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, cwd=cwd)
    for line in p.stdout:
        if ready in line:   # from now on read and dropped, so that a full pipe never blocks the server
            threading.Thread(target=p.stdout.read, daemon=True).start()
            return p
    raise SystemExit(f"soak_remote: {argv[0]} did not start (exit {p.wait()})")


def threads(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


class Stats:
    def __init__(self):
        self.latency = {"Compute": [], "FetchExpert": [], "Heartbeat": []}
        self.errors = {}

    def error(self, what):
        self.errors[what] = self.errors.get(what, 0) + 1


async def edge(name, stats, experts_at, orch_at, model, stop):
    """One edge: Computes, FetchExperts and heartbeats until `stop`, each timed into `stats`."""
    import grpc

    from colibri.remote import colibri_remote_pb2 as pb
    from colibri.remote import colibri_remote_pb2_grpc as pbg
    from colibri.remote.edge import heartbeat_message

    rng = random.Random(name)
    cfg, digest = model["config"], model["hash"]
    n_layers, n_experts, hidden = cfg["num_layers"], cfg["num_experts"], cfg["hidden_size"]
    pending = np.zeros(n_layers * n_experts, dtype=np.int64)
    popularity = np.array([rng.random() for _ in range(n_layers * n_experts)])
    seq, version = 0, 0
    async with grpc.aio.insecure_channel(experts_at) as ec, grpc.aio.insecure_channel(orch_at) as oc:
        experts, orch = pbg.ExpertsStub(ec), pbg.OrchestratorStub(oc)
        next_compute = time.monotonic() + rng.uniform(0, COMPUTE_EVERY)
        next_beat = time.monotonic() + rng.uniform(0, HEARTBEAT_EVERY)
        next_fetch = time.monotonic() + rng.uniform(0, FETCH_EVERY)
        while not stop.is_set():
            now = time.monotonic()
            wait = min(next_compute, next_beat, next_fetch) - now
            if wait > 0:
                try:
                    await asyncio.wait_for(stop.wait(), wait)
                except asyncio.TimeoutError:
                    pass
                continue
            layer = rng.choice(model["moe_layers"])
            try:
                if now >= next_compute:
                    next_compute += COMPUTE_EVERY * rng.uniform(0.8, 1.2)
                    chosen = sorted(rng.sample(range(n_experts), rng.randint(1, min(4, n_experts))))
                    x = np.random.default_rng(rng.getrandbits(32)).standard_normal(
                        (ROWS * len(chosen), hidden)).astype("<f4")
                    t0 = time.perf_counter()
                    reply = await experts.Compute(pb.ComputeRequest(
                        model_hash=digest, layer=layer, experts=chosen, rows=[ROWS * i for i in range(len(chosen) + 1)],
                        x=x.tobytes()), timeout=DEADLINE)
                    stats.latency["Compute"].append(time.perf_counter() - t0)
                    if len(reply.y) != x.nbytes or not np.isfinite(np.frombuffer(reply.y, "<f4")).all():
                        stats.error("Compute: a reply of the wrong size or not finite")
                    for e in chosen:
                        pending[layer * n_experts + e] += ROWS
                elif now >= next_beat:
                    next_beat += HEARTBEAT_EVERY * rng.uniform(0.8, 1.2)
                    popularity = np.clip(popularity + np.array([rng.gauss(0, 0.05) for _ in popularity]), 0, 1)
                    pending += (popularity * 8).astype(np.int64)
                    seq += 1
                    msg, _, _ = heartbeat_message(name, digest[:8], seq, [120, 900], rng.randrange(1000), version,
                                                  budget_bytes=n_layers * n_experts // 4 * 1024, slot_bytes=1024,
                                                  pending=pending)
                    t0 = time.perf_counter()
                    reply = await orch.Heartbeat(msg, timeout=DEADLINE)
                    stats.latency["Heartbeat"].append(time.perf_counter() - t0)
                    pending[:] = 0
                    if reply.local:
                        version = reply.placement_version
                else:
                    next_fetch += FETCH_EVERY * rng.uniform(0.8, 1.2)
                    t0 = time.perf_counter()
                    chunks = [c async for c in experts.FetchExpert(
                        pb.FetchRequest(model_hash=digest, layer=layer, expert=rng.randrange(n_experts)), timeout=DEADLINE)]
                    stats.latency["FetchExpert"].append(time.perf_counter() - t0)
                    if any(zlib.crc32(c.data) != c.crc32 for c in chunks):
                        stats.error("FetchExpert: a chunk's CRC")
            except grpc.aio.AioRpcError as e:
                stats.error(f"{e.code().name}: {e.details()[:60]}")


def quantiles(xs):
    if not xs:
        return "–", "–"
    a = np.array(xs) * 1e3
    return f"{np.median(a):.1f}", f"{np.percentile(a, 99):.1f}"


async def soak(args, experts_at, orch_at, model, procs):
    stats, stop, rows = Stats(), asyncio.Event(), []
    tasks = [asyncio.create_task(edge(f"edge-{i:03d}", stats, experts_at, orch_at, model, stop))
             for i in range(args.edges)]
    start = time.monotonic()
    rss_start = {k: rss_kib(p.pid) for k, p in procs.items()}
    for w in range(int(args.minutes / args.window + 0.5)):
        await asyncio.sleep(max(0.0, start + (w + 1) * args.window * 60 - time.monotonic()))
        window, stats.latency = stats.latency, {k: [] for k in stats.latency}
        errors, stats.errors = stats.errors, {}
        dead = [k for k, p in procs.items() if p.poll() is not None]
        rows.append({"minute": (w + 1) * args.window, "latency": window, "errors": errors, "dead": dead,
                     "rss": {k: rss_kib(p.pid) for k, p in procs.items()},
                     "threads": {k: threads(p.pid) for k, p in procs.items()}, "load": os.getloadavg()[0]})
        print(row_text(rows[-1]), flush=True)
        if dead:
            break
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return rows, rss_start


HEAD = ("| minutes | Compute calls | median / p99 ms | Heartbeat calls | median / p99 ms | FetchExpert calls | "
        "median / p99 ms | errors | serve-experts RSS MiB, threads | orchestrate RSS MiB, threads | load |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|")


def row_text(r):
    cells = [str(r["minute"])]
    for kind in ("Compute", "Heartbeat", "FetchExpert"):
        med, p99 = quantiles(r["latency"][kind])
        cells += [f"{len(r['latency'][kind]):,}", f"{med} / {p99}"]
    errors = sum(r["errors"].values())
    cells.append(f"{errors}" + (": " + "; ".join(f"{n}× {k}" for k, n in r["errors"].items()) if errors else "") +
                 (f" ({', '.join(r['dead'])} exited)" if r["dead"] else ""))
    for k in ("experts", "orchestrate"):
        rss = r["rss"][k]
        cells.append(f"{rss / 1024:.1f}, {r['threads'][k]}" if rss else "gone")
    cells.append(f"{r['load']:.1f}")
    return "| " + " | ".join(cells) + " |"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--edges", type=int, default=100)
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--window", type=float, default=5.0, help="minutes per row")
    p.add_argument("--out", type=Path, default=HERE / "results" / "soak_remote.md")
    args = p.parse_args()
    if args.edges < 1 or args.minutes <= 0 or not 0 < args.window <= args.minutes:
        p.error("--edges at least 1, --minutes above 0, --window in (0, --minutes]")

    import colibri
    from colibri.demo import MODEL_DIR
    from colibri import experts
    from colibri.remote import model_hash

    m = colibri.Model(MODEL_DIR)
    model = {"config": m.config, "hash": model_hash(MODEL_DIR), "moe_layers": experts.moe_layers(m)}
    with tempfile.TemporaryDirectory() as tmp:
        ep, op = _free_port(), _free_port()
        procs = {"experts": start(["serve-experts", "--model", str(MODEL_DIR), "--listen", f"127.0.0.1:{ep}",
                                   "--threads", "1"], "serving", tmp),
                 "orchestrate": start(["orchestrate", "--listen", f"127.0.0.1:{op}", "--state",
                                       str(Path(tmp) / "state.json")], "listening", tmp)}
        try:
            print(HEAD, flush=True)
            rows, rss_start = asyncio.run(soak(args, f"127.0.0.1:{ep}", f"127.0.0.1:{op}", model, procs))
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(30)
    growth = ", ".join(f"{k} {rss_start[k] / 1024:.1f} → {rows[-1]['rss'][k] / 1024:.1f} MiB"
                       for k in procs if rss_start[k] and rows[-1]["rss"][k])
    text = (f"# The remote surfaces under {args.edges} edges, {datetime.date.today().isoformat()}\n\n"
            f"`python benchmarks/soak_remote.py --edges {args.edges} --minutes {args.minutes:g} --window "
            f"{args.window:g}` on {vs_llamacpp.machine()}, commit {commit()}: each edge a Compute of 1 to 4 "
            f"experts ({ROWS} rows each) every {COMPUTE_EVERY:g} s, a heartbeat every {HEARTBEAT_EVERY:g} s, a "
            f"FetchExpert every {FETCH_EVERY:g} s (each with 20% jitter); the bundled model, serve-experts "
            f"with one thread. Latency is the client's wall time of a call, its Python included. RSS from the "
            f"first second of the soak to its end: {growth}.\n\n" + HEAD + "\n" +
            "\n".join(row_text(r) for r in rows) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"\n{growth}\nwritten to {args.out}")
    return 1 if any(r["dead"] or r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""The fleet under load: simulated edges against 1, 2 and 4 expert servers found through a 3-member
etcd cluster, and what a killed expert server, leading orchestrator or etcd member costs real edges.

    python benchmarks/fleet.py [--model DIR] [--edges 1,8,16,64] [--servers 1,2,4] [--seconds 8]
                               [--reps 2] [--threads 1] [--no-kills] [--quick] [--out FILE]

  1. etcd: three members on loopback (tests/etcd_cluster.py; Debian's etcd-server), for the whole run;
  2. the servers: S `colibri serve-experts` processes, each holding every expert (replicas), each
     announcing itself under /colibri/servers/ with a lease (--etcd), --threads compute threads each;
  3. the edges: N processes (this file with --sim-edge), each a FleetDriver over the servers etcd
     names, decoding without a model: for every token, for every MoE layer, top_k distinct experts
     drawn from a Zipf(1) law over the layer's experts (a trained router's skew; the edge's own
     seed), one row each of random activations, one parallel round of Computes (one per server
     holding a part), waited for: what a decoding edge whose every routed expert is remote sends.
     They start together (a shared start time), run --seconds, and report their calls and latencies;
  4. per cell (S, N), repeated --reps times in an interleaved order: Compute calls per second over
     all edges, each call's round-trip latency P50 and P99 (pooled), edge tokens/s (all edges; and
     per edge), the servers' rounds per call (their stop line: batching), the 1-minute load average
     and the CPU other processes took;
  5. kills (real edges: colibri.remote.Edge on the model with the reference kernels, text checked
     against an all-local run of the same prompt, token for token):
     a. 2 replica servers, 4 edges generating: one server killed with SIGKILL mid-run;
     b. 2 `colibri orchestrate --etcd` processes, the leader killed with SIGKILL: time until the other
        leads, placement versions seen by a watch (none twice), edges' text;
     c. one etcd member of 3 killed mid-run;
     each: time to recover (the longest gap between two tokens of an edge after the kill, against the
     median gap) and tokens lost or changed (must be 0);
  6. prints markdown tables and writes them to --out (benchmarks/results/fleet.md).
Everything runs on this machine's cores: servers, edges and etcd share them, so calls/s at N edges
against 1 edge is what batching and concurrency give on the same cores.
"""
import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))   # tests/etcd_cluster.py: real members on loopback

STARTUP_S = 120          # every process up (imports, etcd watch) before the shared start time
PREFIX = "/colibri"
PLAN = 512               # tokens of routing a simulated edge draws ahead and cycles through


def log(*args):
    print(*args, file=sys.stderr, flush=True)


def load_average():
    return float(open("/proc/loadavg").read().split()[0])


def cpu_busy_ticks():
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def process_cpu_ticks(pids):
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total


# ---- 3. a simulated edge (a process of its own) -----------------------------------------------------

def sim_edge(spec):
    """Runs in a child process: decodes spec["seconds"] of simulated tokens through a FleetDriver;
    prints {"calls", "tokens", "latencies_us", "failures"} as JSON."""
    import colibri
    from colibri import experts as ex
    from colibri.remote.fleet import FleetDriver

    model = colibri.Model(spec["model"])
    cfg = model.config
    layers = ex.moe_layers(model)
    n_experts, k, hidden = cfg["num_experts"], cfg["top_k"], cfg["hidden_size"]
    rng = np.random.default_rng(spec["seed"])
    zipf = 1.0 / np.arange(1, n_experts + 1)
    zipf /= zipf.sum()
    # the routing and activations of PLAN tokens, drawn before the clock starts: the edge's time goes to its calls
    plan = [[np.sort(rng.choice(n_experts, size=k, replace=False, p=rng.permutation(zipf))).astype(np.int32)
             for _ in layers] for _ in range(PLAN)]
    xs = rng.standard_normal((PLAN, k, hidden), dtype=np.float32)
    driver = FleetDriver(spec["etcd"], model, prefix=PREFIX, deadline_ms=spec["deadline_ms"])
    rows = np.arange(k + 1, dtype=np.int32)
    gates = np.full(k, 1.0 / k, dtype=np.float32)
    y = np.empty((k, hidden), dtype=np.float32)
    latencies, tokens, failures = [], 0, 0
    time.sleep(max(0.0, spec["start_at"] - time.time()))
    cpu0 = time.process_time()
    end = time.monotonic() + spec["seconds"]
    while time.monotonic() < end:
        for layer, chosen in zip(layers, plan[tokens % PLAN]):
            sent = time.perf_counter()
            driver.compute(layer, chosen, rows, gates, xs[tokens % PLAN])
            try:
                driver.sync(y)
            except Exception:   # a failed call: an edge would compute those experts itself
                failures += 1
                continue
            latencies.append(int((time.perf_counter() - sent) * 1e6))
        tokens += 1
    cpu = time.process_time() - cpu0
    driver.close()
    print(json.dumps({"calls": len(latencies), "tokens": tokens, "latencies_us": latencies, "failures": failures,
                      "cpu_s": cpu}))


# ---- 2. servers ------------------------------------------------------------------------------------

class Server:
    """`colibri serve-experts` in a subprocess, announced in etcd; stop() returns its stop line's
    counters (calls, rounds)."""

    def __init__(self, model, etcd, threads, kernels="auto", hold=None, ttl=2):
        cmd = [sys.executable, "-m", "colibri", "serve-experts", "--model", str(model), "--listen", "127.0.0.1:0",
               "--etcd", etcd, "--lease-ttl", str(ttl), "--threads", str(threads), "--kernels", kernels]
        if hold:
            cmd += ["--hold", hold]
        self.out = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, cwd="/")   # the installed colibri
        deadline = time.monotonic() + STARTUP_S
        while b"serving" not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"colibri serve-experts did not start: {self.text().decode(errors='replace')}")
            time.sleep(0.1)
        self.address = self.text().split(b"colibri serve-experts: ", 1)[1].split()[0].decode()

    def text(self):
        self.out.seek(0)
        return self.out.read()

    def stop(self):
        """{calls, rounds} of its stop line (SIGTERM), None when it was killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        line = self.text().decode(errors="replace")
        counts = {}
        for key in ("calls", "rounds", "rows"):
            tail = line.rsplit(f"{key} ", 1)
            if len(tail) == 2 and tail[1].split(",")[0].replace(",", "").isdigit():
                counts[key] = int(tail[1].split(",")[0])
        return counts

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


def wait_announced(store, n, timeout_s=30):
    deadline = time.monotonic() + timeout_s
    while len(store.get_prefix(f"{PREFIX}/servers/")[0]) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"fewer than {n} expert servers announced in etcd after {timeout_s} s")
        time.sleep(0.1)


# ---- 4. a throughput cell ---------------------------------------------------------------------------

def cell(model, etcd, n_servers, n_edges, seconds, threads, deadline_ms, seed):
    from colibri.remote.etcd import Etcd

    store = Etcd(etcd)
    servers = [Server(model, etcd, threads) for _ in range(n_servers)]
    try:
        wait_announced(store, n_servers)
        start_at = time.time() + 3 + 0.15 * n_edges   # every edge imported and watching before it
        edges = []
        for i in range(n_edges):
            spec = dict(model=str(model), etcd=etcd, seed=seed * 1000 + i, seconds=seconds, start_at=start_at,
                        deadline_ms=deadline_ms)
            edges.append(subprocess.Popen([sys.executable, __file__, "--sim-edge", json.dumps(spec)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/"))
        time.sleep(max(0.0, start_at - time.time()))
        load, busy0, own0 = load_average(), cpu_busy_ticks(), process_cpu_ticks([s.proc.pid for s in servers])
        t0 = time.monotonic()
        reports = []
        for p in edges:
            out, err = p.communicate(timeout=seconds + STARTUP_S)
            if p.returncode != 0:
                raise RuntimeError(f"a simulated edge failed: {err.decode(errors='replace')[-2000:]}")
            reports.append(json.loads(out))
        wall = time.monotonic() - t0
        busy = cpu_busy_ticks() - busy0
        server_ticks = process_cpu_ticks([s.proc.pid for s in servers]) - own0
    finally:
        counts = [s.stop() for s in servers]
    calls = sum(r["calls"] for r in reports)
    lat = np.array([v for r in reports for v in r["latencies_us"]], dtype=np.float64)
    rounds = sum(c.get("rounds", 0) for c in counts)
    served = sum(c.get("calls", 0) for c in counts)
    return dict(servers=n_servers, edges=n_edges, calls_s=calls / seconds, tokens_s=sum(r["tokens"] for r in reports) / seconds,
                p50_us=float(np.percentile(lat, 50)) if lat.size else float("nan"),
                p99_us=float(np.percentile(lat, 99)) if lat.size else float("nan"),
                failures=sum(r["failures"] for r in reports), calls_per_round=served / rounds if rounds else float("nan"),
                load=load, wall=wall, busy_ticks=busy,
                server_cpu_us=server_ticks / os.sysconf("SC_CLK_TCK") * 1e6 / calls if calls else float("nan"),
                edge_cpu_us=sum(r["cpu_s"] for r in reports) * 1e6 / calls if calls else float("nan"))


def throughput(args, etcd):
    cells = [(s, n) for s in args.servers for n in args.edges]
    runs = {c: [] for c in cells}
    for rep in range(args.reps):
        order = cells if rep % 2 == 0 else cells[::-1]   # interleaved: no cell always first
        for s, n in order:
            log(f"rep {rep + 1}/{args.reps}: {s} servers, {n} edges")
            runs[(s, n)].append(cell(args.model, etcd, s, n, args.seconds, args.threads, args.deadline_ms, rep))
    return runs


def throughput_table(runs, servers, edges):
    lines = ["| servers | edges | Compute calls/s | vs 1 edge | call P50 (ms) | call P99 (ms) | edge tokens/s (all) | "
             "per edge | calls per server round | failed calls | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in servers:
        base = statistics.median(r["calls_s"] for r in runs[(s, edges[0])])
        for n in edges:
            rs = runs[(s, n)]
            calls = statistics.median(r["calls_s"] for r in rs)
            tok = statistics.median(r["tokens_s"] for r in rs)
            lines.append(f"| {s} | {n} | {calls:,.0f} | {calls / base:.2f}x | {statistics.median(r['p50_us'] for r in rs) / 1e3:.2f} | "
                         f"{statistics.median(r['p99_us'] for r in rs) / 1e3:.2f} | {tok:,.1f} | {tok / n:,.1f} | "
                         f"{statistics.median(r['calls_per_round'] for r in rs):.2f} | {statistics.median(r['server_cpu_us'] for r in rs):.0f} | "
                         f"{statistics.median(r['edge_cpu_us'] for r in rs):.0f} | {sum(r['failures'] for r in rs)} | "
                         f"{', '.join(format(r['load'], '.1f') for r in rs)} |")
    return "\n".join(lines)


# ---- 6. main ------------------------------------------------------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="colibri model directory (default: the bundled model)")
    p.add_argument("--edges", default="1,8,16,64")
    p.add_argument("--servers", default="1,2,4")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="compute threads of each server")
    p.add_argument("--deadline-ms", type=int, default=2000)
    p.add_argument("--no-kills", action="store_true")
    p.add_argument("--quick", action="store_true", help="1 rep of 3 s, edges 1,8, servers 1,2")
    p.add_argument("--out", type=Path, default=HERE / "results" / "fleet.md")
    p.add_argument("--sim-edge", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sim_edge:
        return sim_edge(json.loads(args.sim_edge))
    if args.quick:
        args.edges, args.servers, args.reps, args.seconds = "1,8", "1,2", 1, 3.0
    args.edges = [int(x) for x in args.edges.split(",")]
    args.servers = [int(x) for x in args.servers.split(",")]
    if args.model is None:
        from colibri.cli.options import open_model
        args.model = Path(open_model(None).path)

    from etcd_cluster import EtcdCluster

    started = datetime.datetime.now().isoformat(timespec="minutes")
    sections = [f"# benchmarks/fleet.py, {started}\n", f"model {args.model}, {os.cpu_count()} CPUs, "
                f"servers with {args.threads} compute thread(s), {args.seconds:g} s a cell, {args.reps} repetitions\n"]
    with tempfile.TemporaryDirectory() as work, EtcdCluster(work, members=3) as cluster:
        runs = throughput(args, cluster.endpoints)
        sections.append("## Throughput\n\n" + throughput_table(runs, args.servers, args.edges) + "\n")
    text = "\n".join(sections)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())

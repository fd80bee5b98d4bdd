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
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
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

class Started:
    """A colibri command in a subprocess (the installed colibri: run from /), its output in a file,
    ready once it has printed `ready`; kill() is SIGKILL, stop() SIGTERM and the output."""

    def __init__(self, what, args, ready):
        self.out = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-m", "colibri", what, *map(str, args)], stdout=self.out,
                                     stderr=subprocess.STDOUT, cwd="/")
        deadline = time.monotonic() + STARTUP_S
        while ready not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"colibri {what} did not start: {self.text()}")
            time.sleep(0.1)

    def text(self):
        self.out.seek(0)
        return self.out.read().decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
        return self.text()

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


class Server(Started):
    """`colibri serve-experts`, announced in etcd; stop() returns the counters of its stop line."""

    def __init__(self, model, etcd, threads, kernels="auto", ttl=2):
        super().__init__("serve-experts", ["--model", model, "--listen", "127.0.0.1:0", "--etcd", etcd, "--lease-ttl",
                                           ttl, "--threads", threads, "--kernels", kernels], "serving")
        self.address = self.text().split("colibri serve-experts: ", 1)[1].split()[0]

    def stop(self):
        """{calls, rounds, rows, ...} of the line it prints at SIGTERM ({} when it was killed)."""
        stopped = re.search(r"stopped \((.*)\)", super().stop())
        return {k: int(v) for k, v in re.findall(r"(\w+) (\d+)", stopped.group(1))} if stopped else {}


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
        start_at = time.time() + 3 + 0.5 * n_edges   # every edge imported and watching before it
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
             "per edge | calls per server round | server CPU µs/call | edge CPU µs/call | failed calls | load avg |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
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


# ---- 5. a real edge (a process of its own) ------------------------------------------------------------

def real_edge(spec):
    """Runs in a child process: an Edge on the fleet (and the orchestrators, when given) generating
    the same spec["tokens"] greedy tokens with the reference kernels again and again for spec["seconds"];
    prints {"runs": each run's tokens, "stamps": each token's time} as JSON."""
    from colibri.remote.edge import Edge

    options = dict(fleet=spec["etcd"], name=spec["name"], expert_budget=spec["budget"], kernels="reference",
                   lease_ttl=spec["ttl"], ctx=len(spec["prompt"]) + spec["tokens"],
                   heartbeat_tokens=8, device_threshold_ms=1e5)   # every remote expert computed remotely
    if spec["orchestrator"]:
        options.update(orchestrator=spec["orchestrator"], etcd=spec["etcd"])
    runs, stamps = [], []
    with Edge(spec["model"], **options) as edge:
        time.sleep(max(0.0, spec["start_at"] - time.time()))
        end = time.time() + spec["seconds"]
        while time.time() < end:   # the same generation again and again: each run is checked against the reference
            edge.session.reset()
            runs.append([])
            for token in edge.stream(spec["prompt"], max_tokens=spec["tokens"], stop_at_eos=False):
                runs[-1].append(int(token))
                stamps.append(time.time())
        lines = edge.counters()
    print(json.dumps({"runs": runs, "stamps": stamps, "counters": lines}))


class Orchestrator(Started):
    """`colibri orchestrate --etcd`."""

    def __init__(self, etcd, ttl):
        super().__init__("orchestrate", ["--etcd", etcd, "--listen", "127.0.0.1:0", "--lease-ttl", ttl, "--interval",
                                         "0.5", "--warmup", "1"], "listening on")
        self.address = self.text().split("listening on ", 1)[1].split(",")[0].split()[0]


def kill_run(args, what, work):
    """Real edges on 2 replica servers and 2 orchestrators, all through a 3-member etcd; `what`
    (server, orchestrator, etcd) killed with SIGKILL a third of the way in.  The row of the kills table."""
    import colibri
    from colibri.remote.etcd import Etcd

    from etcd_cluster import EtcdCluster

    model = colibri.Model(args.model)
    cfg = model.config
    prompt = [int(t) for t in np.random.default_rng(7).integers(1, cfg["vocab_size"], 16)]
    tokens = cfg["max_position_embeddings"] - len(prompt)   # a whole context a run
    want = model.session(kernels="reference", ctx=len(prompt) + tokens).generate(prompt, tokens, stop_at_eos=False)
    budget = model.expert_slots()[0] * (cfg["num_layers"] * cfg["num_experts"] // 2)   # half the experts local
    with EtcdCluster(work, members=3) as cluster:
        store = Etcd(cluster.endpoints)
        servers = [Server(args.model, cluster.endpoints, args.threads, kernels="reference", ttl=args.ttl)
                   for _ in range(2)]
        orchestrators = [Orchestrator(cluster.endpoints, args.ttl) for _ in range(2)]
        watch = store.watch(f"{PREFIX}/placement/", prefix=True)
        versions = []   # (when seen, edge's key, version) of every placement written

        def drain():
            while not watch.closed.is_set():
                versions.extend((time.time(), kv["key"].decode(), json.loads(kv["value"])["version"])
                                for kind, kv in watch.events(timeout=0.2) if kind == "PUT")
        drainer = threading.Thread(target=drain, daemon=True)
        drainer.start()
        try:
            wait_announced(store, 2)
            start_at = time.time() + 5
            edges = [subprocess.Popen([sys.executable, __file__, "--real-edge", json.dumps(dict(
                         model=str(args.model), etcd=cluster.endpoints, name=f"edge-{i}", budget=budget,
                         orchestrator=",".join(o.address for o in orchestrators), tokens=tokens, seconds=args.kill_seconds,
                         prompt=prompt, start_at=start_at, ttl=args.ttl))],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/") for i in range(args.kill_edges)]
            time.sleep(max(0.0, start_at - time.time()) + args.kill_after)
            killed_at, handed_over = time.time(), None
            if what == "server":
                servers[0].kill()
            elif what == "etcd":
                cluster.kill(0)   # the member every client asks first
            else:
                leading = store.leader(f"{PREFIX}/orchestrator")["value"].decode()
                victim = next(o for o in orchestrators if o.address == leading)
                victim.kill()
                deadline = time.monotonic() + 4 * args.ttl
                while time.monotonic() < deadline:
                    now = store.leader(f"{PREFIX}/orchestrator")
                    if now is not None and now["value"].decode() != leading:
                        handed_over = time.time() - killed_at
                        break
                    time.sleep(0.02)
            reports = []
            for p in edges:
                out, err = p.communicate(timeout=STARTUP_S + 600)
                if p.returncode != 0:
                    raise RuntimeError(f"an edge failed: {err.decode(errors='replace')[-2000:]}")
                reports.append(json.loads(out))
        finally:
            time.sleep(0.5)
            watch.close()
            drainer.join(5)
            for o in orchestrators:
                o.stop()
            for s in servers:
                s.stop()
    lost = sum(sum(a != b for a, b in zip(run, want)) + abs(len(run) - len(want)) for r in reports for run in r["runs"])
    gaps_before, worst_before, worst_after = [], 0.0, 0.0
    for r in reports:
        stamps = np.array(r["stamps"])
        gaps = np.diff(stamps)
        before, after = gaps[stamps[1:] < killed_at], gaps[stamps[1:] >= killed_at]
        gaps_before += list(before)
        worst_before = max(worst_before, float(before.max()) if before.size else float("nan"))
        worst_after = max(worst_after, float(after.max()) if after.size else float("nan"))
    per_edge = {}
    repeated = 0
    for _, key, version in versions:
        repeated += version in per_edge.setdefault(key, set())
        per_edge[key].add(version)
    return dict(what=what, edges=len(reports), tokens=len(want) * sum(len(r["runs"]) for r in reports), lost=lost,
                median_gap_ms=1e3 * statistics.median(gaps_before) if gaps_before else float("nan"),
                worst_before_ms=1e3 * worst_before, worst_gap_ms=1e3 * worst_after, handed_over_s=handed_over,
                versions=len(versions), after=sum(when > killed_at for when, _, _ in versions), repeated=repeated)


def kills_table(rows, ttl):
    lines = ["| killed (SIGKILL) | edges | tokens | tokens lost or changed | median gap between tokens (ms) | "
             "longest gap before the kill (ms) | longest gap after it (ms) | new leader after (s) | "
             "placement versions written (after the kill) | versions repeated |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    names = {"server": "1 of 2 replica expert servers", "orchestrator": "the leading orchestrator (of 2)",
             "etcd": "1 of 3 etcd members"}
    for r in rows:
        lines.append(f"| {names[r['what']]} | {r['edges']} | {r['tokens']:,} | {r['lost']} | {r['median_gap_ms']:.1f} | "
                     f"{r['worst_before_ms']:.1f} | {r['worst_gap_ms']:.1f} | {'' if r['handed_over_s'] is None else format(r['handed_over_s'], '.2f')} | "
                     f"{r['versions']} ({r['after']}) | {r['repeated']} |")
    lines.append(f"\nLease TTL {ttl} s for servers, orchestrators and edges.")
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
    p.add_argument("--kill-edges", type=int, default=4, help="real edges in each kill run")
    p.add_argument("--kill-seconds", type=float, default=12.0, help="seconds each of them generates")
    p.add_argument("--kill-after", type=float, default=4.0, help="seconds of generation before the kill")
    p.add_argument("--kills", default="server,orchestrator,etcd")
    p.add_argument("--ttl", type=int, default=2, help="lease TTL (s) of servers, orchestrators and edges")
    p.add_argument("--sim-edge", help=argparse.SUPPRESS)
    p.add_argument("--real-edge", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.sim_edge:
        return sim_edge(json.loads(args.sim_edge))
    if args.real_edge:
        return real_edge(json.loads(args.real_edge))
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
    if args.edges != [0]:
        with tempfile.TemporaryDirectory() as work, EtcdCluster(work, members=3) as cluster:
            runs = throughput(args, cluster.endpoints)
        sections.append("## Throughput\n\n" + throughput_table(runs, args.servers, args.edges) + "\n")
    if not args.no_kills:
        rows = []
        for what in args.kills.split(","):
            log(f"kill run: {what}")
            with tempfile.TemporaryDirectory() as work:
                rows.append(kill_run(args, what, work))
        sections.append("## Kills\n\n" + kills_table(rows, args.ttl) + "\n")
    text = "\n".join(sections)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())

"""Edge and cloud: decode speed with part of the routed experts computed by an expert server behind a
slower network, round trips and bytes per token, against one call per expert; and how long a device
that slows down takes to be bypassed, and to come back.

    python benchmarks/edge_cloud.py [--model DIR] [--tokens 64] [--prompt 128] [--reps 3] [--rtt 0,5,30]
                                    [--mbit 50] [--threads 2] [--server-threads 2] [--kernels auto]
                                    [--placements all-local,90/10,50/50] [--no-per-expert] [--no-fallback]
                                    [--threshold-ms 5] [--slow-rtt-ms 50] [--out FILE]

  1. the model: --model, by default the bench model of benchmarks/expert_stream.py
     (build/bench-stream/bench-qwen3moe-skewed-q4_0.colibri: 24 layers of 64 experts, top-8, routers made
     to route like a trained MoE; `python benchmarks/expert_stream.py --prepare` builds it); any colibri
     model runs (tests/fixtures/tiny-mixtral.colibri for a smoke run);
  2. the text: the GPL-3's words as token ids by frequency rank (expert_stream.text_tokens; folded into
     a smaller vocabulary), a --prompt-token prompt, then --tokens tokens fed one at a time (the text's
     next token each time: every configuration decodes the same tokens);
  3. the placements, by measured load: the load of each expert over 512 other tokens of the text
     (resident colibri), the hottest 90% (50%) of the routed experts local, the rest remote; all-local
     is a session without devices;
  4. the cloud, one subprocess: `colibri serve-experts`'s service on loopback and tests/delay_proxy.py
     in front of it, adding --rtt (half each way) and capping each direction at --mbit; the edge (this
     process) reaches the server through the proxy only;
  5. runs, interleaved (every configuration once per repetition; all-local once per repetition and
     RTT): decode tokens/s, Compute round trips per token, message bytes (the driver's count) and wire
     bytes (the proxy's, HTTP/2 and TLS-less gRPC framing included) per token, the remote share of the
     routed tokens; "per expert": the same placement with one unary Compute per expert, one after
     another (PerExpertDriver below), what a design without per-layer batching pays.  The session's
     bypass threshold is set out of reach there (every remote expert is computed remotely);
     "90/10 latency-aware": the 90/10 placement at the default threshold (--threshold-ms): a remote
     device slower than that is bypassed and its experts computed here (the edge has the weights);
     "90/10 promoted": an edge (colibri.remote.Edge) whose expert cache holds 90% of the routed
     experts, starting from the "auto" placement (an even share of each layer, nothing measured), with
     an orchestrator in this process placing the hottest experts local from its heartbeats (every 8
     tokens) over --warmup tokens of the text before the measured decode; "90/10 promoted latency-aware":
     the same edge at the default threshold: a slow network's experts are read from the edge's own
     weights.bin into its cache and computed here;
  6. fallback: a 50/50 session at --threshold-ms decodes at RTT 0; the proxy's RTT goes to
     --slow-rtt-ms: the time (and tokens, slow calls) until the session bypasses the device; then back
     to 0: the time until a probe brings it back;
  7. prints markdown tables (medians over the repetitions, ratios per interleaved pair) and writes them
     to --out (benchmarks/results/edge_cloud.md), every run's figures to --out with the suffix .json.
"""
import argparse
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import expert_stream as es   # noqa: E402  the text
import vs_llamacpp as vs     # noqa: E402  machine()

DEFAULT_MODEL = ROOT / "build" / "bench-stream" / f"{es.NAME}-q4_0.colibri"
CALIBRATION_TOKENS = 512
UNREACHABLE_MS = 600_000.0   # a threshold no call reaches: the speed runs never bypass the device

CLOUD = r"""
import importlib.util, json, sys
from colibri.remote.server import start
a = json.loads(sys.argv[1])
spec = importlib.util.spec_from_file_location("delay_proxy", a["proxy"])
dp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dp)
server, service, address = start(a["model"], "127.0.0.1:0", kernels=a["kernels"], threads=a["threads"], batch=a["batch"])
proxy = dp.DelayProxy(address, bandwidth=a["bandwidth"]).start()
print(json.dumps({"server": address, "proxy": proxy.address, "kernels": service.session.kernels}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    if "delay_ms" in cmd:
        proxy.set_delay(cmd["delay_ms"])
    print(json.dumps({"bytes": list(proxy.bytes)}), flush=True)
proxy.stop()
server.stop(0)
"""


def log(msg):
    vs.log(msg)


class Cloud:
    """The server and its proxy in a subprocess; set_rtt() and wire_bytes() talk to it."""

    def __init__(self, model, kernels, threads, batch, mbit):
        arg = {"model": str(model), "kernels": kernels, "threads": threads, "batch": batch,
               "bandwidth": mbit * 1e6 / 8 if mbit else None, "proxy": str(ROOT / "tests" / "delay_proxy.py")}
        self.p = subprocess.Popen([sys.executable, "-c", CLOUD, json.dumps(arg)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd="/")
        line = self.p.stdout.readline()
        if not line:
            raise SystemExit("the expert server did not start (its error is above)")
        self.info = json.loads(line)
        self.address = self.info["proxy"]

    def _ask(self, cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def set_rtt(self, ms):
        self._ask({"delay_ms": ms / 2})   # each way

    def wire_bytes(self):
        return sum(self._ask({})["bytes"])

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


class PerExpertDriver:
    """A driver with one unary Compute per expert, one after another (the first started in
    compute(), so it overlaps the local experts as a per-layer call does): what a design without
    per-layer batching pays in round trips.  Wraps any driver of the protocol."""

    def __init__(self, inner):
        self.inner, self.name, self.threshold_ms = inner, inner.name, inner.threshold_ms

    def holds(self, n_layers, n_experts):
        return self.inner.holds(n_layers, n_experts)

    def compute(self, layer, experts, rows, gates, x):
        self.job = (layer, experts.copy(), rows.copy(), gates.copy(), x.copy())
        self._start(0)

    def _start(self, i):
        layer, experts, rows, gates, x = self.job
        a, b = rows[i], rows[i + 1]
        self.inner.compute(layer, experts[i:i + 1], np.array([0, b - a], dtype=np.int32), gates[a:b], x[a:b])

    def sync(self, y):
        rows, latency = self.job[2], 0.0
        for i in range(len(self.job[1])):
            if i:
                self._start(i)
            latency += self.inner.sync(y[rows[i]:rows[i + 1]])
        return latency


# ---- the text, the load, the placements ---------------------------------------------------------

def text(model, n_prompt, n_decode):
    """(prompt, decode, calibration): token ids of the text folded into the model's vocabulary."""
    vocab = model.config["vocab_size"]
    words = es.text_tokens()
    if max(words) >= vocab:
        words = [3 + (w - es.FIRST_WORD) % (vocab - 3) for w in words]
    n_ctx = min(model.config["max_position_embeddings"], 4096)
    if n_prompt + n_decode + 1 > n_ctx:
        raise SystemExit(f"{n_prompt} prompt + {n_decode} decode tokens do not fit this model's {n_ctx} positions")
    prompt, decode = [es.BOS] + words[:n_prompt - 1], words[n_prompt - 1:n_prompt - 1 + n_decode]
    start = n_prompt + n_decode
    return prompt, decode, words[start:start + CALIBRATION_TOKENS], n_ctx


def measured_load(model, tokens, n_ctx, threads, kernels):
    """int64 (n_layers, n_experts): tokens routed to each expert over `tokens` (windows of the context)."""
    s = model.session(ctx=n_ctx, threads=threads, kernels=kernels)
    for i in range(0, len(tokens), n_ctx - 1):
        s.reset()
        s.prefill(tokens[i:i + n_ctx - 1])
    return s.expert_load()


def placement(model, load, local_share):
    """uint8 (n_layers, n_experts): the hottest `local_share` of the routed experts on the cpu (0),
    the rest on the remote device (1); dense layers on the cpu."""
    from colibri.remote.edge import moe_layers

    layers = moe_layers(model)
    n_experts = model.config["num_experts"]
    ids = [layer * n_experts + e for layer in layers for e in range(n_experts)]
    flat = load.reshape(-1)
    ranked = sorted(ids, key=lambda i: (-flat[i], i))
    table = np.zeros(load.shape, dtype=np.uint8).reshape(-1)
    table[ranked[round(local_share * len(ids)):]] = 1
    return table.reshape(load.shape)


PLACEMENTS = {"all-local": 1.0, "90/10": 0.9, "50/50": 0.5}
AWARE, PROMOTED, PROMOTED_AWARE = "90/10 latency-aware", "90/10 promoted", "90/10 promoted latency-aware"


# ---- the runs -----------------------------------------------------------------------------------

def decode_run(model, driver, cloud, table, prompt, decode, n_ctx, threads, kernels, threshold_ms=UNREACHABLE_MS):
    """One configuration's decode: tokens/s, round trips, bytes, the remote share."""
    devices = dict(devices=[driver], placement=table, device_threshold_ms=threshold_ms) if driver else {}
    s = model.session(ctx=n_ctx, threads=threads, kernels=kernels, **devices)
    s.prefill(prompt[:8])   # warm, as the other benchmarks do
    s.reset()
    s.prefill(prompt)
    s.device_stats_clear()
    inner = getattr(driver, "inner", driver)
    rt0, b0 = (inner.round_trips, inner.bytes_sent + inner.bytes_received) if driver else (0, 0)
    w0 = cloud.wire_bytes() if driver else 0
    token, t = None, time.perf_counter()
    for tok in decode:
        token = s.step(tok)
    elapsed = time.perf_counter() - t
    n = len(decode)
    out = {"tg": n / elapsed, "last": token, "decoded": n}
    if driver:
        stats = {d["name"]: d for d in s.device_stats()}
        remote, cpu = stats[driver.name], stats["cpu"]
        out.update(round_trips=(inner.round_trips - rt0) / n, message_bytes=(inner.bytes_sent + inner.bytes_received
                   - b0) / n, wire_bytes=(cloud.wire_bytes() - w0) / n,
                   remote_share=remote["rows"] / max(remote["rows"] + cpu["rows"], 1), fallbacks=remote["fallbacks"],
                   errors=remote["errors"], p90_ms=remote["p90_ns"] / 1e6)
    return out


def promoted_run(model, cloud, orchestrator, prompt, warm, decode, n_ctx, threads, kernels, share=0.9,
                 threshold_ms=UNREACHABLE_MS):
    """An edge caching `share` of the routed experts, placed by the orchestrator from its heartbeats
    while it decodes `warm`, then the measured decode (placements still applied between tokens)."""
    from colibri.remote.driver import RemoteDriver
    from colibri.remote.edge import Edge, moe_layers

    routed = len(moe_layers(model)) * model.config["num_experts"]
    slot, _ = model.expert_slots()
    driver = RemoteDriver(cloud.address, model, deadline_ms=UNREACHABLE_MS)
    edge = Edge(model, cloud.address, placement="auto", orchestrator=orchestrator, name=f"bench-{time.monotonic_ns()}",
                expert_budget=int(share * routed) * slot, device_threshold_ms=threshold_ms, heartbeat_tokens=8,
                driver=driver, ctx=n_ctx, threads=threads, kernels=kernels)
    s = edge.session
    t = time.perf_counter()
    s.prefill(warm[:1])
    for tok in warm[1:]:
        edge.between_tokens()
        s.step(tok)
        edge.generated += 1
        if s.position >= s.n_ctx - 1:
            s.reset()
    warm_s = time.perf_counter() - t
    s.reset()
    s.prefill(prompt)
    s.device_stats_clear()
    rt0, b0, w0 = driver.round_trips, driver.bytes_sent + driver.bytes_received, cloud.wire_bytes()
    token, t = None, time.perf_counter()
    for tok in decode:
        edge.between_tokens()
        token = s.step(tok)
        edge.generated += 1
    elapsed = time.perf_counter() - t
    n = len(decode)
    stats = {d["name"]: d for d in s.device_stats()}
    remote, cpu = stats[driver.name], stats["cpu"]
    cache = s.expert_cache_stats()
    out = {"tg": n / elapsed, "last": token, "decoded": n, "round_trips": (driver.round_trips - rt0) / n,
           "message_bytes": (driver.bytes_sent + driver.bytes_received - b0) / n,
           "wire_bytes": (cloud.wire_bytes() - w0) / n,
           "remote_share": remote["rows"] / max(remote["rows"] + cpu["rows"], 1), "fallbacks": remote["fallbacks"],
           "errors": remote["errors"], "p90_ms": remote["p90_ns"] / 1e6, "warm_s": warm_s,
           "placements_applied": len(edge.applied), "cache_hit": cache["hits"] / max(cache["hits"] + cache["misses"], 1)}
    edge.close()
    return out


def fallback_run(model, driver, cloud, table, prompt, decode, n_ctx, threads, kernels, threshold_ms, slow_rtt_ms,
                 limit_s=30.0):
    """The times from the RTT going to slow_rtt_ms to the session's bypass, and from its return to 0
    to the device's return (the probe's back-off included)."""
    s = model.session(ctx=n_ctx, threads=threads, kernels=kernels, devices=[driver], placement=table,
                      device_threshold_ms=threshold_ms)
    s.prefill(prompt)
    tokens = iter(decode * 1000)

    def remote():
        return next(d for d in s.device_stats() if d["name"] == driver.name)

    def step_until(done):
        t, steps = time.perf_counter(), 0
        while not done(remote()):
            if time.perf_counter() - t > limit_s:
                return None, steps
            if s.position >= s.n_ctx - 1:
                s.reset()
                s.prefill(prompt[:8])
            s.step(next(tokens))
            steps += 1
        return time.perf_counter() - t, steps

    cloud.set_rtt(0)
    # a full latency ring, the device in use (an early outlier may have bypassed it: a probe brings it back)
    settle_s, _ = step_until(lambda d: d["samples"] >= 32 and not d["bypassed_now"])
    out = {"bypassed_at_rtt_0": settle_s is None, "p90_at_rtt_0_ms": remote()["p90_ns"] / 1e6}
    if settle_s is None:
        return out   # the device stays over the threshold at +0 ms: nothing to time
    slow0 = remote()["slow"]
    cloud.set_rtt(slow_rtt_ms)
    out["to_fallback_s"], out["to_fallback_tokens"] = step_until(lambda d: d["bypassed_now"])
    out["slow_calls"] = remote()["slow"] - slow0
    cloud.set_rtt(0)
    probes0 = remote()["probes"]
    out["back_s"], out["back_tokens"] = step_until(lambda d: not d["bypassed_now"])
    out["probes"] = remote()["probes"] - probes0
    return out


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def report(args, runs, fallbacks, info):
    rtts, names = info["rtts"], info["configs"]
    lines = [f"# Edge and cloud: experts computed by an expert server over a slower network, {datetime.date.today()}", "",
             f"Machine: {vs.machine()}.  Model: {info['model']} ({info['n_layers']} layers, {info['n_experts']} "
             f"experts, top-{info['top_k']}, hidden {info['hidden']}).  Text: {es.TEXT}, a {info['prompt']}-token prompt "
             f"then {info['decode']} tokens fed one at a time.  Edge: {args.threads} threads, {info['kernels']} kernels; "
             f"server (`colibri serve-experts`'s service, one subprocess with the proxy): {args.server_threads} threads, "
             f"the same kernels, on loopback behind tests/delay_proxy.py adding the RTT (half each way) and capping each "
             f"direction at {args.mbit:g} Mbit/s.  Placements by the load measured over {CALIBRATION_TOKENS} other tokens "
             f"of the text: the hottest 90% (50%) of the routed experts local.  {args.reps} interleaved repetitions; "
             f"medians; ratios per repetition to that repetition's all-local run.", "",
             "Decode tokens/s (ratio to all-local):", "",
             "| placement | remote share of routed tokens | " + " | ".join(f"RTT +{r:g} ms" for r in rtts) + " |",
             "|---|---|" + "---|" * len(rtts)]
    for name in names:
        share = med(r.get("remote_share") for rtt in rtts for r in runs[name, rtt])
        cells = []
        for rtt in rtts:
            tg = med(r["tg"] for r in runs[name, rtt])
            ratio = med(r["tg"] / b["tg"] for r, b in zip(runs[name, rtt], runs["all-local", rtt]))
            cells.append(f"{fmt(tg, '.1f')} ({fmt(ratio, '.2f')})")
        lines.append(f"| {name} | {fmt(share, '.1%') if share is not None else '0%'} | " + " | ".join(cells) + " |")
    lines += ["", "Per token (medians over every RTT): Compute round trips, message bytes (the requests' and replies' "
              "serialized sizes), bytes on the wire (the proxy's count both ways: HTTP/2 and gRPC framing included), "
              "the remote device's P90 latency at each RTT:", "",
              "| placement | round trips/token | message bytes/token | wire bytes/token | " +
              " | ".join(f"P90 at +{r:g} ms" for r in rtts) + " |", "|---|---|---|---|" + "---|" * len(rtts)]
    for name in names:
        if name == "all-local":
            continue
        rs = [r for rtt in rtts for r in runs[name, rtt]]
        p90 = [fmt(med(r["p90_ms"] for r in runs[name, rtt]), ".2f") + " ms" for rtt in rtts]
        lines.append(f"| {name} | {fmt(med(r['round_trips'] for r in rs), '.1f')} | "
                     f"{fmt(med(r['message_bytes'] for r in rs), ',.0f')} | {fmt(med(r['wire_bytes'] for r in rs), ',.0f')} | "
                     + " | ".join(p90) + " |")
    bad = [(name, rtt) for (name, rtt), rs in runs.items() if name not in (AWARE, PROMOTED_AWARE)
           and any(r.get("fallbacks") or r.get("errors") for r in rs)]
    lasts = {}
    for rs in runs.values():
        for r in rs:
            lasts.setdefault(r["decoded"], set()).add(r["last"])
    lines += ["", "Every configuration's last token, by tokens decoded: "
              + ", ".join(f"{n}: {sorted(v)}" for n, v in sorted(lasts.items()))
              + " (one value each: the same tokens everywhere)."
              + (f"  Runs with fallbacks or errors: {bad}." if bad else "  No fallback or error in any speed run but "
                 f"the latency-aware one's.")]
    for c in (AWARE, PROMOTED_AWARE):
        if (c, rtts[0]) in runs:
            lines += ["", f"{c} (threshold {args.threshold_ms:g} ms): expert computations bound to the remote device "
                      "that ran here instead, per token: " + ", ".join(
                          f"+{rtt:g} ms: {fmt(med(r['fallbacks'] / r['decoded'] for r in runs[c, rtt]), '.1f')}"
                          for rtt in rtts) + "."]
    for c in (PROMOTED, PROMOTED_AWARE):
        if (c, rtts[0]) in runs:
            lines += ["", f"{c}: the edge's warm-up (s), placements the orchestrator pushed, expert cache hit rate in "
                      "the measured decode: " + ", ".join(
                          f"+{rtt:g} ms: {fmt(med(r['warm_s'] for r in runs[c, rtt]), '.1f')} s, "
                          f"{fmt(med(r['placements_applied'] for r in runs[c, rtt]), '.0f')} placements, "
                          f"{fmt(med(r['cache_hit'] for r in runs[c, rtt]), '.1%')}" for rtt in rtts) + "."]
    if fallbacks:
        ok = [f for f in fallbacks if not f.get("bypassed_at_rtt_0")]
        lines += ["", f"Fallback (50/50, threshold {args.threshold_ms:g} ms): the RTT goes from +0 to "
                  f"+{args.slow_rtt_ms:g} ms while decoding, then back; the times are measured between tokens.", "",
                  "| | medians of the repetitions |", "|---|---|"]
        if not ok:
            lines.append(f"| at +0 ms | the device was already over the threshold in every repetition |")
        else:
            lines += [f"| slowed -> bypassed | {fmt(med(f['to_fallback_s'] for f in ok) and med(f['to_fallback_s'] for f in ok) * 1e3, '.0f')} ms, "
                      f"{fmt(med(f['to_fallback_tokens'] for f in ok), '.0f')} tokens, "
                      f"{fmt(med(f['slow_calls'] for f in ok), '.0f')} slow calls |",
                      f"| restored -> back | {fmt(med(f['back_s'] for f in ok) and med(f['back_s'] for f in ok) * 1e3, '.0f')} ms, "
                      f"{fmt(med(f['back_tokens'] for f in ok), '.0f')} tokens, {fmt(med(f['probes'] for f in ok), '.0f')} probes |"]
            if len(ok) < len(fallbacks):
                lines.append(f"| | {len(fallbacks) - len(ok)} repetitions were over the threshold at +0 ms already |")
    return "\n".join(lines) + "\n"


def main():
    import colibri
    from colibri.remote.driver import RemoteDriver

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    p.add_argument("--tokens", type=int, default=64, help="decode tokens per run")
    p.add_argument("--prompt", type=int, default=es.PROMPT_TOKENS, help="prompt tokens")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--rtt", default="0,5,30", help="added round-trip times, ms")
    p.add_argument("--mbit", type=float, default=50.0, help="the proxy's cap each way, Mbit/s (0: none)")
    p.add_argument("--threads", type=int, default=2, help="the edge's threads")
    p.add_argument("--server-threads", type=int, default=2)
    p.add_argument("--kernels", default="auto", help="both sides' kernels")
    p.add_argument("--placements", default="all-local,90/10,50/50")
    p.add_argument("--no-per-expert", action="store_true", help="skip the one-call-per-expert runs")
    p.add_argument("--no-fallback", action="store_true", help="skip the fallback timing")
    p.add_argument("--threshold-ms", type=float, default=5.0, help="the fallback run's bypass threshold")
    p.add_argument("--slow-rtt-ms", type=float, default=50.0, help="the RTT the fallback run slows the device to")
    p.add_argument("--configs", help="run only these configurations (comma-separated, all-local among them)")
    p.add_argument("--warmup", type=int, default=200, help="tokens the promoted edge decodes before it is measured")
    p.add_argument("--per-expert-tokens", type=int, default=16, help="decode tokens of the per-expert runs (slow)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "edge_cloud.md")
    args = p.parse_args()
    args.model = args.model.resolve()
    if not (args.model / "colibri_model.json").exists():
        raise SystemExit(f"{args.model}: no colibri model; `python benchmarks/expert_stream.py --prepare` builds the "
                         f"bench model, or give --model (tests/fixtures/tiny-mixtral.colibri for a smoke run)")

    model = colibri.Model(args.model, threads=args.threads)
    cfg = model.config
    prompt, decode, calibration, n_ctx = text(model, args.prompt, args.tokens)
    warm = calibration[-args.warmup:] if args.warmup <= len(calibration) else calibration
    n_ctx = min(n_ctx, len(prompt) + len(decode) + 8) if args.no_fallback else n_ctx
    load = measured_load(model, calibration, min(n_ctx, 1024), args.threads, args.kernels)
    names = [n.strip() for n in args.placements.split(",")]
    unknown = set(names) - set(PLACEMENTS)
    if unknown or "all-local" not in names:
        raise SystemExit(f"--placements: all-local and any of {', '.join(PLACEMENTS)}, not {args.placements}")
    tables = {n: placement(model, load, PLACEMENTS[n]) for n in names}
    configs = names + ([f"{n} per expert" for n in names if n != "all-local"] if not args.no_per_expert else [])
    if "90/10" in tables:
        configs += [AWARE, PROMOTED, PROMOTED_AWARE]
    if args.configs:
        wanted = [c.strip() for c in args.configs.split(",")]
        if set(wanted) - set(configs) or "all-local" not in wanted:
            raise SystemExit(f"--configs: all-local and any of {', '.join(configs)}")
        configs = wanted
    rtts = [float(r) for r in args.rtt.split(",")]

    log(f"model {args.model} ({cfg['num_layers']} layers x {cfg['num_experts']} experts, top-{cfg['top_k']}); "
        f"{len(prompt)} prompt + {len(decode)} decode tokens; starting the cloud")
    cloud = Cloud(args.model, args.kernels, args.server_threads, 64, args.mbit)
    driver = RemoteDriver(cloud.address, model, deadline_ms=UNREACHABLE_MS)
    per_expert = PerExpertDriver(driver)
    kernels = model.session(ctx=8, kernels=args.kernels).kernels
    if kernels != cloud.info["kernels"]:
        log(f"  the edge computes with {kernels}, the server with {cloud.info['kernels']}: the tokens may differ")
    runs = {(c, rtt): [] for c in configs for rtt in rtts}
    fallbacks = []
    orchestrator = None
    if PROMOTED in configs or PROMOTED_AWARE in configs:
        import tempfile

        from colibri.remote.orchestrator import Orchestrator, serve

        state = Path(tempfile.mkdtemp()) / "orchestrator.json"
        orch_server, orch_port = serve(Orchestrator(state, interval=0.2, warmup=1), "127.0.0.1:0")
        orchestrator = f"127.0.0.1:{orch_port}"
    try:
        for rep in range(args.reps):
            for rtt in rtts:
                cloud.set_rtt(rtt)
                for c in configs:
                    name = c.replace(" per expert", "").replace(" latency-aware", "")
                    drv = None if c == "all-local" else per_expert if c.endswith("per expert") else driver
                    few = decode[:args.per_expert_tokens] if c.endswith("per expert") else decode
                    if c in (PROMOTED, PROMOTED_AWARE):
                        r = promoted_run(model, cloud, orchestrator, prompt, warm, decode, n_ctx, args.threads,
                                         args.kernels, threshold_ms=args.threshold_ms if c == PROMOTED_AWARE
                                         else UNREACHABLE_MS)
                    else:
                        r = decode_run(model, drv, cloud, tables[name], prompt, few, n_ctx, args.threads, args.kernels,
                                       args.threshold_ms if c == AWARE else UNREACHABLE_MS)
                    runs[c, rtt].append(r)
                    log(f"rep {rep + 1}/{args.reps} RTT +{rtt:g} ms {c:18s} {r['tg']:7.2f} tok/s"
                        + (f"  {r['round_trips']:.1f} round trips/token, {r['wire_bytes']:,.0f} B/token on the wire, "
                           f"remote {r['remote_share']:.0%} of routed tokens" if drv else ""))
            if not args.no_fallback and "50/50" in tables:
                f = fallback_run(model, driver, cloud, tables["50/50"], prompt, decode, n_ctx, args.threads,
                                 args.kernels, args.threshold_ms, args.slow_rtt_ms)
                fallbacks.append(f)
                log(f"rep {rep + 1}/{args.reps} fallback: {f}")
    finally:
        driver.close()
        cloud.close()
        if orchestrator:
            orch_server.stop(0)

    info = {"rtts": rtts, "configs": configs, "model": args.model.name, "n_layers": cfg["num_layers"],
            "n_experts": cfg["num_experts"], "top_k": cfg["top_k"], "hidden": cfg["hidden_size"],
            "prompt": len(prompt), "decode": len(decode), "kernels": kernels}
    table = report(args, runs, fallbacks, info)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(args).items()}, "info": info, "fallbacks": fallbacks,
        "runs": [{"config": c, "rtt": rtt, "runs": rs} for (c, rtt), rs in runs.items()]}, indent=1) + "\n")


if __name__ == "__main__":
    main()

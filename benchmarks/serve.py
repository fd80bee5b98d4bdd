"""colibri serve against llama.cpp's own server on the same GGUF: concurrent streaming clients,
aggregate tokens/s, time to first token, inter-token latency and peak RSS, quiet and beside a busy process.

    python benchmarks/serve.py [--work DIR] [--gguf FILE] [--servers colibri,llama.cpp] [--clients 1,4,16]
                               [--tokens 10000] [--reps 3] [--threads 2] [--conditions quiet,busy] [--quick]
                               [--server NAME=COMMAND ...] [--prepare] [--out FILE]

Any OpenAI-compatible server is measured the same way, from the command that starts it (SERVERS, or
--server NAME='COMMAND' with {model} {host} {port} {parallel} {ctx} {ctx_total} {threads} {python}
{llama_server} filled in):
  1. the peer is llama.cpp's `llama-server`, built once with cmake from the vendor/llama.cpp of the same
     llama-cpp-python source distribution benchmarks/vs_llamacpp.py pins (its CPU flags, no web UI, no
     network) into WORK/llama-server-build; `python -m llama_cpp.server` is not the peer: it holds one
     Llama under a lock and answers one request at a time, so it has no parallel slots to compare with;
     the model is vs_llamacpp's bench-qwen3moe quantized to Q4_0 (made when missing), read in place by both;
  2. for each condition (quiet; beside one busy process, a CPU burner started and stopped here), each
     client count C and each repetition, every server in turn (the order alternating between repetitions)
     starts on a free port with C parallel slots of CTX positions, answers /health, takes one warm-up
     request, then C concurrent clients stream POST /v1/completions: each prompt PROMPT_TOKENS token ids
     (random ordinary tokens of the model's vocabulary, different in every request so no server reuses a
     prefix), OUTPUT_TOKENS tokens out (greedy, end-of-sequence ignored), until the cell holds TOKENS output
     tokens over its repetitions; the usage each server reports is checked (prompt and output lengths);
  3. per run: aggregate output tokens/s (all completion tokens over the wall time from the first request
     to the last [DONE], prefill included), each stream's time to first token and inter-token latencies
     (arrival times of the server-sent events that carry text), the peak RSS of the server's process tree
     (VmHWM), the 1-minute load average and the CPU other processes took (/proc/stat);
  4. one table per condition: tokens/s as the median of the repetitions, latencies pooled over them, each
     colibri cell's ratio to llama.cpp (median of the per-repetition ratios), and the issue's targets checked.
The clients run in this process (asyncio, httpx): on a small machine they share its cores with the
server, as a gateway beside an edge server does.
"""
import argparse
import asyncio
import contextlib
import datetime
import importlib.util
import json
import os
import resource
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("vs_llamacpp", HERE / "vs_llamacpp.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

PROMPT_TOKENS, OUTPUT_TOKENS = 128, 128
CTX = PROMPT_TOKENS + OUTPUT_TOKENS + 16    # per slot: a request and the warm-up fit
QUICK_TOKENS = 1024
HEALTH_TIMEOUT_S = 300

# The servers' start commands.  llama-server: -c is the whole KV cache, split over the -np slots (the
# unified cache is off when -np is given); its host-memory prompt cache is off (--cache-ram 0): no
# request here shares a prefix, so it would only copy each finished slot out and add to the RSS.
SERVERS = {
    "colibri": "{python} -m colibri serve --model {model} --host {host} --port {port} --parallel {parallel} "
               "--ctx {ctx} --threads {threads}",
    "llama.cpp": "{llama_server} -m {model} --host {host} --port {port} -np {parallel} -c {ctx_total} "
                 "--cont-batching -t {threads} -tb {threads} --cache-ram 0 --no-webui",
}
PEER = "llama.cpp"
CONDITIONS = ("quiet", "busy")

# llama-server from the sdist's tree: the tools and the server only, the web UI neither built (npm) nor
# downloaded (an empty asset table), no HTTPS; static so the binary needs nothing from the build tree.
LLAMA_SERVER_CMAKE = ["-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_COMMON=ON",
                      "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TESTS=OFF",
                      "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_UI=OFF",
                      "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF"]


log = bench.log


# ---- 1. the peer and the model ------------------------------------------------------------------

def llama_server(work):
    """WORK/llama-server-build/bin/llama-server, built once (2 jobs: about 20 minutes on 2 cores)."""
    tree = bench.llama_cpp_source(work)
    build = work / "llama-server-build"
    exe = build / "bin" / "llama-server"
    with bench._one_at_a_time(work):
        if not exe.exists():
            flags = LLAMA_SERVER_CMAKE + bench.llama_cpp_cmake_args().split()
            log(f"building llama-server {bench.LLAMA_CPP_VERSION} from {tree} into {build}: cmake {' '.join(flags)}")
            subprocess.run(["cmake", "-S", str(tree), "-B", str(build)] + flags, check=True, stdout=subprocess.DEVNULL)
            subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", "-j", "2"], check=True,
                           stdout=subprocess.DEVNULL)
    return exe


def bench_gguf(work):
    """bench-qwen3moe quantized to Q4_0 by llama.cpp (every matrix Q4_0), as vs_llamacpp.py makes it."""
    gguf = work / "bench-qwen3moe-q4_0.gguf"
    if not gguf.exists():
        bench.ensure_llama_cpp()
        hf, bf16 = work / "bench-qwen3moe-hf", work / "bench-qwen3moe-bf16.gguf"
        bench.build_hf_model("qwen3moe", hf)
        bench.make_gguf(bench.llama_cpp_source(work), hf, bf16)
        bench.quantize(bf16, gguf, "q4_0")
    return gguf


def ordinary_tokens(gguf):
    """The ids of the vocabulary's ordinary tokens (GGUF token type 1: no control, byte or unknown ones)."""
    from gguf import GGUFReader
    field = GGUFReader(str(gguf)).fields["tokenizer.ggml.token_type"]
    types = np.array([field.parts[i][0] for i in field.data])
    return np.flatnonzero(types == 1)


# ---- 2. a server --------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_tree(pid):
    """pid and its descendants (/proc/PID/task/*/children)."""
    pids, i = [pid], 0
    while i < len(pids):
        for task in Path(f"/proc/{pids[i]}/task").glob("*"):
            with contextlib.suppress(OSError):
                pids += [int(c) for c in (task / "children").read_text().split()]
        i += 1
    return pids


def tree_peak_rss(pid):
    """Bytes: the sum of VmHWM (each process's peak resident set) over the process tree."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            total += next(int(l.split()[1]) * 1024 for l in open(f"/proc/{p}/status") if l.startswith("VmHWM:"))
    return total


def tree_cpu_seconds(pid):
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick     # utime, stime
    return total


def get_json(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"null")


@contextlib.contextmanager
def running_server(command, name):
    """Starts `command` (argv), waits for GET /health to answer 200; yields the Popen.  Its output goes
    to a file shown when it fails."""
    port = command.port
    with tempfile.TemporaryFile() as output:
        proc = subprocess.Popen(command.argv, stdout=output, stderr=subprocess.STDOUT, cwd="/", env=command.env,
                                start_new_session=True)

        def failed(what):
            output.seek(0)
            return SystemExit(f"{name} {what}:\n{' '.join(command.argv)}\n"
                              f"{output.read().decode(errors='replace')[-3000:]}")
        try:
            deadline = time.monotonic() + HEALTH_TIMEOUT_S
            while True:
                if proc.poll() is not None:
                    raise failed(f"exited with {proc.returncode} before answering /health")
                with contextlib.suppress(OSError, ValueError):
                    if get_json(f"http://127.0.0.1:{port}/health")[0] == 200 and proc.poll() is None:
                        break   # and still running: a server that could not bind the port exits
                if time.monotonic() > deadline:
                    raise failed(f"did not answer /health in {HEALTH_TIMEOUT_S} s")
                time.sleep(0.2)
            try:
                yield proc
            except Exception as e:   # a request failed: the server's own account of it
                raise failed(f"failed a request ({type(e).__name__}: {e}; exit status {proc.poll()})") from e
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


class Command:
    def __init__(self, template, **fields):
        self.port = fields["port"]
        self.argv = [arg.format(**fields) for arg in shlex.split(template)]
        self.env = dict(os.environ, COLIBRI_THREADS=str(fields["threads"]))
        self.env.pop("COLIBRI_KERNELS", None)


# ---- 3. the clients -----------------------------------------------------------------------------

async def one_stream(client, url, body):
    """One streamed completion.  Each line is timed as it arrives and parsed after."""
    lines = []
    sent = time.perf_counter()
    # a connection of its own: llama-server (cpp-httplib) closes a kept-alive connection after a few
    # requests, and a request sent on one as it closes fails unanswered; a loopback connect is well
    # under a millisecond, paid alike by every server
    async with client.stream("POST", url, json=body, headers={"Connection": "close"}) as r:
        if r.status_code != 200:
            raise SystemExit(f"POST {url}: {r.status_code} {(await r.aread()).decode(errors='replace')[:500]}")
        async for line in r.aiter_lines():
            lines.append((time.perf_counter(), line))
    return dict(sent=sent, **parse_stream(lines))


def parse_stream(lines):
    """(arrival time, line) of a completion's server-sent events -> {events (the times of those carrying
    text), prompt_tokens, completion_tokens (usage, in whichever chunk has it; else the text events), finish}."""
    events, usage, finish = [], None, None
    for t, line in lines:
        if not line.startswith("data:") or line[5:].strip() == "[DONE]":
            continue
        chunk = json.loads(line[5:])
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            if choice.get("text"):
                events.append(t)
            finish = choice.get("finish_reason") or finish
    usage = usage or {}
    return dict(events=events, finish=finish, prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens", len(events)))


def request_body(model, prompt, max_tokens):
    # ignore_eos: llama-server's extension (colibri serve takes the same field) so every request reads
    # exactly max_tokens; stream_options: OpenAI's way to ask for usage in the stream's last chunk.
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "seed": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}


async def drive(port, model, prompts):
    """prompts[c]: client c's prompts, sent one after another; the clients run concurrently.
    Returns (streams, wall seconds from the first request to the last stream's end)."""
    import httpx
    url = f"http://127.0.0.1:{port}/v1/completions"
    limits = httpx.Limits(max_connections=len(prompts) + 1, max_keepalive_connections=len(prompts) + 1)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as client:
        async def client_loop(mine):
            return [await one_stream(client, url, request_body(model, p, OUTPUT_TOKENS)) for p in mine]
        start = time.perf_counter()
        per_client = await asyncio.gather(*(client_loop(mine) for mine in prompts))
        wall = time.perf_counter() - start
    return [s for streams in per_client for s in streams], wall


def make_prompts(vocab_ids, n_clients, n_requests, seed):
    """n_clients lists of n_requests prompts, PROMPT_TOKENS ordinary token ids each, no two alike."""
    rng = np.random.default_rng(seed)
    return [[rng.choice(vocab_ids, PROMPT_TOKENS).tolist() for _ in range(n_requests)] for _ in range(n_clients)]


def measure(name, command, vocab_ids, n_clients, n_requests, seed):
    """One run: a fresh server with n_clients slots, a warm-up request, then the clients."""
    with running_server(command, name) as proc:
        models = get_json(f"http://127.0.0.1:{command.port}/v1/models")[1]
        model = models["data"][0]["id"]
        warm = asyncio.run(drive(command.port, model, [[vocab_ids[:16].tolist()]]))[0][0]
        if not warm["events"]:
            raise SystemExit(f"{name}: the warm-up request streamed no text")
        prompts = make_prompts(vocab_ids, n_clients, n_requests, seed)
        tick = os.sysconf("SC_CLK_TCK")
        busy0, server0, self0 = bench.cpu_busy_ticks(), tree_cpu_seconds(proc.pid), resource.getrusage(resource.RUSAGE_SELF)
        streams, wall = asyncio.run(drive(command.port, model, prompts))
        busy1, server1, self1 = bench.cpu_busy_ticks(), tree_cpu_seconds(proc.pid), resource.getrusage(resource.RUSAGE_SELF)
        rss = tree_peak_rss(proc.pid)
    for s in streams:
        if s["prompt_tokens"] not in (None, PROMPT_TOKENS) or s["completion_tokens"] != OUTPUT_TOKENS:
            raise SystemExit(f"{name}: a request of {PROMPT_TOKENS} prompt tokens and max_tokens {OUTPUT_TOKENS} "
                             f"(ignore_eos) was answered with usage prompt_tokens {s['prompt_tokens']}, "
                             f"completion_tokens {s['completion_tokens']} (finish_reason {s['finish']})")
    harness = self1.ru_utime + self1.ru_stime - self0.ru_utime - self0.ru_stime
    return dict(tokens=sum(s["completion_tokens"] for s in streams), wall=wall,
                ttft=[s["events"][0] - s["sent"] for s in streams],
                itl=[float(d) for s in streams for d in np.diff(s["events"])],
                rss=rss, load=os.getloadavg()[0], server_cpu=(server1 - server0) / wall, harness_cpu=harness / wall,
                other_cpu=max(0.0, ((busy1 - busy0) / tick - (server1 - server0) - harness) / wall),
                usage_checked=all(s["prompt_tokens"] is not None for s in streams))


# ---- 4. the table -------------------------------------------------------------------------------

def summary(runs):
    """A cell's figures over its repetitions: tokens/s the median, latencies pooled (ms)."""
    ttft, itl = np.concatenate([r["ttft"] for r in runs]) * 1e3, np.concatenate([r["itl"] for r in runs]) * 1e3
    p = lambda x, q: float(np.percentile(x, q))
    return dict(tps=statistics.median(r["tokens"] / r["wall"] for r in runs), tokens=sum(r["tokens"] for r in runs),
                ttft50=p(ttft, 50), ttft99=p(ttft, 99), itl50=p(itl, 50), itl99=p(itl, 99), itl_std=float(np.std(itl)),
                rss=max(r["rss"] for r in runs), load=statistics.median(r["load"] for r in runs),
                other=statistics.median(r["other_cpu"] for r in runs),
                usage=all(r["usage_checked"] for r in runs))


def noisy(cond, cell):
    """'*' when processes other than the server, the clients (and the busy neighbour) took CPU."""
    return "*" if cell["other"] - (cond == "busy") > bench.QUIET_OTHER_CPU else ""


def verdict(value, ok):
    return f"{value:.2f} {'met' if ok else 'MISSED'}"


def table(results, servers, clients, conditions, args, peer_note):
    """results[(condition, C, server)]: list of runs."""
    cells = {k: summary(v) for k, v in results.items()}
    ratio = lambda cond, c, name: statistics.median(a["tokens"] / a["wall"] / (b["tokens"] / b["wall"])
                                                    for a, b in zip(results[cond, c, name], results[cond, c, PEER]))
    lines = [f"# colibri serve vs llama.cpp's server, {datetime.date.today()}", "",
             f"Machine: {bench.machine()}.", "",
             f"Model: {args.gguf.name} (read in place by both).  {PROMPT_TOKENS}-token prompts (token ids), "
             f"{OUTPUT_TOKENS} tokens out per request (greedy, end-of-sequence ignored), C concurrent streaming clients "
             f"against --parallel C slots of {CTX} positions, {args.threads} threads.  "
             f"{args.tokens} output tokens per cell over {args.reps} interleaved repetition(s)"
             + (" (**quick mode**, not the issue's 10,000)" if args.quick else "") + ".", "",
             f"Peer: {peer_note}", "",
             "Commands (`{port}`: a free port; `{ctx_total}` = C x " + f"{CTX}):", ""]
    lines += [f"- {name}: `{args.templates[name]}`" for name in servers]
    lines += ["", "tok/s: all output tokens over the wall time from the first request to the last stream's end "
              "(prefill included), median of the repetitions.  TTFT: request sent to the first text event.  ITL: "
              "time between a stream's text events as the client receives them.  Latencies in ms, pooled over the "
              "repetitions.  RSS: peak resident set of the server's process tree.  load: 1-minute load average "
              "after the run; other: cores other processes used during the run (the busy neighbour is one).", ""]
    for cond in conditions:
        lines += [f"## {cond}" + (" (one CPU-bound process beside the server)" if cond == "busy" else ""), "",
                  "| C | server | tok/s | vs llama.cpp | TTFT P50 | TTFT P99 | ITL P50 | ITL P99 | ITL std | "
                  "ITL P99/P50 | peak RSS | load | other | tokens |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for c in clients:
            for name in servers:
                s = cells[cond, c, name]
                vs = "1" if name == PEER else (f"{ratio(cond, c, name):.2f}" if PEER in servers else "")
                lines.append(f"| {c} | {name} | {s['tps']:.1f} | {vs} | {s['ttft50']:.0f} | {s['ttft99']:.0f} | "
                             f"{s['itl50']:.1f} | {s['itl99']:.1f} | {s['itl_std']:.1f} | {s['itl99'] / s['itl50']:.2f} | "
                             f"{s['rss'] / 2**30:.2f} GiB | {s['load']:.2f} | {s['other']:.2f}{noisy(cond, s)} | "
                             f"{s['tokens']} |")
        lines.append("")
    lines += ["## The issue's targets", ""]
    lines += targets(cells, ratio, servers, clients, conditions)
    if any(noisy(cond, s) for (cond, _, _), s in cells.items()):
        lines += ["", f"\\* not quiet: other processes took more than {bench.QUIET_OTHER_CPU:.0%} of a core "
                  "(beyond the busy neighbour's one) during the run."]
    if not all(s["usage"] for s in cells.values()):
        lines += ["", "A server sent no usage in its streams: its output tokens were counted as text events."]
    return "\n".join(lines) + "\n"


def targets(cells, ratio, servers, clients, conditions):
    out = ["| target | condition | server | measured |", "|---|---|---|---|"]
    lo, hi = min(clients), max(clients)
    for cond in conditions:
        for name in servers:
            if (cond, lo, name) in cells and (cond, hi, name) in cells and hi > lo:
                x = cells[cond, hi, name]["tps"] / cells[cond, lo, name]["tps"]
                out.append(f"| tok/s at {hi} clients / at {lo} >= 4 | {cond} | {name} | "
                           + (verdict(x, x >= 4) if name != PEER else f"{x:.2f} (reference)") + " |")
    ours = [n for n in servers if n != PEER]
    for cond in conditions:
        for name in ours:
            for c in clients:
                if c >= 4 and PEER in servers:
                    x = ratio(cond, c, name)
                    out.append(f"| tok/s vs llama.cpp at {c} clients >= 1.5 | {cond} | {name} | {verdict(x, x >= 1.5)} |")
            for c in clients:
                s = cells[cond, c, name]
                bound = 1.3 if cond == "quiet" else 2.0
                x = s["itl99"] / s["itl50"]
                out.append(f"| ITL P99/P50 at {c} clients <= {bound} | {cond} | {name} | {verdict(x, x <= bound)} |")
                if cond == "busy" and PEER in servers:
                    y = s["itl99"] / cells[cond, c, PEER]["itl99"]
                    out.append(f"| ITL P99 / llama.cpp's at {c} clients <= 0.5 | busy | {name} | {verdict(y, y <= 0.5)} |")
    if not ours:
        out.append(f"| colibri's targets | all | colibri | not measured: only {', '.join(servers)} ran |")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=HERE.parent / "build" / "bench")
    p.add_argument("--gguf", type=Path, help="the model (default: WORK/bench-qwen3moe-q4_0.gguf, made when missing)")
    p.add_argument("--servers", default="colibri,llama.cpp")
    p.add_argument("--server", action="append", default=[], metavar="NAME=COMMAND",
                   help="a server's start command (adds NAME or replaces its default); fields as in the docstring")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--conditions", default=",".join(CONDITIONS))
    p.add_argument("--tokens", type=int, default=10000, help="output tokens per (condition, C, server) cell, at least")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--quick", action="store_true", help=f"a smoke run: {QUICK_TOKENS} tokens per cell, one repetition")
    p.add_argument("--seed", type=int, default=bench.SEED)
    p.add_argument("--prepare", action="store_true", help="only build llama-server and the model")
    p.add_argument("--out", type=Path, default=HERE / "results" / "serve.md")
    args = p.parse_args()
    if args.quick:
        args.tokens, args.reps = QUICK_TOKENS, 1
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    servers, clients = args.servers.split(","), [int(c) for c in args.clients.split(",")]
    conditions = args.conditions.split(",")
    args.templates = dict(SERVERS, **dict(s.split("=", 1) for s in args.server))
    unknown = [n for n in servers if n not in args.templates]
    if unknown or not set(conditions) <= set(CONDITIONS):
        p.error(f"no start command for {unknown} (--server NAME=COMMAND)" if unknown else f"conditions: {CONDITIONS}")

    exe = llama_server(work) if PEER in servers or args.prepare else None
    args.gguf = (args.gguf or bench_gguf(work)).resolve()
    if args.prepare:
        return
    vocab_ids = ordinary_tokens(args.gguf)
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True).stderr.split("\n")[0] if exe else ""
    peer_note = (f"llama.cpp's `llama-server` (`{version}`) from llama-cpp-python {bench.LLAMA_CPP_VERSION}'s "
                 "vendored llama.cpp, "
                 f"built by this script with `cmake {' '.join(LLAMA_SERVER_CMAKE + bench.llama_cpp_cmake_args().split())}`, "
                 "run with -np C continuous-batching slots.  Not `python -m llama_cpp.server`: it holds one Llama "
                 "under a lock and answers one request at a time, so it has no parallel slots to compare with.")

    results = {}
    for cond in conditions:
        neighbour = bench.busy_neighbour() if cond == "busy" else None
        try:
            for c in clients:
                n_requests = -(-args.tokens // (args.reps * c * OUTPUT_TOKENS))   # per client per repetition
                for rep in range(args.reps):
                    order = servers if rep % 2 == 0 else servers[::-1]
                    for name in order:
                        command = Command(args.templates[name], python=sys.executable, llama_server=exe,
                                          model=args.gguf, host="127.0.0.1", port=free_port(), parallel=c, ctx=CTX,
                                          ctx_total=c * CTX, threads=args.threads)
                        r = measure(name, command, vocab_ids, c, n_requests, seed=(args.seed, rep, c))
                        results.setdefault((cond, c, name), []).append(r)
                        log(f"{cond} C={c} rep {rep + 1}/{args.reps} {name:9s} {r['tokens'] / r['wall']:7.1f} tok/s  "
                            f"TTFT P50 {1e3 * np.median(r['ttft']):6.0f} ms  ITL P50 {1e3 * np.median(r['itl']):6.1f} "
                            f"P99 {1e3 * np.percentile(r['itl'], 99):6.1f} ms  RSS {r['rss'] / 2**30:.2f} GiB  "
                            f"load {r['load']:.2f}  others {r['other_cpu']:.2f} cores")
        finally:
            if neighbour:
                neighbour.kill()
                neighbour.wait()
    text = table(results, servers, clients, conditions, args, peer_note)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()

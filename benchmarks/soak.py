"""A soak: long decodes with resets through colibri-infer and the Python API, and many short requests.

    python benchmarks/soak.py [--model DIR] [--tokens 100000] [--requests 10000] [--threads 1]
                              [--infer PATH] [--out FILE]

Four runs on one model (default: the bundled one), greedy, the same 8-token prompt, one process each
side, the model's context (256 for the bundled model):
  - decode, C: colibri-infer --max_tokens TOKENS --reset_every 0 --latency FILE: one session decodes
    until the context is full, empties it, prefills the prompt again and goes on, TOKENS tokens in all;
  - decode, Python: the same loop through colibri.Session (reset, prefill, sample, then step());
  - requests, C and Python: REQUESTS short requests in one session, each a reset, the prompt's
    prefill and 8 tokens (colibri-infer --reset_every 8).
Per-token latency is one decode step, a token's forward plus sampling the next, by the monotonic
clock: in colibri-infer around colibri_forward + colibri_sample, in Python around Session.step()
(time.perf_counter_ns), the first token after each prefill not counted.  The Python request latency
is the whole request (reset, prefill, 8 tokens).  Both sides must produce the same tokens: checked.

Memory: RSS (VmRSS) at start, after warm-up (the first tenth of the tokens or requests) and at the
end; colibri-infer's from /proc/PID/status sampled every 10 ms.  Allocations: colibri-infer runs under
a counting malloc (benchmarks/malloc_count.c, built under build/soak and LD_PRELOADed: every malloc,
calloc, realloc, memalign and free in the process, the C library's own included), once with the
tokens and once with a tenth of them: the difference is what the extra tokens allocated.  Python:
a second pass of each loop under tracemalloc, the growth between the snapshot after warm-up and
the one at the end.
Prints a markdown table and writes it, with the machine, date, commit and load average, to --out.
"""
import argparse
import datetime
import fnmatch
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import vs_llamacpp                      # noqa: E402  (machine())

PROMPT_TOKENS, REQUEST_TOKENS = 8, 8
SPEC = {"C": 0.8, "Python": 12.3}       # the spec's standard deviations over 100,000 requests, ms


def bundled_model():
    import colibri.demo
    return Path(colibri.demo.__file__).parent / "shakespeare"


def find_infer():
    """colibri-infer installed beside this Python (pip puts it there), else on PATH."""
    path = shutil.which("colibri-infer", path=os.pathsep.join([str(Path(sys.executable).parent),
                                                               os.environ.get("PATH", "")]))
    if not path:
        raise SystemExit("soak: colibri-infer not found beside this Python or on PATH: give --infer PATH")
    return path


def commit():
    def git(*args):
        return subprocess.run(["git", "-C", str(HERE.parent), *args], capture_output=True, text=True).stdout.strip()
    head = git("rev-parse", "--short=12", "HEAD")
    return (head + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")) or "unknown"


def rss_kib(pid="self", name=None):
    """VmRSS of a process in KiB; None when it is gone, or (with name) not yet that program."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = dict(l.split(":", 1) for l in f if ":" in l)
        if name and status["Name"].strip() != name:
            return None
        return int(status["VmRSS"].split()[0])
    except (OSError, KeyError, ValueError):
        return None


def stats(ns):
    """Per-token latency figures in ms from int64 nanoseconds."""
    ms = np.asarray(ns, dtype=np.float64) / 1e6
    p50, p99, p999 = np.percentile(ms, [50, 99, 99.9])
    slow, fast = ms[ms > 1.0], ms[ms <= 1.0]
    return {"n": int(ms.size), "slow": int(slow.size), "median": p50,
            # a step that lost the CPU waits whole scheduler ticks (4 ms on this kernel): 4.1, 8.2 ms ...
            "slow_ticks": int(((slow > 3.5) & ((slow + 0.1) % 4.0 < 0.6)).sum()),
            "std_fast": float(fast.std()) if fast.size else 0.0, "p99": p99, "p99.9": p999, "std": float(ms.std()), "max": float(ms.max()),
            "sum_s": float(ms.sum() / 1e3)}


def resident(n):
    """int64 zeros (n) whose pages are already touched: filling them does not grow the RSS."""
    a = np.empty(n, dtype=np.int64)
    a.fill(0)
    return a


def prompt_for(vocab):
    return np.random.default_rng(0).integers(3, vocab, PROMPT_TOKENS).tolist()


# ---- colibri-infer -----------------------------------------------------------------------------

def build_counter():
    out = HERE.parent / "build" / "soak" / "malloc_count.so"
    src = HERE / "malloc_count.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    return out


def run_infer(infer, model, prompt, tokens, reset_every, threads, counter, work):
    """One colibri-infer run: {latency_ns, tokens, wall_s, rss [(s, KiB)], maxrss (KiB), mallocs}."""
    lat, out, count = work / "latency.bin", work / "ids.txt", work / "mallocs.txt"
    for f in (lat, count):
        f.unlink(missing_ok=True)
    cmd = [infer, "--model", str(model), "--tokens", ",".join(map(str, prompt)), "--max_tokens", str(tokens),
           "--reset_every", str(reset_every), "--ignore_eos", "--temperature", "0", "--threads", str(threads),
           "--ids", "--latency", str(lat)]
    env = dict(os.environ, LD_PRELOAD=str(counter), MALLOC_COUNT_FILE=str(count))
    samples = []
    with open(out, "wb") as stdout, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=stdout, stderr=err, env=env)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)   # its own rusage: the peak RSS
            if pid:
                break
            kib = rss_kib(proc.pid, "colibri-infer")   # from its exec on
            if kib:
                samples.append((time.perf_counter() - start, kib))
            time.sleep(0.01)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"soak: {' '.join(cmd)} failed ({proc.returncode}):\n{err.read().decode()[-2000:]}")
    ids = [int(t) for t in out.read_text().strip().split(",")]
    fields = count.read_text().split()
    return {"latency_ns": np.fromfile(lat, dtype=np.uint64).astype(np.int64), "tokens": ids, "wall_s": wall,
            "rss": samples, "maxrss": usage.ru_maxrss, "mallocs": dict(zip(fields[::2], map(int, fields[1::2])))}


def c_side(infer, model, prompt, tokens, reset_every, threads, counter, work):
    run = run_infer(infer, model, prompt, tokens, reset_every, threads, counter, work)
    small = run_infer(infer, model, prompt, max(1, tokens // 10), reset_every, threads, counter, work)
    rss = run["rss"]
    if not rss:
        raise SystemExit("soak: colibri-infer ended before its RSS could be read: give more --tokens")
    warm = next((kib for t, kib in rss if t >= 0.1 * run["wall_s"]), rss[-1][1])
    total = sum(run["mallocs"].values())
    extra = total - sum(small["mallocs"].values())
    return {**stats(run["latency_ns"]), "tokens": len(run["tokens"]), "wall_s": run["wall_s"], "ids": run["tokens"],
            "rss_start": rss[0][1], "rss_warm": warm, "rss_end": rss[-1][1], "rss_max": run["maxrss"],
            "rss_samples": len(rss),
            "alloc": f"allocator calls: {total} in the process with {len(run['tokens']):,} tokens, "
                     f"{extra:+d} against {len(small['tokens']):,} tokens"}


# ---- the Python API ----------------------------------------------------------------------------

def gc_collections():
    return sum(s["collections"] for s in gc.get_stats())


def py_decode(session, prompt, tokens, lat, ids, on_warm=None):
    """The colibri-infer loop: rounds of reset, prefill, sample, step() until the context is full.
    Fills lat (decode steps, ns) and ids (every token); returns the steps timed."""
    ns = time.perf_counter_ns
    generated = k = 0
    warm_at = tokens // 10
    while generated < tokens:
        session.reset()
        session.prefill(prompt)
        token = session.sample()
        ids[generated] = token
        generated += 1
        while generated < tokens and session.position < session.n_ctx:
            t0 = ns()
            token = session.step(token)
            lat[k] = ns() - t0
            ids[generated] = token
            k += 1
            generated += 1
            if generated == warm_at and on_warm:
                on_warm()
    return k


def py_requests(session, prompt, requests, lat, req, ids, on_warm=None):
    """REQUESTS short requests: reset, prefill, REQUEST_TOKENS tokens.  Fills lat (decode steps, ns),
    req (whole requests, ns) and ids; returns the steps timed."""
    ns = time.perf_counter_ns
    k = g = 0
    for r in range(requests):
        if r == requests // 10 and on_warm:
            on_warm()
        t0 = ns()
        session.reset()
        session.prefill(prompt)
        token = session.sample()
        ids[g] = token
        g += 1
        for _ in range(REQUEST_TOKENS - 1):
            t1 = ns()
            token = session.step(token)
            lat[k] = ns() - t1
            ids[g] = token
            k += 1
            g += 1
        req[r] = ns() - t0
    return k


def traced(run):
    """tracemalloc's growth over run(on_warm): bytes and blocks from after warm-up to the end, and
    the line that grew most."""
    mine = [tracemalloc.Filter(False, tracemalloc.__file__)]   # not the snapshots' own bookkeeping
    fnmatch.fnmatch(tracemalloc.__file__, tracemalloc.__file__)   # the filter's pattern compiled (and cached) now
    tracemalloc.start()
    snaps = []
    run(lambda: snaps.append(tracemalloc.take_snapshot().filter_traces(mine)))
    end = tracemalloc.take_snapshot().filter_traces(mine)
    tracemalloc.stop()
    diff = end.compare_to(snaps[0], "lineno")
    size, count = sum(d.size_diff for d in diff), sum(d.count_diff for d in diff)
    top = max(diff, key=lambda d: d.size_diff, default=None)
    where = f"; most at {top.traceback[0].filename.split('/')[-1]}:{top.traceback[0].lineno} ({top.size_diff:+d} B)" \
        if top is not None and top.size_diff > 0 else ""
    return f"tracemalloc after warm-up to end: {size:+d} B in {count:+d} blocks{where}"


def python_side(model_dir, prompt, tokens, requests, threads):
    import colibri
    rss_start = rss_kib()
    model = colibri.Model(str(model_dir), threads=threads)
    session = model.session()
    out = {}

    lat, ids = resident(tokens), resident(tokens)
    warm = []
    gc0, start = gc_collections(), time.perf_counter()
    k = py_decode(session, prompt, tokens, lat, ids, lambda: warm.append(rss_kib()))
    wall, rss_end, n_gc = time.perf_counter() - start, rss_kib(), gc_collections() - gc0   # before the figures' own memory
    out["decode"] = {**stats(lat[:k]), "tokens": tokens, "wall_s": wall, "ids": ids.tolist(), "rss_start": rss_start,
                     "rss_warm": warm[0] if warm else rss_end, "rss_end": rss_end, "gc": n_gc}

    n_steps = requests * (REQUEST_TOKENS - 1)
    lat, req, rids = (resident(n_steps), resident(requests),
                      resident(requests * REQUEST_TOKENS))
    warm, rss0 = [], rss_kib()
    gc0, start = gc_collections(), time.perf_counter()
    k = py_requests(session, prompt, requests, lat, req, rids, lambda: warm.append(rss_kib()))
    wall, rss_end, n_gc = time.perf_counter() - start, rss_kib(), gc_collections() - gc0
    out["requests"] = {**stats(lat[:k]), "tokens": requests * REQUEST_TOKENS, "wall_s": wall, "ids": rids.tolist(),
                       "request": stats(req), "rss_start": rss0, "rss_warm": warm[0] if warm else rss_end,
                       "rss_end": rss_end, "gc": n_gc}

    # the allocation passes, apart: tracemalloc slows every Python allocation
    scratch = resident(tokens), resident(tokens)
    out["decode"]["alloc"] = traced(lambda w: py_decode(session, prompt, tokens, *scratch, w))
    scratch = (resident(n_steps), resident(requests),
               resident(requests * REQUEST_TOKENS))
    out["requests"]["alloc"] = traced(lambda w: py_requests(session, prompt, requests, *scratch, w))
    return out


# ---- the table ---------------------------------------------------------------------------------

def table(rows, header):
    mib = lambda kib: f"{kib / 1024:.2f}"   # noqa: E731
    lines = [*header, "",
             "| run | tokens | wall s | steps timed | median ms | p99 ms | p99.9 ms | std ms | max ms | steps > 1 ms "
             "| RSS MiB start / warm / end | RSS growth after warm-up | allocation |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {r['tokens']:,} | {r['wall_s']:.1f} | {r['n']:,} | {r['median']:.4f} | {r['p99']:.4f} "
                     f"| {r['p99.9']:.4f} | {r['std']:.4f} | {r['max']:.3f} | {r['slow']:,} "
                     f"| {mib(r['rss_start'])} / {mib(r['rss_warm'])} / {mib(r['rss_end'])} "
                     f"| {(r['rss_end'] - r['rss_warm']):+d} KiB | {r['alloc']} |")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="a colibri model directory (default: the bundled one)")
    p.add_argument("--tokens", type=int, default=100_000, help="tokens of the long decode, each side")
    p.add_argument("--requests", type=int, default=10_000, help="short requests, each side")
    p.add_argument("--threads", type=int, default=1, help="threads of each engine (1: the fairest on a shared machine)")
    p.add_argument("--infer", help="colibri-infer to run (default: the one installed beside this Python)")
    p.add_argument("--out", type=Path, default=HERE / "results" / "soak.md")
    args = p.parse_args()
    if args.tokens < 10 or args.requests < 10:
        raise SystemExit("soak: --tokens and --requests must be at least 10")
    model_dir = (args.model or bundled_model()).resolve()
    infer = args.infer or find_infer()

    import colibri
    m = colibri.Model(str(model_dir))
    prompt, n_ctx = prompt_for(m.vocab_size), m.session().n_ctx
    del m
    load_before, started = os.getloadavg(), time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        counter = build_counter()
        c_decode = c_side(infer, model_dir, prompt, args.tokens, 0, args.threads, counter, Path(tmp))
        c_req = c_side(infer, model_dir, prompt, args.requests * REQUEST_TOKENS, REQUEST_TOKENS, args.threads, counter,
                       Path(tmp))
    py = python_side(model_dir, prompt, args.tokens, args.requests, args.threads)
    load_after, elapsed = os.getloadavg(), time.perf_counter() - started
    same = {"decode": c_decode["ids"] == py["decode"]["ids"], "requests": c_req["ids"] == py["requests"]["ids"]}

    rows = [("decode, C (colibri-infer)", c_decode), ("decode, Python (Session.step)", py["decode"]),
            ("requests, C (colibri-infer --reset_every 8)", c_req), ("requests, Python (Session)", py["requests"])]
    rq = py["requests"]["request"]
    la = lambda l: " ".join(f"{v:.2f}" for v in l)   # noqa: E731
    header = [
        f"# Soak: colibri-infer and the Python API, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC", "",
        f"Machine: {vs_llamacpp.machine()}.  Commit {commit()}.  Load average (1, 5, 15 min) before {la(load_before)}, "
        f"after {la(load_after)}; niceness {os.nice(0)}; the whole run {elapsed:.0f} s.",
        f"`python benchmarks/soak.py --tokens {args.tokens} --requests {args.requests} --threads {args.threads}`"
        f"{' --model ' + str(model_dir) if args.model else ''}: model {model_dir.name}, n_ctx {n_ctx}, "
        f"{args.threads} thread(s), greedy, an {PROMPT_TOKENS}-token prompt.  Decode: one session, reset and the prompt "
        f"prefilled again whenever the context is full; requests: reset, prefill, {REQUEST_TOKENS} tokens.  A step: one "
        f"token's forward plus sampling the next, monotonic clock (the first token after each prefill is not a step).  "
        f"Same tokens from C and Python: decode {'yes' if same['decode'] else 'NO'}, "
        f"requests {'yes' if same['requests'] else 'NO'}.",
        f"Wall: C, the colibri-infer process from start to exit (loading included); Python, the loop.  "
        f"C: RSS from /proc/PID/status every 10 ms from the exec on ({c_decode['rss_samples']} samples in the decode run; 'warm' is the "
        f"sample at a tenth of its wall time), allocator calls counted by benchmarks/malloc_count.c (LD_PRELOAD, the whole "
        f"process); Python: VmRSS of this process, 'warm' after a tenth of the tokens or requests, tracemalloc in a "
        f"second pass of each loop.  Python's garbage collector ran {py['decode']['gc']} times in the decode loop, "
        f"{py['requests']['gc']} in the requests.",
    ]
    lines = table(rows, header)
    lines += ["", f"Python request latency (reset + prefill + {REQUEST_TOKENS} tokens, {rq['n']:,} requests): median "
              f"{rq['median']:.3f} ms, p99 {rq['p99']:.3f}, p99.9 {rq['p99.9']:.3f}, std {rq['std']:.3f}, "
              f"max {rq['max']:.3f} ms.", "",
              f"The spec claims a latency standard deviation of ±{SPEC['C']} ms for C against ±{SPEC['Python']} ms for "
              f"the Python wrapper over 100,000 requests; measured here over {c_decode['n']:,} decode steps it is "
              f"{c_decode['std']:.3f} ms from colibri-infer against {py['decode']['std']:.3f} ms through the Python API "
              f"(medians {c_decode['median']:.4f} and {py['decode']['median']:.4f} ms), set by the "
              f"{100 * c_decode['slow'] / c_decode['n']:.1f}% and {100 * py['decode']['slow'] / py['decode']['n']:.1f}% "
              f"of steps over 1 ms ({100 * (c_decode['slow_ticks'] + py['decode']['slow_ticks']) / max(1, c_decode['slow'] + py['decode']['slow']):.0f}% "
              f"of them within 0.5 ms of a multiple of 4 ms: waits for the CPU, load average {load_before[0]:.1f} on "
              f"{os.cpu_count()} cores), and {c_decode['std_fast']:.4f} against {py['decode']['std_fast']:.4f} ms "
              f"without them."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    drop = {"ids", "rss_samples"}
    args.out.with_suffix(".json").write_text(json.dumps({
        "date": str(datetime.date.today()), "machine": vs_llamacpp.machine(), "commit": commit(), "args": {
            k: str(v) for k, v in vars(args).items()}, "load_before": load_before, "load_after": load_after,
        "same_tokens": same, "runs": {name: {k: v for k, v in r.items() if k not in drop} for name, r in rows}},
        indent=1, default=float))
    if not all(same.values()):
        raise SystemExit("soak: C and Python produced different tokens")


if __name__ == "__main__":
    main()

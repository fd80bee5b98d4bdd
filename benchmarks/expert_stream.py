"""Expert streaming: colibri's decode speed with the routed experts read from storage into a budgeted
cache, against colibri resident and llama.cpp reading the same GGUF through mmap under the same
memory limit; the bench model's routing statistics and the hit rates of Belady's optimal
replacement (MIN) and LRU on its exact demands, so the cache's hit rate can be judged.

    python benchmarks/expert_stream.py [--work DIR] [--reps 3] [--threads 2] [--budgets 25,50,75,100]
                                       [--cache global|per_layer] [--buffered-io] [--no-prefetch]
                                       [--decode 128] [--max-decode-s 60] [--engines ...] [--out FILE]

One command does everything, caching what it made under --work (default build/bench-stream):
  1. bench-qwen3moe-skewed: bench-qwen3moe's checkpoint (benchmarks/vs_llamacpp.py: 64 experts, top-8,
     hidden 1024, 24 layers, random weights) made to route like a trained MoE (construct_routers:
     token embeddings at std 1, routers fitted on text so that routing follows the token, skewed and
     temporally correlated); llama.cpp's converter makes the GGUF, llama.cpp quantizes it to Q4_0
     (pure), colibri imports that GGUF with the interleaved layout (one extent per expert): both
     engines read the same weights;
  2. the text: the GPL-3 (/usr/share/common-licenses/GPL-3), its words as token ids by frequency
     rank, so the token stream has real text's Zipf statistics and repetitions; a 128-token prompt,
     then --decode tokens fed one at a time (each engine is given the text's next token, so both
     decode the same tokens whatever they would sample);
  3. records which experts each decode token demands in each layer (resident colibri, expert_load
     diffed per step), prints the routing statistics and simulates MIN and LRU on those demands at
     every budget (benchmarks/expert_cache_sim.py says exactly what is simulated);
  4. measures the disk (dd iflag=direct over weights.bin; one-expert O_DIRECT reads) and each
     budget's memory limit: the colibri session's arena (its slots included) + the mapped
     non-expert weights + the Python process.  A budget of P% gives P% of the routed experts a slot;
  5. runs, interleaved and each in a fresh process: colibri resident and llama.cpp with the files in
     the page cache (no limit), then per budget colibri streaming, colibri resident ("colibri mmap")
     and llama.cpp (mmap) in a memory cgroup of that budget's limit, both files dropped from the page
     cache before each run (posix_fadvise DONTNEED, checked with mincore); each run reports its
     /proc/self/io read_bytes and stops decoding after --max-decode-s (a thrashing run's rate is
     steady);
  6. prints one table (medians of the quiet runs; ratios per interleaved pair), writes it with the
     routing statistics to --out and every run's figures to --out with the suffix .json.
"""
import argparse
import collections
import ctypes
import datetime
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import expert_cache_sim as sim   # noqa: E402
import vs_llamacpp as vs         # noqa: E402  the bench models, llama.cpp, its converter

NAME = "bench-qwen3moe-skewed"
TEXT = Path("/usr/share/common-licenses/GPL-3")
BOS, FIRST_WORD = 1, 259    # after <unk> <s> </s> and the 256 byte pieces: the pieces "▁w0", "▁w1", ...
PROMPT_TOKENS = 128
CONSTRUCT_FROM, CONSTRUCT_WINDOWS, CONSTRUCT_LEN = 2048, 6, 512   # words 2048.. of the text, apart from the bench's
# The routers are calibrated, layer by layer, to what a trained MoE's routing gives a cache:
# JustVugg/colibri measured OLMoE-1B-7B (64 experts, top-8) at 24 slots a layer: MIN 84.1%, LRU 68.4%.
CALIBRATION_SLOTS, CALIBRATION_MIN = 24, 0.841
# Token embeddings N(0, 1) (T5's and Switch's initialisation) instead of bench-qwen3moe's N(0, 0.02):
# the residual stream then carries the token at every depth, as a trained model's does; at 0.02 the
# attention's averages over the context swamp it past the first layers and no router on the
# hidden state can follow the token there.
EMBED_STD = 1.0
QUIET_OTHER_CPU = vs.QUIET_OTHER_CPU
CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


def log(msg):
    vs.log(msg)


# ---- 1. the text --------------------------------------------------------------------------------

def text_tokens(path=TEXT):
    """The text's words and punctuation marks, lower-cased, each as the piece of its frequency rank
    (the most frequent FIRST_WORD): a real text's token statistics for a synthetic vocabulary."""
    words = re.findall(r"[a-z0-9]+|[^\sa-z0-9]", path.read_text(encoding="utf-8").lower())
    counts = collections.Counter(words)
    rank = {w: r for r, (w, _) in enumerate(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))}
    if FIRST_WORD + len(rank) > vs.VOCAB:
        raise SystemExit(f"{path}: {len(rank)} distinct words do not fit the vocabulary")
    return [FIRST_WORD + rank[w] for w in words]


def bench_tokens(words, n_decode):
    """(prompt, decoded tokens): <s> and the text's first words, then the words that follow."""
    prompt = [BOS] + words[:PROMPT_TOKENS - 1]
    return prompt, words[PROMPT_TOKENS - 1:PROMPT_TOKENS - 1 + n_decode]


# ---- 2. the routers -----------------------------------------------------------------------------

def _layer_hit_rate(selected, slots):
    """MIN's hit rate on one layer's demands (selected: (tokens, top_k) expert ids)."""
    groups = [(0, sorted(row.tolist()), True) for row in selected]
    hits, misses = sim.belady(groups, slots, int(selected.max()) + 1)
    return hits / (hits + misses)


def fit_router(h, tokens, n_experts, top_k, rng):
    """One layer's router rows W (E, d) from its inputs h (windows, positions, d) over the text's
    `tokens` (windows, positions); the last window validates.  Each token of the text gets target
    logits N(0, 1) per expert, and W is their ridge regression on the fast part of h (h less its
    running mean along the window: the token, not its context), with the slow part's response
    penalised; then W's response to the mean of h, which every token shares, is set to
    gamma * b (b a Zipf-like profile, -log(1 + rank), ranks a random permutation): popular
    experts.  gamma is bisected so that MIN's hit rate on the validation window at
    CALIBRATION_SLOTS slots is CALIBRATION_MIN.  Returns (W, {gamma, min_hit, lru_hit, overlap,
    top8_share}) of the validation window."""
    n_win, n_pos, d = h.shape
    mu = h[:-1].reshape(-1, d).mean(0)
    slow = np.empty_like(h)
    acc = h[:, 0] - mu
    for t in range(n_pos):   # running mean, time constant 16 tokens
        acc = acc + (h[:, t] - mu - acc) / 16
        slow[:, t] = acc
    fast = h - mu - slow
    x = fast[:-1].reshape(-1, d)
    s = slow[:-1].reshape(-1, d)
    s = s - s.mean(0)
    vocab = np.unique(tokens)
    target = rng.standard_normal((len(vocab), n_experts))[np.searchsorted(vocab, tokens[:-1].reshape(-1))]
    profile = -np.log1p(rng.permutation(n_experts))
    profile = (profile - profile.mean()) / profile.std()
    gram = x.T @ x + 10 * s.T @ s
    gram += 1e-2 * np.trace(gram) / d * np.eye(d)
    w0 = np.linalg.solve(gram, x.T @ target).T                      # (E, d)
    w0 -= np.outer(w0 @ mu, mu) / (mu @ mu)                          # no response to the mean
    w0 /= (x @ w0.T).std()                                           # token logits of std 1

    def chosen(gamma):
        w = w0 + gamma * np.outer(profile, mu) / (mu @ mu)
        return w, np.argsort(-(h[-1] @ w.T), axis=1, kind="stable")[:, :top_k]

    lo, hi = 0.0, 4.0
    for _ in range(12):
        gamma = (lo + hi) / 2
        if _layer_hit_rate(chosen(gamma)[1], CALIBRATION_SLOTS) < CALIBRATION_MIN:
            lo = gamma
        else:
            hi = gamma
    gamma = (lo + hi) / 2
    w, sel = chosen(gamma)
    groups = [(0, sorted(r.tolist()), True) for r in sel]
    lh, lm = sim.lru(groups, CALIBRATION_SLOTS, n_experts)
    counts = np.sort(np.bincount(sel.ravel(), minlength=n_experts))[::-1]
    return w, {"gamma": round(gamma, 3), "min_hit": round(_layer_hit_rate(sel, CALIBRATION_SLOTS), 3),
               "lru_hit": round(lh / (lh + lm), 3), "overlap": round(_overlap(sel), 3),
               "top8_share": round(float(counts[:8].sum() / counts.sum()), 3)}


def _overlap(sel):
    """Mean share of a token's experts that the previous token also had, one layer."""
    k = sel.shape[1]
    return float(np.mean([len(set(a) & set(b)) / k for a, b in zip(sel[1:].tolist(), sel[:-1].tolist())]))


def construct_routers(hf_dir, words, threads):
    """Makes the checkpoint in `hf_dir` route like a trained MoE: the token embeddings at std
    EMBED_STD, and every layer's router (mlp.gate.weight) fitted in one forward pass over
    CONSTRUCT_WINDOWS windows of the text, by a hook before each router that fits it on the
    hidden states reaching it (each layer sees the routing of the ones below as built).  Writes
    routers.json (the calibration of each layer) last; skipped when it is there."""
    report = hf_dir / "routers.json"
    if report.exists():
        return json.loads(report.read_text())
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM
    log(f"{NAME}: constructing the routers on {CONSTRUCT_WINDOWS} x {CONSTRUCT_LEN} tokens of the text (one forward pass)")
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    cfg = model.config
    embed = model.model.embed_tokens.weight
    embed.data = (embed.data * (EMBED_STD / embed.data.std())).to(torch.bfloat16).float()   # idempotent
    span = words[CONSTRUCT_FROM:CONSTRUCT_FROM + CONSTRUCT_WINDOWS * (CONSTRUCT_LEN - 1)]
    if len(span) < CONSTRUCT_WINDOWS * (CONSTRUCT_LEN - 1):
        raise SystemExit(f"{TEXT} is too short to construct the routers on")
    windows = np.array([[BOS] + span[i * (CONSTRUCT_LEN - 1):(i + 1) * (CONSTRUCT_LEN - 1)] for i in range(CONSTRUCT_WINDOWS)])
    skip = 16   # each window's first positions: the residual stream is still settling there
    rng = np.random.default_rng(vs.SEED)
    new = {"model.embed_tokens.weight": embed.data.to(torch.bfloat16).clone()}
    calibration = []

    def hook(layer):
        def fit(module, args):
            h = args[0].detach().reshape(CONSTRUCT_WINDOWS, CONSTRUCT_LEN, -1)[:, skip:]
            w, info = fit_router(h.double().numpy(), windows[:, skip:], cfg.num_experts, cfg.num_experts_per_tok, rng)
            module.weight.data = torch.from_numpy(w).to(torch.bfloat16).float()
            new[f"model.layers.{layer}.mlp.gate.weight"] = module.weight.data.to(torch.bfloat16).contiguous()
            calibration.append({"layer": layer, **info})
            log(f"  layer {layer:2d}: {info}")
        return fit

    for layer, block in enumerate(model.model.layers):
        block.mlp.gate.register_forward_pre_hook(hook(layer))
    with torch.no_grad():
        model(torch.from_numpy(windows))
    del model
    index = json.loads((hf_dir / "model.safetensors.index.json").read_text())["weight_map"]
    for shard in sorted({index[name] for name in new}):
        tensors = load_file(str(hf_dir / shard))
        tensors.update({name: t for name, t in new.items() if index[name] == shard})
        save_file(tensors, str(hf_dir / (shard + ".tmp")), metadata={"format": "pt"})
        os.replace(hf_dir / (shard + ".tmp"), hf_dir / shard)
    result = {"embed_std": EMBED_STD, "calibration": {"slots": CALIBRATION_SLOTS, "min_hit": CALIBRATION_MIN},
              "layers": calibration}
    report.write_text(json.dumps(result, indent=1))
    return result


def prepare(work, threads):
    """The bench model: (GGUF Q4_0 for llama.cpp, colibri directory, router calibration)."""
    vs.ensure_llama_cpp()
    tree = vs.llama_cpp_source(work)
    hf = work / f"{NAME}-hf"
    vs.build_hf_model("qwen3moe", hf)
    calibration = construct_routers(hf, text_tokens(), threads)
    bf16, q4 = work / f"{NAME}-bf16.gguf", work / f"{NAME}-q4_0.gguf"
    vs.make_gguf(tree, hf, bf16)
    vs.quantize(bf16, q4, "q4_0")
    col = work / f"{NAME}-q4_0.colibri"
    if not (col / "colibri_model.json").exists():
        log(f"colibri convert {q4.name} -> {col.name} (interleaved layout)")
        subprocess.run([sys.executable, "-m", "colibri", "convert", str(q4), str(col), "--layout", "interleaved"],
                       check=True, cwd="/")
    return q4, col, calibration


# ---- 3. the demands and what a cache could do with them -----------------------------------------

WORKER_RECORD = r"""
import json, sys
import numpy as np
import colibri
a = json.loads(sys.argv[1])
s = colibri.Model(a["path"], threads=a["threads"]).session(ctx=a["ctx"], batch=128)
s.prefill(a["prompt"])
prompt = s.expert_load(clear=True)
steps = []
for tok in a["decode"]:
    s.step(tok)
    load = s.expert_load(clear=True)
    steps.append([np.flatnonzero(row).tolist() for row in load])
print(json.dumps({"prompt": [np.flatnonzero(row).tolist() for row in prompt], "steps": steps}))
"""


def record_demands(col, prompt, decode, threads):
    """{prompt: per layer the experts the prompt's chunk demanded, steps: per decode token, per
    layer its experts}, from a resident colibri session."""
    arg = {"path": str(col), "threads": threads, "ctx": len(prompt) + len(decode) + 8, "prompt": prompt, "decode": decode}
    out = subprocess.run([sys.executable, "-c", WORKER_RECORD, json.dumps(arg)], capture_output=True, text=True, cwd="/")
    if out.returncode:
        raise SystemExit(f"recording the demands failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def demand_groups(demands):
    """The groups expert_cache_sim simulates: the prompt's experts one by one (a chunk is computed
    expert by expert), then each decode token's top-k of each layer together, measured."""
    groups = [(layer, [e], False) for layer, experts in enumerate(demands["prompt"]) for e in experts]
    for step in demands["steps"]:
        groups += [(layer, experts, True) for layer, experts in enumerate(step) if experts]
    return groups


def routing_statistics(demands, n_experts):
    """Per layer over the decode tokens: shares of the 8 and 16 most popular experts, the entropy of
    the popularity (bits; uniform: log2 E), the mean share of a token's experts the previous
    token had (independent uniform routing: top_k / E), experts never demanded."""
    steps = demands["steps"]
    rows = []
    for layer in range(len(steps[0])):
        sets = [step[layer] for step in steps]
        counts = np.bincount([e for s in sets for e in s], minlength=n_experts)
        share = np.sort(counts)[::-1] / counts.sum()
        p = share[share > 0]
        overlap = np.mean([len(set(a) & set(b)) / len(a) for a, b in zip(sets[1:], sets[:-1])])
        rows.append({"layer": layer, "top8": share[:8].sum(), "top16": share[:16].sum(),
                     "entropy": float(-(p * np.log2(p)).sum()), "overlap": float(overlap),
                     "unused": int((counts == 0).sum())})
    return rows


def oracle_hit_rates(groups, slots, n_experts, n_layers):
    """{policy: hit rate} over the decode demands at `slots` slots, global and per-layer pools."""
    out = {}
    for name, policy in (("min", sim.belady), ("lru", sim.lru)):
        h, m = policy(groups, slots, n_experts)
        out[name] = h / (h + m)
        h, m = sim.per_layer(policy, groups, slots, n_experts, n_layers)
        out[name + "_per_layer"] = h / (h + m)
    return out


# ---- 4. the disk, the page cache, the memory limit ----------------------------------------------

def disk_bandwidth(path):
    """Bytes/s of `dd if=path of=/dev/null bs=4M iflag=direct` (the page cache bypassed)."""
    out = subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=4M", "iflag=direct"], capture_output=True, text=True)
    m = re.search(r"(\d+) bytes .* copied, ([\d.]+) s", out.stderr)
    if out.returncode or not m:
        raise SystemExit(f"dd over {path} failed:\n{out.stderr}")
    return int(m.group(1)) / float(m.group(2))


def random_read_bandwidth(path, offset, size, extent, reads=64, seed=0):
    """Bytes/s of `reads` reads of `extent` bytes at random 4 KiB-aligned offsets in [offset,
    offset + size), O_DIRECT, one at a time: an expert miss's read, as the I/O thread issues it."""
    import mmap
    rng = np.random.default_rng(seed)
    buf = mmap.mmap(-1, -(-extent // 4096) * 4096)   # page-aligned, whole pages, as O_DIRECT wants
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        start = time.perf_counter()
        for _ in range(reads):   # offsets on 4 KiB (the extents' own need not be)
            at = (offset + int(rng.integers(0, (size - extent) // 4096)) * 4096) // 4096 * 4096
            os.preadv(fd, [buf], at)
        return reads * extent / (time.perf_counter() - start)
    finally:
        os.close(fd)


def drop_page_cache(path):
    """Evicts `path` from the page cache (the pages nobody maps); returns the bytes still resident."""
    for attempt in range(3):   # pages still under a read ahead are skipped: try again after it
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)   # dirty pages stay
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        left = resident_bytes(path)
        if not left:
            break
        time.sleep(0.2)
    return left


def resident_bytes(path):
    """Bytes of `path` in the page cache (mincore over a mapping that touches nothing)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size, page = os.path.getsize(path), os.sysconf("SC_PAGE_SIZE")
    if size == 0:
        return 0
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)   # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        vec = (ctypes.c_ubyte * ((size + page - 1) // page))()
        try:
            if libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(v & 1 for v in vec) * page


def memory_cgroup_parent():
    """This process's memory cgroup directory (measured runs go in a child of it); the v1 memory
    controller is mounted when it is not."""
    if not (CGROUP_ROOT / "cgroup.procs").exists():
        CGROUP_ROOT.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "cgroup", "-o", "memory", "none", str(CGROUP_ROOT)], check=True)
    for line in open("/proc/self/cgroup"):
        _, controllers, path = line.rstrip("\n").split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_ROOT / path.lstrip("/")
    return CGROUP_ROOT


# ---- 5. the runs --------------------------------------------------------------------------------

WORKER_COLIBRI = vs.PEAK + r"""
import json, resource, sys, time
import colibri
a = json.loads(sys.argv[1])
def read_bytes():
    return next(int(l.split()[1]) for l in open("/proc/self/io") if l.startswith("read_bytes:"))
COUNTERS = ("hits", "misses", "prefetches", "prefetch_hits", "bytes_read", "reads", "io_wait_ns")
def stats(s):
    return s.expert_cache_stats() if a["budget"] else {}
model = colibri.Model(a["path"], threads=a["threads"])
opts = {}
if a["budget"]:
    opts = dict(expert_budget=a["budget"], expert_cache=a["cache"], direct_io=a["direct_io"], prefetch=a["prefetch"])
s = model.session(ctx=a["ctx"], batch=128, **opts)
if a.get("plan"):
    print(json.dumps({"memory": s.memory(), "slots": list(model.expert_slots(**opts)),
                      "tensors": model.tensors(), "peak": PEAK()}))
    sys.exit(0)
prompt = a["prompt"]
s.prefill(prompt[:8]); s.reset()                       # warm, as benchmarks/vs_llamacpp.py does
r0, t = read_bytes(), time.perf_counter()
s.prefill(prompt)
pp = time.perf_counter() - t
token = s.sample()
r1, c1, f1 = read_bytes(), stats(s), resource.getrusage(resource.RUSAGE_SELF).ru_majflt
t, done = time.perf_counter(), 0
for tok in a["decode"]:                                # stopped after max_decode_s: a thrashing run's rate is steady
    token = s.step(tok); done += 1
    if time.perf_counter() - t > a["max_decode_s"]:
        break
tg = time.perf_counter() - t
r2, c2, f2 = read_bytes(), stats(s), resource.getrusage(resource.RUSAGE_SELF).ru_majflt
print(json.dumps({"pp": len(prompt) / pp, "tg": done / tg, "decoded": done, "last": token, "read_open": r0,
                  "read_prompt": r1 - r0, "read_decode": r2 - r1, "majflt_decode": f2 - f1, "memory": s.memory(),
                  "cache": {k: c2[k] - c1[k] for k in COUNTERS} if c2 else {},
                  "peak": PEAK()}))
"""

WORKER_LLAMA = vs.PEAK + r"""
import json, resource, sys, time
import numpy as np
import llama_cpp
import llama_cpp.llama_cpp as capi
a = json.loads(sys.argv[1])
def read_bytes():
    return next(int(l.split()[1]) for l in open("/proc/self/io") if l.startswith("read_bytes:"))
defaults = capi.llama_model_default_params
def model_params():   # no repacked copy of the weights: they stay in the mapped file
    p = defaults(); p.use_extra_bufts = False; return p
capi.llama_model_default_params = model_params
llm = llama_cpp.Llama(model_path=a["path"], n_ctx=a["ctx"], n_batch=128, n_ubatch=128, n_threads=a["threads"],
                      n_threads_batch=a["threads"], use_mmap=True, verbose=False)
def greedy():
    return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))))
prompt = a["prompt"]
llm.eval(prompt[:8]); llm.reset()
r0, t = read_bytes(), time.perf_counter()
llm.eval(prompt)
pp = time.perf_counter() - t
token = greedy()
r1, f1 = read_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_majflt
t, done = time.perf_counter(), 0
for tok in a["decode"]:
    llm.eval([tok]); token = greedy(); done += 1
    if time.perf_counter() - t > a["max_decode_s"]:
        break
tg = time.perf_counter() - t
r2, f2 = read_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_majflt
print(json.dumps({"pp": len(prompt) / pp, "tg": done / tg, "decoded": done, "last": token, "read_open": r0,
                  "read_prompt": r1 - r0, "read_decode": r2 - r1, "majflt_decode": f2 - f1,
                  "peak": PEAK()}))
"""


def user_ticks():
    """CPU ticks the whole machine spent in user space (/proc/stat: user + nice): a neighbour's
    computing, not the kernel's reads and reclaim that a streaming or thrashing run causes."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return fields[0] + fields[1]


def run_worker(code, arg, limit=None, cgroup_parent=None, tag="run"):
    """One run in a fresh process, in a memory cgroup of `limit` bytes when given.  Returns the
    worker's JSON plus rss (its peak, bytes, where it reports one), other_cpu (cores other processes used in user space), and with a
    limit the cgroup's peak charge (page cache included) and whether it killed the run (oom)."""
    cmd = [sys.executable, "-c", code, json.dumps(arg)]
    group = None
    if limit is not None:
        group = cgroup_parent / f"colibri-stream-{os.getpid()}-{tag}"
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(int(limit)))
        cmd = ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *cmd]
    tick = os.sysconf("SC_CLK_TCK")
    busy0, wall0 = user_ticks(), time.perf_counter()
    try:
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, cwd="/",
                                    env=dict(os.environ, COLIBRI_THREADS=str(arg["threads"])))
            out = proc.stdout.read()
            _, status, usage = os.wait4(proc.pid, 0)
            code_ = os.waitstatus_to_exitcode(status)
            busy1, wall = user_ticks(), time.perf_counter() - wall0
            err.seek(0)
            stderr = err.read().decode(errors="replace")
        result = {}
        if group is not None:
            result["cgroup_peak"] = int((group / "memory.max_usage_in_bytes").read_text())
            result["oom"] = code_ == -9 or "oom_kill 1" in (group / "memory.oom_control").read_text()
        if code_ != 0:
            if result.get("oom"):
                return {**result, "failed": "killed at the memory limit"}
            raise SystemExit(f"{tag} failed ({code_}):\n{stderr[-3000:]}")
        result.update(json.loads(out.decode().strip().splitlines()[-1]))
        # the worker's own VmHWM, where it reports one: ru_maxrss would count the parent's at the fork
        result["rss"] = result.pop("peak", None)
        result["other_cpu"] = max(0.0, ((busy1 - busy0) / tick - usage.ru_utime) / wall)
        return result
    finally:
        if group is not None:
            try:
                (group / "memory.force_empty").write_text("0")
            except OSError:
                pass
            group.rmdir()


# ---- 6. the table -------------------------------------------------------------------------------

def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def tokens_per_s(rs):
    """Median tokens/s; "-" when not run, "killed" when every run was."""
    ok = quiet(rs)
    return fmt(med(r["tg"] for r in ok), ".1f") if ok or not rs else "killed"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=HERE.parent / "build" / "bench-stream")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--budgets", default="25,50,75,100", help="percent of the routed experts that get a slot")
    p.add_argument("--cache", default="global", choices=["global", "per_layer"])
    p.add_argument("--buffered-io", action="store_true", help="pread through the page cache, not O_DIRECT")
    p.add_argument("--no-prefetch", action="store_true")
    p.add_argument("--decode", type=int, default=128, help="tokens decoded after the 128-token prompt")
    p.add_argument("--max-decode-s", type=float, default=60.0,
                   help="a run stops decoding after this long (thrashing runs: their rate is steady)")
    p.add_argument("--engines", default="colibri,colibri mmap,llama.cpp",
                   help="which of colibri (streaming), colibri mmap, llama.cpp to run")
    p.add_argument("--prepare", action="store_true", help="only build the model and record its routing")
    p.add_argument("--out", type=Path, default=HERE / "results" / "expert_stream.md")
    args = p.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)

    gguf_file, col, calibration = prepare(work, args.threads)
    prompt, decode = bench_tokens(text_tokens(), args.decode)
    ctx = len(prompt) + len(decode) + 8
    demands = record_demands(col, prompt, decode, args.threads)
    n_layers, n_experts = len(demands["steps"][0]), 64
    groups = demand_groups(demands)
    stats = routing_statistics(demands, n_experts)
    if args.prepare:
        for r in stats:
            log(f"layer {r['layer']:2d}: top-8 {r['top8']:.0%} top-16 {r['top16']:.0%} entropy {r['entropy']:.2f} bits "
                f"overlap {r['overlap']:.0%} unused {r['unused']}")
        for frac in (12.5, 25, 37.5, 50, 75):
            slots = int(frac / 100 * n_layers * n_experts)
            log(f"{frac}% slots: {oracle_hit_rates(groups, slots, n_experts, n_layers)}")
        return

    # the plan of each budget: slot size, arena, the limit
    base = dict(path=str(col), threads=args.threads, ctx=ctx, cache=args.cache, direct_io=not args.buffered_io,
                prefetch=not args.no_prefetch)
    plan0 = run_worker(WORKER_COLIBRI, {**base, "budget": 0, "plan": True}, tag="plan")
    tensors = plan0["tensors"]
    expert_bytes = sum(t["file_size"] for t in tensors if "expert_stride" in t)
    other_bytes = sum(t["file_size"] for t in tensors if "expert_stride" not in t)
    parent = memory_cgroup_parent()
    overhead = max(run_worker(f"import numpy, {module}; print('{{}}')", {"threads": 1}, limit=1 << 40,
                              cgroup_parent=parent, tag=f"base-{module}")["cgroup_peak"] for module in ("colibri", "llama_cpp"))
    slot_bytes, min_budget = plan0["slots"]
    budgets = {}
    for pct in [float(b) for b in args.budgets.split(",")]:   # pct of the experts get a slot
        slots = round(pct / 100 * n_layers * n_experts)
        budget = max(slots * slot_bytes, min_budget)
        plan = run_worker(WORKER_COLIBRI, {**base, "budget": budget, "plan": True}, tag="plan")
        budgets[pct] = {"budget": budget, "slots": budget // slot_bytes, "slot_bytes": slot_bytes,
                        "arena": plan["memory"]["arena_reserved"],
                        "limit": overhead + plan["memory"]["arena_reserved"] + other_bytes}
        budgets[pct].update(oracle_hit_rates(groups, budgets[pct]["slots"], n_experts, n_layers))
        log(f"budget {pct:g}%: {budget / 2**20:.0f} MiB, {budgets[pct]['slots']} slots of {slot_bytes} B, "
            f"limit {budgets[pct]['limit'] / 2**20:.0f} MiB; MIN {budgets[pct]['min']:.1%} (per layer "
            f"{budgets[pct]['min_per_layer']:.1%}), LRU {budgets[pct]['lru']:.1%} ({budgets[pct]['lru_per_layer']:.1%})")
    disk = disk_bandwidth(col / "weights.bin")
    first = min(t["file_offset"] for t in tensors if "expert_stride" in t)
    disk_random = random_read_bandwidth(col / "weights.bin", first, expert_bytes, expert_bytes // (n_layers * n_experts))
    log(f"disk: {disk / 1e6:.0f} MB/s sequential (dd bs=4M iflag=direct), {disk_random / 1e6:.0f} MB/s in one-expert "
        f"reads (O_DIRECT, one at a time); memory overhead of the Python process {overhead / 2**20:.0f} MiB")

    files = [col / "weights.bin", gguf_file]
    feed = {"prompt": prompt, "decode": decode, "ctx": ctx, "threads": args.threads, "max_decode_s": args.max_decode_s}
    runners = {   # engine: (worker, its argument at a budget)
        "colibri": lambda b: (WORKER_COLIBRI, {**base, **feed, "budget": b}),
        "colibri mmap": lambda b: (WORKER_COLIBRI, {**base, **feed, "budget": 0}),
        "llama.cpp": lambda b: (WORKER_LLAMA, {**feed, "path": str(gguf_file)}),
    }
    engines = args.engines.split(",")
    runs = collections.defaultdict(list)
    for rep in range(args.reps):   # interleaved: every configuration once per repetition
        for f in files:
            vs.warm_page_cache(f)
        for engine in [e for e in ("colibri", "llama.cpp") if e in engines]:
            code, arg = runners["colibri mmap" if engine == "colibri" else engine](0)
            r = run_worker(code, arg, tag=f"resident-{engine}")
            runs["resident", engine].append(r)
            log(f"rep {rep + 1}/{args.reps} resident {engine:12s} tg {r['tg']:6.1f}  others {r['other_cpu']:.2f} cores")
        for pct, b in budgets.items():
            for engine in [e for e in runners if e in engines]:
                left = [drop_page_cache(f) for f in files]
                if any(left):
                    log(f"  page cache: {left} bytes of {[f.name for f in files]} still resident after the drop")
                code, arg = runners[engine](b["budget"])
                r = run_worker(code, arg, limit=b["limit"], cgroup_parent=parent, tag=f"{engine.replace(' ', '-')}-{pct:g}")
                r["resident_after_drop"] = sum(left)
                runs[pct, engine].append(r)
                log(f"rep {rep + 1}/{args.reps} {pct:g}% {engine:12s} " + (r["failed"] if "failed" in r else
                    f"tg {r['tg']:6.1f}  read {r['read_decode'] / r['decoded'] / 2**20:6.2f} MiB/token ({r['decoded']} tokens)  "
                    f"peak {r['cgroup_peak'] / 2**20:.0f} MiB  others {r['other_cpu']:.2f} cores"
                    + (f"  hits {r['cache']['hits']} misses {r['cache']['misses']}" if r.get("cache") else "")))

    table = report(args, runs, budgets, demands, groups, calibration, dict(
        disk=disk, disk_random=disk_random, overhead=overhead, expert_bytes=expert_bytes, other_bytes=other_bytes,
        n_layers=n_layers, n_experts=n_experts, prompt=len(prompt), decode=len(decode)))
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps({
        "args": {k: str(v) for k, v in vars(args).items()}, "budgets": budgets, "disk": disk, "disk_random": disk_random,
        "overhead": overhead, "runs": [{"config": list(key), "runs": rs} for key, rs in runs.items()]}, indent=1) + "\n")


def quiet(rs):
    """The runs that finished, the quiet ones when there are any."""
    ok = [r for r in rs if "failed" not in r]
    return [r for r in ok if r["other_cpu"] < QUIET_OTHER_CPU] or ok


def pairs(a, b):
    """The interleaved pairs (one repetition each) that both finished, the quiet ones when any are."""
    ok = [(x, y) for x, y in zip(a, b) if "failed" not in x and "failed" not in y]
    return [(x, y) for x, y in ok if max(x["other_cpu"], y["other_cpu"]) < QUIET_OTHER_CPU] or ok


def report(args, runs, budgets, demands, groups, calibration, m):
    n, mib = m["decode"], 2**20
    res_c, res_l = quiet(runs["resident", "colibri"]), quiet(runs["resident", "llama.cpp"])
    tg_res = med(r["tg"] for r in res_c)
    extent = m["expert_bytes"] / (m["n_layers"] * m["n_experts"])
    lines = [f"# Expert streaming: colibri against llama.cpp {vs.LLAMA_CPP_VERSION} under a memory limit, {datetime.date.today()}", "",
             f"Machine: {vs.machine()}.  Disk: {m['disk'] / 1e6:.0f} MB/s sequential (`dd bs=4M iflag=direct` over weights.bin), "
             f"{m['disk_random'] / 1e6:.0f} MB/s in one-expert reads ({extent / 1024:.0f} KiB at random offsets, O_DIRECT, one at a time).",
             f"Model: {NAME} ({m['n_layers']} layers, {m['n_experts']} experts, top-8, Q4_0 pure: routed experts "
             f"{m['expert_bytes'] / mib:.0f} MiB, the rest {m['other_bytes'] / mib:.0f} MiB), routers constructed for skewed, "
             f"token-dependent routing (below).  Text: {TEXT}, a {m['prompt']}-token prompt then {n} tokens decoded one at a "
             f"time, each engine fed the text's next token.",
             f"{args.threads} threads, {args.reps} interleaved repetitions, each run a fresh process; medians of the quiet runs "
             f"(other processes < {QUIET_OTHER_CPU:.0%} of a core in user space; all when none was).  Streaming: {args.cache} cache, "
             f"{'buffered pread' if args.buffered_io else 'O_DIRECT'}, prefetch {'off' if args.no_prefetch else 'on'}.  "
             f"Each budget's runs are in a memory cgroup of its limit: colibri's arena with the slots + the non-expert weights "
             f"+ {m['overhead'] / mib:.0f} MiB for the Python process; weights.bin and the GGUF are dropped from the page cache "
             f"before each (posix_fadvise DONTNEED, checked with mincore).  Resident: both files in the page cache, no limit; "
             f"llama.cpp without its repacked copy of the weights (use_extra_bufts off) everywhere, so that it reads the mapped file.", "",
             "| budget | limit | colibri tok/s | ratio to resident | hit rate (1 - reads/demands) | MIN | LRU | read/token (MiB) | "
             "time/token / max(resident, read/disk) | llama.cpp tok/s | llama.cpp read/token (MiB) | ratio to llama.cpp | "
             "colibri mmap tok/s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    pool = "_per_layer" if args.cache == "per_layer" else ""
    ratio = lambda a, b: med(x["tg"] / y["tg"] for x, y in pairs(a, b))
    over_bound = lambda a, b: med((1 / x["tg"]) / max(1 / y["tg"], x["cache"]["bytes_read"] / x["decoded"] / m["disk"])
                                  for x, y in pairs(a, b))
    lines.append(f"| resident | - | {tg_res:.1f} | 1 | - | - | - | - | - | {tokens_per_s(runs['resident', 'llama.cpp'])} | - | "
                 f"{fmt(ratio(runs['resident', 'colibri'], runs['resident', 'llama.cpp']), '.2f')} | - |")
    for pct, b in budgets.items():
        c, l = (quiet(runs[pct, e]) for e in ("colibri", "llama.cpp"))
        tg = med(r["tg"] for r in c)
        demanded = [r["cache"]["hits"] + r["cache"]["misses"] for r in c]
        hit = med(r["cache"]["hits"] / d for r, d in zip(c, demanded) if d)
        by_reads = med(1 - r["cache"]["bytes_read"] / extent / d for r, d in zip(c, demanded) if d)
        read_l = med(r["read_decode"] / r["decoded"] for r in l)
        lines.append(
            f"| {pct:g}% ({b['budget'] / mib:.0f} MiB, {b['slots']} slots) | {b['limit'] / mib:.0f} MiB | {fmt(tg, '.1f')} | "
            f"{fmt(ratio(runs[pct, 'colibri'], runs['resident', 'colibri']), '.2f')} | {fmt(hit, '.1%')} ({fmt(by_reads, '.1%')}) | {b['min' + pool]:.1%} | "
            f"{b['lru' + pool]:.1%} | "
            f"{fmt(med(r['read_decode'] / r['decoded'] for r in c) and med(r['read_decode'] / r['decoded'] for r in c) / mib, '.2f')} | "
            f"{fmt(over_bound(runs[pct, 'colibri'], runs['resident', 'colibri']), '.2f')} | {tokens_per_s(runs[pct, 'llama.cpp'])} | "
            f"{fmt(read_l and read_l / mib, '.2f')} | {fmt(ratio(runs[pct, 'colibri'], runs[pct, 'llama.cpp']), '.2f')} | "
            f"{tokens_per_s(runs[pct, 'colibri mmap'])} |")
    lines += ["", "hit rate: colibri's hits / (hits + misses) over the decode tokens, a prefetched expert found in its slot "
              "counting as a hit; in parentheses 1 - experts read / experts demanded, prefetches included, which is what MIN "
              "bounds.  MIN, LRU: simulated on the exact demands of the same decode tokens (recorded from resident colibri; "
              f"benchmarks/expert_cache_sim.py), the same number of slots in one {args.cache.replace('_', '-')} pool, the "
              "prompt warming the cache.  read/token: /proc/self/io read_bytes over the decode (expert reads, and the page "
              "faults of whatever is mapped).  time/token / max(...): colibri's time per token over max(resident time per "
              "token, its cache's bytes read per token / the dd bandwidth).  Ratios and that quotient: medians over the "
              "interleaved pairs (the same repetition's resident run, or llama.cpp's run).  "
              "colibri mmap: colibri resident (weights.bin mapped whole) under the same limit.", "",
              "Per configuration (medians): the cache's reads, prefetches, I/O wait; major page faults in the decode; the "
              "cgroup's peak charge (page cache included); the last greedy token (the same everywhere when the logits are):", ""]
    for pct in budgets:
        for engine in ("colibri", "colibri mmap", "llama.cpp"):
            ok = quiet(runs[pct, engine])
            killed = sum("failed" in r for r in runs[pct, engine])
            if not runs[pct, engine]:
                continue
            if not ok:
                lines.append(f"- {pct:g}% {engine}: killed at the memory limit in every run")
                continue
            detail = ""
            if ok[0].get("cache"):
                detail = (f"cache read {med(r['cache']['bytes_read'] / r['decoded'] for r in ok) / mib:.2f} MiB/token in "
                          f"{med(r['cache']['reads'] / r['decoded'] for r in ok):.1f} reads, prefetches {med(r['cache']['prefetches'] / r['decoded'] for r in ok):.1f}"
                          f"/token ({med(r['cache']['prefetch_hits'] / r['decoded'] for r in ok):.1f} hit), I/O wait "
                          f"{med(r['cache']['io_wait_ns'] / r['decoded'] for r in ok) / 1e6:.2f} ms/token; ")
            lines.append(f"- {pct:g}% {engine}: {detail}major faults {med(r['majflt_decode'] for r in ok):.0f}, peak "
                         f"{med(r['cgroup_peak'] for r in ok) / mib:.0f} MiB, read while opening and warming "
                         f"{med(r['read_open'] for r in ok) / mib:.0f} MiB, in the prompt {med(r['read_prompt'] for r in ok) / mib:.0f} "
                         f"MiB, decoded {min(r['decoded'] for r in ok)}-{max(r['decoded'] for r in ok)} tokens, last token "
                         f"{sorted({r['last'] for r in ok if r['decoded'] == n}) or '-'}, runs {len(ok)} used of {len(runs[pct, engine])}"
                         + (f", {killed} killed" if killed else ""))
    lines.append(f"- resident: last token colibri {sorted({r['last'] for r in res_c})}, llama.cpp {sorted({r['last'] for r in res_l})}")
    lines += routing_report(routing_statistics(demands, m["n_experts"]), groups, m["n_experts"], m["n_layers"], calibration)
    return "\n".join(lines) + "\n"


def routing_report(stats, groups, n_experts, n_layers, calibration):
    k = 8
    mean = lambda key: sum(r[key] for r in stats) / len(stats)
    lines = ["", "## Routing of the bench model on the text (decode tokens)", "",
             f"Averages over the {n_layers} layers: the 8 most popular experts take {mean('top8'):.0%} of a layer's demands "
             f"(uniform: {8 / n_experts:.1%}), the 16 most popular {mean('top16'):.0%} ({16 / n_experts:.0%}); popularity entropy "
             f"{mean('entropy'):.2f} bits (uniform: {math.log2(n_experts):.0f}); a token shares {mean('overlap'):.0%} of its experts "
             f"with the previous token (independent uniform routing: {k / n_experts:.1%}).  The routers were calibrated, layer by "
             f"layer on another part of the text (float32 forward pass of the bf16 checkpoint), to MIN {CALIBRATION_MIN:.1%} at "
             f"{CALIBRATION_SLOTS} slots of {n_experts} a layer (JustVugg/colibri's OLMoE-1B-7B measurement).", "",
             "MIN and LRU on these demands, by cache size (share of all routed experts):", "",
             "| slots | share | MIN global | LRU global | MIN per layer | LRU per layer |", "|---|---|---|---|---|---|"]
    total = n_layers * n_experts
    for frac in (0.125, 0.25, 0.375, 0.5, 0.75, 1.0):
        slots = int(frac * total)
        o = oracle_hit_rates(groups, slots, n_experts, n_layers)
        lines.append(f"| {slots} | {frac:.1%} | {o['min']:.1%} | {o['lru']:.1%} | {o['min_per_layer']:.1%} | {o['lru_per_layer']:.1%} |")
    lines += ["", "| layer | top-8 share | top-16 share | entropy (bits) | overlap with previous token | experts unused | "
              "calibration gamma |", "|---|---|---|---|---|---|---|"]
    cal = {c["layer"]: c for c in calibration["layers"]}
    for r in stats:
        lines.append(f"| {r['layer']} | {r['top8']:.0%} | {r['top16']:.0%} | {r['entropy']:.2f} | {r['overlap']:.0%} | "
                     f"{r['unused']} | {cal.get(r['layer'], {}).get('gamma', '-')} |")
    return lines


if __name__ == "__main__":
    main()

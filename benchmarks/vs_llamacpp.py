"""colibri against llama.cpp on identical weights: decode, prefill, peak RSS, and the share of the
memory-bandwidth limit each reaches.

    python benchmarks/vs_llamacpp.py [--work DIR] [--reps 3] [--threads 1,2] [--models qwen3moe,mixtral]
                                     [--types bf16,q8_0,q4_0,q4_k_m] [--families native,avx2] [--contended] [--out FILE]

One command does everything, caching what it made under --work (default build/bench):
  1. builds the two bench models (MODELS: Qwen3-MoE's and Mixtral's layouts at hidden 1024, 24 layers)
     as Hugging Face checkpoints: random weights N(0, 0.02), norms 1, bf16, seed fixed, hub tensor
     names, a synthetic SentencePiece tokenizer (32000 pieces) so llama.cpp's converter accepts them;
  2. installs llama-cpp-python from PyPI when missing (built for this CPU), and takes llama.cpp's own
     converter from its source distribution; on a CPU with AVX-512 it also builds llama.cpp without it
     (GGML_NATIVE off, AVX2 on, AVX-512 off) into --work, so the AVX2 family (colibri with
     COLIBRI_KERNELS=avx2 against that build) is measured in the same run as the AVX-512 one;
  3. converts each checkpoint to a BF16 GGUF with that converter, quantizes it with llama.cpp
     (Q8_0, Q4_0: every tensor in the one type, `pure`; Q4_K_M and the other llama.cpp file types
     by name: llama.cpp's own mix of types), and imports every GGUF into colibri with no options, as a
     user does (`colibri convert x.gguf out`: the matmuls whose format this machine's kernels run
     faster row-interleaved stored so, q4_0x8, q4_kx8, ...: the same blocks, moved; the rest byte for
     byte; --no-repack: every tensor byte for byte): both engines read the same weights;
  4. measures the bandwidth with a STREAM-style triad (benchmarks/stream.c) on the same threads;
  5. runs both engines interleaved (llama.cpp, colibri, llama.cpp, ...), each run a fresh process:
     a 128-token prompt in one forward (pp128), then 64 greedy tokens (tg64), tokens/s by the wall
     clock around the same calls, peak RSS of the process; per run, the CPU time other processes
     took (/proc/stat) marks it quiet or not;
  6. prints one table per thread count (medians of the quiet runs; the ratio to llama.cpp as the
     median of the per-pair ratios) and writes it, with the CPU it found and the date, to --out.
--contended repeats decode with one busy process beside the engines.
"""
import argparse
import contextlib
import datetime
import fcntl
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
LLAMA_CPP_VERSION = "0.3.36"
SEED = 0
VOCAB = 32000
MODELS = {   # 64 experts top-8 with narrow experts; 8 experts top-2 with wide ones
    "qwen3moe": dict(arch="Qwen3MoeForCausalLM", hidden=1024, layers=24, heads=16, kv_heads=4, head_dim=64,
                     experts=64, top_k=8, ffn=256),
    "mixtral": dict(arch="MixtralForCausalLM", hidden=1024, layers=24, heads=16, kv_heads=4, head_dim=64,
                    experts=8, top_k=2, ffn=2304),
}
PURE_TYPES = ("q8_0", "q4_0")
PROMPT_TOKENS, DECODE_TOKENS = 128, 64
QUIET_OTHER_CPU = 0.10      # a run is quiet when other processes took < 10% of one core


def log(msg):
    print(msg, file=sys.stderr, flush=True)


# ---- 1. the bench models ------------------------------------------------------------------------

def hf_tensors(shape):
    """(name, shape, init) of a checkpoint with hub names; init "normal" or "ones"."""
    d, L, E, f = shape["hidden"], shape["layers"], shape["experts"], shape["ffn"]
    q, kv = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    yield "model.embed_tokens.weight", (VOCAB, d), "normal"
    for l in range(L):
        p = f"model.layers.{l}."
        yield p + "input_layernorm.weight", (d,), "ones"
        yield p + "post_attention_layernorm.weight", (d,), "ones"
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            yield p + f"self_attn.{name}.weight", (rows, d), "normal"
        yield p + "self_attn.o_proj.weight", (d, q), "normal"
        if shape["arch"] == "Qwen3MoeForCausalLM":
            yield p + "self_attn.q_norm.weight", (shape["head_dim"],), "ones"
            yield p + "self_attn.k_norm.weight", (shape["head_dim"],), "ones"
            yield p + "mlp.gate.weight", (E, d), "normal"
            for e in range(E):
                yield p + f"mlp.experts.{e}.gate_proj.weight", (f, d), "normal"
                yield p + f"mlp.experts.{e}.up_proj.weight", (f, d), "normal"
                yield p + f"mlp.experts.{e}.down_proj.weight", (d, f), "normal"
        else:
            yield p + "block_sparse_moe.gate.weight", (E, d), "normal"
            for e in range(E):
                yield p + f"block_sparse_moe.experts.{e}.w1.weight", (f, d), "normal"
                yield p + f"block_sparse_moe.experts.{e}.w3.weight", (f, d), "normal"
                yield p + f"block_sparse_moe.experts.{e}.w2.weight", (d, f), "normal"
    yield "model.norm.weight", (d,), "ones"
    yield "lm_head.weight", (VOCAB, d), "normal"


def hf_config(shape):
    from transformers import MixtralConfig, Qwen3MoeConfig
    common = dict(vocab_size=VOCAB, hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
                  num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
                  max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False, torch_dtype="bfloat16",
                  bos_token_id=1, eos_token_id=2, rope_theta=1e6)
    if shape["arch"] == "Qwen3MoeForCausalLM":
        return Qwen3MoeConfig(**common, num_experts=shape["experts"], num_experts_per_tok=shape["top_k"],
                              moe_intermediate_size=shape["ffn"], intermediate_size=4 * shape["hidden"],
                              norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    return MixtralConfig(**common, num_local_experts=shape["experts"], num_experts_per_tok=shape["top_k"],
                         intermediate_size=shape["ffn"])


def sentencepiece_model(path):
    """A SentencePiece BPE model of VOCAB pieces (<unk> <s> </s>, 256 byte pieces, the rest
    synthetic words): enough for llama.cpp's converter, which only copies the vocabulary."""
    from sentencepiece import sentencepiece_model_pb2 as spm
    m = spm.ModelProto()
    m.trainer_spec.model_type = spm.TrainerSpec.BPE
    m.trainer_spec.vocab_size = VOCAB
    m.trainer_spec.byte_fallback = True
    m.trainer_spec.unk_id, m.trainer_spec.bos_id, m.trainer_spec.eos_id, m.trainer_spec.pad_id = 0, 1, 2, -1
    m.normalizer_spec.name = "identity"
    m.normalizer_spec.add_dummy_prefix = True
    m.normalizer_spec.escape_whitespaces = True
    for text, kind in (("<unk>", spm.ModelProto.SentencePiece.UNKNOWN), ("<s>", spm.ModelProto.SentencePiece.CONTROL),
                       ("</s>", spm.ModelProto.SentencePiece.CONTROL)):
        m.pieces.add(piece=text, score=0.0, type=kind)
    for b in range(256):
        m.pieces.add(piece=f"<0x{b:02X}>", score=0.0, type=spm.ModelProto.SentencePiece.BYTE)
    for i in range(VOCAB - len(m.pieces)):
        m.pieces.add(piece=f"\u2581w{i}", score=-float(i), type=spm.ModelProto.SentencePiece.NORMAL)
    path.write_bytes(m.SerializeToString())


def build_hf_model(name, out):
    """The bench model `name` as a Hugging Face checkpoint in `out` (skipped when there)."""
    shape = MODELS[name]
    out.mkdir(parents=True, exist_ok=True)
    hf_config(shape).save_pretrained(out)
    config = json.loads((out / "config.json").read_text())   # what llama.cpp's converter looks for too
    config.update(architectures=[shape["arch"]], rope_theta=1e6, num_experts=shape["experts"])
    (out / "config.json").write_text(json.dumps(config, indent=1))
    if (out / "model.safetensors.index.json").exists():
        return
    import torch
    from safetensors.torch import save_file
    from tqdm import tqdm
    sentencepiece_model(out / "tokenizer.model")
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
                                                           "eos_token": "</s>", "unk_token": "<unk>"}))
    gen = torch.Generator().manual_seed(SEED)
    shard, shard_bytes, index, n = {}, 0, {}, 0
    tensors = list(hf_tensors(shape))

    def flush():
        nonlocal shard, shard_bytes, n
        file = f"model-{n:05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        index.update({k: file for k in shard})
        shard, shard_bytes, n = {}, 0, n + 1

    for tname, tshape, init in tqdm(tensors, desc=f"{name}: random weights", unit="tensor"):
        t = torch.ones(tshape) if init == "ones" else torch.randn(tshape, generator=gen) * 0.02
        shard[tname] = t.to(torch.bfloat16)
        shard_bytes += shard[tname].numel() * 2
        if shard_bytes > 1 << 30:
            flush()
    if shard:
        flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}, indent=1))


# ---- 2. llama.cpp -------------------------------------------------------------------------------

X86_FEATURES = {"sse4_2": "SSE42", "avx": "AVX", "avx2": "AVX2", "avx_vnni": "AVX_VNNI", "bmi2": "BMI2", "fma": "FMA",
                "f16c": "F16C", "avx512f": "AVX512", "avx512vbmi": "AVX512_VBMI", "avx512_vnni": "AVX512_VNNI",
                "avx512_bf16": "AVX512_BF16"}   # /proc/cpuinfo flag -> GGML_ option


def cpu_flags():
    return set(next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), []))


def llama_cpp_cmake_args(family="native"):
    """llama.cpp built for this CPU: on x86 every SIMD extension the CPU has but AMX (`-march=native`
    would take AMX too, whose tiles need a permission from the kernel that virtual machines often
    withhold: llama.cpp then dies of SIGILL on its first quantized matmul).  Family "avx2": what an
    AVX2-only CPU (an AMD EPYC before Zen 4) runs: no AVX-512, no AVX-VNNI."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return "-DGGML_NATIVE=ON"
    flags = cpu_flags()
    if family == "avx2":
        flags = {f for f in flags if not f.startswith("avx512") and f != "avx_vnni"}
    return " ".join(["-DGGML_NATIVE=OFF"] + [f"-DGGML_{opt}={'ON' if flag in flags else 'OFF'}"
                                             for flag, opt in X86_FEATURES.items()])


# The x86 families measured: the kernels colibri is told to take (None: its pick for this CPU) and the
# llama.cpp build beside them.  "avx2" runs only where the CPU has AVX-512 (else "native" is it);
# "avx512-bf16" (colibri's bf16-activation kernels, a numerics choice, against the native llama.cpp,
# whose BF16 path rounds the activations so too) only where it has AVX512_BF16.
FAMILIES = {"native": None, "avx2": "avx2", "avx512-bf16": "avx512-bf16"}


def families_here(names):
    flags, x86 = cpu_flags(), platform.machine() in ("x86_64", "AMD64")
    runs = {"native": True, "avx2": x86 and "avx512f" in flags, "avx512-bf16": x86 and "avx512_bf16" in flags}
    return [f for f in names if runs.get(f, False)]


def ensure_llama_cpp():
    try:
        import llama_cpp   # noqa: F401
        return
    except ImportError:
        pass
    log(f"installing llama-cpp-python {LLAMA_CPP_VERSION} from PyPI, built for this CPU (about 10 minutes on 2 cores)")
    env = dict(os.environ, CMAKE_ARGS=llama_cpp_cmake_args(), CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
    # never pip's cached wheel: it may have been built for another CPU, with other flags
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", f"llama-cpp-python=={LLAMA_CPP_VERSION}"],
                   check=True, env=env)


def llama_cpp_family(work, family):
    """PYTHONPATH for a worker of `family`: "" for the installed build; for "avx2" a build of its own
    under WORK (pip --target), made once."""
    if family in ("native", "avx512-bf16"):   # the native build
        return ""
    target = work / f"llama-cpp-{family}"
    with _one_at_a_time(work):   # the suite's workers share WORK: one builds, the others wait and reuse
        if not (target / "llama_cpp" / "__init__.py").exists():
            log(f"building llama-cpp-python {LLAMA_CPP_VERSION} without AVX-512 into {target} (about 10 minutes on 2 cores)")
            env = dict(os.environ, CMAKE_ARGS=llama_cpp_cmake_args(family),
                       CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2))
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-cache-dir", "--no-deps", "--target",
                            str(target), f"llama-cpp-python=={LLAMA_CPP_VERSION}"], check=True, env=env)
    return str(target)


def llama_cpp_source(work):
    """llama.cpp's tree from the llama-cpp-python source distribution (for its converter)."""
    tree = work / f"llama_cpp_python-{LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp"
    with _one_at_a_time(work):   # two workers unpacking into one folder collide (FileExistsError)
        if (tree / "convert_hf_to_gguf.py").exists():
            return tree
        sdist = work / f"llama_cpp_python-{LLAMA_CPP_VERSION}.tar.gz"
        if not sdist.exists():
            log("downloading llama-cpp-python's source distribution for llama.cpp's converter")
            # only this package from source: with --no-binary :all: pip builds its build tools (cmake) too
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                            f"llama-cpp-python=={LLAMA_CPP_VERSION}", "-d", str(work)], check=True)
        shutil.unpack_archive(str(sdist), str(work))
    return tree


@contextlib.contextmanager
def _one_at_a_time(work):
    """An exclusive lock on WORK's llama.cpp files, across processes (pytest-xdist's workers)."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / "llama-cpp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# llama.cpp's converter, with Qwen3-MoE's vocabulary read through the SentencePiece path: its BPE
# path refuses tokenizers it does not know by hash.
CONVERTER = """
import sys
sys.path.insert(0, sys.argv.pop(1))
import convert_hf_to_gguf
from conversion import qwen
qwen.Qwen3MoeModel.set_vocab = lambda self: self._set_vocab_sentencepiece()
convert_hf_to_gguf.main()
"""


def make_gguf(tree, hf_dir, out):
    if out.exists():
        return
    log(f"llama.cpp convert_hf_to_gguf.py {hf_dir.name} -> {out.name}")
    subprocess.run([sys.executable, "-c", CONVERTER, str(tree), str(hf_dir), "--outtype", "bf16",
                    "--outfile", str(out)], check=True, env={k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"})


def quantize(src, out, kind):
    if out.exists():
        return
    import llama_cpp
    log(f"llama.cpp quantize {src.name} -> {out.name}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind.upper()}")
    params.nthread = os.cpu_count() or 2
    # q8_0, q4_0: every matrix in that type; a mix (q4_k_m: Q4_K, Q6_K for attn_v, ffn_down and
    # output, F32 norms) as llama.cpp makes the files users download.  colibri imports either byte for byte.
    params.pure = kind in PURE_TYPES
    if llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), params) != 0:
        raise SystemExit(f"llama.cpp could not quantize {src}")


def import_gguf(gguf_file, out, repack=True):
    """`colibri convert` with no options (repack False: --no-repack, byte for byte).  A model already
    under --work is kept: delete it to import it again with another colibri."""
    if (out / "colibri_model.json").exists():
        return
    log(f"colibri convert {gguf_file.name} -> {out.name}{'' if repack else ' --no-repack'}")
    subprocess.run([sys.executable, "-m", "colibri", "convert", str(gguf_file), str(out)] + ["--no-repack"] * (not repack),
                   check=True, cwd="/")


# ---- 4. the bandwidth limit ---------------------------------------------------------------------

def bandwidth(work, threads):
    exe = work / "stream"
    if not exe.exists():
        subprocess.run(["cc", "-O2", "-pthread", str(HERE / "stream.c"), "-o", str(exe)], check=True)
    return float(subprocess.run([str(exe), str(threads)], capture_output=True, text=True, check=True).stdout)


def bytes_per_token(gguf_file, kv_positions):
    """What decoding one token reads: every non-expert tensor, top_k/E of the expert tensors,
    one embedding row, and the KV cache (f16) at `kv_positions`."""
    from gguf import GGUFReader
    r = GGUFReader(str(gguf_file))
    meta = {k: f.parts[f.data[0]].tolist() for k, f in r.fields.items() if f.data}
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    top_k, E = meta[f"{arch}.expert_used_count"][0], meta[f"{arch}.expert_count"][0]
    layers, kv_heads = meta[f"{arch}.block_count"][0], meta[f"{arch}.attention.head_count_kv"][0]
    head_dim = meta.get(f"{arch}.attention.key_length", [meta[f"{arch}.embedding_length"][0] // meta[f"{arch}.attention.head_count"][0]])[0]
    total = 0.0
    for t in r.tensors:
        if t.name == "token_embd.weight":
            total += t.n_bytes / t.shape[-1]
        elif "_exps" in t.name:
            total += t.n_bytes * top_k / E
        else:
            total += t.n_bytes
    return total + layers * 2 * kv_heads * head_dim * 2 * kv_positions


# ---- 5. the runs --------------------------------------------------------------------------------

def prompt_tokens():
    return np.random.default_rng(SEED).integers(3, VOCAB, PROMPT_TOKENS).tolist()


# The worker's peak resident bytes (VmHWM: this process's own, from its exec on; rusage's ru_maxrss
# would also count the parent's memory at the fork)
PEAK = """
def PEAK():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
"""

WORKER_LLAMA = PEAK + """
import json, sys, time
import numpy as np
import llama_cpp
path, threads, prompt, n_decode = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_batch=128, n_ubatch=128, n_threads=threads,
                      n_threads_batch=threads, verbose=False)
def greedy():   # the last position's logits, read in place
    return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))))
llm.eval(prompt[:8]); llm.reset()                              # warm: graphs, buffers
start = time.perf_counter(); llm.eval(prompt); pp = time.perf_counter() - start
token = greedy()
start = time.perf_counter()
for _ in range(n_decode):
    llm.eval([token]); token = greedy()
tg = time.perf_counter() - start
print(json.dumps({"pp": len(prompt) / pp, "tg": n_decode / tg, "last": token, "hwm": PEAK(),
                  "system": llama_cpp.llama_print_system_info().decode()}))
"""

WORKER_COLIBRI = PEAK + """
import json, sys, time
import colibri
path, threads, prompt, n_decode = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
s = colibri.Model(path, threads=threads).session(ctx=256, batch=128, profile=len(sys.argv) > 5)
s.prefill(prompt[:8]); s.reset()                               # warm: the same as llama.cpp's
start = time.perf_counter(); s.prefill(prompt); pp = time.perf_counter() - start
token = s.sample()
after_prefill = dict(s.profile())
start = time.perf_counter()
for _ in range(n_decode):
    token = s.step(token)
tg = time.perf_counter() - start
decode = {k: (v - after_prefill[k]) / n_decode for k, v in s.profile().items()} if len(sys.argv) > 5 else {}
print(json.dumps({"pp": len(prompt) / pp, "tg": n_decode / tg, "last": token, "kernels": s.kernels, "hwm": PEAK(),
                  "kv": s.memory()["kv_cache"], "decode_step_ns": decode}))
"""


def cpu_busy_ticks():
    """Busy CPU ticks of the whole machine (/proc/stat: all but idle and iowait)."""
    fields = [int(v) for v in open("/proc/stat").readline().split()[1:]]
    return sum(fields) - fields[3] - fields[4]


def warm_page_cache(path):
    for f in (Path(path).glob("*") if Path(path).is_dir() else [Path(path)]):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def run_engine(engine, path, threads, family=("native", ""), profile=False):
    """One run in a fresh process: {pp, tg, rss (bytes), other_cpu (cores other processes used)}.
    family: (name, PYTHONPATH of its llama.cpp build)."""
    warm_page_cache(path)
    env = dict(os.environ, COLIBRI_THREADS=str(threads))
    env.pop("COLIBRI_KERNELS", None)
    if engine == "llama.cpp" and family[1]:
        env["PYTHONPATH"] = os.pathsep.join([family[1]] + [p for p in [env.get("PYTHONPATH")] if p])
    if engine == "colibri" and FAMILIES[family[0]]:
        env["COLIBRI_KERNELS"] = FAMILIES[family[0]]
    code = WORKER_LLAMA if engine == "llama.cpp" else WORKER_COLIBRI
    args = [sys.executable, "-c", code, str(path), str(threads), json.dumps(prompt_tokens()), str(DECODE_TOKENS)]
    if profile:
        args.append("profile")
    tick = os.sysconf("SC_CLK_TCK")
    busy0, wall0 = cpu_busy_ticks(), time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err, cwd="/", env=env)
        out = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)   # this process's own rusage: its CPU time
        proc.returncode = os.waitstatus_to_exitcode(status)
        busy1, wall = cpu_busy_ticks(), time.perf_counter() - wall0
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{engine} on {path} failed:\n{err.read().decode()[-2000:]}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    result["rss"] = result.pop("hwm")
    result["other_cpu"] = max(0.0, ((busy1 - busy0) / tick - usage.ru_utime - usage.ru_stime) / wall)
    return result




def routing_alone(work, threads, reps=200):
    """benchmarks/routing.c (built against the core in WORK/build-routing): the router matmul,
    softmax, top-k and renormalise on warm caches, as PyTorch's loop below runs.  Median us."""
    build = work / "build-routing"
    if not (build / "build.ninja").exists():
        subprocess.run(["meson", "setup", str(build), str(HERE.parent), "-Dpython=false"], check=True, capture_output=True)
    subprocess.run(["ninja", "-C", str(build), "benchmarks/routing"], check=True, capture_output=True)
    out = subprocess.run([str(build / "benchmarks" / "routing"), str(threads), str(reps)], check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip())


def routing_microbench(work, threads, reps=200):
    """Routing, 128 tokens x hidden 4096, 8 experts, top-2 (router matmul + softmax + top-k +
    renormalise), f32: colibri alone (warm caches), colibri's router phase inside a 128-token
    prefill (its profiler; the caches hold the attention's weights by then), and PyTorch on the
    same shapes and threads (warm).  Returns (alone us, in-prefill us, torch us), medians."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM
    import colibri
    from colibri.convert import convert
    hf, out = work / "routing-hf", work / "routing.colibri"
    if not (out / "colibri_model.json").exists():
        torch.manual_seed(SEED)
        cfg = MixtralConfig(vocab_size=256, hidden_size=4096, intermediate_size=32, num_hidden_layers=1, num_attention_heads=32,
                            num_key_value_heads=8, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=256)
        MixtralForCausalLM(cfg).save_pretrained(hf)
        convert(hf, out, dtype="f32", progress=False)
    s = colibri.Model(out, threads=threads).session(ctx=128, batch=128, profile=True)
    tokens = np.arange(128) % 256
    ours = []
    for _ in range(reps // 4):
        before = s.profile()["router"]
        s.reset(); s.prefill(tokens)
        ours.append((s.profile()["router"] - before) / 1e3)
    torch.set_num_threads(threads)
    model = MixtralForCausalLM.from_pretrained(hf, dtype=torch.float32)
    w = model.model.layers[0].mlp.gate.weight.detach().contiguous()
    x = torch.randn(128, 4096)
    theirs = []
    with torch.no_grad():
        for _ in range(reps):
            start = time.perf_counter()
            probs = torch.softmax(x @ w.T, dim=-1)
            top, ids = torch.topk(probs, 2, dim=-1)
            top = top / top.sum(-1, keepdim=True)
            theirs.append((time.perf_counter() - start) * 1e6)
    return routing_alone(work, threads, reps), statistics.median(ours), statistics.median(theirs)


def busy_neighbour():
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


# ---- 6. the table -------------------------------------------------------------------------------

def machine():
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.machine())
    flags = set(next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), []))
    simd = " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "asimddp") if f in flags)
    mem = int(re.search(r"MemTotal:\s+(\d+)", open("/proc/meminfo").read()).group(1)) / 2**20
    return f"{cpu}, {os.cpu_count()} CPUs, {mem:.0f} GiB, {simd}"


def kv_bytes_llama(gguf_file, ctx=256):
    """llama.cpp's KV cache at n_ctx: f16 keys and values of every layer."""
    from gguf import GGUFReader
    r = GGUFReader(str(gguf_file))
    meta = {k: f.parts[f.data[0]].tolist() for k, f in r.fields.items() if f.data}
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    layers, kv_heads = meta[f"{arch}.block_count"][0], meta[f"{arch}.attention.head_count_kv"][0]
    head_dim = meta.get(f"{arch}.attention.key_length", [meta[f"{arch}.embedding_length"][0] // meta[f"{arch}.attention.head_count"][0]])[0]
    return layers * 2 * kv_heads * head_dim * 2 * ctx


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=HERE.parent / "build" / "bench")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", default="2", help="thread counts, comma-separated (e.g. 1,2)")
    p.add_argument("--models", default="qwen3moe,mixtral")
    p.add_argument("--types", default="bf16,q8_0,q4_0")
    p.add_argument("--families", default="native,avx2",
                   help="x86 kernel families: native (the best this CPU runs, both engines), avx2 (colibri's AVX2 "
                        "kernels against llama.cpp built without AVX-512; only where the CPU has AVX-512)")
    p.add_argument("--no-repack", dest="repack", action="store_false",
                   help="import every GGUF byte for byte (default: as `colibri convert` does with no options)")
    p.add_argument("--contended", action="store_true", help="also decode with one busy process beside the engine")
    p.add_argument("--prepare", action="store_true", help="only build, convert, quantize and import the models")
    p.add_argument("--out", type=Path, default=HERE / "results" / "vs_llamacpp.md")
    args = p.parse_args()
    models, types = args.models.split(","), args.types.split(",")
    thread_counts = [int(t) for t in args.threads.split(",")]
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)

    ensure_llama_cpp()
    families = [(f, llama_cpp_family(work, f)) for f in families_here(args.families.split(","))]
    tree = llama_cpp_source(work)
    files = {}
    for name in models:
        hf = work / f"bench-{name}-hf"
        build_hf_model(name, hf)
        bf16 = work / f"bench-{name}-bf16.gguf"
        make_gguf(tree, hf, bf16)
        for kind in types:
            gguf_file = bf16 if kind == "bf16" else work / f"bench-{name}-{kind}.gguf"
            if kind != "bf16":
                quantize(bf16, gguf_file, kind)
            col = work / f"bench-{name}-{kind}{'' if args.repack else '-plain'}.colibri"
            import_gguf(gguf_file, col, args.repack)
            files[name, kind] = {"llama.cpp": gguf_file, "colibri": col}

    if args.prepare:
        return
    gbps = {t: bandwidth(work, t) for t in thread_counts}
    log("bandwidth (STREAM triad): " + ", ".join(f"{t} threads {g:.1f} GB/s" for t, g in gbps.items()))

    cases = [(family, t, key) for family in families for t in thread_counts for key in files]
    runs = {case: {"llama.cpp": [], "colibri": []} for case in cases}
    for rep in range(args.reps):   # interleaved: every pair side by side, rep after rep
        for case in cases:
            family, threads, key = case
            for engine in ("llama.cpp", "colibri"):
                r = run_engine(engine, files[key][engine], threads, family)
                runs[case][engine].append(r)
                log(f"rep {rep + 1}/{args.reps} {family[0]} {threads}t {key[0]} {key[1]} {engine:9s} pp {r['pp']:7.1f}  "
                    f"tg {r['tg']:6.1f}  rss {r['rss'] / 2**30:.2f} GiB  others {r['other_cpu']:.2f} cores")

    top = max(thread_counts)
    contended = {}
    if args.contended:
        neighbour = busy_neighbour()
        try:
            for key, paths in files.items():
                contended[key] = {e: statistics.median(run_engine(e, paths[e], top)["tg"] for _ in range(2))
                                  for e in ("llama.cpp", "colibri")}
                log(f"contended {key}: {contended[key]}")
        finally:
            neighbour.kill()

    routing = routing_microbench(work, top)
    log(f"routing: colibri alone {routing[0]:.1f} us, in a prefill {routing[1]:.1f} us, PyTorch {routing[2]:.1f} us")
    profiles = {key: run_engine("colibri", paths["colibri"], top, profile=True)["decode_step_ns"]
                for key, paths in files.items()}

    builds = {f[0]: runs[next(c for c in cases if c[0] == f)]["llama.cpp"][0]["system"] for f in families}
    kernels = {f[0]: runs[next(c for c in cases if c[0] == f)]["colibri"][0]["kernels"] for f in families}
    lines = [f"# colibri vs llama.cpp {LLAMA_CPP_VERSION}, {datetime.date.today()}", "",
             f"Machine: {machine()}.  Bandwidth (STREAM triad): "
             + ", ".join(f"{g:.1f} GB/s on {t} thread{'s' * (t > 1)}" for t, g in gbps.items()) + ".", ""]
    lines += [f"- family `{f}`: colibri's `{kernels[f]}` kernels; llama.cpp built with `{llama_cpp_cmake_args(f)}` "
              f"(its system info: `{builds[f].strip()}`)" for f, _ in families]
    lines += ["", f"{args.reps} interleaved repetitions, medians of the quiet ones (other processes < {QUIET_OTHER_CPU:.0%} "
              f"of a core; all when none was quiet).  pp128: one forward over a 128-token prompt; tg64: 64 greedy tokens; "
              f"tokens/s.  Limit: bandwidth / bytes one decode step reads.  RSS / (file + KV): peak RSS over the weights "
              f"file plus the engine's KV cache at 256 positions (target <= 1.10).", "",
             "| family | threads | model | type | engine | pp128 | tg64 | peak RSS | RSS / (file + KV) | tg % of limit "
             "| pp ratio | tg ratio | quiet runs |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for case, by_engine in runs.items():
        family, threads, (name, kind) = case
        limit = gbps[threads] * 1e9 / bytes_per_token(files[name, kind]["llama.cpp"], PROMPT_TOKENS + DECODE_TOKENS // 2)
        size = {"llama.cpp": files[name, kind]["llama.cpp"].stat().st_size,
                "colibri": (files[name, kind]["colibri"] / "weights.bin").stat().st_size}
        kv = {"llama.cpp": kv_bytes_llama(files[name, kind]["llama.cpp"]), "colibri": by_engine["colibri"][0]["kv"]}
        pairs = list(zip(by_engine["llama.cpp"], by_engine["colibri"]))
        quiet = [(a, b) for a, b in pairs if a["other_cpu"] < QUIET_OTHER_CPU and b["other_cpu"] < QUIET_OTHER_CPU] or pairs
        for i, engine in enumerate(("llama.cpp", "colibri")):
            rs = [pair[i] for pair in quiet]
            pp, tg = statistics.median(r["pp"] for r in rs), statistics.median(r["tg"] for r in rs)
            rss = max(r["rss"] for r in by_engine[engine])
            ratio = lambda f: "1" if engine == "llama.cpp" else f"{statistics.median(b[f] / a[f] for a, b in quiet):.2f}"
            lines.append(f"| {family[0]} | {threads} | bench-{name} | {kind} | {engine} | {pp:.0f} | {tg:.1f} | "
                         f"{rss / 2**30:.2f} GiB | {rss / (size[engine] + kv[engine]):.2f} | {100 * tg / limit:.0f}% | "
                         f"{ratio('pp')} | {ratio('tg')} | {len(quiet)}/{len(pairs)} |")
    if contended:
        lines += ["", f"Decode with one busy process beside the engine (native, {top} threads, tg64, tokens/s, median of 2):", "",
                  "| model | type | llama.cpp | colibri | ratio |", "|---|---|---|---|---|"]
        for (name, kind), c in contended.items():
            lines.append(f"| bench-{name} | {kind} | {c['llama.cpp']:.1f} | {c['colibri']:.1f} | {c['colibri'] / c['llama.cpp']:.2f} |")
    lines += ["", f"Routing (128 tokens x hidden 4096, 8 experts, top-2; router matmul + softmax + top-k + "
              f"renormalise, f32, {top} threads, medians): colibri alone {routing[0]:.1f} us (benchmarks/routing.c, warm caches), "
              f"PyTorch {routing[2]:.1f} us (warm); colibri's router phase inside a 128-token prefill {routing[1]:.1f} us."]
    lines += ["", f"One colibri decode step (native, {top} threads, mean of the 64 after the 128-token prompt, the session's profiler):", ""]
    for (name, kind), prof in profiles.items():
        total = sum(prof.values()) or 1
        parts = ", ".join(f"{phase} {ns / 1e3:.0f} us ({100 * ns / total:.0f}%)"
                          for phase, ns in sorted(prof.items(), key=lambda kv: -kv[1]) if ns >= 0.005 * total)
        lines.append(f"- bench-{name} {kind}: {total / 1e3:.0f} us; {parts}")
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)


if __name__ == "__main__":
    main()

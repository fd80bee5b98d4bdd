"""Logits of every family, the bundled model and quantized models, saved to compare one build of
colibri with another: a refactoring must keep the strict mode's bits, and the fast mode's within
the bounds the tests hold it to.

    python tests/snapshot_logits.py prepare DIR           # the models, once (needs torch + transformers)
    python tests/snapshot_logits.py save DIR before.npz   # with one build installed
    python tests/snapshot_logits.py save DIR after.npz    # with the other
    python tests/snapshot_logits.py compare before.npz after.npz

Each model runs a prompt in one call, then decodes token by token (the decode paths differ from
prefill: the experts on threads, one row of attention), in the strict mode (the reference kernels,
one thread), and in the fast mode (the best kernels this CPU runs, and avx2 where it runs) on one and
two threads.  The memory plan of a session is saved too."""
import sys
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parent
N_PROMPT, N_DECODE, CTX = 20, 8, 64


def prepare(root):
    """Every family of tests/support.py (f32), qwen3_moe at q4_0, the tiny fixture at q8_0 and q4_0,
    and a Q4_K_M-style GGUF file (Q4_K and Q6_K) imported."""
    sys.path.insert(0, str(TESTS))
    import support
    from colibri.convert import convert

    root = Path(root)
    for name in support.FAMILIES:
        hf = root / "hf" / name
        support.build(name).save_pretrained(hf)
        convert(hf, root / f"{name}.f32", dtype="f32", progress=False)
    convert(root / "hf" / "qwen3_moe", root / "qwen3_moe.q4_0", dtype="q4_0", progress=False)
    for quant in ("q8_0", "q4_0"):
        convert(TESTS / "fixtures" / "tiny-mixtral", root / f"tiny-mixtral.{quant}", dtype=quant, progress=False)
    import test_gguf_quants as gq
    kind = lambda name: "F32" if "ffn_gate_inp" in name else \
        "Q6_K" if any(k in name for k in ("token_embd", "output.", "attn_v", "ffn_down")) else "Q4_K"
    gguf = gq.write_gguf(root / "q4_k_m.gguf", gq.model_tensors(kind, np.random.default_rng(3)))
    convert(gguf, root / "q4_k_m", progress=False)


def run(model, kernels, threads, tokens):
    """(prompt + decode logits, memory plan) of one session."""
    s = model.session(ctx=CTX, kernels=kernels, threads=threads)
    rows = [s.forward(tokens[:N_PROMPT])] + [s.forward(tokens[i:i + 1]) for i in range(N_PROMPT, len(tokens))]
    return np.concatenate(rows), model.memory_plan(ctx=CTX)


class CpuBehind:
    """A device driver computing through a second session's cpu experts (as test_devices.py's)."""
    name = "other"

    def __init__(self, model):
        self.cpu = model.session(ctx=4, kernels="reference")

    def compute(self, layer, experts, rows, gates, x):
        self.job = (layer, experts.copy(), rows.copy(), x.copy())

    def sync(self, y):
        y[:] = self.cpu.compute_experts(*self.job)
        return 1e-4


def run_moe_ways(model, tokens):
    """Strict-mode logits with the routed experts streamed through the smallest cache, and with every
    other expert on a device: {way: logits}; nothing for a model without routed experts."""
    import colibri
    if not model.config.get("num_experts"):
        return {}
    _, min_budget = model.expert_slots()
    L, E = model.config["num_layers"], model.config["num_experts"]
    placement = (np.arange(E) % 2 == 0)[None].repeat(L, 0).astype(np.uint8)
    ways = {"streamed": dict(expert_budget=min_budget),
            "device": dict(devices=[CpuBehind(model)], placement=placement)}
    out = {}
    for way, options in ways.items():
        try:
            s = model.session(ctx=CTX, kernels="reference", **options)
        except colibri.Error as e:   # a device computes the plain formats only (repacked q4_0x8: not)
            print(f"  {way}: {e}")
            continue
        rows = [s.forward(tokens[:N_PROMPT])] + [s.forward(tokens[i:i + 1]) for i in range(N_PROMPT, len(tokens))]
        out[way] = np.concatenate(rows)
    return out


def texts(build_dir):
    """What colibri-infer (built from the installed package's core, into build_dir) and `colibri
    generate` print on the bundled model, greedy and sampled."""
    import subprocess
    out = {}
    for where in ("python", "native"):   # native: the colibri-infer this checkout builds
        for how, flags in (("greedy", ["--temperature", "0"]), ("sampled", ["--temperature", "0.8", "--seed", "3"]),
                           ("ids", ["--temperature", "0.8", "--seed", "5", "--tokens", "1,2,3"])):
            argv = [sys.executable, "-m", "colibri", "generate", "--max-tokens", "40", *flags]
            argv += [] if how == "ids" else ["--prompt", "ROMEO:"]
            argv += [] if where == "python" else ["--target", "native", "--build-dir", str(build_dir)]
            out[f"text|{where}|{how}"] = subprocess.run(argv, capture_output=True, check=True, cwd=TESTS).stdout
    return out


def save(root, out):
    import colibri
    from colibri.demo import MODEL_DIR

    models = {p.name: p for p in sorted(Path(root).iterdir()) if (p / "colibri_model.json").exists()}
    models["bundled"] = Path(MODEL_DIR)
    variants = [v for v, runs in colibri.kernel_variants().items() if runs]
    modes = [("strict", "reference", 1), ("fast", "auto", 1), ("fast", "auto", 2)]
    if "avx2" in variants:
        modes += [("fast", "avx2", 1), ("fast", "avx2", 2)]
    arrays = {}
    for name, path in models.items():
        model = colibri.Model(str(path))
        tokens = np.random.default_rng(7).integers(0, model.vocab_size, N_PROMPT + N_DECODE).astype(np.int32)
        for mode, kernels, threads in modes:
            logits, plan = run(model, kernels, threads, tokens)
            arrays[f"{name}|{mode}|{kernels}|{threads}"] = logits
        for way, logits in run_moe_ways(model, tokens).items():
            arrays[f"{name}|strict|{way}"] = logits
        arrays[f"{name}|plan"] = np.array([plan], dtype=np.int64)
        print(f"{name}: {len(modes)} runs, plan {plan:,} B")
    for key, text in texts(Path(out).with_suffix('.build')).items():
        arrays[key] = np.frombuffer(text, np.uint8)
        print(f"{key}: {text[:60]!r}")
    np.savez(out, **arrays)


def compare(a_path, b_path):
    """Strict runs must be equal to the bit; fast runs are listed with their largest difference."""
    a, b = np.load(a_path), np.load(b_path)
    failed = 0
    for key in sorted(set(a.files) | set(b.files)):
        if key not in a.files or key not in b.files:
            print(f"{key}: only in {'the first' if key in a.files else 'the second'}")
            failed += "|strict|" in key
            continue
        x, y = a[key], b[key]
        if key.startswith("text|"):
            same = x.tobytes() == y.tobytes()
            failed += not same
            print(f"{key}: {'the same text' if same else f'{x.tobytes()!r} -> {y.tobytes()!r}'}")
            continue
        if key.endswith("|plan"):
            if x[0] != y[0]:
                print(f"{key}: {x[0]:,} -> {y[0]:,} B ({y[0] - x[0]:+,})")
            continue
        same = np.array_equal(x.view(np.uint32), y.view(np.uint32))
        worst = float(np.abs(x - y).max())
        if "|strict|" in key:
            failed += not same
        print(f"{key}: {'bit-identical' if same else f'max |diff| {worst:.2e}'} ({x.size} logits)")
    print("strict mode and texts:", "bit-identical everywhere" if not failed else f"{failed} runs differ")
    return 1 if failed else 0


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "prepare":
        prepare(*args)
    elif command == "save":
        save(*args)
    elif command == "compare":
        sys.exit(compare(*args))
    else:
        sys.exit(__doc__)

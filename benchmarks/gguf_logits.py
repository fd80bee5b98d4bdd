"""colibri against llama.cpp on the same quantized GGUF, for every MoE architecture and file type:
the logits at every position, through both engines.

    python benchmarks/gguf_logits.py [--work DIR] [--families a,b] [--types q4_k_m,...] [--out FILE]

For each family of tests/test_gguf_families.py (its tiny random checkpoint widened to rows of 256,
converted to an F32 GGUF by llama.cpp's own convert_hf_to_gguf.py, as the test does), llama.cpp
quantizes the F32 GGUF to each file type (llama_model_quantize, its own mix of tensor types: rows
that are not whole K-quant blocks fall back as llama.cpp chooses), colibri imports the file byte for
byte, and both engines compute the logits of the same 24 tokens:

  - llama.cpp 0.3.36 (llama-cpp-python, built for this CPU), logits_all, in a process of its own;
  - colibri with its default kernels (the int8-activation path, as llama.cpp's) and with the
    reference kernels (float activations).

It prints, per architecture x type, max |colibri - llama.cpp| over all logits against the size of
the quantization itself (max |llama.cpp at that type - llama.cpp at F32|) and how many of the
positions' greedy tokens agree, and writes the table to --out.  Needs llama-cpp-python
(benchmarks/vs_llamacpp.py installs it), torch and transformers.
"""
import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
import test_gguf_families as families   # noqa: E402  the families' GGUFs, as the tests make them
import vs_llamacpp                      # noqa: E402

TYPES = ["q8_0", "q6_k", "q5_k_m", "q4_k_m", "q3_k_m", "q2_k", "iq4_xs", "iq4_nl", "q5_1", "q5_0", "q4_1", "q4_0",
         "mxfp4_moe"]

# where llama.cpp cannot run the test's config: its olmoe and dots1 take as many kv heads as heads
# and no attention biases (as OLMoE and dots.llm1 have); its converter writes ERNIE 4.5's shared
# expert width as intermediate_size / kv heads (true of the released models: 128 here) and takes
# every layer from the first MoE one on as MoE (interval 1, as released).  Its
# deepseek2 loads V2 without q LoRA only at 26 or 27 layers (V2-Lite's): the test's does not load.
LLAMA_CPP_CONFIG = {"olmoe": dict(num_key_value_heads=16, attention_bias=False),
                    "dots1": dict(num_key_value_heads=4, attention_bias=False),
                    "ernie4_5_moe": dict(moe_intermediate_size=128, moe_layer_interval=1)}

# where llama.cpp computes another model than transformers (colibri follows transformers: tests/test_gguf_families.py)
LLAMA_CPP_DIFFERS = {
    "phimoe": "llama.cpp routes PhiMoE by a softmax over the top 2 (src/models/phi3.cpp), not by transformers' "
              "sparsemixer (each expert's weight a softmax over the scores near its own): the engines differ "
              "everywhere, the F32 file too",
    "gpt_oss": "llama.cpp's YaRN rounds the correction range to whole dimensions (ggml_rope_yarn_corr_dims: floorf, "
               "ceilf); gpt-oss's configuration says `truncate: false`, which transformers and colibri honour: at F32 "
               "the first position agrees to 2e-6, later ones to a few 1e-2",
}

WORKER = """
import sys
import numpy as np
import llama_cpp
path, tokens, out = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3]
llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True,
                      type_k=0, type_v=0, verbose=True)   # an f32 KV cache, as colibri's; the log says why a load fails
llm.eval(tokens)
np.save(out, np.array(llm.scores[:len(tokens)], dtype=np.float32))
"""


def llama_logits(path, tokens):
    """(n_tokens, vocab) f32 from llama.cpp, or the reason it failed (a GGML_ASSERT aborts)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "logits.npy"
        r = subprocess.run([sys.executable, "-c", WORKER, str(path), ",".join(map(str, tokens)), str(out)],
                           capture_output=True, text=True, timeout=300, cwd="/")
        if r.returncode != 0:
            lines = r.stderr.strip().splitlines() or [f"exit {r.returncode}"]
            return next((l.split("error loading model: ")[-1] for l in lines if "error loading model: " in l), lines[-1])[:160]
        return np.load(out)


def quantize(src, out, kind):
    """llama.cpp's quantization in a process of its own, its log of every tensor kept out of the
    table; None, or why it failed."""
    if not out.exists():
        code = f"from pathlib import Path; import vs_llamacpp; vs_llamacpp.quantize(Path({str(src)!r}), Path({str(out)!r}), {kind!r})"
        r = subprocess.run([sys.executable, "-c", code], cwd=HERE, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            return next((l for l in r.stderr.splitlines() if "failed" in l), f"exit {r.returncode}")[:120]
    return None


def tensor_types(path):
    from gguf import GGUFReader
    return sorted({t.tensor_type.name for t in GGUFReader(str(path)).tensors})


def colibri_logits(path, out, tokens):
    """{kernels: (n_tokens, vocab) f32} from colibri, or the error it gave."""
    import colibri
    from colibri.convert import convert
    try:
        model = colibri.Model(convert(path, out, progress=False), verify=True)
    except Exception as e:   # an import error is a result of the table too
        return f"{type(e).__name__}: {e}"[:160]
    return {k: model.session(ctx=64, kernels=k).forward(tokens) for k in ("auto", "reference")}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=HERE.parent / "build" / "gguf-logits")
    p.add_argument("--families", default=",".join(families.CASES))
    p.add_argument("--types", default=",".join(TYPES))
    p.add_argument("--out", type=Path, default=HERE / "results" / "gguf_logits.md")
    p.add_argument("--render", type=Path, help="only write the tables of a run's JSON (the --out of a run, .json)")
    args = p.parse_args()
    if args.render:
        return render(json.loads(args.render.read_text()), args.out)
    work, kinds = args.work.resolve(), args.types.split(",")
    work.mkdir(parents=True, exist_ok=True)
    vs_llamacpp.ensure_llama_cpp()
    for family, config in LLAMA_CPP_CONFIG.items():
        arch, overrides, extra = families.CASES[family]
        families.CASES[family] = (arch, {**overrides, **config}, extra)
    tokens = np.random.default_rng(1).integers(0, families.COMMON["vocab_size"], families.N_TOKENS)

    results, types_seen, notes = {}, {}, []
    for family in args.families.split(","):
        arch = families.CASES[family][0]
        f32, _ = families.gguf_of(family, "f32", work, wider=True)
        base = llama_logits(f32, tokens)
        if isinstance(base, str):   # llama.cpp cannot run the family's checkpoint at all
            results.update({(family, kind): "llama.cpp failed" for kind in ["f32"] + kinds})
            notes.append(f"{family}: llama.cpp: {base}")
            continue
        for kind in ["f32"] + kinds:
            path = f32 if kind == "f32" else work / family / f"{kind}.gguf"
            why = quantize(f32, path, kind) if kind != "f32" else None
            if why:
                results[family, kind] = "llama.cpp failed"
                notes.append(f"{family} {kind}: llama.cpp: {why}")
                continue
            types_seen.setdefault(kind, set()).update(tensor_types(path))
            theirs = base if kind == "f32" else llama_logits(path, tokens)
            ours = colibri_logits(path, work / family / f"colibri-{kind}", tokens)
            if isinstance(theirs, str) or isinstance(ours, str) or isinstance(base, str):
                failed = "llama.cpp" if isinstance(theirs, str) or isinstance(base, str) else "colibri"
                why = next(x for x in (theirs, base, ours) if isinstance(x, str))
                results[family, kind] = f"{failed} failed"
                notes.append(f"{family} {kind}: {failed}: {why}")
            else:
                fast, ref = ours["auto"], ours["reference"]
                rms = lambda d: float(np.sqrt(np.mean(np.square(d)) / np.mean(np.square(base))))
                results[family, kind] = dict(
                    fast=float(np.abs(fast - theirs).max()), ref=float(np.abs(ref - theirs).max()),
                    quant=float(np.abs(theirs - base).max()), scale=float(np.abs(base).max()),
                    fast_rms=rms(fast - theirs), quant_rms=rms(theirs - base), int8_rms=rms(fast - ref),
                    top1=int((fast.argmax(-1) == theirs.argmax(-1)).sum()))
            print(f"{family:18s} {arch:13s} {kind:9s} {results[family, kind]}", file=sys.stderr, flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    saved = {"results": {f"{f} {k}": v for (f, k), v in results.items()}, "types": {k: sorted(v) for k, v in types_seen.items()},
             "notes": notes, "families": args.families.split(","), "kinds": kinds, "machine": vs_llamacpp.machine(),
             "date": str(datetime.date.today())}
    args.out.with_suffix(".json").write_text(json.dumps(saved, indent=1))
    render(saved, args.out)


def render(saved, out):
    """The tables of a run (its JSON) into `out`: every cell, then one line a family."""
    results, families_run, cols = saved["results"], saved["families"], ["f32"] + saved["kinds"]
    pct = lambda x: f"{100 * x:.1f}%"
    lines = [f"# colibri vs llama.cpp {vs_llamacpp.LLAMA_CPP_VERSION}: logits on the same GGUF, {saved['date']}", "",
             f"Machine: {saved['machine']}.  `python benchmarks/gguf_logits.py`.  Each family's tiny random checkpoint "
             f"(tests/test_gguf_families.py, rows of 256), converted to an F32 GGUF by llama.cpp's converter, quantized "
             f"by llama.cpp to each file type (its own mix of tensor types), imported by colibri byte for byte; the "
             f"logits of {families.N_TOKENS} tokens through both engines.", "",
             "Sizes are RMS over all logits relative to the RMS of llama.cpp's F32 logits.  Each cell: colibri (default "
             "kernels: int8 activations, as llama.cpp's) against llama.cpp / colibri's int8 path against its own float "
             "reference kernels (what rounding the activations alone moves) / the quantization itself (llama.cpp at the "
             f"type against llama.cpp at F32); then the positions (of {families.N_TOKENS}) whose greedy token agrees.  "
             "The F32 column: max |colibri - llama.cpp|.", "",
             "| family (gguf arch) | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for family in families_run:
        cells = []
        for kind in cols:
            r = results[f"{family} {kind}"]
            cells.append(r if isinstance(r, str) else f"{r['fast']:.1e} ({r['top1']})" if kind == "f32" else
                         f"{pct(r['fast_rms'])} / {pct(r['int8_rms'])} / {pct(r['quant_rms'])} ({r['top1']})")
        lines.append(f"| {family} (`{families.CASES[family][0]}`) | " + " | ".join(cells) + " |")
    lines += ["", "One line a family, over its quantized types (medians):", "",
              "| family (gguf arch) | F32: max abs diff | types run | colibri vs llama.cpp | colibri int8 vs float | "
              "quantization | greedy tokens agreeing |", "|---|---|---|---|---|---|---|"]
    for family in families_run:
        f32 = results[f"{family} f32"]
        runs = [results[f"{family} {k}"] for k in saved["kinds"] if not isinstance(results[f"{family} {k}"], str)]
        if isinstance(f32, str) or not runs:
            first = f32 if isinstance(f32, str) else f"{f32['fast']:.1e}"
            lines.append(f"| {family} (`{families.CASES[family][0]}`) | {first} | 0 | | | | |")
            continue
        med = lambda key: pct(float(np.median([r[key] for r in runs])))
        lines.append(f"| {family} (`{families.CASES[family][0]}`) | {f32['fast']:.1e} | {len(runs)} | {med('fast_rms')} | "
                     f"{med('int8_rms')} | {med('quant_rms')} | {sum(r['top1'] for r in runs)}/{families.N_TOKENS * len(runs)} |")
    lines += ["", "Tensor types in the files of each column: " +
              "; ".join(f"{k}: {', '.join(v)}" for k, v in saved["types"].items()) + "."]
    lines += ["", "Where llama.cpp computes another model than transformers:", ""] + \
             [f"- {family}: {why}" for family, why in LLAMA_CPP_DIFFERS.items() if family in families_run]
    if saved["notes"]:
        lines += ["", "Failures:", ""] + [f"- {n}" for n in saved["notes"]]
    table = "\n".join(lines) + "\n"
    print(table)
    out.write_text(table)


if __name__ == "__main__":
    main()

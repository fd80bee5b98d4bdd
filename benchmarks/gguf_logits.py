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

WORKER = """
import sys
import numpy as np
import llama_cpp
path, tokens, out = sys.argv[1], [int(t) for t in sys.argv[2].split(",")], sys.argv[3]
llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_batch=64, n_ubatch=64, n_threads=2, logits_all=True,
                      type_k=0, type_v=0, verbose=False)   # an f32 KV cache, as colibri's
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
            return (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1][:120]
        return np.load(out)


def quantize(src, out, kind):
    """llama.cpp's quantization in a process of its own, its log of every tensor kept out of the table."""
    if not out.exists():
        code = f"from pathlib import Path; import vs_llamacpp; vs_llamacpp.quantize(Path({str(src)!r}), Path({str(out)!r}), {kind!r})"
        subprocess.run([sys.executable, "-c", code], cwd=HERE, check=True, capture_output=True, timeout=600)


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
    args = p.parse_args()
    work, kinds = args.work.resolve(), args.types.split(",")
    work.mkdir(parents=True, exist_ok=True)
    vs_llamacpp.ensure_llama_cpp()
    tokens = np.random.default_rng(1).integers(0, families.COMMON["vocab_size"], families.N_TOKENS)

    results, types_seen, notes = {}, {}, []
    for family in args.families.split(","):
        arch = families.CASES[family][0]
        f32, _ = families.gguf_of(family, "f32", work, wider=True)
        base = llama_logits(f32, tokens)
        for kind in ["f32"] + kinds:
            path = f32 if kind == "f32" else work / family / f"{kind}.gguf"
            if kind != "f32":
                quantize(f32, path, kind)
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
                results[family, kind] = dict(
                    fast=float(np.abs(fast - theirs).max()), ref=float(np.abs(ref - theirs).max()),
                    quant=float(np.abs(theirs - base).max()), scale=float(np.abs(base).max()),
                    top1=int((fast.argmax(-1) == theirs.argmax(-1)).sum()))
            print(f"{family:18s} {arch:13s} {kind:9s} {results[family, kind]}", file=sys.stderr, flush=True)

    cols = ["f32"] + kinds
    lines = [f"# colibri vs llama.cpp {vs_llamacpp.LLAMA_CPP_VERSION}: logits on the same GGUF, {datetime.date.today()}", "",
             f"Machine: {vs_llamacpp.machine()}.  `python benchmarks/gguf_logits.py`.  Each family's tiny random "
             f"checkpoint (tests/test_gguf_families.py, rows of 256), llama.cpp's F32 GGUF quantized by llama.cpp to "
             f"each file type, imported by colibri byte for byte; the logits of {families.N_TOKENS} tokens through "
             f"both engines.", "",
             "Each cell: max |colibri - llama.cpp| over all logits, colibri's default kernels (int8 activations, as "
             "llama.cpp's) / the quantization's own size, max |llama.cpp at the type - llama.cpp at F32|; then the "
             f"positions (of {families.N_TOKENS}) whose greedy token agrees.", "",
             "| family (gguf arch) | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for family in args.families.split(","):
        cells = []
        for kind in cols:
            r = results[family, kind]
            cells.append(r if isinstance(r, str) else
                         (f"{r['fast']:.1e} ({r['top1']})" if kind == "f32" else f"{r['fast']:.1e} / {r['quant']:.1e} ({r['top1']})"))
        lines.append(f"| {family} (`{families.CASES[family][0]}`) | " + " | ".join(cells) + " |")
    ok = [r for r in results.values() if not isinstance(r, str)]
    lines += ["", "Tensor types in the files of each column: " +
              "; ".join(f"{k}: {', '.join(sorted(v))}" for k, v in types_seen.items()) + ".", "",
              f"The reference kernels (float activations) against llama.cpp: max |Δ| {max(r['ref'] for r in ok):.1e} "
              f"over every cell; logits up to {max(r['scale'] for r in ok):.2f} in size."]
    if notes:
        lines += ["", "Failures:", ""] + [f"- {n}" for n in notes]
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    (args.out.with_suffix(".json")).write_text(json.dumps({f"{f} {k}": v for (f, k), v in results.items()}, indent=1))


if __name__ == "__main__":
    main()

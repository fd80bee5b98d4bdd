"""A GGUF run in place against the same file converted, and llama.cpp on the file: what the first
open writes, whether the logits are the conversion's, and decode and prefill speed.

    python benchmarks/gguf_in_place.py [--work DIR] [--types q4_k_m,q4_0] [--reps 3] [--threads 2]

Takes the bench models benchmarks/vs_llamacpp.py makes under --work (run it with --prepare first):
the llama.cpp-quantized GGUFs and their colibri conversions (Q4_0 with --repack, its best layout).
For each file: the description the first open writes into an empty cache (bytes, as `du` counts
them, against the file's; seconds), the strict-mode logits of a 32-token prompt in place and
converted (strict mode, the reference kernels: bit-identical or not), then runs interleaved (llama.cpp, colibri converted, colibri in
place; each a fresh process, vs_llamacpp.run_engine: pp128 and tg64) and a table of medians with
each colibri's ratio to llama.cpp, and the in-place run's peak resident memory against the file's
size (its matrices rewritten at open in the mapping's own pages: no copy beside it)."""
import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("vs_llamacpp", HERE / "vs_llamacpp.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def du(path):
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=HERE.parent / "build" / "bench")
    p.add_argument("--model", default="qwen3moe")
    p.add_argument("--types", default="q4_k_m,q4_0")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import colibri

    cache = Path(tempfile.mkdtemp(prefix="colibri-cache-"))
    os.environ["COLIBRI_CACHE"] = str(cache)   # run_engine's processes inherit it
    rows = []
    try:
        for kind in args.types.split(","):
            gguf = args.work / f"bench-{args.model}-{kind}.gguf"
            converted = args.work / f"bench-{args.model}-{kind}{'-x8' if kind in bench.PURE_TYPES else ''}.colibri"
            if not gguf.exists() or not converted.exists():
                raise SystemExit(f"{gguf} or {converted} missing: run benchmarks/vs_llamacpp.py --prepare "
                                 f"--models {args.model} --types {kind}")
            before = du(cache)
            start = time.perf_counter()
            in_place = colibri.Model(gguf)
            described = time.perf_counter() - start
            written = du(cache) - before
            prompt = bench.prompt_tokens()[:32]
            same = np.array_equal(in_place.session(ctx=64, kernels="reference").forward(prompt),   # strict mode
                                  colibri.Model(converted).session(ctx=64, kernels="reference").forward(prompt))
            del in_place
            runs = {"llama.cpp": [], "converted": [], "in place": []}
            for rep in range(args.reps):
                for name, engine, path in (("llama.cpp", "llama.cpp", gguf), ("converted", "colibri", converted),
                                           ("in place", "colibri", gguf)):
                    r = bench.run_engine(engine, path, args.threads)
                    runs[name].append(r)
                    bench.log(f"rep {rep + 1}/{args.reps} {kind} {name:9s} pp {r['pp']:7.1f}  tg {r['tg']:6.1f}")
            med = {k: {m: statistics.median(r[m] for r in v) for m in ("pp", "tg", "rss")} for k, v in runs.items()}
            ratio = {k: {m: statistics.median(a[m] / b[m] for a, b in zip(runs[k], runs["llama.cpp"]))
                         for m in ("pp", "tg")} for k in ("converted", "in place")}
            rows.append((kind, gguf.stat().st_size, du(converted), written, described, same, med, ratio))
    finally:
        shutil.rmtree(cache, ignore_errors=True)

    print(f"\n{args.model} bench model, {args.threads} threads, medians of {args.reps} interleaved runs "
          f"({bench.machine()})\n")
    print("| file | GGUF bytes | converted (du) | description written (du) | first open | strict logits | "
          "tg llama.cpp | tg converted (ratio) | tg in place (ratio) | pp llama.cpp | pp converted (ratio) | "
          "pp in place (ratio) | peak RSS in place (÷ file) |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for kind, size, conv, written, described, same, med, ratio in rows:
        print(f"| {kind} | {size:,} | {conv:,} | {written:,} ({100 * written / size:.3f}%) | {described:.1f} s | "
              f"{'bit-identical' if same else 'DIFFER'} | {med['llama.cpp']['tg']:.1f} | "
              f"{med['converted']['tg']:.1f} ({ratio['converted']['tg']:.2f}x) | "
              f"{med['in place']['tg']:.1f} ({ratio['in place']['tg']:.2f}x) | {med['llama.cpp']['pp']:.1f} | "
              f"{med['converted']['pp']:.1f} ({ratio['converted']['pp']:.2f}x) | "
              f"{med['in place']['pp']:.1f} ({ratio['in place']['pp']:.2f}x) | "
              f"{med['in place']['rss'] / 2**20:,.0f} MiB ({med['in place']['rss'] / size:.2f}) |")


if __name__ == "__main__":
    sys.exit(main())

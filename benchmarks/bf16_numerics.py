"""What the avx512-bf16 kernels (bf16 weights times activations rounded to bf16, vdpbf16ps) cost in
numbers and buy in speed, against the default avx512 kernels (activations in f32) on the same model.

    python benchmarks/bf16_numerics.py MODEL [--threads 1] [--prompt 128] [--decode 32] [--reps 5]

MODEL: a model with bf16 matrices (a colibri directory or a GGUF file, opened in place), e.g.
build/bench/bench-qwen3moe-bf16.gguf from benchmarks/vs_llamacpp.py --prepare.  Prints, for one
random prompt (seed fixed): the largest and mean |logit difference| relative to the largest |logit|,
the share of positions whose argmax agrees, the first greedy token where the two decodes part; then
decode tokens/s of each (the two alternating, fresh sessions, medians of --reps) and their ratio.
"""
import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np

import colibri


def decode_rate(model, kernels, threads, prompt, n):
    session = model.session(ctx=len(prompt) + n + 8, kernels=kernels, threads=threads)
    token = int(np.argmax(session.forward(prompt)[-1]))
    start = time.perf_counter()
    for _ in range(n):
        token = int(np.argmax(session.forward([token])[-1]))
    return n / (time.perf_counter() - start)


def greedy(model, kernels, threads, prompt, n):
    session = model.session(ctx=len(prompt) + n + 8, kernels=kernels, threads=threads)
    out = [int(np.argmax(session.forward(prompt)[-1]))]
    while len(out) < n:
        out.append(int(np.argmax(session.forward([out[-1]])[-1])))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--decode", type=int, default=32)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    if not colibri.kernel_variants().get("avx512-bf16"):
        raise SystemExit("this CPU does not run avx512-bf16 (AVX512_BF16), or this build has no such variant")
    model = colibri.Model(args.model)
    prompt = np.random.default_rng(0).integers(0, model.vocab_size, args.prompt)
    ref = model.session(ctx=args.prompt + 8, kernels="avx512", threads=args.threads).forward(prompt)
    ours = model.session(ctx=args.prompt + 8, kernels="avx512-bf16", threads=args.threads).forward(prompt)
    scale = np.abs(ref).max()
    diff = np.abs(ours - ref)
    agree = float(np.mean(ours.argmax(axis=1) == ref.argmax(axis=1)))
    a, b = (greedy(model, k, args.threads, prompt, args.decode) for k in ("avx512", "avx512-bf16"))
    parted = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    rates = {"avx512": [], "avx512-bf16": []}
    for rep in range(args.reps):
        for k in (("avx512", "avx512-bf16") if rep % 2 == 0 else ("avx512-bf16", "avx512")):
            rates[k].append(decode_rate(model, k, args.threads, prompt, args.decode))
    ratio = statistics.median(y / x for x, y in zip(rates["avx512"], rates["avx512-bf16"]))
    print(f"{args.model.name}, {args.prompt}-token prompt, {args.threads} thread(s), load average "
          f"{', '.join(f'{v:.2f}' for v in os.getloadavg())}\n")
    print("| | avx512 (f32 activations) | avx512-bf16 (bf16 activations) |\n|---|---|---|")
    print(f"| logits: max / mean abs difference, of the largest | | {diff.max() / scale:.2e} / {diff.mean() / scale:.2e} |")
    print(f"| positions whose argmax agrees | | {agree:.1%} |")
    print(f"| greedy decode of {args.decode}: first token that differs | | {'none' if parted is None else parted} |")
    print(f"| decode tokens/s (median of {args.reps}) | {statistics.median(rates['avx512']):.1f} | "
          f"{statistics.median(rates['avx512-bf16']):.1f} ({ratio:.2f}x) |")


if __name__ == "__main__":
    main()

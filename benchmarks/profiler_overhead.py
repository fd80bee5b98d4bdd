"""The profiler's cost: decode with it on and off, interleaved in one process, on the same model.

    python benchmarks/profiler_overhead.py MODEL_DIR [--threads 2] [--pairs 6]

Prints decode tokens/s off and on (medians) and the median of the per-pair ratios on/off.
"""
import argparse
import statistics
import time

import numpy as np

import colibri


def decode_speed(model, prompt, profile, steps=64):
    s = model.session(ctx=256, batch=128, profile=profile)
    s.prefill(prompt)
    token = s.sample()
    start = time.perf_counter()
    for _ in range(steps):
        token = s.step(token)
    return steps / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=6)
    args = p.parse_args()
    model = colibri.Model(args.model, threads=args.threads)
    prompt = np.random.default_rng(0).integers(3, model.vocab_size, 128).tolist()
    off, on = [], []
    for _ in range(args.pairs):
        off.append(decode_speed(model, prompt, False))
        on.append(decode_speed(model, prompt, True))
    ratios = [b / a for a, b in zip(off, on)]
    print(f"{args.model}: decode off {statistics.median(off):.1f} tok/s, on {statistics.median(on):.1f} tok/s, "
          f"median on/off {statistics.median(ratios):.3f} (pairs: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()

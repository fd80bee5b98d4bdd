"""Decode step time at 1, 4, 8 and 16 sequences: one forward_batch of one token per running sequence,
as the server's loop runs it (each expert's rows a small GEMM over every token routed to it in the
step), against one sequence alone.

    python benchmarks/batched_decode.py MODEL [--threads 2] [--batches 1,4,8,16] [--steps 16] [--reps 5]
                                              [--kernels NAME] [--out FILE]

Each sequence first takes its own 32-token prompt (random ids, seed fixed), so the steps attend over
32 .. 32 + steps positions.  The batch sizes alternate within each rep (1, 4, 8, 16, then the next
rep in reverse), each step timed by the wall clock; per batch size the median over reps of the mean
step time, and the median of the per-rep ratios to one sequence.  Prints a Markdown table (and writes
it to --out) with the machine's load average at the start and the end.
"""
import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

import colibri

PROMPT = 32


def load():
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def step_times(session, batch, steps, rng, vocab):
    """Mean seconds of `steps` decode steps over the first `batch` slots, each slot reset and given its
    prompt first (not timed)."""
    for seq in range(batch):
        session.seq_reset(seq)
    session.forward_batch([(seq, rng.integers(0, vocab, PROMPT), False) for seq in range(batch)])
    total = 0.0
    for _ in range(steps):
        entries = [(seq, [int(rng.integers(0, vocab))], True) for seq in range(batch)]
        start = time.perf_counter()
        session.forward_batch(entries)
        total += time.perf_counter() - start
    return total / steps


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batches", default="1,4,8,16")
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--kernels", default=None, help="a kernel variant by name (default: this CPU's best)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    model = colibri.Model(args.model)
    vocab = model.vocab_size
    options = dict(ctx=PROMPT + args.steps + 8, batch=max(batches) * PROMPT, n_seq=max(batches), threads=args.threads)
    if args.kernels:
        options["kernels"] = args.kernels
    session = model.session(**options)
    rng = np.random.default_rng(0)
    load_before = load()
    step_times(session, max(batches), 2, rng, vocab)   # warm: pages in, caches
    times = {b: [] for b in batches}
    for rep in range(args.reps):
        for b in (batches if rep % 2 == 0 else batches[::-1]):
            times[b].append(step_times(session, b, args.steps, rng, vocab))
    ratios = {b: statistics.median(t / one for t, one in zip(times[b], times[batches[0]])) for b in batches}
    lines = [f"{args.model.name}, {session.kernels} kernels, {args.threads} threads, {platform.processor() or platform.machine()}; "
             f"median of {args.reps} reps of {args.steps} steps; load average {load_before} before, {load()} after",
             "", f"| sequences | ms a step | ms a token | step time / {batches[0]} sequence |", "|---|---|---|---|"]
    for b in batches:
        ms = 1e3 * statistics.median(times[b])
        lines.append(f"| {b} | {ms:.2f} | {ms / b:.2f} | {ratios[b]:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""How far the fast kernels' int8 path strays from the scalar int8 path over many sequences: the
bundled model converted to q8_0 and q4_0, with the default repack (the x8 layouts) and without.

    python benchmarks/int8_spread.py [--sequences 64] [--tokens 32] [--out FILE]

Both paths quantize the activations to the same int8 blocks from the same float values, except that
the fast kernels compute those float values (norms, attention, the float matmuls) in another
summation order.  A last-bit difference there can move one activation across a rounding boundary of
its int8 block, and that step carries through the layers.  So the fast path is not bound to
reference-int8 within rounding everywhere: this measures how often, and how far, it is not.

The sequences are sampled from the bundled model (reference kernels, temperature 1, seeds 0..N-1,
from <s>).  Per model and variant: over the sequences, the median / P90 / max of max |fast -
reference-int8| over every position's logits; how many sequences stay within 1e-4 everywhere; how
many positions' greedy tokens differ; and, for scale, the median of max |reference-int8 -
reference|, what quantizing the activations moves itself."""
import argparse
import datetime
import tempfile
from pathlib import Path

import numpy as np

import colibri
from colibri.convert import convert
from colibri.demo import MODEL_DIR

CHECKPOINT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "shakespeare-hf"
WITHIN = 1e-4


def sequences(n, tokens):
    """n token sequences of 1 + `tokens` ids, sampled from the bundled model."""
    model = colibri.Model(MODEL_DIR)
    bos = model.config["bos_token_id"]
    session = model.session(ctx=tokens + 1, kernels="reference")
    out = []
    for seed in range(n):
        session.reset()
        out.append([bos] + session.generate([bos], max_tokens=tokens, temperature=1.0, seed=seed, stop_at_eos=False))
    return out


def all_logits(model, kernels, seqs):
    """float32 [len(seqs), positions, vocab]: every position's logits under `kernels`."""
    session = model.session(ctx=max(map(len, seqs)), kernels=kernels)
    out = []
    for seq in seqs:
        session.reset()
        out.append(session.forward(seq))
    return np.stack(out)


def rows(model_dir, label, seqs, fast_variants):
    model = colibri.Model(model_dir)
    int8_ref = all_logits(model, "reference-int8", seqs)
    float_ref = all_logits(model, "reference", seqs)
    scale = np.median(np.abs(int8_ref - float_ref).max(axis=(1, 2)))
    for variant in fast_variants:
        fast = all_logits(model, variant, seqs)
        worst = np.abs(fast - int8_ref).max(axis=(1, 2))   # (sequences)
        flips = int((fast.argmax(-1) != int8_ref.argmax(-1)).sum())
        yield (f"| {label} | {variant} | {np.median(worst):.1e} | {np.percentile(worst, 90):.1e} | {worst.max():.1e} "
               f"| {int((worst <= WITHIN).sum())} / {len(seqs)} | {flips} / {fast.shape[0] * fast.shape[1]} "
               f"| {scale:.1e} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=32, help="sampled tokens after <s> in each sequence")
    ap.add_argument("--out", help="also write the table to FILE")
    args = ap.parse_args()

    variants = [v for v, runs in colibri.kernel_variants().items() if runs and not v.startswith("reference")]
    seqs = sequences(args.sequences, args.tokens)
    lines = [f"The fast int8 path against reference-int8 on the bundled model: {args.sequences} sampled sequences of "
             f"{args.tokens + 1} tokens, every position's logits ({datetime.date.today()})\n",
             "| model | kernels | max abs diff: median | P90 | max | sequences within 1e-4 | greedy tokens that differ "
             "| int8 vs float (median) |",
             "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("q8_0", "q4_0"):
            for repack, layout in ((None, f"{dtype}x8 (default repack)"), (False, f"{dtype} (--no-repack)")):
                out = convert(CHECKPOINT, Path(tmp) / f"{dtype}-{repack}", dtype=dtype, progress=False, repack=repack)
                for line in rows(out, layout, seqs, variants):
                    print(line, flush=True)
                    lines.append(line)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

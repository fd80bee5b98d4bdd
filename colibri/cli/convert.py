"""colibri convert and colibri validate: a checkpoint or .gguf file to a colibri model, and every
load check of one."""
import argparse
import json
import signal
import sys
from pathlib import Path

from colibri.cli.options import open_model
from colibri.tokenizer import read_regular_text


# convert --quantize NAME: the weight dtype it means (the spec writes w4a16: 4-bit weights, 16-bit activations).
QUANTIZE = {"w4a16": "w4g128", "w4g128": "w4g128", "q8_0": "q8_0", "q4_0": "q4_0"}


def _one_spelling(what, *given):
    """The value of an option that has several spellings: (spelling, value) pairs, None where not given."""
    named = [(flag, value) for flag, value in given if value is not None]
    if len(named) > 1:
        raise SystemExit(f"colibri convert: {' and '.join(flag for flag, _ in named)} both give the {what}: use one")
    return named[0][1] if named else None


def cmd_convert(args):
    from colibri.convert import convert

    src = _one_spelling("source", ("SRC", args.src), ("--input-dir", args.input_dir))
    out = _one_spelling("output directory", ("OUT", args.out), ("--output-dir", args.output_dir))
    if src is None or out is None:
        raise SystemExit("colibri convert: give the source and the output directory (SRC OUT, or --input-dir and --output-dir)")
    dtype = _one_spelling("weight dtype", ("--quant", args.dtype),
                          ("--quantize", QUANTIZE.get(args.quantize) if args.quantize else None)) or "keep"
    # SIGTERM unwinds like Ctrl-C, so the unfinished model is removed (a kill -9 leaves it for the next run)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out = convert(src, out, dtype=dtype, progress=not args.quiet, layout=args.layout, repack=args.repack)
    model = open_model(out)   # convert() has loaded it with verify=True before putting it in place
    matrices = sorted({t["dtype"] for t in model.tensors() if len(t["shape"]) >= 2 and t["dtype"] not in ("u8", "i32")})
    print(f"wrote {out}: {model.architecture}, {len(model.tensors())} tensors, "
          f"{model.weight_bytes / 1e6:.1f} MB of weights, matrices in {', '.join(matrices)} (validated)")
    return 0


def cmd_validate(args):
    model = open_model(args.model, verify=True)
    cfg = model.config
    print(f"{model.path}: valid {model.architecture} model")
    print(f"  {cfg['num_layers']} layers, hidden {cfg['hidden_size']}, {cfg['num_heads']} heads "
          f"({cfg['num_kv_heads']} kv) x {cfg['head_dim']}, vocab {cfg['vocab_size']}")
    print(f"  {cfg['num_experts']} experts of ffn {cfg['intermediate_size']}, top-{cfg['top_k']} routing")
    print(f"  {len(model.tensors())} tensors, {model.weight_bytes:,} bytes: shapes, offsets, "
          f"CRC-32 checksums and finiteness checked")
    enc = json.loads(read_regular_text(Path(model.directory) / "colibri_model.json")).get("encoder")
    print(f"  encoder: {enc['kind']}, {enc['pre_tokenizer']} pre-tokenizer; its ids, merges and order checked" if enc
          else "  no encoder: runs on token ids (reconvert with colibri convert to encode text in the core)")
    return 0


def add_convert(sub):
    c = sub.add_parser("convert", help="Hugging Face directory (config.json + *.safetensors) or .gguf file -> colibri model")
    c.add_argument("src", nargs="?", help="Hugging Face model directory, or a .gguf file (its weights imported as they are)")
    c.add_argument("out", nargs="?", help="output colibri model directory")
    c.add_argument("--input-dir", help="the same as SRC")
    c.add_argument("--output-dir", help="the same as OUT")
    c.add_argument("--dtype", "--quant", choices=["f32", "f16", "bf16", "q8_0", "q4_0", "w4g128"],
                   help="weight storage: default, each weight in the checkpoint's own f32, f16 or bf16; or f32, f16, "
                        "bf16, llama.cpp's q8_0 / q4_0 blocks (int8 activations), or w4g128 (4-bit groups of 128, "
                        "float activations: w4a16) for the matrices")
    c.add_argument("--quantize", choices=sorted(QUANTIZE),
                   help="the quantization by name: w4a16 (= --quant w4g128), or a block format as --quant")
    c.add_argument("--layout", choices=["stacked", "interleaved"], default="stacked",
                   help="the routed experts in weights.bin: stacked (default: each tensor whole) or interleaved "
                        "(each expert's tensors one contiguous extent, one read per expert)")
    c.add_argument("--repack", action=argparse.BooleanOptionalAction, default=None,
                   help="store the block matrices of the matmuls with their rows interleaved in groups of 8 (q4_0x8, "
                        "q8_0x8, q4_kx8, q6_kx8, ...: the same blocks, moved, so the fast kernels read 8 rows at once; "
                        "the same numbers). Default: the forms this machine's kernels run faster than the plain ones; "
                        "--repack: every interleaved form (for a machine whose kernels have them); --no-repack: every "
                        "tensor as the source has it (a .gguf file byte for byte)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_convert)


def add_validate(sub):
    v = sub.add_parser("validate", help="every load check plus checksums, no inference")
    v.add_argument("model", nargs="?", help="colibri model directory or GGUF file (default: the bundled model)")
    v.set_defaults(func=cmd_validate)

"""Write a colibri model directory (docs/FORMAT.md): ``colibri_model.json`` + ``weights.bin``."""

import json
import os
import zlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .errors import ConvertError

ALIGN = 64
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32, "w4g128": 66 / 128}   # bytes per weight
BLOCK = {"q8_0": 32, "q4_0": 32, "w4g128": 128}   # weights per block of the block formats
GGML_TYPE = {"q8_0": "Q8_0", "q4_0": "Q4_0"}   # llama.cpp's block formats, quantized by the gguf package


class Stored:
    """Bytes already in a colibri dtype (a GGUF file's q8_0 blocks, f16 values): written as they are."""

    def __init__(self, data, dtype):
        self.data, self.dtype = np.ascontiguousarray(data), dtype


def stored_dtype(shape, dtype):
    """What a tensor is stored as: the block formats apply to matrices whose rows are whole blocks
    (32 weights, 128 for w4g128); vectors (norms, biases) and other rows (a convolution's 3 taps, a
    64-wide matrix at w4g128) stay f32."""
    if dtype in BLOCK and not (len(shape) >= 2 and shape[-1] % BLOCK[dtype] == 0):
        return "f32"
    return dtype


def quantize_w4g128(x):
    """float32 (..., cols) -> uint8 (..., cols / 128 * 66), colibri's 4-bit group-128 blocks: q4_0's
    rule over 128 weights (d = the weight of largest magnitude / -8, q = trunc(x / d + 8.5) in
    0..15, weight = d * (q - 8)), d stored as f16, then the quants as four q4_0 nibble groups of 32
    (byte j of a group: weight j in the low nibble, weight j + 16 in the high)."""
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, 128)
    peak = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
    d = peak / -8
    if not np.isfinite(d.astype(np.float16)).all():
        raise ConvertError("w4g128: a block's scale is beyond the f16 range (|w| > 524,000); use bf16 or f32")
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, 0, 1 / d)
    q = np.trunc(blocks * inv[:, None] + 8.5).clip(0, 15).astype(np.uint8).reshape(-1, 4, 2, 16)   # block, group, half, j
    nibbles = (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(-1, 64)
    out = np.concatenate([d.astype("<f2").view(np.uint8).reshape(-1, 2), nibbles], axis=1)
    return out.reshape(*x.shape[:-1], x.shape[-1] // 128 * 66)


def f32_to_bf16_bits(x):
    """float32 array -> uint16 bfloat16 bits, rounded to nearest, ties to even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16  # wraps only for NaN patterns, replaced below
    quiet_nan = (u >> 16) | 0x0040
    return np.where(np.isnan(x), quiet_nan, rounded).astype(np.uint16)


def check_dtype(dtype):
    if dtype not in ITEMSIZE:
        raise ConvertError(f"unknown dtype {dtype!r}: expected one of {sorted(ITEMSIZE)}")


# Integer tables (the tokenizer's bytes and offsets) keep their own type whatever the weights' dtype.
INTEGER_DTYPES = {np.dtype(np.uint8): "u8", np.dtype("<i4"): "i32"}


def encode(x, dtype):
    """float32 array -> array of `dtype` (bf16 as its uint16 bits; q8_0 and q4_0 as llama.cpp's
    blocks, w4g128 as colibri's, row by row), little-endian, C order."""
    if dtype in GGML_TYPE:
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        return quantize(np.ascontiguousarray(x, dtype=np.float32), getattr(GGMLQuantizationType, GGML_TYPE[dtype]))
    if dtype == "w4g128":
        return quantize_w4g128(x)
    if dtype == "f32":
        return np.ascontiguousarray(x, dtype="<f4")
    if dtype == "f16":
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(x, dtype="<f2")
    if dtype == "bf16":
        return f32_to_bf16_bits(x).astype("<u2")
    check_dtype(dtype)


def _header_text(doc):
    """The JSON, indented, with each tensor entry on one line so the table reads as a table."""
    head = {k: v for k, v in doc.items() if k != "tensors"}
    text = json.dumps(head, indent=2)
    rows = ",\n".join("    " + json.dumps(t) for t in doc["tensors"])
    return text[:-2] + ',\n  "tensors": [\n' + rows + "\n  ]\n}\n"


def write_model(out_dir, doc, tensors, dtype, progress=True):
    """Stream `tensors` into out_dir/weights.bin, then write colibri_model.json.

    doc: the JSON document without "tensors". tensors: (name, expected shape, load) triples in file
    order, where load() returns a float32 array, or a Stored; then a fourth item names its dtype,
    so the progress bar knows its size. One tensor is in memory at a time. weights.bin is written
    under a temporary name and renamed only when every tensor was written.
    """
    check_dtype(dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = [(t[0], t[1], t[2], t[3] if len(t) > 3 else stored_dtype(t[1], dtype)) for t in tensors]
    total = int(sum(int(np.prod(shape)) * ITEMSIZE.get(stored, 1) for _, shape, _, stored in tensors))
    partial = out_dir / "weights.bin.partial"
    table = []
    try:
        with open(partial, "wb") as f, tqdm(total=total, unit="B", unit_scale=True,
                                            desc="weights.bin", disable=not progress) as bar:
            for name, shape, load, _ in tensors:
                x = load()
                if isinstance(x, Stored):
                    y, stored = x.data, x.dtype
                elif tuple(x.shape) != tuple(shape):
                    raise ConvertError(f"tensor `{name}`: shape {list(x.shape)} != expected {list(shape)}")
                elif x.dtype in INTEGER_DTYPES:
                    y, stored = np.ascontiguousarray(x), INTEGER_DTYPES[x.dtype]
                elif not np.isfinite(x).all():
                    raise ConvertError(f"tensor `{name}`: the source holds NaN or infinite values")
                else:
                    stored = stored_dtype(shape, dtype)
                    y = encode(x, stored)
                if stored == "f16" and not np.isfinite(y).all():
                    raise ConvertError(f"tensor `{name}`: values beyond the f16 range (|x| > 65504); use bf16 or f32")
                data = y.tobytes()
                f.write(b"\0" * (-f.tell() % ALIGN))
                table.append({"name": name, "dtype": stored, "shape": list(shape), "file_offset": f.tell(),
                              "file_size": len(data), "checksum": "crc32:%08x" % zlib.crc32(data)})
                f.write(data)
                bar.update(min(len(data), total - bar.n))
        os.replace(partial, out_dir / "weights.bin")
    finally:
        partial.unlink(missing_ok=True)
    (out_dir / "colibri_model.json").write_text(_header_text({**doc, "tensors": table}))

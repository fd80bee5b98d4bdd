"""Write a colibri model directory (docs/FORMAT.md): ``colibri_model.json`` + ``weights.bin``."""

import json
import os
import zlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .errors import ConvertError

ALIGN = 64
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32, "q4_0": 18 / 32}   # bytes per weight
QUANTIZED = {"q8_0": "Q8_0", "q4_0": "Q4_0"}   # llama.cpp's block formats, quantized by the gguf package
BLOCK = 32


class Stored:
    """Bytes already in a colibri dtype (a GGUF file's q8_0 blocks, f16 values): written as they are."""

    def __init__(self, data, dtype):
        self.data, self.dtype = np.ascontiguousarray(data), dtype


def stored_dtype(shape, dtype):
    """What a tensor is stored as: the block formats apply to matrices whose rows are whole blocks of
    32; vectors (norms, biases) and odd rows (a convolution's 3 taps) stay f32."""
    if dtype in QUANTIZED and not (len(shape) >= 2 and shape[-1] % BLOCK == 0):
        return "f32"
    return dtype


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
    blocks, row by row), little-endian, C order."""
    if dtype in QUANTIZED:
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        return quantize(np.ascontiguousarray(x, dtype=np.float32), getattr(GGMLQuantizationType, QUANTIZED[dtype]))
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
    order, where load() returns a float32 array. One tensor is in memory at a time. weights.bin is
    written under a temporary name and renamed only when every tensor was written.
    """
    check_dtype(dtype)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = list(tensors)
    total = int(sum(int(np.prod(shape)) * ITEMSIZE[stored_dtype(shape, dtype)] for _, shape, _ in tensors))
    partial = out_dir / "weights.bin.partial"
    table = []
    try:
        with open(partial, "wb") as f, tqdm(total=total, unit="B", unit_scale=True,
                                            desc="weights.bin", disable=not progress) as bar:
            for name, shape, load in tensors:
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

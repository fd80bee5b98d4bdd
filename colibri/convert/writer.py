"""Write a colibri model directory (docs/FORMAT.md): ``colibri_model.json`` + ``weights.bin``."""

import functools
import json
import re
import zlib
from pathlib import Path

import numpy as np

from .errors import ConvertError

ALIGN = 64
DTYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "w4g128")   # what a float checkpoint can be written as
OWN_BLOCKS = {"w4g128": (128, 66), "u8": (1, 1), "i32": (1, 4)}   # (weights, bytes) of colibri's own blocks
GGML_TYPE = {"q8_0": "Q8_0", "q4_0": "Q4_0"}   # llama.cpp's block formats, quantized by the gguf package


@functools.cache
def block_size(dtype):
    """(weights, bytes) of one block of stored dtype `dtype` (1 weight for f32, f16, bf16): llama.cpp's
    formats (a GGUF file's types, of the same names) as the gguf package sizes them."""
    if dtype in OWN_BLOCKS:
        return OWN_BLOCKS[dtype]
    if dtype.endswith("x8"):   # a row-interleaved form: its plain format's blocks, moved
        return block_size(dtype[:-2])
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[dtype.upper()]]


def nbytes(shape, dtype):
    """The bytes a tensor of `shape` takes as `dtype` (its rows whole blocks)."""
    weights, size = block_size(dtype)
    return int(np.prod(shape, dtype=np.int64)) // weights * size


class Stored:
    """Bytes already in a colibri dtype (a GGUF file's q8_0 blocks, f16 values): written as they are.
    `at`: where they lie in their file, when they are a file's bytes as they are (a GGUF run in place
    uses them there)."""

    def __init__(self, data, dtype, at=None):
        self.data, self.dtype, self.at = np.ascontiguousarray(data), dtype, at


def stored_dtype(shape, dtype):
    """What a tensor is stored as: the block formats apply to matrices whose rows are whole blocks
    (32 weights, 128 for w4g128); vectors (norms, biases) and other rows (a convolution's 3 taps, a
    64-wide matrix at w4g128) stay f32."""
    block = block_size(dtype)[0]
    if block > 1 and not (len(shape) >= 2 and shape[-1] % block == 0):
        return "f32"
    return dtype


# The matrices the core multiplies only through colibri_matmul (c_core/src/model/tensors.c's names), so
# the only ones it takes in the row-interleaved forms (q4_0x8, q4_kx8, ...: docs/FORMAT.md): not the
# token embedding (read by row, and the LM head when tied) nor attn.wkv_b (latent attention reads each
# head's key rows on their own).
MATMUL_TENSOR = re.compile(r"(layers\.\d+\.(attn\.(wq|wk|wv|wo|wq_a|wq_b|wkv_a)|conv\.(in_proj|out_proj)|router"
                           r"|experts\.(w1|w3|w2)|shared\.(w1|w3|w2|gate)|mlp\.(w1|w3|w2))|lm_head)$")
REPACK = (False, True, "fast")   # byte for byte; every interleaved form; the forms this CPU's kernels run faster


def repacked_dtype(name, shape, dtype, fast_here=False):
    """The row-interleaved form of a block dtype (the core's: q4_0 -> q4_0x8, q4_k -> q4_kx8, ...) for a
    matrix of the core's matmuls with rows (its second-to-last dimension: each expert's rows) in whole
    groups of 8; with fast_here, only a form the kernels here run faster than the plain one; otherwise
    `dtype` itself."""
    from colibri._core import interleaved_form

    if MATMUL_TENSOR.match(name) and len(shape) >= 2 and shape[-2] % 8 == 0:
        return interleaved_form(dtype, fast_here) or dtype
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
    if dtype not in DTYPES:
        raise ConvertError(f"unknown dtype {dtype!r}: expected one of {sorted(DTYPES)}")


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
    text = json.dumps(head, indent=2, allow_nan=False)   # NaN is not JSON: the core would refuse it
    rows = ",\n".join("    " + json.dumps(t) for t in doc["tensors"])
    return text[:-2] + ',\n  "tensors": [\n' + rows + "\n  ]\n}\n"


LAYOUTS = ("stacked", "interleaved")   # experts.weight_layout
# The routed experts' tensors: stacked, each holds its E experts one after another; interleaved, each
# expert's parts of all of a layer's expert tensors lie side by side in one extent (docs/FORMAT.md).
EXPERT_TENSOR = re.compile(r"layers\.(\d+)\.experts\.(w1|w3|w2|b1|b3|b2)$")


def check_layout(layout):
    if layout not in LAYOUTS:
        raise ConvertError(f"unknown layout {layout!r}: expected one of {', '.join(LAYOUTS)}")


def check_repack(repack):
    if repack not in REPACK:   # 1 == True, 0 == False: what a caller means by them
        raise ConvertError(f"repack={repack!r}: expected one of {', '.join(map(repr, REPACK))}")


def _repacked(name, shape, y, stored, repack):
    """(y, stored) in the interleaved form where repacked_dtype allows it: the same bytes, moved by the core."""
    from colibri._core import interleave_rows

    x8 = repacked_dtype(name, shape, stored, fast_here=repack == "fast")
    if x8 == stored:
        return y, stored
    return interleave_rows(np.asarray(y).reshape(*shape[:-1], nbytes(shape[-1:], stored)), stored), x8


def _encoded(name, shape, load, planned, repack=False):
    """(bytes, stored dtype) of one tensor of the plan, a float array written as `planned` (its
    fourth item); with `repack` (REPACK), block matrices of the core's matmuls in their interleaved forms."""
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
        stored = planned
        y = encode(x, stored)
    if stored == "f16" and not np.isfinite(y).all():
        raise ConvertError(f"tensor `{name}`: values beyond the f16 range (|x| > 65504); use bf16 or f32")
    if repack:
        y, stored = _repacked(name, shape, y, stored, repack)
    return y.tobytes(), stored


def _groups(tensors, layout):
    """The plan as (extents, members): one tensor alone, or with the interleaved layout a layer's
    routed-expert tensors together, at the place of the first of them."""
    groups, layers = [], {}
    for t in tensors:
        match = EXPERT_TENSOR.match(t[0]) if layout == "interleaved" else None
        if match is None:
            groups.append((False, [t]))
        elif match.group(1) in layers:
            layers[match.group(1)].append(t)
        else:
            layers[match.group(1)] = [t]
            groups.append((True, layers[match.group(1)]))
    return groups


def _pad(f):
    f.write(b"\0" * (-f.tell() % ALIGN))


def _entry(name, stored, shape, offset, data, **extra):
    return {"name": name, "dtype": stored, "shape": list(shape), "file_offset": offset, "file_size": len(data),
            **extra, "checksum": "crc32:%08x" % zlib.crc32(data)}


def _count(bar, estimate, size):
    """The bar's total corrected where `size`, a tensor's bytes, differs from its `estimate` (an
    integer table given without its dtype was counted as f32): at the end, total = bytes written."""
    if size != estimate:
        bar.total += size - estimate
        bar.refresh()


def _write_extents(f, group, table, bar, repack):
    """One layer's routed-expert tensors as E extents: expert e's extent holds its part of each
    tensor in plan order, each part 64-byte aligned; the stride (the extent's size) is a multiple of
    64. The bytes are the stacked tensors' bytes, rearranged, so the checksums do not change."""
    encoded = [_encoded(name, shape, load, planned, repack) for name, shape, load, planned in group]
    _count(bar, sum(nbytes(shape, stored) for _, shape, _, stored in group), sum(len(data) for data, _ in encoded))
    n_experts = group[0][1][0]
    parts = []
    for (name, shape, _, _), (data, _) in zip(group, encoded):
        if shape[0] != n_experts or len(data) % n_experts:
            raise ConvertError(f"tensor `{name}`: shape {list(shape)} does not hold {n_experts} experts")
        parts.append(len(data) // n_experts)
    at, stride = [], 0
    for part in parts:
        at.append(stride)
        stride += -(-part // ALIGN) * ALIGN
    _pad(f)
    base = f.tell()
    checksums = []   # one per extent, its padding included: a session may check what it streams
    for e in range(n_experts):
        extent = b"".join(data[e * part:(e + 1) * part].ljust(-(-part // ALIGN) * ALIGN, b"\0")
                          for (data, _), part in zip(encoded, parts))
        checksums.append("crc32:%08x" % zlib.crc32(extent))
        f.write(extent)
        bar.update(sum(parts))
    for i, ((name, shape, _, _), (data, stored), offset) in enumerate(zip(group, encoded, at)):
        extra = dict(extent_checksums=checksums) if i == 0 else {}
        table.append(_entry(name, stored, shape, base + offset, data, expert_stride=stride, **extra))


def write_model(out_dir, doc, tensors, dtype, progress=True, layout="stacked", repack=False):
    """Stream `tensors` into out_dir/weights.bin, then write colibri_model.json.

    doc: the JSON document without "tensors". tensors: (name, expected shape, load) triples in file
    order, where load() returns a float32 array, or a Stored; a fourth item names the dtype it is
    stored as (a float array is written so; by default stored_dtype(shape, dtype)), so the progress
    bar knows its size. One tensor is in memory at a time; with layout
    "interleaved", one layer's routed-expert tensors, written as its experts' extents, all of them
    after every other tensor: weights.bin is then the resident prefix (what a device keeps in
    memory), then the extents (what it may stream). The table keeps the plan's order. With
    `repack` (REPACK: True, or "fast" for the forms this CPU's kernels run faster), the block
    matrices the core allows in the interleaved forms (repacked_dtype) are stored so, the Stored
    ones too. out_dir is written in place: convert() gives it a fresh directory it renames into
    place (output.py).
    """
    check_dtype(dtype)
    check_layout(layout)
    check_repack(repack)
    tensors = list(tensors)
    block = block_size(dtype)[0]
    if block > 1:   # a quantization that would quantize nothing is refused, not written as f32
        widths = sorted({int(t[1][-1]) for t in tensors if len(t) <= 3 and len(t[1]) >= 2})
        if widths and all(w % block for w in widths):
            raise ConvertError(f"{dtype} quantizes matrices whose rows are whole blocks of {block} weights; "
                               f"this model's rows have {', '.join(map(str, widths))}: every weight would stay f32 "
                               f"(q8_0 and q4_0 take blocks of 32; f16 and bf16 any row)")
    from tqdm import tqdm   # the "convert" extra, as the readers are

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = [(t[0], t[1], t[2], t[3] if len(t) > 3 else stored_dtype(t[1], dtype)) for t in tensors]
    total = sum(nbytes(shape, stored) for _, shape, _, stored in tensors)   # bytes, padding aside
    groups = _groups(tensors, layout)
    rows = [[] for _ in groups]   # each group's table entries, in plan order
    with open(out_dir / "weights.bin", "wb") as f, tqdm(total=total, unit="B", unit_scale=True,
                                                        desc="weights.bin", disable=not progress) as bar:
        for i in sorted(range(len(groups)), key=lambda i: groups[i][0]):   # the extents last
            extents, group = groups[i]
            if extents:
                _write_extents(f, group, rows[i], bar, repack)
                continue
            name, shape, load, planned = group[0]
            data, stored = _encoded(name, shape, load, planned, repack)
            _pad(f)
            rows[i].append(_entry(name, stored, shape, f.tell(), data))
            f.write(data)
            _count(bar, nbytes(shape, group[0][3]), len(data))
            bar.update(len(data))
    table = [entry for row in rows for entry in row]
    if "experts" in doc:
        doc = {**doc, "experts": {**doc["experts"], "weight_layout": layout}}
    (out_dir / "colibri_model.json").write_text(_header_text({**doc, "tensors": table}))

"""The row-interleaved block formats (docs/FORMAT.md): q4_0, q8_0, q4_k, q5_k, q6_k, iq4_xs and mxfp4
blocks with each group of 8 rows interleaved.  The core's permutation against the format's definition,
byte by byte; which tensors the converter stores so; then whole models, converted from a checkpoint
and imported from a GGUF file, repacked and plain: the same bytes moved, strict-mode logits
bit-identical, the fast kernels' logits within the int8 path's bound, and validation."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from colibri._core import interleave_rows, interleaved_form
from colibri.convert.writer import MATMUL_TENSOR, block_size, nbytes, repacked_dtype, write_model
from support import FIXTURES

KINDS = {"q4_0": GGMLQuantizationType.Q4_0, "q8_0": GGMLQuantizationType.Q8_0}
TOKENS = np.random.default_rng(19).integers(0, 320, 24).astype(np.int32)
# The plain blocks' fields, in bytes, as docs/FORMAT.md lists them for the interleaved forms.
FIELDS = {"q4_0": (2, 16), "q8_0": (2, 32), "q4_k": (2, 2, 4, 4, 4, 128), "q5_k": (2, 2, 4, 4, 4, 32, 128),
          "q6_k": (128, 64, 16, 2), "iq4_xs": (2, 2, 4, 128), "mxfp4": (1, 16)}


# ------------------------------------------------------------------------------- the permutation

def group_positions(dtype):
    """pos (8, B): where byte k of row i's block goes in its group of 8 * B bytes, as docs/FORMAT.md
    defines it: each field of the plain block in turn, the 8 rows' copies side by side, a field of 8k
    bytes in 8-byte pieces (row i's piece c at 64 c + 8 i of the field's copies), a smaller one row
    after row (row i's at size * i)."""
    B = block_size(dtype)[1]
    pos = np.full((8, B), -1)
    at = byte = 0
    for size in FIELDS[dtype]:
        for i in range(8):
            for k in range(size):
                pos[i, byte + k] = at + (size * i + k if size % 8 else 64 * (k // 8) + 8 * i + k % 8)
        at, byte = at + 8 * size, byte + size
    assert byte == B and sorted(pos.ravel()) == list(range(8 * B))
    return pos


def _groups(a, dtype):
    B = block_size(dtype)[1]
    rows, nb = a.shape[-2], a.shape[-1] // B
    assert rows % 8 == 0 and a.shape[-1] % B == 0
    return rows, nb, B


def interleave_by_definition(plain, dtype):
    """The interleaved bytes of plain (..., rows, nb * B) by the definition (group_positions)."""
    a = np.ascontiguousarray(plain, np.uint8)
    rows, nb, B = _groups(a, dtype)
    blocks = a.reshape(-1, rows // 8, 8, nb, B).transpose(0, 1, 3, 2, 4)   # expert, group, block column, row, byte
    out = np.empty((*blocks.shape[:3], 8 * B), np.uint8)
    out[..., group_positions(dtype)] = blocks
    return out.reshape(a.shape)


def deinterleave_by_definition(x8, dtype):
    a = np.ascontiguousarray(x8, np.uint8)
    rows, nb, B = _groups(a, dtype)
    blocks = a.reshape(-1, rows // 8, nb, 8 * B)[..., group_positions(dtype)]   # expert, group, column, row, byte
    return blocks.transpose(0, 1, 3, 2, 4).reshape(a.shape)


def decode_x8(x8, dtype, rows, cols):
    """The weights of a q4_0x8 / q8_0x8 matrix decoded by the format's definition alone: row i of group
    g, block b: d = the block group's f16 d[i]; q4_0 quant byte j (j < 16) holds weight j in the low
    nibble and weight j + 16 in the high one, value d * (nibble - 8); q8_0 byte j is weight j, d * q."""
    B = block_size(dtype)[1]
    groups = np.asarray(x8, dtype=np.uint8).reshape(rows // 8, cols // 32, 8 * B)
    w = np.empty((rows, cols), dtype=np.float32)
    for g in range(rows // 8):
        for b in range(cols // 32):
            bg = groups[g, b]
            for i in range(8):
                d = np.float32(bg[2 * i:2 * i + 2].view("<f2")[0])
                quants = np.array([bg[16 + 64 * (j // 8) + 8 * i + j % 8] for j in range(B - 2)], dtype=np.uint8)
                if dtype == "q4_0":
                    values = np.concatenate([quants & 0x0F, quants >> 4]).astype(np.float32) - 8
                else:
                    values = quants.view(np.int8).astype(np.float32)
                w[8 * g + i, 32 * b:32 * (b + 1)] = d * values
    return w


@pytest.mark.parametrize("dtype", ["q4_0", "q8_0"])
def test_an_interleaved_matrix_decodes_to_the_plain_weights(dtype):
    """16 rows of 3 blocks (two groups), quantized by the gguf package: the core's permutation equals
    the definition byte by byte, and the definition's decoding gives the weights of the plain blocks."""
    w = np.random.default_rng(1).standard_normal((16, 96)).astype(np.float32)
    plain = quantize(w, KINDS[dtype])
    assert plain.shape == (16, nbytes((96,), dtype))
    x8 = interleave_rows(plain, dtype)
    assert x8.shape == plain.shape and x8.dtype == np.uint8
    np.testing.assert_array_equal(x8, interleave_by_definition(plain, dtype))
    np.testing.assert_array_equal(decode_x8(x8, dtype, 16, 96), dequantize(plain, KINDS[dtype]).reshape(16, 96))


@pytest.mark.parametrize("dtype", list(FIELDS))
@pytest.mark.parametrize("shape", [(8, 1), (24, 3), (3, 16, 2), (2, 2, 8, 5)])
def test_the_cores_interleaving_is_the_definition(dtype, shape):
    """Any bytes, any leading dimensions (stacked experts, each 8 rows of one expert a group): the
    core's bytes are the definition's, group by group, and the definition's inverse undoes them."""
    B = block_size(dtype)[1]
    plain = np.random.default_rng(2).integers(0, 256, (*shape[:-1], shape[-1] * B), dtype=np.uint8)
    x8 = interleave_rows(plain, dtype)
    assert x8.shape == plain.shape and not np.array_equal(x8, plain)
    np.testing.assert_array_equal(x8, interleave_by_definition(plain, dtype))
    np.testing.assert_array_equal(deinterleave_by_definition(x8, dtype), plain)
    np.testing.assert_array_equal(interleave_rows(x8, dtype + "x8"), plain)   # and the core's way back
    experts = plain.reshape(-1, *plain.shape[-2:])
    np.testing.assert_array_equal(x8.reshape(experts.shape), np.stack([interleave_rows(e, dtype) for e in experts]))
    assert interleaved_form(dtype) == dtype + "x8" and block_size(dtype + "x8") == block_size(dtype)


def test_rows_that_are_not_groups_of_8_are_refused():
    with pytest.raises(ValueError, match=r"rows in groups of 8, not shape \[12, 36\]"):
        interleave_rows(np.zeros((12, 36), np.uint8), "q4_0")
    with pytest.raises(ValueError, match="rows of 35 bytes are not whole 34-byte blocks"):
        interleave_rows(np.zeros((8, 35), np.uint8), "q8_0")
    with pytest.raises(ValueError, match="q3_k has no row-interleaved form"):
        interleave_rows(np.zeros((8, 110), np.uint8), "q3_k")
    assert interleaved_form("q3_k") is None and interleaved_form("f16") is None


def test_block_sizes_are_the_plain_formats():
    assert block_size("q4_0x8") == block_size("q4_0") == (32, 18)
    assert block_size("q8_0x8") == block_size("q8_0") == (32, 34)
    assert nbytes((4, 96, 64), "q4_0x8") == nbytes((4, 96, 64), "q4_0") == 4 * 96 * 2 * 18


# ------------------------------------------------------------------------------- which tensors

def tensor_kinds():
    """The core's tensor names (c_core/src/model/tensors.c's tables), "layers.N." for a layer's."""
    source = (Path(__file__).resolve().parents[1] / "c_core" / "src" / "model" / "tensors.c").read_text()
    layer = re.search(r"colibri_layer_tensor_names\[[^]]*\] = \{(.*?)\};", source, re.S).group(1)
    names = ["layers.0." + n for n in re.findall(r'"([^"]+)"', layer)]
    glob = re.search(r"\[G_TOK_EMBEDDINGS\].*?\};", source, re.S).group(0)
    return names + re.findall(r'"([^"]+)"', glob)


# the tensors the forward pass multiplies through colibri_matmul, and nothing else
MATMULS = {"attn.wq", "attn.wk", "attn.wv", "attn.wo", "attn.wq_a", "attn.wq_b", "attn.wkv_a", "conv.in_proj",
           "conv.out_proj", "router", "experts.w1", "experts.w3", "experts.w2", "shared.w1", "shared.w3",
           "shared.w2", "shared.gate", "mlp.w1", "mlp.w3", "mlp.w2", "lm_head"}


def test_the_repacked_tensors_are_the_cores_matmuls():
    """Every name of the core's tables is repacked exactly when it is one of its matmuls' weights:
    the token embedding, attn.wkv_b (latent attention reads its rows one head at a time), biases,
    norms and the tokenizer's tables are not."""
    names = tensor_kinds()
    assert "tok_embeddings" in names and "layers.0.attn.wkv_b" in names and "layers.0.experts.w2" in names
    for name in names:
        kind = name[len("layers.0."):] if name.startswith("layers.") else name
        assert bool(MATMUL_TENSOR.match(name)) == (kind in MATMULS), name
    assert repacked_dtype("layers.12.experts.w1", (8, 96, 64), "q4_0") == "q4_0x8"
    assert repacked_dtype("lm_head", (320, 64), "q8_0") == "q8_0x8"
    assert repacked_dtype("layers.0.router", (4, 64), "q4_0") == "q4_0"   # 4 rows: not a group of 8
    assert repacked_dtype("layers.0.experts.w2", (8, 68, 96), "q4_0") == "q4_0"   # 68 rows an expert
    assert repacked_dtype("tok_embeddings", (320, 64), "q4_0") == "q4_0"
    assert repacked_dtype("layers.0.attn.wkv_b", (64, 32), "q8_0") == "q8_0"
    assert repacked_dtype("layers.0.attn.wq", (64, 64), "q4_k") == "q4_kx8"
    assert repacked_dtype("layers.0.attn.wq", (64, 64), "q3_k") == "q3_k"   # no interleaved form
    assert repacked_dtype("layers.0.attn.wq", (64, 64), "f16") == "f16"
    # fast_here: the forms the kernels here have kernels of their own for (the x86 ones: q4_k and q6_k too)
    assert repacked_dtype("lm_head", (64, 64), "q4_k", fast_here=True) == interleaved_form("q4_k", fast_here=True)
    assert repacked_dtype("lm_head", (64, 64), "q5_k", fast_here=True) == (interleaved_form("q5_k", fast_here=True) or "q5_k")


def written(tmp_path, repack, layout="stacked"):
    """A table of tensors written at q4_0: (json table by name, weights.bin bytes)."""
    shapes = {"tok_embeddings": (16, 64), "layers.0.attn.wq": (64, 64), "layers.0.router": (4, 64),
              "layers.0.experts.w1": (4, 96, 64), "layers.0.experts.w2": (4, 64, 96), "layers.0.ffn_norm": (64,),
              "lm_head": (16, 64)}
    tensors = [(name, shape, lambda i=i, shape=shape: np.random.default_rng(i).standard_normal(shape).astype(np.float32))
               for i, (name, shape) in enumerate(shapes.items())]
    out = tmp_path / f"{repack}-{layout}"
    doc = {"format": "colibri", "version": 1, "experts": {"count": 4}}
    write_model(out, doc, tensors, "q4_0", progress=False, layout=layout, repack=repack)
    table = {t["name"]: t for t in json.loads((out / "colibri_model.json").read_text())["tensors"]}
    return table, (out / "weights.bin").read_bytes()


def tensor_bytes(blob, t, n_experts=4):
    """A tensor's bytes from weights.bin, its parts in expert order when interleaved."""
    stride, start, size = t.get("expert_stride", 0), t["file_offset"], t["file_size"]
    if not stride:
        return blob[start:start + size]
    part = size // n_experts
    return b"".join(blob[start + e * stride:start + e * stride + part] for e in range(n_experts))


def as_plain(data, t):
    """The plain bytes of tensor entry t (those of an interleaved one de-interleaved)."""
    if not t["dtype"].endswith("x8"):
        return data
    shape = t["shape"]
    x8 = np.frombuffer(data, np.uint8).reshape(*shape[:-1], nbytes(shape[-1:], t["dtype"]))
    return deinterleave_by_definition(x8, t["dtype"][:-2]).tobytes()


@pytest.mark.parametrize("layout", ["stacked", "interleaved"])
def test_the_writer_moves_the_blocks_of_the_matmuls(layout, tmp_path):
    plain, plain_blob = written(tmp_path, False, layout)
    x8, x8_blob = written(tmp_path, True, layout)
    assert {n: t["dtype"] for n, t in plain.items()} == {
        "tok_embeddings": "q4_0", "layers.0.attn.wq": "q4_0", "layers.0.router": "q4_0", "layers.0.experts.w1": "q4_0",
        "layers.0.experts.w2": "q4_0", "layers.0.ffn_norm": "f32", "lm_head": "q4_0"}
    assert {n: t["dtype"] for n, t in x8.items()} == {
        "tok_embeddings": "q4_0", "layers.0.attn.wq": "q4_0x8", "layers.0.router": "q4_0",
        "layers.0.experts.w1": "q4_0x8", "layers.0.experts.w2": "q4_0x8", "layers.0.ffn_norm": "f32",
        "lm_head": "q4_0x8"}
    assert len(x8_blob) == len(plain_blob)
    for name, t in x8.items():
        u = plain[name]
        assert (t["file_offset"], t["file_size"], t.get("expert_stride")) == \
            (u["file_offset"], u["file_size"], u.get("expert_stride")), name
        data = tensor_bytes(x8_blob, t)
        assert as_plain(data, t) == tensor_bytes(plain_blob, u), name
        assert (data == tensor_bytes(plain_blob, u)) == (t["dtype"] == u["dtype"]), name


# ------------------------------------------------------------------------------- whole models (the core)
# These need a core that loads q4_0x8 / q8_0x8 (colibri_dtype 19, 20).

def colibri_core():
    import colibri

    return colibri


def model_pair(root, src, **kw):
    """(repacked, plain) conversions of src: repack=True and repack=False."""
    from colibri.convert import convert

    return (convert(src, root / "x8", progress=False, repack=True, **kw),
            convert(src, root / "plain", progress=False, repack=False, **kw))


def table(model_dir):
    return {t["name"]: t for t in json.loads((Path(model_dir) / "colibri_model.json").read_text())["tensors"]}


def assert_moved_blocks(x8_dir, plain_dir, fast_here=False):
    """The repacked model is the plain one with the blocks of its matmuls with rows in groups of 8
    moved (into the forms repack=True writes, or with fast_here the default's): the dtypes, the same
    file, each interleaved tensor's bytes de-interleaved the plain ones."""
    x8, plain = table(x8_dir), table(plain_dir)
    assert list(x8) == list(plain)
    n_repacked = 0
    for name, t in x8.items():
        u = plain[name]
        rows = t["shape"][-2] if len(t["shape"]) >= 2 else 0
        form = interleaved_form(u["dtype"], fast_here) if u["dtype"] in FIELDS else None
        want = form if form and MATMUL_TENSOR.match(name) and rows % 8 == 0 else u["dtype"]
        assert t["dtype"] == want, name
        n_repacked += want != u["dtype"]
        assert (t["shape"], t["file_offset"], t["file_size"]) == (u["shape"], u["file_offset"], u["file_size"]), name
    assert n_repacked >= 4 or fast_here
    x8_blob, plain_blob = (Path(x8_dir) / "weights.bin").read_bytes(), (Path(plain_dir) / "weights.bin").read_bytes()
    assert len(x8_blob) == len(plain_blob)
    for name, t in x8.items():
        assert as_plain(tensor_bytes(x8_blob, t), t) == tensor_bytes(plain_blob, plain[name]), name


def assert_same_numbers(x8_dir, plain_dir, tokens=TOKENS):
    """Strict mode (and the scalar int8 path) read a row's blocks from the groups and compute what
    the plain format computes: bit-identical logits.  The fast kernels take the same integer dots,
    summed in float in another order, which can flip an activation's int8 rounding or a router's
    choice (the plain format's fast kernels do so as often): within the bound test_gguf_quants.py
    sets the int8 path's fast kernels, 5% of the logits' size, of the scalar int8 path's logits and
    of the plain model's fast ones."""
    colibri = colibri_core()
    x8, plain = colibri.Model(x8_dir, verify=True), colibri.Model(plain_dir, verify=True)
    for kernels in ("reference", "reference-int8"):
        a = x8.session(ctx=64, kernels=kernels).forward(tokens)
        b = plain.session(ctx=64, kernels=kernels).forward(tokens)
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), kernels
    int8_ref, scale = b, np.abs(b).max()
    fast = x8.session(ctx=64)
    ours, theirs = fast.forward(tokens), plain.session(ctx=64).forward(tokens)
    print(f"{fast.kernels}: max |x8 - plain| = {np.abs(ours - theirs).max():.2e}, "
          f"max |x8 - reference-int8| = {np.abs(ours - int8_ref).max():.2e} of {scale:.2e}")
    assert np.abs(ours - int8_ref).max() <= 0.05 * scale
    assert np.abs(ours - theirs).max() <= 0.05 * scale


def assert_by_row_and_short_stay_plain(x8_dir, dtype):
    """The tiny Mixtral's embedding (read by row) and router (4 rows) stay plain."""
    x8 = table(x8_dir)
    assert x8["tok_embeddings"]["dtype"] == x8["layers.0.router"]["dtype"] == dtype
    assert {x8[f"layers.{i}.{m}"]["dtype"] for i in (0, 1) for m in ("attn.wq", "attn.wk", "attn.wv", "attn.wo",
            "experts.w1", "experts.w3", "experts.w2")} | {x8["lm_head"]["dtype"]} == {dtype + "x8"}


@pytest.mark.parametrize("layout", ["stacked", "interleaved"])
@pytest.mark.parametrize("dtype", ["q4_0", "q8_0"])
def test_a_repacked_checkpoint_computes_the_plain_numbers(dtype, layout, tmp_path):
    x8, plain = model_pair(tmp_path, FIXTURES / "tiny-mixtral", dtype=dtype, layout=layout)
    assert_moved_blocks(x8, plain)
    assert_by_row_and_short_stay_plain(x8, dtype)
    assert_same_numbers(x8, plain)


@pytest.mark.parametrize("dtype", ["q4_0", "q8_0"])
def test_a_gguf_import_is_repacked_unless_asked_not_to(dtype, tmp_path):
    """Byte for byte with repack=False (the GGUF's own q4_0 / q8_0), moved with repack=True, and by
    default in the forms this machine's kernels run faster."""
    from colibri.convert import convert
    from test_gguf_import import write_gguf

    write_gguf(tmp_path / "model.gguf", KINDS[dtype])
    x8, plain = model_pair(tmp_path, tmp_path / "model.gguf")
    assert {t["dtype"] for t in table(plain).values() if len(t["shape"]) >= 2 and t["dtype"] not in ("u8", "i32")} \
        == {dtype}
    assert_moved_blocks(x8, plain)
    assert_by_row_and_short_stay_plain(x8, dtype)
    assert_same_numbers(x8, plain)
    assert_moved_blocks(convert(tmp_path / "model.gguf", tmp_path / "default", progress=False), plain, fast_here=True)


@pytest.mark.parametrize("kquant", ["Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "MXFP4"])
def test_a_ggufs_k_quants_are_repacked(kquant, tmp_path):
    """A file of K-quant (or IQ4_XS, MXFP4) attention and experts, a Q6_K embedding and a Q4_0
    router and LM head: repack=True moves the blocks of every matmul of 8-row groups into its
    interleaved form, leaves the embedding and the 4-row router as they are, and computes the plain
    file's numbers (bit for bit in strict mode); the default moves the forms the kernels here run
    faster."""
    from colibri.convert import convert
    import test_gguf_quants as kq

    def kind(name):
        return kquant if ("attn" in name or "exps" in name) else "Q6_K" if "token_embd" in name else "F32"
    tensors = kq.model_tensors(kind, np.random.default_rng(7))
    for name, (k, x) in tensors.items():
        if k == "F32" and x.ndim >= 2:
            tensors[name] = ("Q4_0", quantize(x, GGMLQuantizationType.Q4_0))
    path = kq.write_gguf(tmp_path / "model.gguf", tensors)
    x8, plain = model_pair(tmp_path, path)
    assert_moved_blocks(x8, plain)
    got = {name: t["dtype"] for name, t in table(x8).items()}
    want = kquant.lower()
    assert got["tok_embeddings"] == "q6_k" and got["layers.1.router"] == "q4_0" and got["lm_head"] == "q4_0x8"
    assert {got[f"layers.1.{m}"] for m in ("attn.wq", "experts.w1", "experts.w2")} == {want + "x8"}, got
    assert_same_numbers(x8, plain, kq.TOKENS)
    assert_moved_blocks(convert(path, tmp_path / "default", progress=False), plain, fast_here=True)


def colibri_cli(*args):
    return subprocess.run([sys.executable, "-m", "colibri", *map(str, args)], capture_output=True, text=True)


def test_the_convert_command_repacks_by_default(tmp_path):
    """`colibri convert --quant q4_0` repacks, --no-repack does not, and `colibri validate` passes
    the repacked model; a GGUF import with --repack too."""
    from test_gguf_import import write_gguf

    r = colibri_cli("convert", FIXTURES / "tiny-mixtral", tmp_path / "x8", "--quant", "q4_0", "--quiet")
    assert r.returncode == 0 and "q4_0x8" in r.stdout, r.stdout + r.stderr
    r = colibri_cli("convert", FIXTURES / "tiny-mixtral", tmp_path / "plain", "--quant", "q4_0", "--no-repack", "--quiet")
    assert r.returncode == 0 and "q4_0x8" not in r.stdout, r.stdout + r.stderr
    assert_moved_blocks(tmp_path / "x8", tmp_path / "plain")
    r = colibri_cli("validate", tmp_path / "x8")
    assert r.returncode == 0 and "valid mixtral model" in r.stdout, r.stdout + r.stderr
    write_gguf(tmp_path / "model.gguf", GGMLQuantizationType.Q8_0)
    r = colibri_cli("convert", tmp_path / "model.gguf", tmp_path / "gguf-x8", "--repack", "--quiet")
    assert r.returncode == 0 and "q8_0x8" in r.stdout, r.stdout + r.stderr
    r = colibri_cli("validate", tmp_path / "gguf-x8")
    assert r.returncode == 0 and "valid mixtral model" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("family", ["deepseek_v3", "lfm2_moe", "qwen2_moe", "gpt_oss"])
def test_every_repacked_tensor_of_a_family_loads(family, tmp_path):
    """convert() loads what it writes (verify=True), so a tensor the core does not take in the x8
    form (a latent attention's wkv_b, a shared expert's gate) fails the conversion; and strict
    mode computes the plain model's bits."""
    from support import build

    build(family).save_pretrained(tmp_path / "hf")
    x8, plain = model_pair(tmp_path, tmp_path / "hf", dtype="q8_0")
    assert any(t["dtype"] == "q8_0x8" for t in table(x8).values())
    colibri = colibri_core()
    tokens = TOKENS % 128
    a = colibri.Model(x8).session(ctx=64, kernels="reference").forward(tokens)
    b = colibri.Model(plain).session(ctx=64, kernels="reference").forward(tokens)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("dtype", ["q4_0", "q8_0"])
def test_the_converter_writes_what_the_cores_tests_build(dtype, tmp_path):
    """test_interleaved.py moves a plain model's blocks with its own permutation: the same file."""
    from test_interleaved import to_x8

    x8, plain = model_pair(tmp_path, FIXTURES / "tiny-mixtral", dtype=dtype)
    to_x8(plain, dtype)
    assert (x8 / "weights.bin").read_bytes() == (plain / "weights.bin").read_bytes()
    assert table(x8) == table(plain)


@pytest.mark.parametrize("target", ["aarch64", "sanitize"])
def test_a_repacked_model_on_other_targets(target, tmp_path):
    """colibri-infer under QEMU (NEON's x8 kernels) and under ASan/UBSan: the repacked model
    validates, its strict-mode logits are the plain model's on the host bit for bit, its fast ones
    within the int8 path's bound (assert_same_numbers) of the plain model's on the same target."""
    from support import infer, prompt_logits

    x8, plain = model_pair(tmp_path, FIXTURES / "tiny-mixtral", dtype="q4_0")
    infer(target, "--model", x8, "--validate-model")
    host = colibri_core().Model(plain).session(ctx=64, kernels="reference").forward(TOKENS)
    strict = prompt_logits(target, x8, TOKENS, tmp_path, "--reference")
    assert np.array_equal(strict.view(np.uint32), host.view(np.uint32))
    fast, theirs = prompt_logits(target, x8, TOKENS, tmp_path), prompt_logits(target, plain, TOKENS, tmp_path)
    print(f"{target}: max |x8 - plain| = {np.abs(fast - theirs).max():.2e} of {np.abs(host).max():.2e}")
    assert np.abs(fast - theirs).max() <= 0.05 * np.abs(host).max()

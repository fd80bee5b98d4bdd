"""The block formats: llama.cpp's q8_0 and q4_0 (the converter quantizes with the gguf package) and
colibri's w4g128 (the converter's own quantizer); the core dequantizes on the fly.  The reference is transformers run on the very weights the blocks encode
(gguf's own dequantizer applied to each quantized matrix), so the only difference left is float
summation order."""
import json
import shutil
import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file, save_file

import colibri
from colibri.convert import convert
from colibri.convert.writer import encode
from support import FIXTURES, build, hf_logits, hf_model, infer, prompt_logits, require_reference

require_reference()
TOKENS = np.random.default_rng(5).integers(0, 320, 24).astype(np.int32)


def matrix_dtypes(model):
    """The dtypes of the model's weight matrices (the tokenizer's integer tables aside)."""
    return {t["dtype"] for t in model.tensors() if len(t["shape"]) >= 2 and not t["name"].startswith("tokenizer.")}


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_quantized_logits_are_transformers_on_the_dequantized_weights(dtype, tmp_path):
    kind = getattr(GGMLQuantizationType, dtype.upper())
    src = FIXTURES / "tiny-mixtral"
    model = colibri.Model(convert(src, tmp_path / dtype, dtype=dtype, progress=False), verify=True)
    assert matrix_dtypes(model) == {dtype, dtype + "x8"}   # the matmuls' rows interleaved (tests/test_repack.py)

    # the same checkpoint with every matrix replaced by what its blocks decode to
    shutil.copytree(src, tmp_path / "hf")
    weights = load_file(src / "model.safetensors")
    for name, w in weights.items():
        if w.ndim >= 2 and w.shape[-1] % 32 == 0:
            weights[name] = dequantize(quantize(w.astype(np.float32), kind), kind).reshape(w.shape).astype(np.float32)
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})

    ours = model.session(ctx=64, kernels="reference").forward(TOKENS)
    ref = hf_logits(hf_model(tmp_path / "hf"), TOKENS)
    full = colibri.Model(convert(src, tmp_path / "f32", dtype="f32", progress=False)).session(ctx=64).forward(TOKENS)
    print(f"{dtype}: max |colibri - transformers on the same weights| = {np.abs(ours - ref).max():.2e}; "
          f"quantization moved the logits by {np.abs(ours - full).max():.2e}; "
          f"weights {model.weight_bytes:,} B")
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_fast_kernels_compute_the_int8_path(dtype, tmp_path):
    """The fast kernels quantize activations to int8 blocks for q8_0 and q4_0 weights, as llama.cpp
    does.  Whole-model logits of these tokens equal the scalar int8 path's (reference-int8: the same
    integers, float sums in another order); one matmul of that path against the float oracle is
    bounded in c_core/tests/test_kernels.c.  Longer sequences need not stay this close: a last-bit
    difference can flip an activation's int8 rounding (benchmarks/int8_spread.py measures how often)."""
    model = colibri.Model(convert(FIXTURES / "tiny-mixtral", tmp_path / dtype, dtype=dtype, progress=False))
    fast = model.session(ctx=64)
    int8_ref = model.session(ctx=64, kernels="reference-int8").forward(TOKENS)
    float_ref = model.session(ctx=64, kernels="reference").forward(TOKENS)
    ours = fast.forward(TOKENS)
    print(f"{dtype} {fast.kernels}: max |fast - reference-int8| = {np.abs(ours - int8_ref).max():.2e}; "
          f"int8 activations moved the logits by {np.abs(int8_ref - float_ref).max():.2e}")
    np.testing.assert_allclose(ours, int8_ref, atol=1e-4, rtol=0)
    assert np.abs(int8_ref - float_ref).max() > 1e-3   # the int8 path really ran


def dequantize_w4g128(blocks, shape):
    """The w4g128 format as docs/FORMAT.md states it, decoded weight by weight: block b of 66 bytes
    is d (f16) then 64 bytes; weight 32 g + j (group g, j < 32) is d * (nibble - 8), the nibble the
    low half of byte 16 g + j for j < 16, the high half of byte 16 g + j - 16 otherwise."""
    blocks = np.asarray(blocks, dtype=np.uint8).reshape(-1, 66)
    d = blocks[:, :2].copy().view("<f2").astype(np.float32)[:, 0]
    w = np.empty((len(blocks), 128), dtype=np.float32)
    for i in range(128):
        g, j = divmod(i, 32)
        byte = blocks[:, 2 + 16 * g + j % 16]
        w[:, i] = d * ((byte & 0x0F if j < 16 else byte >> 4).astype(np.float32) - 8)
    return w.reshape(shape)


def wide_mixtral(path):
    """A tiny Mixtral whose matrices all have rows of 128 (w4g128's group)."""
    build("mixtral", hidden_size=128, intermediate_size=128).save_pretrained(path)
    return path


def test_w4g128_logits_are_transformers_on_the_dequantized_weights(tmp_path):
    """w4g128 (4-bit groups of 128, one f16 scale, float activations): every variant's float path
    (the fast one here, the reference too) against transformers on the weights the blocks encode,
    decoded by the format's definition above; those weights are within half a step of the originals."""
    src = wide_mixtral(tmp_path / "hf")
    model = colibri.Model(convert(src, tmp_path / "w4", dtype="w4g128", progress=False), verify=True)
    assert matrix_dtypes(model) == {"w4g128"}
    table = {t["name"]: t for t in json.loads((tmp_path / "w4" / "colibri_model.json").read_text())["tensors"]}
    blob = np.fromfile(tmp_path / "w4" / "weights.bin", dtype=np.uint8)

    shutil.copytree(src, tmp_path / "hf-deq")
    weights = load_file(src / "model.safetensors")
    for name, w in weights.items():
        if w.ndim >= 2 and w.shape[-1] % 128 == 0:
            q = dequantize_w4g128(encode(w.astype(np.float32), "w4g128"), w.shape)
            # within one step (|peak| / 8) of the original: half a step inside [-8, 7] steps, a whole
            # one for the far side's last eighth, which clips to 7
            step = np.abs(w.reshape(-1, 128)).max(axis=1, keepdims=True) / 8
            assert (np.abs(q - w).reshape(-1, 128) <= step * (1 + 1e-3)).all(), name
            weights[name] = q
    layer = "model.layers.0."
    save_file(weights, tmp_path / "hf-deq" / "model.safetensors", metadata={"format": "pt"})
    # the file holds what the format says: one matrix decoded from weights.bin equals its tensor above
    t = table["layers.0.attn.wq"]
    stored = dequantize_w4g128(blob[t["file_offset"]:t["file_offset"] + t["file_size"]], t["shape"])
    np.testing.assert_array_equal(stored, weights[layer + "self_attn.q_proj.weight"])

    ref = hf_logits(hf_model(tmp_path / "hf-deq", "AutoModelForCausalLM"), TOKENS % 128)
    for kernels in ("auto", "reference"):
        session = model.session(ctx=64, kernels=kernels)
        ours = session.forward(TOKENS % 128)
        print(f"w4g128 {session.kernels}: max |colibri - transformers on the same weights| = {np.abs(ours - ref).max():.2e}")
        np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_a_block_scale_that_is_not_finite_is_named_by_validation(tmp_path):
    """Block 3 of a w4g128 matrix gets an infinite scale (checksum updated to match): load with
    verify names the tensor and the block; without it the model still loads (the checks are O(size))."""
    src = convert(wide_mixtral(tmp_path / "hf"), tmp_path / "w4", dtype="w4g128", progress=False)
    doc = json.loads((src / "colibri_model.json").read_text())
    t = next(t for t in doc["tensors"] if t["name"] == "layers.1.attn.wo")
    with open(src / "weights.bin", "r+b") as f:
        f.seek(t["file_offset"] + 3 * 66)
        f.write(np.array([0x7C00], dtype="<u2").tobytes())   # f16 +inf
        f.seek(t["file_offset"])
        t["checksum"] = "crc32:%08x" % zlib.crc32(f.read(t["file_size"]))
    (src / "colibri_model.json").write_text(json.dumps(doc))
    colibri.Model(src)
    with pytest.raises(colibri.Error, match=r"tensor `layers.1.attn.wo`: the scale of block 3 is not finite"):
        colibri.Model(src, verify=True)


def test_quantized_rows_must_be_whole_blocks(tmp_path):
    """The converter keeps a matrix with rows of 3 (LFM2's convolution taps) in f32; marked q8_0 by
    hand, the loader refuses it, naming the tensor and the rule."""
    build("lfm2_moe").save_pretrained(tmp_path / "hf")
    src = convert(tmp_path / "hf", tmp_path / "m", dtype="q8_0", progress=False)
    doc = json.loads((src / "colibri_model.json").read_text())
    entry = next(t for t in doc["tensors"] if t["name"] == "layers.0.conv.kernel")
    assert (entry["dtype"], entry["shape"]) == ("f32", [64, 3])
    entry["dtype"] = "q8_0"
    (src / "colibri_model.json").write_text(json.dumps(doc))
    with pytest.raises(colibri.Error, match=r"layers.0.conv.kernel`: q8_0 rows must be whole blocks: the last "
                                            r"dimension \(3\) is not a multiple of 32"):
        colibri.Model(src)


def test_cli_quant_flag(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "colibri", "convert", str(FIXTURES / "tiny-mixtral"), str(tmp_path / "q"),
                        "--quant", "q4_0", "--quiet"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "q4_0" in {t["dtype"] for t in json.loads((tmp_path / "q" / "colibri_model.json").read_text())["tensors"]}


@pytest.mark.parametrize("dtype", ["q4_0", "w4g128"])
@pytest.mark.parametrize("target", ["aarch64", "riscv64", "sanitize"])
def test_quantized_models_give_the_same_bits_on_every_target(target, dtype, tmp_path):
    hf = FIXTURES / "tiny-mixtral" if dtype == "q4_0" else wide_mixtral(tmp_path / "hf")
    src = convert(hf, tmp_path / "q", dtype=dtype, progress=False)
    infer(target, "--model", src, "--validate-model")   # every block's scale checked (under the sanitizers too)
    host = prompt_logits("native", src, TOKENS % 128, tmp_path, "--reference")
    assert np.array_equal(host.view(np.uint32), prompt_logits(target, src, TOKENS % 128, tmp_path, "--reference").view(np.uint32))


def test_experts_quantization_object_agrees_with_the_dtypes(tmp_path):
    """experts.quantization as the spec writes it, {enabled, bits, group_size}: (4, 128) on a w4g128
    model loads with the same logits; (8, 32) (q8_0) is an error naming the claim and the tensor."""
    path = convert(wide_mixtral(tmp_path / "hf"), tmp_path / "w4", dtype="w4g128", progress=False)
    meta = path / "colibri_model.json"
    doc = json.loads(meta.read_text())
    plain = colibri.Model(path).session(ctx=8, kernels="reference").forward([1, 2, 3])
    doc["experts"]["quantization"] = {"enabled": True, "bits": 4, "group_size": 128}
    meta.write_text(json.dumps(doc))
    claimed = colibri.Model(path, verify=True).session(ctx=8, kernels="reference").forward([1, 2, 3])
    assert np.array_equal(plain.view(np.uint32), claimed.view(np.uint32))
    doc["experts"]["quantization"] = {"enabled": True, "bits": 8, "group_size": 32}
    meta.write_text(json.dumps(doc))
    with pytest.raises(colibri.Error, match=r"experts.quantization says 8-bit groups of 32 \(q8_0\) but tensor "
                                            r"`layers.0.experts.w1` is w4g128"):
        colibri.Model(path)
    doc["experts"]["quantization"] = {"enabled": False}
    meta.write_text(json.dumps(doc))
    with pytest.raises(colibri.Error, match=r"experts.quantization.enabled is false but tensor `layers.0.experts.w1` is w4g128"):
        colibri.Model(path)

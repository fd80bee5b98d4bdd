"""llama.cpp's block formats (q8_0, q4_0): the converter quantizes with the gguf package, the core
dequantizes on the fly.  The reference is transformers run on the very weights the blocks encode
(gguf's own dequantizer applied to each quantized matrix), so the only difference left is float
summation order."""
import json
import shutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file, save_file

import colibri
from colibri.convert import convert
from conftest import FIXTURES, require_reference

torch, transformers = require_reference()
TOKENS = np.random.default_rng(5).integers(0, 320, 24).astype(np.int32)


def hf_logits(path, tokens):
    model = transformers.MixtralForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                            attn_implementation="eager").eval()
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))[None]).logits[0].numpy()


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_quantized_logits_are_transformers_on_the_dequantized_weights(dtype, tmp_path):
    kind = getattr(GGMLQuantizationType, dtype.upper())
    src = FIXTURES / "tiny-mixtral"
    model = colibri.Model(convert(src, tmp_path / dtype, dtype=dtype, progress=False), verify=True)
    assert {t["dtype"] for t in model.tensors() if len(t["shape"]) >= 2} == {dtype}

    # the same checkpoint with every matrix replaced by what its blocks decode to
    shutil.copytree(src, tmp_path / "hf")
    weights = load_file(src / "model.safetensors")
    for name, w in weights.items():
        if w.ndim >= 2 and w.shape[-1] % 32 == 0:
            weights[name] = dequantize(quantize(w.astype(np.float32), kind), kind).reshape(w.shape).astype(np.float32)
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})

    ours = model.session(ctx=64, kernels="reference").forward(TOKENS)
    ref = hf_logits(tmp_path / "hf", TOKENS)
    full = colibri.Model(convert(src, tmp_path / "f32", dtype="f32", progress=False)).session(ctx=64).forward(TOKENS)
    print(f"{dtype}: max |colibri - transformers on the same weights| = {np.abs(ours - ref).max():.2e}; "
          f"quantization moved the logits by {np.abs(ours - full).max():.2e}; "
          f"weights {model.weight_bytes:,} B")
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_fast_kernels_compute_the_int8_path(dtype, tmp_path):
    """The fast kernels quantize activations to int8 blocks for q8_0 and q4_0 weights, as llama.cpp
    does.  Whole-model logits equal the scalar int8 path's (reference-int8: the same integers,
    float sums in another order); one matmul of that path against the float oracle is bounded in
    c_core/tests/test_kernels.c."""
    model = colibri.Model(convert(FIXTURES / "tiny-mixtral", tmp_path / dtype, dtype=dtype, progress=False))
    fast = model.session(ctx=64)
    int8_ref = model.session(ctx=64, kernels="reference-int8").forward(TOKENS)
    float_ref = model.session(ctx=64, kernels="reference").forward(TOKENS)
    ours = fast.forward(TOKENS)
    print(f"{dtype} {fast.kernels}: max |fast - reference-int8| = {np.abs(ours - int8_ref).max():.2e}; "
          f"int8 activations moved the logits by {np.abs(int8_ref - float_ref).max():.2e}")
    np.testing.assert_allclose(ours, int8_ref, atol=1e-4, rtol=0)
    assert np.abs(int8_ref - float_ref).max() > 1e-3   # the int8 path really ran


def test_quantized_rows_must_be_whole_blocks(tmp_path):
    """The converter keeps a matrix with rows of 3 (LFM2's convolution taps) in f32; marked q8_0 by
    hand, the loader refuses it, naming the tensor and the rule."""
    from test_families import build

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


@pytest.mark.parametrize("target", ["aarch64", "riscv64", "sanitize"])
def test_quantized_models_give_the_same_bits_on_every_target(target, tmp_path):
    from test_targets import prompt_logits

    from test_targets import infer

    src = convert(FIXTURES / "tiny-mixtral", tmp_path / "q", dtype="q4_0", progress=False)
    infer(target, "--model", src, "--validate-model")   # every block's scale checked (under the sanitizers too)
    host = prompt_logits("native", src, TOKENS, tmp_path, "--reference")
    assert np.array_equal(host.view(np.uint32), prompt_logits(target, src, TOKENS, tmp_path, "--reference").view(np.uint32))

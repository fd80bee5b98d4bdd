"""The routed experts' two layouts (docs/FORMAT.md): every family converted stacked and interleaved
computes the same bits, in strict and fast mode, float and block formats, and a GGUF import
rewritten into extents keeps its bytes; validation accepts interleaved models and refuses broken
extents; the bundled model's interleaved conversion runs cleanly under ASan/UBSan."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import colibri
from bad_models import CASES, make_case
from colibri.convert import convert
from colibri.demo import MODEL_DIR as BUNDLED
from colibri.targets import env_for, infer_binary
from support import COMMON, FAMILIES, FIXTURES, build, require_reference

require_reference()
TOKENS = np.random.default_rng(3).integers(0, COMMON["vocab_size"], 12).astype(np.int32)


def tensor_bytes(model_dir, t, n_experts):
    """A tensor's bytes from weights.bin, its parts in expert order when interleaved."""
    data = (Path(model_dir) / "weights.bin").read_bytes()
    stride = t.get("expert_stride", 0)
    if not stride:
        return data[t["file_offset"]:t["file_offset"] + t["file_size"]]
    part = t["file_size"] // n_experts
    return b"".join(data[t["file_offset"] + e * stride:t["file_offset"] + e * stride + part] for e in range(n_experts))


def assert_same_bits(a, b, tokens=TOKENS):
    for kernels in ("reference", "auto"):
        x = colibri.Model(a).session(ctx=32, kernels=kernels).forward(tokens)
        y = colibri.Model(b).session(ctx=32, kernels=kernels).forward(tokens)
        assert np.array_equal(x.view(np.uint32), y.view(np.uint32)), kernels


def assert_extents(model_dir):
    """Every routed-expert tensor has a stride; a layer's share one, and its tensors' bytes equal the
    stacked ones; every other tensor lies in the resident prefix, before the first extent."""
    model = colibri.Model(model_dir, verify=True)
    assert model.config["weight_layout"] == "interleaved"
    layers, resident_end, first_extent = {}, 0, None
    for t in model.tensors():
        name = t["name"].split(".")
        if len(name) == 4 and name[2] == "experts":
            layers.setdefault(name[1], set()).add(t["expert_stride"])
            first_extent = min(t["file_offset"], first_extent or t["file_offset"])
        else:
            assert "expert_stride" not in t, t
            resident_end = max(resident_end, t["file_offset"] + t["file_size"])
    assert layers and all(len(s) == 1 for s in layers.values()), layers
    assert resident_end <= first_extent, (resident_end, first_extent)


def convert_both(src, root, **kw):
    return (convert(src, root / "stacked", progress=False, **kw),
            convert(src, root / "interleaved", layout="interleaved", progress=False, **kw))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_computes_the_same_bits(family, tmp_path):
    build(family).save_pretrained(tmp_path / "hf")
    stacked, interleaved = convert_both(tmp_path / "hf", tmp_path)
    assert colibri.Model(stacked).config["weight_layout"] == "stacked"
    assert_extents(interleaved)
    assert_same_bits(stacked, interleaved)
    a, b = colibri.Model(stacked).tensors(), colibri.Model(interleaved).tensors()
    assert [(t["name"], t["shape"], t["crc32"]) for t in a] == [(t["name"], t["shape"], t["crc32"]) for t in b]


@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
@pytest.mark.parametrize("family", ["mixtral", "gpt_oss"])   # gpt_oss: per-expert biases in the extents
def test_block_formats_compute_the_same_bits(family, dtype, tmp_path):
    build(family).save_pretrained(tmp_path / "hf")
    stacked, interleaved = convert_both(tmp_path / "hf", tmp_path, dtype=dtype)
    assert_extents(interleaved)
    assert_same_bits(stacked, interleaved)


@pytest.mark.parametrize("kind", ["f32", "q4_0"])
def test_a_gguf_import_is_rewritten_byte_for_byte(kind, tmp_path):
    from gguf import GGMLQuantizationType
    from test_gguf_import import write_gguf

    write_gguf(tmp_path / "model.gguf", None if kind == "f32" else GGMLQuantizationType.Q4_0)
    stacked, interleaved = convert_both(tmp_path / "model.gguf", tmp_path)
    assert_extents(interleaved)
    E = colibri.Model(stacked).config["num_experts"]
    for a, b in zip(colibri.Model(stacked).tensors(), colibri.Model(interleaved).tensors()):
        assert a["name"] == b["name"] and a["dtype"] == b["dtype"]
        assert tensor_bytes(stacked, a, E) == tensor_bytes(interleaved, b, E), a["name"]
    assert_same_bits(stacked, interleaved, TOKENS % 320)


def test_validate_and_convert_commands(tmp_path):
    out = tmp_path / "m"
    r = subprocess.run([sys.executable, "-m", "colibri", "convert", str(FIXTURES / "tiny-mixtral"), str(out),
                        "--layout", "interleaved", "--quiet"], capture_output=True, text=True)
    assert r.returncode == 0 and "validated" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "-m", "colibri", "validate", str(out)], capture_output=True, text=True)
    assert r.returncode == 0 and "valid mixtral model" in r.stdout, r.stderr
    assert_same_bits(FIXTURES / "tiny-mixtral.colibri", out, TOKENS % 320)


@pytest.mark.parametrize("case", [c for c in CASES if "interleaved" in c.name or "stride" in c.name],
                         ids=lambda c: c.name)
def test_broken_extents_are_refused(case, tmp_path):
    with pytest.raises(colibri.Error) as e:
        colibri.Model(make_case(case, tmp_path), verify=True)
    assert e.value.status == case.status and case.fragment in e.value.detail, str(e.value)


def test_bundled_model_interleaved_under_sanitizers(tmp_path):
    """The bundled model's checkpoint converted interleaved: the same greedy ids as the bundled
    (stacked) model from the ASan/UBSan build of colibri-infer, and a clean validation."""
    out = convert(FIXTURES / "shakespeare-hf", tmp_path / "m", dtype="f16", layout="interleaved", progress=False)
    assert_extents(out)
    binary, env = str(infer_binary("sanitize")), env_for("sanitize")
    ids = []
    for model in (BUNDLED, out):
        r = subprocess.run([binary, "--model", str(model), "--tokens", "1,2,3,4", "--max_tokens", "12",
                            "--temperature", "0", "--ids"], capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        ids.append(r.stdout.strip())
    assert ids[0] == ids[1]
    r = subprocess.run([binary, "--model", str(out), "--validate-model"], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr

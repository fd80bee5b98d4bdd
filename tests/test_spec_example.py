"""The spec's example colibri_model.json (section 4.2 of the origin document), field by field, as
docs/FORMAT.md ("The spec's spellings") says: what loads as written, what is read under another
name, and what is refused, with which status and message.  The example cannot run as it stands
(it has no hyper-parameters, one tensor of a model that has dozens); completed with the bundled
Shakespeare model's, step by step, it loads and computes that model's logits bit for bit."""
import copy
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import colibri

SHAKESPEARE = Path(colibri.__file__).parent / "demo" / "shakespeare"
TOKENS = [1, 2, 3, 5, 8, 13, 21, 34]

# The spec's text, which is not JSON: its keys and strings are unquoted and it has a comment.
SPEC_TEXT = """{ version: 1.0, architecture: MoE-Transformer,
  routing: { type: topk, top_k: 2, capacity_factor: 1.25 },
  experts: { count: 8, weight_layout: interleaved, // or contiguous
             quantization: { enabled: true, bits: 4, group_size: 128 } },
  tensors: [ { name: router.weight, dtype: fp16, shape: [4096, 8], file_offset: 0, file_size: 65536 } ] }"""

# The same, quoted into JSON, the comment dropped.
SPEC = {
    "version": 1.0, "architecture": "MoE-Transformer",
    "routing": {"type": "topk", "top_k": 2, "capacity_factor": 1.25},
    "experts": {"count": 8, "weight_layout": "interleaved",
                "quantization": {"enabled": True, "bits": 4, "group_size": 128}},
    "tensors": [{"name": "router.weight", "dtype": "fp16", "shape": [4096, 8], "file_offset": 0, "file_size": 65536}],
}


def _real():
    return json.loads((SHAKESPEARE / "colibri_model.json").read_text())


def _write(tmp_path, doc, text=None):
    """A model directory: the Shakespeare model's weights.bin and tokenizer.json, and `doc`."""
    d = tmp_path / "model"
    if not d.exists():
        shutil.copytree(SHAKESPEARE, d)
    (d / "colibri_model.json").write_text(json.dumps(doc, indent=1) if text is None else text)
    return d


def _refused(d, status, fragment):
    with pytest.raises(colibri.Error) as e:
        colibri.Model(d)
    assert e.value.status == status and fragment in str(e.value), str(e.value)


def _logits(d, **options):
    return colibri.Model(d, verify=True).session(ctx=16, kernels="reference", **options).forward(TOKENS)


def _router(doc):
    return next(t for t in doc["tensors"] if t["name"] in ("router.weight", "layers.0.router"))


# ---- completing the example, one edit at a time

def _add_format(doc):
    doc["format"] = "colibri"


def _add_hparams(doc):
    doc["hparams"] = _real()["hparams"]


def _add_activation(doc):
    doc["experts"]["activation"] = "silu"


def _add_the_other_tensors(doc):
    """The real model's table with the spec's entry in place of its layers.0.router; the vocabulary
    and encoder tables come with the encoder that reads them."""
    real = _real()
    doc["tensors"] = [doc["tensors"][0] if t["name"] == "layers.0.router" else t for t in real["tensors"]]
    doc.update(tokenizer=real["tokenizer"], encoder=real["encoder"])


def _router_field(key, value):
    def edit(doc):
        _router(doc)[key] = value
    return edit


def _real_router_field(key):
    def edit(doc):
        _router(doc)[key] = next(t for t in _real()["tensors"] if t["name"] == "layers.0.router")[key]
    return edit


def _set_experts(key, value):
    def edit(doc):
        doc["experts"][key] = value
    return edit


QUANTIZATION_TRUE = {"enabled": False, "bits": 4, "group_size": 128}

# (what the step does, its edit, then the status and message of the model as edited so far)
LADDER = [
    ("the spec's example as it is", None, "COLIBRI_E_MISSING", "model.format is missing"),
    ("format added; version 1.0 reads as 1", _add_format, "COLIBRI_E_MISSING", "model.hparams is missing"),
    ("hparams added", _add_hparams, "COLIBRI_E_MISSING", "experts.activation is missing"),
    ("activation added", _add_activation,
     "COLIBRI_E_TENSOR", "model.tensors lists 1 entries, too few for a 4-layer model"),
    ("the model's other tensors added", _add_the_other_tensors,
     "COLIBRI_E_TENSOR", "tensor `router.weight` is not part of a MoE-Transformer model with 4 layers"),
    ("named for its layer", _router_field("name", "layers.0.router"),
     "COLIBRI_E_SHAPE", "tensor `layers.0.router`: shape [4096,8] != expected [8,128]"),
    ("the spec's [in, out] at this model's size", _router_field("shape", [128, 8]),
     "COLIBRI_E_SHAPE", "tensor `layers.0.router`: shape [128,8] != expected [8,128]"),
    ("[out, in]", _router_field("shape", [8, 128]),
     "COLIBRI_E_SIZE", "tensor `layers.0.router`: file_size 65536 != 2048 bytes of f16"),
    ("its size", _router_field("file_size", 2048), "COLIBRI_E_MISSING", "tensor `layers.0.router`.checksum is missing"),
    ("its checksum", _real_router_field("checksum"),
     "COLIBRI_E_MISSING", "tensor `layers.0.experts.w1`.expert_stride is missing"),
    ("contiguous, the spec's other layout", _set_experts("weight_layout", "contiguous"),
     "COLIBRI_E_VALUE", "experts.quantization says 4-bit groups of 128 (w4g128) but tensor `layers.0.experts.w1` is f16"),
    ("a true claim: the model's experts are f16", _set_experts("quantization", QUANTIZATION_TRUE),
     "COLIBRI_E_OVERLAP", "tensor `tok_embeddings` [0, 262144) overlaps tensor `layers.0.router` at 0"),
]


def _edited(steps):
    doc = copy.deepcopy(SPEC)
    for _, edit, _, _ in LADDER[:steps]:
        if edit:
            edit(doc)
    return doc


def _completed():
    """Every step above, and the router at its offset in weights.bin."""
    doc = _edited(len(LADDER))
    _real_router_field("file_offset")(doc)
    return doc


def test_the_spec_text_is_not_json(tmp_path):
    _refused(_write(tmp_path, None, SPEC_TEXT), "COLIBRI_E_JSON", "colibri_model.json line 1")


@pytest.mark.parametrize("step", range(len(LADDER)), ids=[s[0] for s in LADDER])
def test_each_refusal_of_the_example(step, tmp_path):
    """Each step fixes the fault the step before was refused for, and nothing else."""
    _, _, status, fragment = LADDER[step]
    _refused(_write(tmp_path, _edited(step + 1)), status, fragment)


def test_the_completed_example_computes_the_model(tmp_path):
    """With the edits above and the router at its offset, the spec's fields load as written
    (version 1.0, routing.type "topk", capacity_factor, "contiguous", dtype "fp16", the quantization
    object) and the model computes the original's logits bit for bit; the model's capacity_factor
    is the default of capacity routing."""
    doc = _completed()
    assert (doc["version"], doc["routing"], _router(doc)["dtype"]) == (1.0, SPEC["routing"], "fp16")
    d = _write(tmp_path, doc)
    assert '"version": 1.0' in (d / "colibri_model.json").read_text()
    model = colibri.Model(d, verify=True)
    assert (model.architecture, model.config["weight_layout"]) == ("MoE-Transformer", "stacked")
    assert {t["name"]: t["dtype"] for t in model.tensors()}["layers.0.router"] == "f16"
    assert np.array_equal(_logits(d).view(np.uint32), _logits(SHAKESPEARE).view(np.uint32))
    assert np.array_equal(_logits(d, routing="capacity", capacity_factor=0.0).view(np.uint32),
                          _logits(d, routing="capacity", capacity_factor=1.25).view(np.uint32))


def test_interleaved_loads_with_expert_strides(tmp_path):
    """The spec's "interleaved" is colibri's interleaved layout: each expert's parts of a
    layer's expert tensors in one extent, expert_stride apart.  The Shakespeare experts moved into
    extents appended to weights.bin compute the original's logits."""
    doc = _completed()
    doc["experts"]["weight_layout"] = "interleaved"
    d = _write(tmp_path, doc)
    blob = bytearray((d / "weights.bin").read_bytes())
    blob += bytes(-len(blob) % 64)
    E = doc["experts"]["count"]
    for layer in range(doc["hparams"]["num_layers"]):
        parts = [t for t in doc["tensors"] if t["name"] in (f"layers.{layer}.experts.{w}" for w in ("w1", "w3", "w2"))]
        size = parts[0]["file_size"] // E   # each part is 96 * 128 f16 values: 64-byte aligned
        base, stride = len(blob), size * len(parts)
        blob += bytes(E * stride)
        for k, t in enumerate(parts):
            old = t["file_offset"]
            for e in range(E):
                at = base + e * stride + k * size
                blob[at:at + size] = blob[old + e * size:old + (e + 1) * size]
            t.update(file_offset=base + k * size, expert_stride=stride)
    (d / "weights.bin").write_bytes(bytes(blob))
    (d / "colibri_model.json").write_text(json.dumps(doc))
    assert colibri.Model(d).config["weight_layout"] == "interleaved"
    assert np.array_equal(_logits(d).view(np.uint32), _logits(SHAKESPEARE).view(np.uint32))


@pytest.mark.parametrize("version", ["1", "1.0", "1.00", "10e-1", "1e0", "0.1E+1"])
def test_version_one_in_any_spelling(version, tmp_path):
    text = (SHAKESPEARE / "colibri_model.json").read_text()
    assert '"version": 1,' in text
    colibri.Model(_write(tmp_path, None, text.replace('"version": 1,', f'"version": {version},', 1)))


@pytest.mark.parametrize("version, status", [("1.5", "COLIBRI_E_VERSION"), ("2.0", "COLIBRI_E_VERSION"),
                                             ("-1.0", "COLIBRI_E_VERSION"), ("11e-1", "COLIBRI_E_VERSION"),
                                             ("1.0000000000000000001", "COLIBRI_E_VERSION"), ('"1"', "COLIBRI_E_TYPE")])
def test_other_versions_are_refused(version, status, tmp_path):
    text = (SHAKESPEARE / "colibri_model.json").read_text().replace('"version": 1,', f'"version": {version},', 1)
    message = "model.version must be a number" if status == "COLIBRI_E_TYPE" else f"model.version {version} is not supported"
    _refused(_write(tmp_path, None, text), status, message)


@pytest.mark.parametrize("where", ["model", "experts"])
def test_shared_expert_is_not_a_field(where, tmp_path):
    """The spec names a shared_expert field (for Phi-3-MoE) but neither where it goes nor what it
    holds; colibri's shared expert is experts.shared, {intermediate_size, gate}."""
    doc = _real()
    (doc if where == "model" else doc["experts"])["shared_expert"] = True
    _refused(_write(tmp_path, doc), "COLIBRI_E_VALUE", f'{where}: unknown field "shared_expert"')

"""The HF -> colibri converter: docs/FORMAT.md rules, layouts, dtypes, errors, and fixture freshness.

None of this needs the C core: the converted weights are also checked by a small numpy forward pass
(float64) against the transformers reference logits, so a layout mistake (w1/w3 swapped, a
transposed projection) fails here and not only in the parity tests.
"""

import json
import platform
import re
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import colibri
from colibri.convert import ConvertError, convert
from colibri.convert.writer import f32_to_bf16_bits
from support import DTYPES, FIXTURES, HF_MODELS, hf_model, require_reference

ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}
HPARAMS = ["vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
           "head_dim", "max_position_embeddings", "rope_theta", "rms_norm_eps", "sliding_window",
           "tie_word_embeddings", "bos_token_id", "eos_token_id"]


# ---------------------------------------------------------------------------------------- helpers

def expected_tensors(hp, n_experts):
    """(name, shape) in file order, written out from the FORMAT.md table."""
    V, D, F, E = hp["vocab_size"], hp["hidden_size"], hp["intermediate_size"], n_experts
    q, kv = hp["num_heads"] * hp["head_dim"], hp["num_kv_heads"] * hp["head_dim"]
    out = [("tok_embeddings", [V, D])]
    for i in range(hp["num_layers"]):
        out += [(f"layers.{i}.{n}", s) for n, s in [
            ("attn_norm", [D]), ("attn.wq", [q, D]), ("attn.wk", [kv, D]), ("attn.wv", [kv, D]),
            ("attn.wo", [D, q]), ("ffn_norm", [D]), ("router", [E, D]),
            ("experts.w1", [E, F, D]), ("experts.w3", [E, F, D]), ("experts.w2", [E, D, F])]]
    out.append(("norm", [D]))
    if not hp["tie_word_embeddings"]:
        out.append(("lm_head", [V, D]))
    return out


def read_colibri(path):
    """(json document, {name: float32 array}) of a colibri model directory."""
    doc = json.loads((path / "colibri_model.json").read_text())
    blob = (path / "weights.bin").read_bytes()
    weights = {}
    for t in doc["tensors"]:
        raw = blob[t["file_offset"]:t["file_offset"] + t["file_size"]]
        if t["dtype"] in ("u8", "i32"):   # the tokenizer's byte table, not a weight
            continue
        if t["dtype"] == "bf16":
            x = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            x = np.frombuffer(raw, {"f32": "<f4", "f16": "<f2"}[t["dtype"]]).astype(np.float32)
        weights[t["name"]] = x.reshape(t["shape"])
    return doc, weights


def numpy_forward(doc, w, tokens):
    """Logits [T, V] by the FORMAT.md semantics, in float64: an oracle for the converted layout."""
    hp, k = doc["hparams"], doc["routing"]["top_k"]
    H, KV, hd, eps = hp["num_heads"], hp["num_kv_heads"], hp["head_dim"], hp["rms_norm_eps"]
    w = {n: a.astype(np.float64) for n, a in w.items()}
    T = len(tokens)

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def softmax(s):
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    ang = np.arange(T)[:, None] * hp["rope_theta"] ** (-np.arange(0, hd, 2) / hd)
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]

    def rope(x):  # [T, heads, hd], rotate-half pairs j with j + hd/2
        return x * cos + np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin

    qpos, kpos = np.arange(T)[:, None], np.arange(T)[None, :]
    visible = (kpos <= qpos) & ((hp["sliding_window"] == 0) | (qpos - kpos < hp["sliding_window"]))
    x = w["tok_embeddings"][tokens]
    for i in range(hp["num_layers"]):
        L = lambda n: w[f"layers.{i}.{n}"]  # noqa: E731
        h = rms(x, L("attn_norm"))
        q = rope((h @ L("attn.wq").T).reshape(T, H, hd))
        kk = np.repeat(rope((h @ L("attn.wk").T).reshape(T, KV, hd)), H // KV, axis=1)
        v = np.repeat((h @ L("attn.wv").T).reshape(T, KV, hd), H // KV, axis=1)
        s = np.where(visible, np.einsum("qhd,khd->hqk", q, kk) / np.sqrt(hd), -np.inf)
        x = x + np.einsum("hqk,khd->qhd", softmax(s), v).reshape(T, H * hd) @ L("attn.wo").T
        h = rms(x, L("ffn_norm"))
        probs = softmax(h @ L("router").T)
        moe = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-probs[t])[:k]
            for e, g in zip(top, probs[t, top] / probs[t, top].sum()):
                a = h[t] @ L("experts.w1")[e].T
                moe[t] += g * (L("experts.w2")[e] @ (a / (1 + np.exp(-a)) * (h[t] @ L("experts.w3")[e].T)))
        x = x + moe
    head = w["tok_embeddings"] if hp["tie_word_embeddings"] else w["lm_head"]
    return rms(x, w["norm"]) @ head.T


def copy_hf(src, dst, drop=(), replace=None, config=None):
    """A copy of an HF fixture dir with tensors dropped/replaced and config.json edited."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    tensors = {n: a for n, a in load_file(src / "model.safetensors").items() if n not in drop}
    tensors.update(replace or {})
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    if config:
        cfg = json.loads((src / "config.json").read_text())
        for key, value in config.items():
            if value is None:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        (dst / "config.json").write_text(json.dumps(cfg))
    return dst


# ------------------------------------------------------------------------------------ the format

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model", HF_MODELS)
def test_output_follows_format(converted, model, dtype):
    path = converted[(model, dtype)]
    doc = json.loads((path / "colibri_model.json").read_text())
    src_cfg = json.loads((FIXTURES / model / "config.json").read_text())
    has_tok = (FIXTURES / model / "tokenizer.json").exists()

    assert list(doc) == ["format", "version", "architecture", "hparams", "routing", "experts"] + \
        (["tokenizer", "encoder"] if has_tok else []) + ["metadata", "tensors"]
    assert (doc["format"], doc["version"], doc["architecture"]) == ("colibri", 1, "mixtral")
    hp = doc["hparams"]
    assert list(hp) == HPARAMS
    for key in HPARAMS:
        kind = {"rope_theta": float, "rms_norm_eps": float, "tie_word_embeddings": bool}.get(key, int)
        assert type(hp[key]) is kind, key
    assert hp["vocab_size"] == src_cfg["vocab_size"]
    assert hp["num_layers"] == src_cfg["num_hidden_layers"]
    assert hp["head_dim"] == (src_cfg["head_dim"] or src_cfg["hidden_size"] // src_cfg["num_attention_heads"])
    assert hp["sliding_window"] == (src_cfg["sliding_window"] or 0)
    assert hp["rope_theta"] == src_cfg["rope_parameters"]["rope_theta"]
    assert doc["routing"] == {"type": "topk_softmax", "top_k": src_cfg["num_experts_per_tok"], "normalize": True}
    assert doc["experts"] == {"count": src_cfg["num_local_experts"], "weight_layout": "stacked",
                              "quantization": "none", "activation": "silu"}
    assert doc["metadata"]["source"] == model and doc["metadata"]["source_dtype"] == "f32"
    assert doc["metadata"]["converter"].startswith("colibri ")
    if has_tok:
        assert (path / "tokenizer.json").read_bytes() == (FIXTURES / model / "tokenizer.json").read_bytes()
    else:
        assert not (path / "tokenizer.json").exists()

    blob = (path / "weights.bin").read_bytes()
    expected = expected_tensors(hp, doc["experts"]["count"])
    vocab = {"tokenizer.token_bytes": "u8", "tokenizer.token_offsets": "i32", "tokenizer.merges": "i32",
             "tokenizer.merge_order": "i32", "tokenizer.byte_ids": "i32", "tokenizer.added": "i32",
             "tokenizer.added_bytes": "u8"} if has_tok else {}   # the encoder: tests/test_tokenizer.py
    weights = [t for t in doc["tensors"] if t["name"] not in vocab]
    assert [(t["name"], t["shape"]) for t in weights] == expected
    assert [t["name"] for t in doc["tensors"][len(weights):]] == list(vocab)   # the byte table comes last
    end = 0
    for t in doc["tensors"]:
        assert list(t) == ["name", "dtype", "shape", "file_offset", "file_size", "checksum"]
        assert t["dtype"] == vocab.get(t["name"], dtype)
        assert t["file_offset"] % 64 == 0 and t["file_offset"] >= end, t["name"]
        assert blob[end:t["file_offset"]] == bytes(t["file_offset"] - end), "padding is zeros"
        assert t["file_size"] == int(np.prod(t["shape"])) * {**ITEMSIZE, "u8": 1, "i32": 4}[t["dtype"]]
        end = t["file_offset"] + t["file_size"]
        assert t["checksum"] == "crc32:%08x" % zlib.crc32(blob[t["file_offset"]:end])
    assert end == len(blob)
    _, weights = read_colibri(path)
    assert all(np.isfinite(a).all() for a in weights.values())


@pytest.mark.parametrize("model", HF_MODELS)
def test_f32_weights_are_the_source_rearranged(converted, model):
    src = load_file(FIXTURES / model / "model.safetensors")
    doc, w = read_colibri(converted[(model, "f32")])
    E = doc["experts"]["count"]
    assert np.array_equal(w["tok_embeddings"], src["model.embed_tokens.weight"])
    assert np.array_equal(w["norm"], src["model.norm.weight"])
    for i in range(doc["hparams"]["num_layers"]):
        p = f"model.layers.{i}."
        for ours, theirs in [("attn_norm", "input_layernorm"), ("ffn_norm", "post_attention_layernorm"),
                             ("attn.wq", "self_attn.q_proj"), ("attn.wk", "self_attn.k_proj"),
                             ("attn.wv", "self_attn.v_proj"), ("attn.wo", "self_attn.o_proj"),
                             ("router", "block_sparse_moe.gate")]:
            assert np.array_equal(w[f"layers.{i}.{ours}"], src[p + theirs + ".weight"]), ours
        for j in range(E):
            for n in ("w1", "w2", "w3"):
                assert np.array_equal(w[f"layers.{i}.experts.{n}"][j], src[f"{p}block_sparse_moe.experts.{j}.{n}.weight"])
    if not doc["hparams"]["tie_word_embeddings"]:
        assert np.array_equal(w["lm_head"], src["lm_head.weight"])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("model", HF_MODELS)
def test_numpy_oracle_on_converted_weights_matches_transformers(converted, references, model, dtype):
    ref = references[model]
    doc, w = read_colibri(converted[(model, dtype)])
    logits = numpy_forward(doc, w, ref["tokens"])
    want = ref["logits" if dtype == "f32" else f"logits_{dtype}"]
    print(f"{model} {dtype}: max |numpy - transformers| = {np.abs(logits - want).max():.2e}")
    np.testing.assert_allclose(logits, want, atol=1e-4, rtol=0)


def test_reconverting_gives_the_committed_colibri_model(tmp_path):
    out = convert(FIXTURES / "tiny-mixtral", tmp_path / "m", progress=False)
    committed = FIXTURES / "tiny-mixtral.colibri"
    assert (out / "weights.bin").read_bytes() == (committed / "weights.bin").read_bytes()
    assert (out / "tokenizer.json").read_bytes() == (committed / "tokenizer.json").read_bytes()
    ours, theirs = (json.loads((d / "colibri_model.json").read_text()) for d in (out, committed))
    # the converter's version string changes with every release; everything else must not
    ours["metadata"].pop("converter"), theirs["metadata"].pop("converter")
    assert ours == theirs


# ---------------------------------------------------------------------------------- other inputs

def test_fused_sharded_layout_converts_to_the_same_weights(converted, tmp_path):
    """transformers-5 module names (gate_up_proj / down_proj / mlp.gate), split over two shards."""
    src = FIXTURES / "tiny-mixtral"
    hub = load_file(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    E, F = cfg["num_local_experts"], cfg["intermediate_size"]
    fused = {}
    for name, a in hub.items():
        if ".block_sparse_moe." not in name:
            fused[name] = a
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        stack = lambda n: np.stack([hub[f"{p}block_sparse_moe.experts.{j}.{n}.weight"] for j in range(E)])  # noqa: E731
        fused[p + "mlp.experts.gate_up_proj"] = np.concatenate([stack("w1"), stack("w3")], axis=1)
        fused[p + "mlp.experts.down_proj"] = stack("w2")
        fused[p + "mlp.gate.weight"] = hub[p + "block_sparse_moe.gate.weight"]
        assert fused[p + "mlp.experts.gate_up_proj"].shape == (E, 2 * F, cfg["hidden_size"])
    dst = tmp_path / "tiny-mixtral"
    dst.mkdir()
    shutil.copy(src / "config.json", dst)
    shutil.copy(src / "tokenizer.json", dst)
    names = sorted(fused)
    save_file({n: fused[n] for n in names[::2]}, dst / "model-00001-of-00002.safetensors")
    save_file({n: fused[n] for n in names[1::2]}, dst / "model-00002-of-00002.safetensors")
    out = convert(dst, tmp_path / "out", progress=False)
    assert (out / "weights.bin").read_bytes() == (converted[("tiny-mixtral", "f32")] / "weights.bin").read_bytes()


def test_bf16_source_needs_no_torch(tmp_path):
    """BF16 checkpoints are read through safetensors' numpy reader with ml_dtypes' bfloat16."""
    import ml_dtypes
    src = FIXTURES / "tiny-mixtral-b"
    bf16 = {n: a.astype(ml_dtypes.bfloat16) for n, a in load_file(src / "model.safetensors").items()}
    copy_hf(src, tmp_path / "src", replace=bf16)
    as_bf16 = convert(tmp_path / "src", tmp_path / "bf16", dtype="bf16", progress=False)
    as_f32 = convert(tmp_path / "src", tmp_path / "f32", dtype="f32", progress=False)
    doc, w16 = read_colibri(as_bf16)
    _, w32 = read_colibri(as_f32)
    assert doc["metadata"]["source_dtype"] == "bf16"
    assert np.array_equal(w16["layers.2.experts.w2"][5], bf16["model.layers.2.block_sparse_moe.experts.5.w2.weight"].astype(np.float32))
    assert all(np.array_equal(w16[n], w32[n]) for n in w16), "bf16 -> f32 -> bf16 is exact"


def test_the_default_keeps_each_weights_source_dtype(tmp_path):
    """A bf16 checkpoint stays bf16 (the bytes --dtype bf16 writes); a tensor whose sources differ
    (one expert stored f32 among bf16 ones) is f32, the dtype that holds both exactly."""
    import ml_dtypes
    src = FIXTURES / "tiny-mixtral-b"
    bf16 = {n: a.astype(ml_dtypes.bfloat16) for n, a in load_file(src / "model.safetensors").items()}
    copy_hf(src, tmp_path / "src", replace=bf16)
    kept = convert(tmp_path / "src", tmp_path / "kept", progress=False)
    asked = convert(tmp_path / "src", tmp_path / "bf16", dtype="bf16", progress=False)
    assert (kept / "weights.bin").read_bytes() == (asked / "weights.bin").read_bytes()
    assert {t["dtype"] for t in read_colibri(kept)[0]["tensors"]} >= {"bf16"}

    mixed = "model.layers.1.block_sparse_moe.experts.3.w1.weight"
    copy_hf(tmp_path / "src", tmp_path / "mixed", replace={mixed: bf16[mixed].astype(np.float32)})
    doc, w = read_colibri(convert(tmp_path / "mixed", tmp_path / "mixed-out", progress=False))
    dtypes = {t["name"]: t["dtype"] for t in doc["tensors"]}
    assert dtypes["layers.1.experts.w1"] == "f32" and dtypes["layers.1.experts.w3"] == dtypes["layers.0.experts.w1"] == "bf16"
    assert np.array_equal(w["layers.1.experts.w1"][3], bf16[mixed].astype(np.float32))


def test_an_f16_checkpoint_stays_f16_and_runs_as_transformers(tmp_path):
    """The shipped f16 checkpoint converts to f16 by default: its weights take half the bytes they
    take with --dtype f32 (which the command line still writes), and both models give the logits of
    transformers' run of the checkpoint (its reference.npz) to the bar the bundled model meets."""
    src = FIXTURES / "shakespeare-hf"
    kept = convert(src, tmp_path / "kept", progress=False)
    subprocess.run([sys.executable, "-m", "colibri", "convert", str(src), str(tmp_path / "f32"), "--dtype", "f32",
                    "--quiet"], check=True, capture_output=True, cwd=tmp_path)
    tables = {}
    for name in ("kept", "f32"):
        doc, w = read_colibri(tmp_path / name)
        tables[name] = ({t["dtype"] for t in doc["tensors"] if t["dtype"] not in ("u8", "i32")},
                        sum(t["file_size"] for t in doc["tensors"] if t["dtype"] not in ("u8", "i32")), w)
    assert (tables["kept"][0], tables["f32"][0]) == ({"f16"}, {"f32"})
    assert tables["kept"][1] * 2 == tables["f32"][1]
    from colibri.demo import MODEL_DIR   # the shipped model is this checkpoint at f16 (test_bundled_model.py)
    assert (kept / "weights.bin").read_bytes() == (MODEL_DIR / "weights.bin").read_bytes()
    assert all(np.array_equal(tables["kept"][2][n], tables["f32"][2][n]) for n in tables["f32"][2]), "f16 -> f32 is exact"
    with np.load(src / "reference.npz") as z:
        tokens, reference = z["tokens"], z["logits"]
    for name in ("kept", "f32"):
        logits = colibri.Model(tmp_path / name).session(ctx=256).forward(tokens)
        np.testing.assert_allclose(logits, reference, atol=1e-4, rtol=0)


@pytest.mark.parametrize("edit, want", [
    ({"rope_parameters": None, "rope_theta": 10000}, {"rope_theta": 10000.0}),  # older hub configs
    ({"eos_token_id": [2, 7], "bos_token_id": None}, {"eos_token_id": 2, "bos_token_id": 1}),
    ({"eos_token_id": None}, {"eos_token_id": 2}),  # absent: Mixtral's default
    ({"head_dim": None, "sliding_window": None, "num_key_value_heads": None},
     {"head_dim": 8, "sliding_window": 0, "num_kv_heads": 6}),
])
def test_config_variants(tmp_path, edit, want):
    src = tmp_path / "src"
    copy_hf(FIXTURES / "tiny-mixtral-b", src, config=edit)
    if "num_kv_heads" in want:  # kv heads now = heads: give wk / wv that shape
        tensors = load_file(src / "model.safetensors")
        for n in list(tensors):
            if n.endswith(("k_proj.weight", "v_proj.weight")):
                tensors[n] = np.tile(tensors[n], (6, 1))
        save_file(tensors, src / "model.safetensors")
    doc = json.loads((convert(src, tmp_path / "out", progress=False) / "colibri_model.json").read_text())
    assert {k: doc["hparams"][k] for k in want} == want


def test_generation_config_end_ids_join_config_json(tmp_path):
    """generation_config.json's eos_token_id list (what generate() stops on) is kept after config.json's."""
    src = tmp_path / "src"
    copy_hf(FIXTURES / "tiny-mixtral-b", src)
    eos = json.loads((src / "config.json").read_text())["eos_token_id"]
    (src / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, eos, 9]}))
    hp = json.loads((convert(src, tmp_path / "out", progress=False) / "colibri_model.json").read_text())["hparams"]
    assert hp["eos_token_id"] == eos and hp["eos_token_ids"] == [eos, 7, 9]


# ---------------------------------------------------------------------------------------- errors

def _bad_shape():
    return {"model.layers.1.self_attn.q_proj.weight": np.zeros((48, 64), np.float32)}


@pytest.mark.parametrize("setup, match", [
    (lambda d: d.mkdir(), r"no config\.json"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, config={"model_type": "llama"}),
     r"model_type 'llama' is not supported"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, drop=["model.layers.1.block_sparse_moe.experts.3.w2.weight"]),
     r"`model\.layers\.1\.block_sparse_moe\.experts\.3\.w2\.weight` \(for colibri `layers\.1\.experts\.w2`\) missing"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, drop=["lm_head.weight"]), r"`lm_head\.weight`.*missing"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, replace=_bad_shape()),
     r"`model\.layers\.1\.self_attn\.q_proj\.weight` \(for colibri `layers\.1\.attn\.wq`\): shape \[48, 64\] != expected \[64, 64\]"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, config={"hidden_act": "tanh"}), r"unsupported: hidden_act 'tanh' in mixtral"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, config={"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}),
     r"rope_type 'yarn'"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, config={"num_key_value_heads": 3}), r"not a multiple"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, config={"num_experts_per_tok": 5}), r"num_experts_per_tok 5"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, config={"hidden_size": "64"}), r"`hidden_size` = '64' is not an integer"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d, config={"vocab_size": None}), r"`vocab_size` missing"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d,
                       replace={"model.norm.weight": np.full(64, np.nan, np.float32)}), r"`norm`: the source holds NaN"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d,
                       replace={"model.norm.weight": np.arange(64, dtype=np.int32)}), r"`model\.norm\.weight`: source dtype I32"),
    (lambda d: copy_hf(FIXTURES / "tiny-mixtral", d) and (d / "model.safetensors").write_bytes(b"\x08" + bytes(15)),
     r"model\.safetensors: not a readable safetensors file"),
], ids=["no-config", "model-type", "missing-expert", "missing-lm-head", "shape", "act", "rope-type", "kv-heads",
        "top-k", "type", "null", "nan", "int-dtype", "corrupt-file"])
def test_bad_input_raises_convert_error(tmp_path, setup, match):
    setup(tmp_path / "src")
    with pytest.raises(ConvertError, match=match):
        convert(tmp_path / "src", tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "weights.bin").exists() and not (tmp_path / "out" / "colibri_model.json").exists()


def test_bad_dtype_argument(tmp_path):
    with pytest.raises(ConvertError, match=r"unknown dtype 'q8'.*\['bf16', 'f16', 'f32', 'q4_0', 'q8_0', 'w4g128'\]"):
        convert(FIXTURES / "tiny-mixtral", tmp_path / "out", dtype="q8", progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("repack", ["yes", 2, "fast"])
def test_bad_repack_argument(tmp_path, repack):
    with pytest.raises(ConvertError, match=re.escape(f"repack={repack!r}: expected None")):
        convert(FIXTURES / "tiny-mixtral", tmp_path / "out", repack=repack, progress=False)
    assert not (tmp_path / "out").exists()


def test_f16_overflow_is_an_error(tmp_path):
    big = load_file(FIXTURES / "tiny-mixtral" / "model.safetensors")["model.norm.weight"] * 1e5
    copy_hf(FIXTURES / "tiny-mixtral", tmp_path / "src", replace={"model.norm.weight": big})
    with pytest.raises(ConvertError, match=r"`norm`: values beyond the f16 range"):
        convert(tmp_path / "src", tmp_path / "out", dtype="f16", progress=False)
    convert(tmp_path / "src", tmp_path / "out", dtype="bf16", progress=False)  # bf16 has the range


def test_convert_error_is_a_value_error():
    assert issubclass(ConvertError, ValueError)


# ----------------------------------------------------------------------------------- bf16 rounding

def test_bf16_round_to_nearest_even():
    def bits(*u32):
        return f32_to_bf16_bits(np.array(u32, np.uint32).view(np.float32)).tolist()

    assert bits(0x3F800000, 0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF) == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x3F80]
    assert bits(0x80000000, 0x00000001, 0x00008000, 0x00018000) == [0x8000, 0x0000, 0x0000, 0x0002]  # -0, subnormals
    assert bits(0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000) == [0x7F80, 0xFF80, 0x7F80]  # rounds up to +-inf; inf stays
    assert bits(0x7FC00000, 0xFFFFFFFF, 0x7F800001) == [0x7FC0, 0xFFFF, 0x7FC0]  # NaN stays NaN (quiet)


def test_bf16_rounding_matches_ml_dtypes():
    import ml_dtypes
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(100000) * 10.0 ** rng.integers(-40, 39, 100000)  # all exponents
    ties = (rng.integers(0, 2**16, 1000, dtype=np.uint32) << 16 | 0x8000).view(np.float32)  # halfway cases
    with np.errstate(over="ignore"):
        x = np.concatenate([normal.astype(np.float32), ties])
    x = x[np.isfinite(x)]
    assert np.array_equal(f32_to_bf16_bits(x), x.astype(ml_dtypes.bfloat16).view(np.uint16))


# ------------------------------------------------------------------------------ fixture freshness

def test_fixtures_regenerate_identically(tmp_path):
    """make_fixtures.py reproduces the committed files bit for bit, so they cannot drift from the
    script: it pins torch to one thread, ATen's AVX2 kernels and MKL's COMPATIBLE branch, which
    give the same bits on every x86-64 CPU with AVX2, whatever else it has."""
    require_reference()
    if platform.machine() != "x86_64" or "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("the fixtures are torch's results with its x86-64 AVX2 kernels")
    subprocess.run([sys.executable, FIXTURES / "make_fixtures.py", "--out", tmp_path, "--quiet"], check=True,
                   cwd=tmp_path)
    for model in HF_MODELS:
        for f in ("model.safetensors", "tokenizer.json"):
            if (FIXTURES / model / f).exists():
                assert (tmp_path / model / f).read_bytes() == (FIXTURES / model / f).read_bytes(), f"{model}/{f}"
        with np.load(tmp_path / model / "reference.npz") as new, np.load(FIXTURES / model / "reference.npz") as old:
            assert sorted(new.files) == sorted(old.files)
            for k in old.files:
                assert new[k].dtype == old[k].dtype and new[k].tobytes() == old[k].tobytes(), \
                    f"{model}: {k}: {np.count_nonzero(new[k] != old[k])} of {old[k].size} differ"
    for f in ("weights.bin", "tokenizer.json"):
        assert (tmp_path / "tiny-mixtral.colibri" / f).read_bytes() == (FIXTURES / "tiny-mixtral.colibri" / f).read_bytes()


def test_converter_runs_without_torch(tmp_path):
    """torch and transformers are test-time tools only; converting must not import them."""
    code = ("import sys; sys.modules['torch'] = sys.modules['transformers'] = None\n"
            "from colibri.convert import convert\n"
            f"convert({str(FIXTURES / 'tiny-mixtral-b')!r}, {str(tmp_path / 'out')!r}, dtype='bf16', progress=False)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
    assert (tmp_path / "out" / "weights.bin").exists()


def test_transformers_state_dict_converts_to_the_same_weights(converted, tmp_path):
    """A state_dict saved straight from transformers (fused expert names) converts like the hub file."""
    src = FIXTURES / "tiny-mixtral"
    model = hf_model(src)
    from safetensors.torch import save_file as save_torch   # needs torch: after the skip without it
    state = model.state_dict()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    (tmp_path / "src").mkdir()
    save_torch({n: t.contiguous() for n, t in state.items()}, tmp_path / "src" / "model.safetensors")
    shutil.copy(src / "config.json", tmp_path / "src")
    shutil.copy(src / "tokenizer.json", tmp_path / "src")
    out = convert(tmp_path / "src", tmp_path / "out", progress=False)
    assert (out / "weights.bin").read_bytes() == (converted[("tiny-mixtral", "f32")] / "weights.bin").read_bytes()


# ------------------------------------------------------------------------------- the spec's spelling

def _colibri(*args):
    return subprocess.run([sys.executable, "-m", "colibri", *map(str, args)], capture_output=True, text=True)


def test_spec_spellings_convert_as_the_positional_ones(tmp_path):
    """`colibri convert --input-dir DIR --output-dir DIR --quantize NAME` (the spec's command line)
    writes what `colibri convert SRC OUT --quant NAME` writes."""
    src = FIXTURES / "tiny-mixtral"
    r = _colibri("convert", "--input-dir", src, "--output-dir", tmp_path / "spec", "--quantize", "q8_0", "--quiet")
    assert r.returncode == 0, r.stderr
    r = _colibri("convert", src, tmp_path / "plain", "--quant", "q8_0", "--quiet")
    assert r.returncode == 0, r.stderr
    for name in ("colibri_model.json", "weights.bin"):
        assert (tmp_path / "spec" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()


@pytest.mark.parametrize("args,match", [
    (["SRC", "OUT", "--input-dir", "SRC"], "SRC and --input-dir both give the source"),
    (["SRC", "OUT", "--output-dir", "OUT"], "OUT and --output-dir both give the output directory"),
    (["SRC", "OUT", "--quant", "q8_0", "--quantize", "w4a16"], "--quant and --quantize both give the weight dtype"),
    (["--output-dir", "OUT"], "give the source and the output directory"),
])
def test_two_spellings_of_one_thing_are_an_error(tmp_path, args, match):
    paths = {"SRC": FIXTURES / "tiny-mixtral", "OUT": tmp_path / "out"}
    r = _colibri("convert", *[paths.get(a, a) for a in args], "--quiet")
    assert r.returncode != 0 and match in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_a_quantization_that_quantizes_nothing_is_refused(tmp_path):
    """w4a16 (w4g128) quantizes rows of whole 128-weight groups; the fixture's rows are 64 and 96
    wide, so every weight would stay f32: the converter says so and writes nothing."""
    cfg = json.loads((FIXTURES / "tiny-mixtral" / "config.json").read_text())
    widths = sorted({cfg["hidden_size"], cfg["intermediate_size"]})
    assert all(w % 128 for w in widths)
    r = _colibri("convert", "--input-dir", FIXTURES / "tiny-mixtral", "--output-dir", tmp_path / "out",
                 "--quantize", "w4a16", "--quiet")
    assert r.returncode == 1
    assert f"w4g128 quantizes matrices whose rows are whole blocks of 128 weights; this model's rows have " in r.stderr
    assert all(str(w) in r.stderr for w in widths) and "every weight would stay f32" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()

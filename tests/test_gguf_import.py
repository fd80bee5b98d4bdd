"""GGUF import: a file written as llama.cpp's converter writes Mixtral (tensor names, metadata, the
rows of q and k reordered for RoPE on adjacent pairs, experts stacked, Q8_0 blocks from the gguf
package) runs in colibri as transformers runs the original checkpoint with the same rounding; a
file with metadata of the wrong type or range, or cut short anywhere, is refused by a ConvertError
that names what is wrong; the progress bar counts the bytes written."""
import json
import re
import struct
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize
from safetensors.numpy import load_file

import colibri
from colibri.convert import ConvertError, convert
from support import FIXTURES, build, hf_logits, hf_model, require_reference

torch, transformers = require_reference()
SRC = FIXTURES / "tiny-mixtral"
TOKENS = np.random.default_rng(6).integers(0, 320, 24).astype(np.int32)


def rows_for_adjacent_pairs(w, heads):
    """llama.cpp's reordering of q/k rows: each head's halves interleaved, (j, j + d/2) -> (2j, 2j + 1)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path, kind):
    cfg = transformers.AutoConfig.from_pretrained(SRC)
    w = load_file(SRC / "model.safetensors")
    E, L = cfg.num_local_experts, cfg.num_hidden_layers
    out = GGUFWriter(str(path), "llama")
    out.add_context_length(cfg.max_position_embeddings)
    out.add_embedding_length(cfg.hidden_size)
    out.add_block_count(L)
    out.add_feed_forward_length(cfg.intermediate_size)
    out.add_head_count(cfg.num_attention_heads)
    out.add_head_count_kv(cfg.num_key_value_heads)
    out.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    out.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    out.add_expert_count(E)
    out.add_expert_used_count(cfg.num_experts_per_tok)
    out.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)

    def add(name, x):
        x = x.astype(np.float32)
        if kind is None or x.ndim == 1:
            out.add_tensor(name, x)
        else:
            out.add_tensor(name, quantize(x, kind), raw_dtype=kind)

    add("token_embd.weight", w["model.embed_tokens.weight"])
    for i in range(L):
        p = f"model.layers.{i}."
        add(f"blk.{i}.attn_norm.weight", w[p + "input_layernorm.weight"])
        add(f"blk.{i}.attn_q.weight", rows_for_adjacent_pairs(w[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        add(f"blk.{i}.attn_k.weight", rows_for_adjacent_pairs(w[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        add(f"blk.{i}.attn_v.weight", w[p + "self_attn.v_proj.weight"])
        add(f"blk.{i}.attn_output.weight", w[p + "self_attn.o_proj.weight"])
        add(f"blk.{i}.ffn_norm.weight", w[p + "post_attention_layernorm.weight"])
        moe = p + "block_sparse_moe."
        add(f"blk.{i}.ffn_gate_inp.weight", w[moe + "gate.weight"])
        for ours, theirs in (("ffn_gate_exps", "w1"), ("ffn_up_exps", "w3"), ("ffn_down_exps", "w2")):
            add(f"blk.{i}.{ours}.weight", np.stack([w[f"{moe}experts.{e}.{theirs}.weight"] for e in range(E)]))
    add("output_norm.weight", w["model.norm.weight"])
    add("output.weight", w["lm_head.weight"])
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


@pytest.mark.parametrize("kind", [None, GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0], ids=["f32", "q8_0", "q4_0"])
def test_an_imported_gguf_runs_as_transformers(kind, tmp_path):
    write_gguf(tmp_path / "model.gguf", kind)
    model = colibri.Model(convert(tmp_path / "model.gguf", tmp_path / "colibri", progress=False), verify=True)
    hf = hf_model(SRC)
    if kind is not None:   # transformers on what the blocks encode
        with torch.no_grad():
            for p in hf.parameters():
                if p.ndim >= 2:
                    p.copy_(torch.from_numpy(dequantize(quantize(p.numpy(), kind), kind).reshape(p.shape)))
    ref = hf_logits(hf, TOKENS)
    ours = model.session(ctx=64, kernels="reference").forward(TOKENS)   # float activations, as transformers
    print(f"gguf {kind.name if kind else 'F32'}: max |colibri - transformers| = {np.abs(ours - ref).max():.2e}")
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_unsupported_gguf_is_refused(tmp_path):
    out = GGUFWriter(str(tmp_path / "m.gguf"), "falcon")
    out.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    with pytest.raises(ConvertError, match="unsupported: architecture 'falcon' in gguf"):
        convert(tmp_path / "m.gguf", tmp_path / "out", progress=False)
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 40)
    with pytest.raises(ConvertError, match="not a readable GGUF file"):
        convert(tmp_path / "broken.gguf", tmp_path / "out2", progress=False)


def test_a_qwen3moe_gguf_runs_as_transformers(tmp_path):
    """qwen3moe: no row reordering (rotate-half RoPE), per-head QK-norm, expert_feed_forward_length."""
    hf = build("qwen3_moe", mlp_only_layers=[], use_sliding_window=False, attention_bias=False)
    cfg, sd = hf.config, {k: v.numpy() for k, v in hf.state_dict().items()}
    out = GGUFWriter(str(tmp_path / "q.gguf"), "qwen3moe")
    out.add_context_length(cfg.max_position_embeddings)
    out.add_embedding_length(cfg.hidden_size)
    out.add_block_count(cfg.num_hidden_layers)
    out.add_feed_forward_length(cfg.intermediate_size)
    out.add_expert_feed_forward_length(cfg.moe_intermediate_size)
    out.add_head_count(cfg.num_attention_heads)
    out.add_head_count_kv(cfg.num_key_value_heads)
    out.add_key_length(cfg.head_dim)
    out.add_value_length(cfg.head_dim)
    out.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    out.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    out.add_expert_count(cfg.num_experts)
    out.add_expert_used_count(cfg.num_experts_per_tok)
    F = cfg.moe_intermediate_size
    out.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        for ours, theirs in (("attn_norm", "input_layernorm"), ("attn_q", "self_attn.q_proj"), ("attn_k", "self_attn.k_proj"),
                             ("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"),
                             ("attn_q_norm", "self_attn.q_norm"), ("attn_k_norm", "self_attn.k_norm"),
                             ("ffn_norm", "post_attention_layernorm"), ("ffn_gate_inp", "mlp.gate")):
            out.add_tensor(f"blk.{i}.{ours}.weight", sd[p + theirs + ".weight"])
        gate_up = sd[p + "mlp.experts.gate_up_proj"]   # [E, 2F, D] in memory: gate rows first
        out.add_tensor(f"blk.{i}.ffn_gate_exps.weight", np.ascontiguousarray(gate_up[:, :F]))
        out.add_tensor(f"blk.{i}.ffn_up_exps.weight", np.ascontiguousarray(gate_up[:, F:]))
        out.add_tensor(f"blk.{i}.ffn_down_exps.weight", sd[p + "mlp.experts.down_proj"])
    out.add_tensor("output_norm.weight", sd["model.norm.weight"])
    out.add_tensor("output.weight", sd["lm_head.weight"])
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    model = colibri.Model(convert(tmp_path / "q.gguf", tmp_path / "colibri", progress=False))
    tokens = np.random.default_rng(7).integers(0, cfg.vocab_size, 24)
    np.testing.assert_allclose(model.session(ctx=64).forward(tokens), hf_logits(hf, tokens), atol=1e-4, rtol=0)


def rewritten(src, dst, key, add=None):
    """A copy of the GGUF file `src` without metadata `key`; add(writer) then writes it anew."""
    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), bytes(r.fields["general.architecture"].parts[-1]).decode())
    for k, field in r.fields.items():
        if not (k.startswith("GGUF.") or k in ("general.architecture", key)):
            array = field.types[0] == GGUFValueType.ARRAY
            w.add_key_value(k, field.contents(), field.types[0], sub_type=field.types[1] if array else None)
    if add is not None:
        add(w)
    for t in r.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


INT_MAX = 2**31 - 1
BAD_METADATA = [   # key (after llama.), how the file has it (GGUFWriter's method and value; None: left out), the error
    ("block_count", "add_string", "x", r"is a string \('x'\), expected an integer"),
    ("block_count", "add_float32", 2.0, r"is a float \(2.0\), expected an integer"),
    ("block_count", "add_array", [2, 2], r"is an array \(\[2, 2\]\), expected an integer"),
    ("context_length", "add_bool", True, r"is a boolean \(True\), expected an integer"),
    ("attention.head_count", "add_uint32", 0, f"is 0, expected an integer from 1 to {INT_MAX}"),
    ("attention.head_count", "add_int32", -4, f"is -4, expected an integer from 1 to {INT_MAX}"),
    ("embedding_length", "add_uint64", 2**40, f"is {2**40}, expected an integer from 1 to {INT_MAX}"),
    ("expert_used_count", "add_uint32", 5, r"is 5, more than `llama.expert_count` \(4\)"),
    ("attention.head_count_kv", "add_array", [4, 4], r"is an array \(\[4, 4\]\), expected an integer"),
    ("rope.freq_base", "add_string", "1e4", r"is a string \('1e4'\), expected a number"),
    ("rope.freq_base", "add_float32", 0.0, r"is 0.0, expected a finite number > 0"),
    ("attention.layer_norm_rms_epsilon", "add_float32", float("nan"), r"is nan, expected a finite number"),
    ("expert_used_count", None, None, "missing"),
]


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "model.gguf"
    write_gguf(path, None)
    return path


@pytest.mark.parametrize("key, method, value, message", BAD_METADATA + [
    ("tokenizer.ggml.bos_token_id", "add_string", "1", r"is a string \('1'\), expected an integer")],
    ids=lambda x: x if isinstance(x, str) and " " not in x else "")
def test_metadata_of_the_wrong_type_or_range_is_refused_by_name(key, method, value, message, f32_gguf, tmp_path):
    key = key if key.startswith("tokenizer.") else f"llama.{key}"
    bad = rewritten(f32_gguf, tmp_path / "bad.gguf", key, method and (lambda w: getattr(w, method)(key, value)))
    with pytest.raises(ConvertError, match=rf"^GGUF: `{re.escape(key)}` {message}$"):
        convert(bad, tmp_path / "out", progress=False)


def test_the_family_importers_check_their_metadata_by_the_same_getter():
    from colibri.convert import gguf_arch

    moe = {"expert_count": 4, "expert_used_count": 2}
    cases = [("qwen2moe", {"expert_count": 4, "expert_used_count": True}, "expert_used_count",
              r"is a boolean \(True\), expected an integer"),
             ("qwen2moe", {**moe, "attention.head_count": 0}, "attention.head_count",
              f"is 0, expected an integer from 1 to {INT_MAX}"),
             ("olmoe", {"expert_count": 4, "expert_used_count": 8}, "expert_used_count",
              r"is 8, more than `olmoe.expert_count` \(4\)"),
             ("lfm2moe", {**moe, "attention.head_count_kv": [2, "x"]}, r"attention.head_count_kv\[1\]",
              r"is a string \('x'\), expected an integer"),
             ("deepseek2", {**moe, "attention.head_count": 4, "rope.dimension_count": 1.5}, "rope.dimension_count",
              r"is a float \(1.5\), expected an integer")]
    for arch, keys, key, message in cases:
        with pytest.raises(ConvertError, match=rf"^GGUF: `{arch}.{key}` {message}$"):
            gguf_arch.describe({f"{arch}.{k}": v for k, v in keys.items()}, arch, {})


def test_a_file_cut_short_anywhere_is_refused_naming_the_part(f32_gguf, tmp_path):
    data, r = f32_gguf.read_bytes(), GGUFReader(str(f32_gguf))
    table, last = r.tensors[0].field.offset, r.tensors[-1].field
    cuts = {10: "the header", 20: "the header", r.fields["llama.block_count"].offset + 3: "the metadata",
            table - 1: "the metadata", table + 5: "the tensor table",
            last.offset + sum(int(x.nbytes) for x in last.parts) - 1: "the tensor table",
            r.data_offset - 1: r"tensor `token_embd.weight` \(F32\): its data \(shape \[\d+(, \d+)*\]\)",   # in the alignment padding
            r.data_offset + 7: r"tensor `token_embd.weight` \(F32\): its data \(shape \[\d+(, \d+)*\]\)",
            r.tensors[-1].data_offset + 1: r"tensor `output.weight` \(F32\): its data \(shape \[\d+(, \d+)*\]\)",
            len(data) - 1: r"tensor `output.weight` \(F32\): its data \(shape \[\d+(, \d+)*\]\)"}
    for cut, part in cuts.items():
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(ConvertError, match=rf"not a readable GGUF file: {part} runs to byte \d+, past the end of "
                                               rf"the file \({cut} bytes\)$"):
            convert(tmp_path / "cut.gguf", tmp_path / "out", progress=False)


def test_a_tensor_of_no_weights_or_of_more_than_the_file_holds_is_refused(f32_gguf, tmp_path):
    """A dimension of 0, or so large that gguf's uint64 count of the bytes would wrap around (the
    unknown type and a size that disagrees with the type: test_gguf_quants)."""
    data, name = f32_gguf.read_bytes(), b"token_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4   # its dimensions, fastest first
    for dims, message in (((64, 0), r"shape \[0, 64\] holds no weights"),
                          ((64, 2**63), rf"its data \(shape \[{2**63}, 64\]\) runs to byte \d+, past the end of the file"),
                          ((2**32, 2**32), rf"its data \(shape \[{2**32}, {2**32}\]\) runs to byte \d+, past the end")):
        bad = bytearray(data)
        struct.pack_into("<2Q", bad, at, *dims)
        (tmp_path / "bad.gguf").write_bytes(bytes(bad))
        with pytest.raises(ConvertError, match=rf"not a readable GGUF file: tensor `token_embd.weight` \(F32\): {message}"):
            convert(tmp_path / "bad.gguf", tmp_path / "out", progress=False)


def test_the_command_line_prints_the_error_without_a_traceback(f32_gguf, tmp_path):
    key = "llama.block_count"
    bad = rewritten(f32_gguf, tmp_path / "bad.gguf", key, lambda w: w.add_string(key, "x"))
    r = subprocess.run([sys.executable, "-m", "colibri", "convert", str(bad), str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == "colibri convert: GGUF: `llama.block_count` is a string ('x'), expected an integer"


K_TYPES = ("Q4_K", "Q6_K", "Q5_K", "Q2_K", "Q3_K", "IQ4_XS", "Q5_0", "Q4_1", "IQ4_NL", "MXFP4")


def k_quant_gguf(path):
    """A llama GGUF with 256 weights a row, each matrix in another of K_TYPES (random blocks with
    finite scales: only their bytes are looked at), the norms F32; and a vocabulary, for the byte tables."""
    D, E, L = 256, 4, 2
    out = GGUFWriter(str(path), "llama")
    for add, value in ((out.add_context_length, 64), (out.add_embedding_length, D), (out.add_block_count, L),
                       (out.add_feed_forward_length, D), (out.add_head_count, 4), (out.add_head_count_kv, 2),
                       (out.add_layer_norm_rms_eps, 1e-5), (out.add_expert_count, E), (out.add_expert_used_count, 2)):
        add(value)
    out.add_tokenizer_model("llama")
    out.add_token_list([f"<{i}>" for i in range(300)])
    out.add_token_scores([0.0] * 300)
    out.add_token_types([1] * 300)
    rng, kinds = np.random.default_rng(8), iter(K_TYPES * 4)

    def add(name, shape):
        if len(shape) == 1:
            return out.add_tensor(name, np.ones(shape, np.float32))
        kind = GGMLQuantizationType[next(kinds)]
        block, size = GGML_QUANT_SIZES[kind]
        rows = rng.integers(0, 256, (*shape[:-1], shape[-1] // block * size), dtype=np.uint8)
        blocks = rows.reshape(-1, size)
        while True:   # a block whose scale is not finite is redrawn: the model must load
            with np.errstate(all="ignore"):
                bad = ~np.isfinite(dequantize(blocks, kind)).all(-1)
            if not bad.any():
                break
            blocks[bad] = rng.integers(0, 256, (int(bad.sum()), size), dtype=np.uint8)
        out.add_tensor(name, rows, raw_dtype=kind)

    add("token_embd.weight", (300, D))
    for i in range(L):
        for name, shape in (("attn_norm", (D,)), ("attn_q", (D, D)), ("attn_k", (D // 2, D)), ("attn_v", (D // 2, D)),
                            ("attn_output", (D, D)), ("ffn_norm", (D,)), ("ffn_gate_inp", (E, D)),
                            ("ffn_gate_exps", (E, D, D)), ("ffn_up_exps", (E, D, D)), ("ffn_down_exps", (E, D, D))):
            add(f"blk.{i}.{name}.weight", shape)
    add("output_norm.weight", (D,))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return path


@pytest.mark.parametrize("layout", ["stacked", "interleaved"])
def test_the_progress_bar_counts_the_bytes_written(layout, monkeypatch, tmp_path):
    """Its total, in bytes, is set before the first tensor and is what weights.bin holds but its
    padding: the GGUF's own tensor sizes, then the byte tables (integers, not f32)."""
    import tqdm

    bars = []

    class Recorded(tqdm.tqdm):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            bars.append({"first total": self.total, "unit": self.unit})

        def close(self):
            bars[-1].update(total=self.total, n=self.n)
            super().close()

    monkeypatch.setattr(tqdm, "tqdm", Recorded)   # what the writer imports when it writes
    src = k_quant_gguf(tmp_path / "k.gguf")
    out = convert(src, tmp_path / "out", progress=True, layout=layout)
    (bar,) = bars
    table = json.loads((out / "colibri_model.json").read_text())["tensors"]
    kinds = {t["dtype"].removesuffix("x8") for t in table}   # the interleaved forms: their plain formats' bytes
    assert {k.lower() for k in K_TYPES} <= kinds and {"u8", "i32"} <= kinds
    gguf_bytes = sum(int(t.n_bytes) for t in GGUFReader(str(src)).tensors)   # the reader's own count
    tables = sum(t["file_size"] for t in table if t["name"].startswith("tokenizer."))
    assert bar["unit"] == "B" and bar["first total"] == bar["total"] == bar["n"] == gguf_bytes + tables
    parts = sum(t["shape"][0] if "expert_stride" in t else 1 for t in table)
    assert 0 <= (out / "weights.bin").stat().st_size - bar["total"] < 64 * parts, "all but the padding counted"


def test_the_progress_bar_ends_at_the_bytes_written_for_an_integer_table_without_its_dtype(monkeypatch, tmp_path):
    import tqdm

    from colibri.convert import writer

    bars = []

    class Recorded(tqdm.tqdm):
        def close(self):
            bars.append((self.total, self.n))
            super().close()

    monkeypatch.setattr(tqdm, "tqdm", Recorded)
    tensors = [("w", (2, 64), lambda: np.ones((2, 64), np.float32)),
               ("t", (10,), lambda: np.arange(10, dtype=np.uint8))]   # counted as f32 until written
    writer.write_model(tmp_path, {"format": "colibri", "version": 1}, tensors, "q8_0")
    assert set(bars) == {(2 * 34 * 2 + 10, 2 * 34 * 2 + 10)}   # q8_0: 34 bytes a block of 32; the table's 10 bytes


def gguf_string(text):
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def raw_gguf(path, pairs=(), tensors=0):
    """A GGUF file written byte by byte: architecture llama, the metadata `pairs` (key, GGUF value type,
    the value's bytes), and `tensors` F32 tensors of one element, all at the file's one data block."""
    meta = [("general.architecture", GGUFValueType.STRING, gguf_string("llama")), *pairs]
    head = (b"GGUF" + struct.pack("<IQQ", 3, tensors, len(meta))
            + b"".join(gguf_string(key) + struct.pack("<I", kind) + value for key, kind, value in meta)
            + b"".join(gguf_string(f"t{i}") + struct.pack("<IQIQ", 1, 1, GGMLQuantizationType.F32, 0)
                       for i in range(tensors)))
    path.write_bytes(head + bytes(-len(head) % 32 + 32))
    return path


# The super-linear imports of small hostile files, measured 2026-12-03 on a shared 2-core AMD EPYC
# (benchmarks/gguf_hostile.py): the old code took 19 s on 20,000 tensors (a quadratic check of
# their names) and 36 s and 1.6 GB on 8 MB of empty strings (gguf's reader keeps two numpy views a
# string); the fixed one 2 s each and 64 MiB.  The bounds below sit between: the 40,000 tensors took
# 5 to 10 s fixed under load against 90 to 180 s before, no size gives a wider gap under the table's
# 65,536-entry cap.
def test_the_names_of_many_tensors_are_checked_in_linear_time(tmp_path):
    from test_gguf_tokenizer import imported_within

    path = raw_gguf(tmp_path / "m.gguf", tensors=40_000)
    said, _ = imported_within(path, 30)
    assert said == f"{path}: no token_embd.weight"


def test_metadata_takes_memory_in_proportion_to_its_bytes(tmp_path):
    from test_gguf_tokenizer import imported_within

    n = 1_000_000   # 8 MB of empty strings
    path = raw_gguf(tmp_path / "m.gguf", [("x", GGUFValueType.ARRAY, struct.pack("<IQ", GGUFValueType.STRING, n)
                                           + bytes(8 * n))])
    said, peak = imported_within(path, 20)
    assert said == f"{path}: no token_embd.weight"
    _, baseline = imported_within(raw_gguf(tmp_path / "empty.gguf"), 20)
    assert peak - baseline < 10 * 8, "MiB: more than ten times the metadata's bytes"


def array(kind, n, items=b""):
    return GGUFValueType.ARRAY, struct.pack("<IQ", kind, n) + items


@pytest.mark.parametrize("pairs, message", [
    ([("x", *array(GGUFValueType.STRING, 2**40))],
     rf"`x`: {2**40} string elements take at least {8 * 2**40} bytes, more than the \d+ left in the file"),
    ([("x", *array(GGUFValueType.UINT16, 2**62, bytes(64)))],
     rf"`x`: {2**62} uint16 elements take at least {2**63} bytes, more than the \d+ left in the file"),
    ([("x", *array(GGUFValueType.ARRAY, 1, struct.pack("<IQ", GGUFValueType.UINT8, 1) + bytes(1)))],
     "`x`: an array of arrays, which colibri does not read"),
    ([("x", *array(GGUFValueType.STRING, 0))] * 2, "`x` appears twice in the metadata"),
], ids=["strings", "numbers", "nested", "twice"])
def test_metadata_larger_than_the_file_or_not_gguf_is_refused_before_it_is_read(pairs, message, tmp_path):
    with pytest.raises(ConvertError, match=rf"not a readable GGUF file: {message}$"):
        convert(raw_gguf(tmp_path / "m.gguf", pairs), tmp_path / "out", progress=False)


def test_a_tensor_table_longer_than_any_model_is_refused_before_it_is_read(tmp_path):
    from colibri.convert.limits import integer_range

    MAX_LAYERS = integer_range("hparams.num_layers")[1]
    data = bytearray(raw_gguf(tmp_path / "m.gguf").read_bytes())
    struct.pack_into("<Q", data, 8, MAX_LAYERS * 64 + 1)   # the tensor count
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    with pytest.raises(ConvertError, match=rf"not a readable GGUF file: the tensor table: {MAX_LAYERS * 64 + 1} "
                                           rf"tensors, more than the {MAX_LAYERS * 64} of a model colibri loads"):
        convert(tmp_path / "m.gguf", tmp_path / "out", progress=False)

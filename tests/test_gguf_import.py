"""GGUF import: a file written as llama.cpp's converter writes Mixtral (tensor names, metadata, the
rows of q and k reordered for RoPE on adjacent pairs, experts stacked, Q8_0 blocks from the gguf
package) runs in colibri as transformers runs the original checkpoint with the same rounding."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter
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

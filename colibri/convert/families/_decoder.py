"""The plan every decoder family shares: embeddings, per layer the attention block (biases and
QK-norm as the hparams say) and an MLP the family supplies, the final norm and lm_head."""

from ..errors import ConvertError
from ..layout import dim1_slice, direct, stacked


def plan(desc, mlp, attention=None, names=None):
    """`mlp(layer, source prefix, colibri prefix)` -> the entries of that layer's MLP;
    `attention` likewise for the attention projections (default: q, k, v, o and their options).
    `names` renames the norms: {"attn_norm": ..., "ffn_norm": ..., "norm": full name}."""
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm", "norm": "model.norm.weight",
             **(names or {})}
    hp = desc["hparams"]
    V, D, hd = hp["vocab_size"], hp["hidden_size"], hp["head_dim"]
    q_dim, kv_dim = hp["num_heads"] * hd, hp["num_kv_heads"] * hd
    qk_norm = hp.get("qk_norm", "none")
    entries = [direct("tok_embeddings", (V, D), "model.embed_tokens.weight")]
    for i in range(hp["num_layers"]):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        att = src + "self_attn."
        entries.append(direct(dst + "attn_norm", (D,), src + names["attn_norm"] + ".weight"))
        if attention:
            entries += attention(i, src, dst)
            entries.append(direct(dst + "ffn_norm", (D,), src + names["ffn_norm"] + ".weight"))
            entries += mlp(i, src, dst)
            continue
        entries += [
            direct(dst + "attn.wq", (q_dim, D), att + "q_proj.weight"),
            direct(dst + "attn.wk", (kv_dim, D), att + "k_proj.weight"),
            direct(dst + "attn.wv", (kv_dim, D), att + "v_proj.weight"),
            direct(dst + "attn.wo", (D, q_dim), att + "o_proj.weight"),
        ]
        if hp.get("attention_bias"):
            entries += [direct(dst + "attn.bq", (q_dim,), att + "q_proj.bias"),
                        direct(dst + "attn.bk", (kv_dim,), att + "k_proj.bias"),
                        direct(dst + "attn.bv", (kv_dim,), att + "v_proj.bias")]
        if hp.get("attention_out_bias"):
            entries.append(direct(dst + "attn.bo", (D,), att + "o_proj.bias"))
        if qk_norm in ("head", "full"):   # "head_plain" has no weights
            entries += [direct(dst + "attn.q_norm", (hd if qk_norm == "head" else q_dim,), att + "q_norm.weight"),
                        direct(dst + "attn.k_norm", (hd if qk_norm == "head" else kv_dim,), att + "k_norm.weight")]
        entries.append(direct(dst + "ffn_norm", (D,), src + names["ffn_norm"] + ".weight"))
        entries += mlp(i, src, dst)
    entries.append(direct("norm", (D,), names["norm"]))
    if not hp["tie_word_embeddings"]:
        entries.append(direct("lm_head", (V, D), "lm_head.weight"))
    return entries


def routed_experts(ckpt, src, dst, E, F, D, names=("gate_proj", "up_proj", "down_proj")):
    """experts.w1/w3/w2 from per-expert tensors `src.{e}.{name}.weight` (what save_pretrained
    and the hub write), or from transformers 5's fused `src.gate_up_proj` [E, 2F, D] (gate
    first) and `src.down_proj` [E, D, F]. A checkpoint without expert E - 1 is refused here:
    the plan of a config's 4096 experts in each of 1024 layers is 12 million names."""
    if src + "gate_up_proj" in ckpt:
        return [dim1_slice(dst + "experts.w1", (E, F, D), src + "gate_up_proj", (E, 2 * F, D), 0),
                dim1_slice(dst + "experts.w3", (E, F, D), src + "gate_up_proj", (E, 2 * F, D), F),
                direct(dst + "experts.w2", (E, D, F), src + "down_proj")]
    gate, up, down = names
    if len(ckpt) and f"{src}{E - 1}.{gate}.weight" not in ckpt:   # before E names are made for each layer
        raise ConvertError(f"tensor `{src}{E - 1}.{gate}.weight` missing from {ckpt.dir}: the config says {E} experts")
    per_expert = [f"{src}{e}." for e in range(E)]
    return [stacked(dst + "experts.w1", (E, F, D), [p + gate + ".weight" for p in per_expert]),
            stacked(dst + "experts.w3", (E, F, D), [p + up + ".weight" for p in per_expert]),
            stacked(dst + "experts.w2", (E, D, F), [p + down + ".weight" for p in per_expert])]


def moe_mlp(desc, ckpt, shared_source="mlp.shared_experts.", shared_gate_source=None, selection_bias=None):
    """`plan`'s mlp for the Qwen/DeepSeek layout: dense layers mlp.{gate,up,down}_proj; MoE layers
    mlp.gate.weight, the routed experts under mlp.experts., a shared expert under `shared_source`
    (its sigmoid gate at `shared_gate_source`), and `selection_bias(source prefix, colibri prefix,
    n_experts)` -> the entry of the selection bias, if the router has one."""
    hp, E = desc["hparams"], desc["experts"]["count"]
    D, F = hp["hidden_size"], hp["intermediate_size"]
    kinds = hp.get("mlp_layers", ["moe"] * hp["num_layers"])
    shared = desc["experts"].get("shared")

    def mlp(i, src, dst):
        if kinds[i] == "dense":
            return gated_mlp(dst + "mlp.", src + "mlp.", hp["dense_intermediate_size"], D)
        out = [direct(dst + "router", (E, D), src + "mlp.gate.weight")]
        if selection_bias:
            out.append(selection_bias(src, dst, E))
        out += routed_experts(ckpt, src + "mlp.experts.", dst, E, F, D)
        if shared:
            out += gated_mlp(dst + "shared.", src + shared_source, shared["intermediate_size"], D)
            if shared_gate_source:
                out.append(direct(dst + "shared.gate", (1, D), src + shared_gate_source))
        return out

    return mlp


def gated_mlp(dst_prefix, src_prefix, F, D):
    """One SwiGLU MLP (dense layer or shared expert): gate/up [F, D], down [D, F]."""
    return [direct(dst_prefix + "w1", (F, D), src_prefix + "gate_proj.weight"),
            direct(dst_prefix + "w3", (F, D), src_prefix + "up_proj.weight"),
            direct(dst_prefix + "w2", (D, F), src_prefix + "down_proj.weight")]

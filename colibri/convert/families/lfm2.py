"""LFM2-MoE (lfm2_moe, LFM2-8B-A1B) -> colibri.

  layers   layer_types: "conv" (a short convolution: B, C, x = in_proj(h); y = C * causal depthwise
           conv over conv_L_cache positions of B * x; out_proj(y)) or "full_attention" (per-head QK
           RMSNorm with weights before RoPE, rotate half; out_proj); the first num_dense_layers
           have a dense MLP (intermediate_size), the rest MoE (moe_intermediate_size)
  router   sigmoid scores; experts chosen on score + expert_bias (the bias only chooses); the
           chosen scores renormalised (+1e-6) when norm_topk_prob, times routed_scaling_factor
  norms    operator_norm, ffn_norm, and the final one named embedding_norm; embeddings tied
Checkpoint: model.layers.{i}.conv.{in_proj,out_proj}.weight, conv.conv.weight [D, 1, L] (+ biases
with conv_bias), self_attn.{q,k,v,out}_proj.weight, self_attn.{q,k}_layernorm.weight,
feed_forward.gate.weight [E, D], feed_forward.expert_bias [E], feed_forward.experts.{e}.w1/w3/w2,
dense feed_forward.w1/w3/w2.
"""

from ..layout import direct, reshaped
from . import _config as c
from . import _decoder


def describe(config, family):
    config = {"rope_theta": 1e6, "tie_word_embeddings": True, **config}
    config["rms_norm_eps"] = config.get("norm_eps", 1e-5)
    hp = c.attention_hparams(config, family, c.dim(config, "moe_intermediate_size"), eps_default=1e-5)
    L = hp["num_layers"]
    n_experts, top_k = c.experts(config, ("num_experts",))
    types = config.get("layer_types")
    if not c.names(types, L, {"conv", "full_attention"}):
        raise c.unsupported(family, f"layer_types {types!r}")
    n_dense = c.get(config, "num_dense_layers", 2)
    hp.update(operator_layers=["conv" if t == "conv" else "attention" for t in types],
              conv_kernel=c.dim(config, "conv_L_cache", 3), conv_bias=c.get(config, "conv_bias", False, kind=bool),
              qk_norm="head")
    if n_dense:
        hp.update(mlp_layers=["dense" if i < n_dense else "moe" for i in range(L)],
                  dense_intermediate_size=c.dim(config, "intermediate_size"))
    return {
        "architecture": family,
        "hparams": hp,
        "routing": {"type": "topk", "top_k": top_k, "score": "sigmoid",
                    "selection_bias": c.get(config, "use_expert_bias", True, kind=bool),
                    "normalize": c.get(config, "norm_topk_prob", True, kind=bool), "normalize_eps": 1e-6,
                    "scale": float(c.get(config, "routed_scaling_factor", 1.0, kind=float))},
        "experts": {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"},
    }


def plan(desc, ckpt):
    hp, E = desc["hparams"], desc["experts"]["count"]
    D, F, K, hd = hp["hidden_size"], hp["intermediate_size"], hp["conv_kernel"], hp["head_dim"]
    q_dim, kv_dim = hp["num_heads"] * hd, hp["num_kv_heads"] * hd
    kinds = hp.get("mlp_layers", ["moe"] * hp["num_layers"])

    def attention(i, src, dst):
        if hp["operator_layers"][i] == "conv":
            cv = src + "conv."
            out = [direct(dst + "conv.in_proj", (3 * D, D), cv + "in_proj.weight"),
                   reshaped(dst + "conv.kernel", (D, K), cv + "conv.weight", (D, 1, K)),
                   direct(dst + "conv.out_proj", (D, D), cv + "out_proj.weight")]
            if hp["conv_bias"]:
                out += [direct(dst + "conv.in_bias", (3 * D,), cv + "in_proj.bias"),
                        direct(dst + "conv.kernel_bias", (D,), cv + "conv.bias"),
                        direct(dst + "conv.out_bias", (D,), cv + "out_proj.bias")]
            return out
        att = src + "self_attn."
        return [direct(dst + "attn.wq", (q_dim, D), att + "q_proj.weight"),
                direct(dst + "attn.wk", (kv_dim, D), att + "k_proj.weight"),
                direct(dst + "attn.wv", (kv_dim, D), att + "v_proj.weight"),
                direct(dst + "attn.wo", (D, q_dim), att + "out_proj.weight"),
                direct(dst + "attn.q_norm", (hd,), att + "q_layernorm.weight"),
                direct(dst + "attn.k_norm", (hd,), att + "k_layernorm.weight")]

    def mlp(i, src, dst):
        ff = src + "feed_forward."
        if kinds[i] == "dense":
            return [direct(dst + "mlp.w1", (hp["dense_intermediate_size"], D), ff + "w1.weight"),
                    direct(dst + "mlp.w3", (hp["dense_intermediate_size"], D), ff + "w3.weight"),
                    direct(dst + "mlp.w2", (D, hp["dense_intermediate_size"]), ff + "w2.weight")]
        out = [direct(dst + "router", (E, D), ff + "gate.weight")]
        if desc["routing"]["selection_bias"]:
            out.append(direct(dst + "router.selection_bias", (E,), ff + "expert_bias"))
        return out + _decoder.routed_experts(ckpt, ff + "experts.", dst, E, F, D, names=("w1", "w3", "w2"))

    return _decoder.plan(desc, mlp, attention, names={"attn_norm": "operator_norm", "ffn_norm": "ffn_norm",
                                                      "norm": "model.embedding_norm.weight"})

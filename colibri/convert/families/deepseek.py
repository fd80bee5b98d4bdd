"""GLM-4.5 (glm4_moe) and dots.llm1 (dots1) -> colibri: DeepSeek-V3's router with standard
attention.

  router   sigmoid scores; experts chosen on score + e_score_correction_bias (the bias only
           chooses), among the topk_group best of n_group groups (a group ranks by the sum of
           its best two); weights are the chosen scores, renormalised (+1e-20) when
           norm_topk_prob, times routed_scaling_factor
  layers   the first first_k_dense_replace are dense (intermediate_size), then MoE
           (moe_intermediate_size) with n_shared_experts shared experts as one SwiGLU MLP
           of moe_intermediate_size * n_shared_experts, added unscaled
  glm4_moe q/k/v biases (attention_bias; never on o), per-head QK-norm when use_qk_norm,
           RoPE on the first head_dim * partial_rotary_factor dimensions (default 0.5)
  dots1    per-head QK-norm always, full RoPE, biases on q, k, v and o (attention_bias),
           a window on the layers layer_types marks "sliding_attention"
Checkpoint: mlp.gate.weight [E, D], mlp.gate.e_score_correction_bias [E],
mlp.experts.{e}.{gate,up,down}_proj, mlp.shared_experts.*, dense mlp.{gate,up,down}_proj.
"""

from ..layout import direct
from . import _config as c
from . import _decoder


def _rope_fraction(config):
    rope = config.get("rope_parameters") or {}
    value = rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 0.5))
    value = c.get({"partial_rotary_factor": value}, "partial_rotary_factor", kind=float)
    if not 0 < value <= 1:
        raise c.unsupported("glm4_moe", f"partial_rotary_factor {value}")
    return value


def _layer_types(config, family, n_layers):
    window = config.get("sliding_window")
    if family != "dots1" or window is None:
        return 0, None
    window = c.dim(config, "sliding_window")
    types = config.get("layer_types") or ["sliding_attention" if i >= c.get(config, "max_window_layers", 0)
                                          else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise c.unsupported(family, f"layer_types {types!r}")
    return window, ["sliding" if t == "sliding_attention" else "full" for t in types]


def describe(config, family):
    hp = c.attention_hparams(config, family, c.dim(config, "moe_intermediate_size"),
                             eps_default=1e-5 if family == "glm4_moe" else 1e-6)
    L = hp["num_layers"]
    n_experts, top_k = c.experts(config, ("n_routed_experts",))
    first_dense = c.get(config, "first_k_dense_replace", 1 if family == "glm4_moe" else 0)
    if first_dense:
        hp["mlp_layers"] = ["dense" if i < first_dense else "moe" for i in range(L)]
        hp["dense_intermediate_size"] = c.dim(config, "intermediate_size")
    hp["sliding_window"], attention = _layer_types(config, family, L)
    if attention is not None:
        hp["attention_layers"] = attention
    bias = c.get(config, "attention_bias", False, kind=bool)
    hp["attention_bias"] = bias
    if family == "dots1":
        hp["attention_out_bias"] = bias
        hp["qk_norm"] = "head"
    else:
        if c.get(config, "use_qk_norm", False, kind=bool):
            hp["qk_norm"] = "head"
        rope_dim = int(hp["head_dim"] * _rope_fraction(config))
        if rope_dim % 2 or rope_dim < 2:
            raise c.unsupported(family, f"a rotary dimension of {rope_dim} (it must be even)")
        hp["rope_dim"] = rope_dim
    groups, topk_groups = c.dim(config, "n_group", 1), c.dim(config, "topk_group", 1)
    routing = {"type": "topk", "top_k": top_k, "score": "sigmoid", "selection_bias": True,
               "normalize": c.get(config, "norm_topk_prob", family == "glm4_moe", kind=bool),
               "normalize_eps": 1e-20, "scale": float(c.get(config, "routed_scaling_factor", 1.0, kind=float))}
    if groups > 1:
        routing.update(groups=groups, topk_groups=topk_groups, group_score="top2_sum")
    experts = {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"}
    n_shared = c.get(config, "n_shared_experts", 0) or 0
    if n_shared:
        experts["shared"] = {"intermediate_size": hp["intermediate_size"] * n_shared, "gate": "none"}
    return {"architecture": family, "hparams": hp, "routing": routing, "experts": experts}


def plan(desc, ckpt):
    hp, E = desc["hparams"], desc["experts"]["count"]
    D, F = hp["hidden_size"], hp["intermediate_size"]
    kinds = hp.get("mlp_layers", ["moe"] * hp["num_layers"])
    shared = desc["experts"].get("shared")

    def mlp(i, src, dst):
        if kinds[i] == "dense":
            return _decoder.gated_mlp(dst + "mlp.", src + "mlp.", hp["dense_intermediate_size"], D)
        out = [direct(dst + "router", (E, D), src + "mlp.gate.weight"),
               direct(dst + "router.selection_bias", (E,), src + "mlp.gate.e_score_correction_bias"),
               *_decoder.routed_experts(ckpt, src + "mlp.experts.", dst, E, F, D)]
        if shared:
            out += _decoder.gated_mlp(dst + "shared.", src + "mlp.shared_experts.", shared["intermediate_size"], D)
        return out

    return _decoder.plan(desc, mlp)

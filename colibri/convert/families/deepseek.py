"""DeepSeek-V2, DeepSeek-V3 (and Moonlight), GLM-4.5 (glm4_moe), GLM-4.7-Flash (glm4_moe_lite: V3's
latent attention with GLM's MoE, dense layers by mlp_layer_types) and dots.llm1 (dots1) -> colibri.

  deepseek_v2/v3  multi-head latent attention: q straight from q_proj or through q_a_proj ->
           q_a_layernorm -> q_b_proj; kv_a_proj_with_mqa gives the latent (kv_a_layernorm) and one
           rotary key all heads share; kv_b_proj expands the latent into each head's key and
           value.  RoPE on the last qk_rope_head_dim of each query head, pairs (2j, 2j+1) (V3 with
           rope_interleave false: rotate half); YaRN scales cos/sin by its attention factor and
           the softmax by mscale(factor, mscale_all_dim)^2.  V2's router: softmax, greedy or
           group-limited by the groups' best score, times routed_scaling_factor, never
           renormalised.  V3's router is the one below.

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
    if not c.names(types, n_layers, {"sliding_attention", "full_attention"}):
        raise c.unsupported(family, f"layer_types {types!r}")
    return window, ["sliding" if t == "sliding_attention" else "full" for t in types]


def _latent_attention(config, family, hp):
    """MLA's hparams: head_dim is the query/key head (nope + rope), rope_dim its rotary part."""
    import math

    nope, rope_dim = c.dim(config, "qk_nope_head_dim"), c.dim(config, "qk_rope_head_dim")
    if hp["num_kv_heads"] != hp["num_heads"]:
        raise c.unsupported(family, "num_key_value_heads != num_attention_heads")
    if c.get(config, "mlp_bias", False, kind=bool):
        raise c.unsupported(family, "mlp_bias (biases on the dense and shared MLPs)")
    hp.update(head_dim=nope + rope_dim, rope_dim=rope_dim,
              rope_interleaved=family == "deepseek_v2" or c.get(config, "rope_interleave", True, kind=bool),
              latent_attention={"q_lora_rank": c.get(config, "q_lora_rank", 0) or 0,
                                "kv_lora_rank": c.dim(config, "kv_lora_rank"),
                                "v_head_dim": c.dim(config, "v_head_dim"), "norm_eps": 1e-6})
    bias = c.get(config, "attention_bias", False, kind=bool)
    hp.update(attention_bias=bias, attention_out_bias=bias)
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    scale = (nope + rope_dim) ** -0.5   # as transformers computes it, in Python floats
    mscale_all_dim = c.get(rope, "mscale_all_dim", None, kind=float)
    if rope.get("rope_type", rope.get("type", "default")) != "default" and mscale_all_dim:
        factor = hp["rope_scaling"]["factor"]
        mscale = 1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0
        scale *= mscale * mscale
    hp["attention_scale"] = scale


def describe(config, family):
    latent = family in ("deepseek_v2", "deepseek_v3", "glm4_moe_lite")
    if latent:   # transformers sets head_dim to the rotary part; the rest of colibri's reading is the same
        config = {**config, "head_dim": config.get("qk_rope_head_dim")}
    hp = c.attention_hparams(config, family, c.dim(config, "moe_intermediate_size"),
                             eps_default=1e-5 if family == "glm4_moe" else 1e-6,
                             rope_types=("default", "yarn") if latent else ("default",))
    L = hp["num_layers"]
    n_experts, top_k = c.experts(config, ("n_routed_experts",))
    first_dense = c.get(config, "first_k_dense_replace", {"glm4_moe": 1, "deepseek_v3": 3}.get(family, 0))
    kinds = config.get("mlp_layer_types") or ["dense" if i < first_dense else "sparse" for i in range(L)]
    if not c.names(kinds, L, {"dense", "sparse"}):
        raise c.unsupported(family, f"mlp_layer_types {kinds!r}")
    if "dense" in kinds:
        hp["mlp_layers"] = ["moe" if k == "sparse" else "dense" for k in kinds]
        hp["dense_intermediate_size"] = c.dim(config, "intermediate_size")
    hp["sliding_window"], attention = _layer_types(config, family, L)
    if attention is not None:
        hp["attention_layers"] = attention
    bias = c.get(config, "attention_bias", False, kind=bool)
    hp["attention_bias"] = bias
    if latent:
        _latent_attention(config, family, hp)
    elif family == "dots1":
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
    scale = float(c.get(config, "routed_scaling_factor", 1.0, kind=float))
    if family == "deepseek_v2":
        method = config.get("topk_method", "greedy")
        if method not in ("greedy", "group_limited_greedy"):
            raise c.unsupported(family, f"topk_method {method!r}")
        routing = {"type": "topk", "top_k": top_k, "score": "softmax", "normalize": False, "scale": scale}
        if method == "group_limited_greedy" and groups > 1:
            routing.update(groups=groups, topk_groups=topk_groups, group_score="max")
    else:
        routing = {"type": "topk", "top_k": top_k, "score": "sigmoid", "selection_bias": True,
                   "normalize": c.get(config, "norm_topk_prob", family != "dots1", kind=bool),
                   "normalize_eps": 1e-20, "scale": scale}
        if groups > 1:
            routing.update(groups=groups, topk_groups=topk_groups, group_score="top2_sum")
    experts = {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"}
    n_shared = c.get(config, "n_shared_experts", 0) or 0
    if n_shared:
        experts["shared"] = {"intermediate_size": hp["intermediate_size"] * n_shared, "gate": "none"}
    return {"architecture": family, "hparams": hp, "routing": routing, "experts": experts}


def plan(desc, ckpt):
    hp = desc["hparams"]
    D = hp["hidden_size"]

    def selection_bias(src, dst, E):
        return direct(dst + "router.selection_bias", (E,), src + "mlp.gate.e_score_correction_bias")

    mlp = _decoder.moe_mlp(desc, ckpt, selection_bias=selection_bias if desc["routing"].get("selection_bias") else None)
    la = hp.get("latent_attention")
    if not la:
        return _decoder.plan(desc, mlp)
    H, qd, dr, R, QL = hp["num_heads"], hp["head_dim"], hp["rope_dim"], la["kv_lora_rank"], la["q_lora_rank"]
    nope, dv = qd - dr, la["v_head_dim"]

    def attention(i, src, dst):
        att, out = src + "self_attn.", []
        if QL:
            out += [direct(dst + "attn.wq_a", (QL, D), att + "q_a_proj.weight"),
                    direct(dst + "attn.q_a_norm", (QL,), att + "q_a_layernorm.weight"),
                    direct(dst + "attn.wq_b", (H * qd, QL), att + "q_b_proj.weight")]
            if hp["attention_bias"]:
                out.append(direct(dst + "attn.bq_a", (QL,), att + "q_a_proj.bias"))
        else:
            out.append(direct(dst + "attn.wq", (H * qd, D), att + "q_proj.weight"))
        out += [direct(dst + "attn.wkv_a", (R + dr, D), att + "kv_a_proj_with_mqa.weight"),
                direct(dst + "attn.kv_a_norm", (R,), att + "kv_a_layernorm.weight"),
                direct(dst + "attn.wkv_b", (H * (nope + dv), R), att + "kv_b_proj.weight"),
                direct(dst + "attn.wo", (D, H * dv), att + "o_proj.weight")]
        if hp["attention_bias"]:
            out += [direct(dst + "attn.bkv_a", (R + dr,), att + "kv_a_proj_with_mqa.bias"),
                    direct(dst + "attn.bo", (D,), att + "o_proj.bias")]
        return out

    return _decoder.plan(desc, mlp, attention)

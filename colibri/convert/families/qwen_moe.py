"""Qwen3-MoE, Qwen2-MoE (Qwen1.5-MoE) and OLMoE -> colibri.

All three: softmax over all experts, top-k, renormalised only when `norm_topk_prob`.
  qwen3_moe  per-head QK RMSNorm (weight [head_dim]) before RoPE; dense layers by
             decoder_sparse_step / mlp_only_layers; an optional window on every layer
  qwen2_moe  q/k/v biases; a shared expert scaled by sigmoid(shared_expert_gate . x); dense
             layers as qwen3; a window on the layers layer_types marks "sliding_attention"
  olmoe      QK RMSNorm over the whole projection, then the optional clamp of q, k, v
             (clip_qkv); every layer MoE; the expert FFN is `intermediate_size`
Checkpoint tensors: model.layers.{i}.mlp.gate.weight [E, D], mlp.experts.{e}.{gate,up,down}_proj
(or transformers 5's fused mlp.experts.gate_up_proj / down_proj), mlp.shared_expert.*,
mlp.shared_expert_gate.weight [1, D], dense layers mlp.{gate,up,down}_proj.
"""

from ..errors import ConvertError
from . import _config as c
from . import _decoder


def _mlp_layers(config, family, n_layers):
    """"moe" or "dense" per layer: MoE iff not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    if family == "olmoe":
        return ["moe"] * n_layers
    step = c.dim(config, "decoder_sparse_step", 1)
    only = config.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise ConvertError(f"config.json: `mlp_only_layers` = {only!r} is not a list of layer indices")
    return ["moe" if i not in only and (i + 1) % step == 0 else "dense" for i in range(n_layers)]


def _attention_layers(config, family, n_layers):
    """(sliding_window, "sliding"/"full" per layer) as each family's config resolves them."""
    if family == "olmoe" or not c.get(config, "use_sliding_window", False, kind=bool):
        return 0, None
    window = c.dim(config, "sliding_window")
    if family == "qwen3_moe":
        return window, None   # every layer
    types = config.get("layer_types")
    if types is None:
        limit = c.get(config, "max_window_layers", n_layers)
        types = ["sliding_attention" if i % 2 == 0 and i < limit else "full_attention" for i in range(n_layers)]
    if not c.names(types, n_layers, {"sliding_attention", "full_attention"}):
        raise c.unsupported(family, f"layer_types {types!r}")
    return window, ["sliding" if t == "sliding_attention" else "full" for t in types]


def describe(config, family):
    expert_ffn = c.dim(config, "intermediate_size" if family == "olmoe" else "moe_intermediate_size")
    hp = c.attention_hparams(config, family, expert_ffn)
    L, D = hp["num_layers"], hp["hidden_size"]
    n_experts, top_k = c.experts(config, ("num_experts", "num_local_experts"))
    if family == "olmoe" and hp["head_dim"] * hp["num_heads"] != D:
        raise c.unsupported(family, "head_dim != hidden_size / num_attention_heads (OLMoE's QK-norm spans hidden_size)")
    mlp = _mlp_layers(config, family, L)
    hp["sliding_window"], attention = _attention_layers(config, family, L)
    if attention is not None:
        hp["attention_layers"] = attention
    if "dense" in mlp:
        hp["mlp_layers"] = mlp
        hp["dense_intermediate_size"] = c.dim(config, "intermediate_size")
    if family == "qwen2_moe":
        hp["attention_bias"] = c.get(config, "qkv_bias", True, kind=bool)
    else:
        bias = c.get(config, "attention_bias", False, kind=bool)
        hp["attention_bias"] = hp["attention_out_bias"] = bias
        hp["qk_norm"] = "head" if family == "qwen3_moe" else "full"
    if family == "olmoe" and config.get("clip_qkv") is not None:
        clip = c.get(config, "clip_qkv", kind=float)
        if clip <= 0:
            raise ConvertError(f"config.json: clip_qkv = {clip} must be positive")
        hp["clip_qkv"] = float(clip)
    experts = {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"}
    if family == "qwen2_moe" and c.get(config, "shared_expert_intermediate_size", 0):
        experts["shared"] = {"intermediate_size": c.dim(config, "shared_expert_intermediate_size"), "gate": "sigmoid"}
    return {
        "architecture": family,
        "hparams": hp,
        "routing": {"type": "topk", "top_k": top_k, "score": "softmax",
                    "normalize": c.get(config, "norm_topk_prob", False, kind=bool)},
        "experts": experts,
    }


def plan(desc, ckpt):
    return _decoder.plan(desc, _decoder.moe_mlp(desc, ckpt, "mlp.shared_expert.", "mlp.shared_expert_gate.weight"))

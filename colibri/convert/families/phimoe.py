"""Phi-3.5-MoE (phimoe) -> colibri.

  norms    LayerNorm with weight and bias (input_layernorm, post_attention_layernorm, model.norm),
           eps rms_norm_eps
  router   the sparsemixer, always two experts: the best, weighted by a softmax over the experts
           within 2 * router_jitter_noise of it (relative); then the best of the rest, likewise;
           the weights are not renormalised
  RoPE     LongRoPE: each frequency divided by short_factor[j] (transformers uses the short
           factors at every length), cos and sin times short_mscale, or long_mscale at positions
           past original_max_position_embeddings
  biases   q/k/v/o (attention_bias) and lm_head (lm_head_bias); an optional window on every layer
Checkpoint: model.layers.{i}.block_sparse_moe.gate.weight [E, D], block_sparse_moe.experts.{e}.w1/w3/w2
(or transformers 5's fused mlp.experts.gate_up_proj / down_proj and mlp.router.weight).
"""

import math

import numpy as np

from ..errors import ConvertError
from ..layout import Entry, direct
from . import _config as c
from . import _decoder


def _longrope(config, family, head_dim):
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    if rope.get("rope_type", rope.get("type", "default")) != "longrope":
        return None, None
    factors = rope.get("short_factor")
    if not isinstance(factors, list) or len(factors) != head_dim // 2 or \
            not all(isinstance(f, (int, float)) and not isinstance(f, bool) and math.isfinite(f) for f in factors):
        raise ConvertError(f"config.json: rope short_factor must list {head_dim // 2} numbers")
    original = config.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings")
    scaling = {"type": "longrope",
               "original_max_position_embeddings": c.dim({"original_max_position_embeddings": original},
                                                         "original_max_position_embeddings"),
               "short_mscale": float(c.get(rope, "short_mscale", kind=float)),
               "long_mscale": float(c.get(rope, "long_mscale", kind=float))}
    return scaling, np.asarray(factors, dtype=np.float32)


def describe(config, family):
    config = {"rope_theta": 1e6, **config}
    plain = {**config, "rope_parameters": {**(config.get("rope_parameters") or {}), "rope_type": "default"},
             "rope_scaling": None}
    hp = c.attention_hparams(plain, family, c.dim(config, "intermediate_size"), eps_default=1e-5)
    scaling, _ = _longrope(config, family, hp["head_dim"])
    if scaling:
        hp["rope_scaling"] = scaling
    n_experts, _ = c.experts(config, ("num_local_experts",))
    bias = c.get(config, "attention_bias", False, kind=bool)
    hp.update(norm="layer", attention_bias=bias, attention_out_bias=bias,
              lm_head_bias=c.get(config, "lm_head_bias", False, kind=bool),
              sliding_window=c.get(config, "sliding_window", None) or 0)
    return {
        "architecture": family,
        "hparams": hp,
        "routing": {"type": "sparsemixer", "top_k": 2,
                    "jitter_eps": float(c.get(config, "router_jitter_noise", 0.01, kind=float))},
        "experts": {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"},
    }


def plan(desc, ckpt):
    hp, E = desc["hparams"], desc["experts"]["count"]
    D, F, V = hp["hidden_size"], hp["intermediate_size"], hp["vocab_size"]

    def mlp(i, src, dst):
        if src + "mlp.experts.gate_up_proj" in ckpt:
            return [direct(dst + "router", (E, D), src + "mlp.router.weight"),
                    *_decoder.routed_experts(ckpt, src + "mlp.experts.", dst, E, F, D)]
        moe = src + "block_sparse_moe."
        return [direct(dst + "router", (E, D), moe + "gate.weight"),
                *_decoder.routed_experts(ckpt, moe + "experts.", dst, E, F, D, names=("w1", "w3", "w2"))]

    entries = _decoder.plan(desc, mlp)
    for i in range(hp["num_layers"]):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        entries += [direct(dst + "attn_norm_bias", (D,), src + "input_layernorm.bias"),
                    direct(dst + "ffn_norm_bias", (D,), src + "post_attention_layernorm.bias")]
    entries.append(direct("norm_bias", (D,), "model.norm.bias"))
    if hp["lm_head_bias"]:
        entries.append(direct("lm_head_bias", (V,), "lm_head.bias"))
    _, factors = _longrope(ckpt.config, desc["architecture"], hp["head_dim"])
    if factors is not None:   # from config.json: each frequency's divisor, as a tensor
        entries.append(Entry("rope.factors", factors.shape, (), lambda arrays: factors))
    return entries

"""Granite-MoE and Granite-MoE-shared (granite-3.x 1b-a400m, 3b-a800m) -> colibri.

  router     top-k on the raw logits, then a softmax over the chosen k
  experts    fused: block_sparse_moe.input_linear.weight [E, 2F, D] (gate rows first, then up),
             output_linear.weight [E, D, F]; router block_sparse_moe.router.layer.weight [E, D]
  shared     granitemoeshared: shared_mlp.input_linear.weight [2S, D] (gate first),
             output_linear.weight [D, S], added to the routed sum unscaled
  multipliers  embeddings * embedding_multiplier; each block's output * residual_multiplier;
             q.k * attention_multiplier (instead of 1/sqrt(head_dim)); logits / logits_scaling
  attention_bias: biases on q, k, v and o
"""

from ..layout import dim0_slice, dim1_slice, direct
from . import _config as c
from . import _decoder


def describe(config, family):
    hp = c.attention_hparams(config, family, c.dim(config, "intermediate_size"))
    n_experts, top_k = c.experts(config, ("num_local_experts",))
    bias = c.get(config, "attention_bias", False, kind=bool)
    hp.update(attention_bias=bias, attention_out_bias=bias)
    for ours, theirs in (("embedding_multiplier", "embedding_multiplier"), ("residual_multiplier", "residual_multiplier"),
                         ("attention_scale", "attention_multiplier"), ("logits_divisor", "logits_scaling")):
        value = c.get(config, theirs, 1.0, kind=float)
        if value <= 0:
            raise c.unsupported(family, f"{theirs} = {value} (must be positive)")
        hp[ours] = float(value)
    experts = {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"}
    if family == "granitemoeshared" and c.get(config, "shared_intermediate_size", 0):
        experts["shared"] = {"intermediate_size": c.dim(config, "shared_intermediate_size"), "gate": "none"}
    return {
        "architecture": family,
        "hparams": hp,
        "routing": {"type": "topk", "top_k": top_k, "score": "logits", "weights": "softmax_of_selected",
                    "normalize": False},
        "experts": experts,
    }


def plan(desc, ckpt):
    hp, E = desc["hparams"], desc["experts"]["count"]
    D, F = hp["hidden_size"], hp["intermediate_size"]
    shared = desc["experts"].get("shared")

    def mlp(i, src, dst):
        moe = src + "block_sparse_moe."
        out = [direct(dst + "router", (E, D), moe + "router.layer.weight"),
               dim1_slice(dst + "experts.w1", (E, F, D), moe + "input_linear.weight", (E, 2 * F, D), 0),
               dim1_slice(dst + "experts.w3", (E, F, D), moe + "input_linear.weight", (E, 2 * F, D), F),
               direct(dst + "experts.w2", (E, D, F), moe + "output_linear.weight")]
        if shared:
            S = shared["intermediate_size"]
            out += [dim0_slice(dst + "shared.w1", (S, D), src + "shared_mlp.input_linear.weight", (2 * S, D), 0),
                    dim0_slice(dst + "shared.w3", (S, D), src + "shared_mlp.input_linear.weight", (2 * S, D), S),
                    direct(dst + "shared.w2", (D, S), src + "shared_mlp.output_linear.weight")]
        return out

    return _decoder.plan(desc, mlp)

"""ERNIE-4.5 MoE (ernie4_5_moe, ERNIE-4.5-21B-A3B) -> colibri.

  router   softmax; experts chosen on p + e_score_correction_bias (the bias only chooses);
           weights are the chosen p, renormalised (clamped below at moe_norm_min = 1e-12, which
           a sum of top-k probabilities never reaches: a plain renormalisation)
  layers   MoE where (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i <=
           moe_layer_end_index, else dense (intermediate_size); moe_num_shared_experts shared
           experts as one SwiGLU MLP of moe_intermediate_size * n, added unscaled
  RoPE     interleaved pairs (2j, 2j+1) over the whole head; embeddings tied by default
Checkpoint: mlp.gate.weight [E, D], mlp.moe_statics.e_score_correction_bias [1, E],
mlp.experts.{e}.{gate,up,down}_proj, mlp.shared_experts.*, dense mlp.{gate,up,down}_proj.
"""

from ..layout import reshaped
from . import _config as c
from . import _decoder


def describe(config, family):
    config = {"rope_theta": 5e5, "tie_word_embeddings": True, **config}   # ERNIE's defaults
    if c.get(config, "use_bias", False, kind=bool):
        raise c.unsupported(family, "use_bias (biases on the MLPs and lm_head)")
    hp = c.attention_hparams(config, family, c.dim(config, "moe_intermediate_size"), eps_default=1e-5)
    L = hp["num_layers"]
    n_experts, top_k = c.experts(config, ("moe_num_experts",), top_k_key="moe_k")
    start, interval = c.get(config, "moe_layer_start_index", 1), c.dim(config, "moe_layer_interval", 1)
    end = c.get(config, "moe_layer_end_index", -1)
    end = L - 1 if end == -1 else end
    kinds = ["moe" if (i + 1) % interval == 0 and start <= i <= end else "dense" for i in range(L)]
    if "dense" in kinds:
        hp["mlp_layers"] = kinds
        hp["dense_intermediate_size"] = c.dim(config, "intermediate_size")
    hp["rope_interleaved"] = True
    experts = {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"}
    n_shared = c.get(config, "moe_num_shared_experts", 0) or 0
    if n_shared:
        experts["shared"] = {"intermediate_size": hp["intermediate_size"] * n_shared, "gate": "none"}
    return {
        "architecture": family,
        "hparams": hp,
        "routing": {"type": "topk", "top_k": top_k, "score": "softmax", "selection_bias": True, "normalize": True},
        "experts": experts,
    }


def plan(desc, ckpt):
    def selection_bias(src, dst, E):
        return reshaped(dst + "router.selection_bias", (E,), src + "mlp.moe_statics.e_score_correction_bias", (1, E))

    return _decoder.plan(desc, _decoder.moe_mlp(desc, ckpt, selection_bias=selection_bias))

"""Mixtral (and Mixtral-shaped MoE checkpoints) -> colibri architecture "mixtral".

Two source layouts of the expert weights are accepted, per layer:
  hub style (what save_pretrained writes, and the Mixtral checkpoints on the hub):
    model.layers.{i}.block_sparse_moe.gate.weight           [E, D]
    model.layers.{i}.block_sparse_moe.experts.{j}.w1.weight [F, D]  gate   (w3: up, same shape)
    model.layers.{i}.block_sparse_moe.experts.{j}.w2.weight [D, F]  down
  fused (transformers 5 module names, e.g. a state_dict saved directly):
    model.layers.{i}.mlp.gate.weight                        [E, D]
    model.layers.{i}.mlp.experts.gate_up_proj               [E, 2F, D]  gate = rows :F, up = rows F:
    model.layers.{i}.mlp.experts.down_proj                  [E, D, F]
"""

from ..layout import direct
from . import _config as c
from . import _decoder


def describe(config, family="mixtral"):
    config = {"rope_theta": 1e6, "bos_token_id": 1, "eos_token_id": 2, **config}   # Mixtral's defaults
    hp = c.attention_hparams(config, family, c.dim(config, "intermediate_size"), eps_default=1e-5,
                             activations=tuple(c.ACTIVATIONS))
    hp["sliding_window"] = c.get(config, "sliding_window", None) or 0
    n_experts, top_k = c.experts(config, ("num_local_experts",))
    return {
        "architecture": "mixtral",
        "hparams": hp,
        "routing": {"type": "topk_softmax", "top_k": top_k, "normalize": True},
        "experts": {"count": n_experts, "weight_layout": "stacked", "quantization": "none",
                    "activation": c.ACTIVATIONS[config.get("hidden_act", "silu")]},
    }


def plan(desc, ckpt):
    hp, E = desc["hparams"], desc["experts"]["count"]
    D, F = hp["hidden_size"], hp["intermediate_size"]

    def mlp(i, src, dst):
        if src + "mlp.experts.gate_up_proj" in ckpt:
            return [direct(dst + "router", (E, D), src + "mlp.gate.weight"),
                    *_decoder.routed_experts(ckpt, src + "mlp.experts.", dst, E, F, D)]
        moe = src + "block_sparse_moe."
        return [direct(dst + "router", (E, D), moe + "gate.weight"),
                *_decoder.routed_experts(ckpt, moe + "experts.", dst, E, F, D, names=("w1", "w3", "w2"))]

    return _decoder.plan(desc, mlp)

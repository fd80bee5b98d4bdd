"""gpt-oss -> colibri.

  attention  q/k/v/o biases; one learned sink logit per head joins each softmax
             (self_attn.sinks [heads]); layer_types alternate sliding and full windows;
             YaRN RoPE (rotate half)
  router     mlp.router.weight [E, D] with its bias; top-k on the logits, softmax over the k
  experts    clamped SwiGLU with biases: gate = min(x W1 + b1, limit), up = clamp(x W3 + b3,
             +-limit), y = ((up + 1) * gate * sigmoid(alpha * gate)) W2 + b2.  The checkpoint's
             mlp.experts.gate_up_proj is [E, D, 2F] with gate and up in alternate columns,
             down_proj [E, F, D]: both transposed here to colibri's [E, out, in]
The hub's gpt-oss-20b stores its experts as MXFP4 blocks (gate_up_proj_blocks/_scales): colibri
reads float checkpoints only, so those are refused until quantized formats exist.
"""

from ..layout import Entry, direct
from . import _config as c
from . import _decoder


def _alternate(name, shape, source, source_shape, which, transpose):
    """Columns `which`, which + 2, ... of the last axis (gate 0, up 1), optionally [E, a, b] -> [E, b, a]."""
    def build(arrays):
        picked = arrays[0][..., which::2]
        return picked.transpose(0, 2, 1) if transpose else picked
    return Entry(name, tuple(shape), ((source, tuple(source_shape)),), build)


def _transposed(name, shape, source, source_shape):
    return Entry(name, tuple(shape), ((source, tuple(source_shape)),), lambda arrays: arrays[0].transpose(0, 2, 1))


def describe(config, family):
    config = {"rope_theta": 150000.0, "attention_bias": True, **config}
    hp = c.attention_hparams(config, family, c.dim(config, "intermediate_size"), eps_default=1e-5,
                             rope_types=("default", "yarn"), activations=(config.get("hidden_act"),))
    L = hp["num_layers"]
    n_experts, top_k = c.experts(config, ("num_local_experts",))
    if not c.get(config, "attention_bias", True, kind=bool):
        raise c.unsupported(family, "attention_bias false")
    hp.update(attention_bias=True, attention_out_bias=True, attention_sinks=True)
    window = c.get(config, "sliding_window", None)
    if window:
        types = config.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(L)]
        if not c.names(types, L, {"sliding_attention", "full_attention"}):
            raise c.unsupported(family, f"layer_types {types!r}")
        hp["sliding_window"] = c.dim(config, "sliding_window")
        hp["attention_layers"] = ["sliding" if t == "sliding_attention" else "full" for t in types]
    return {
        "architecture": family,
        "hparams": hp,
        "routing": {"type": "topk", "top_k": top_k, "score": "logits", "weights": "softmax_of_selected",
                    "normalize": False, "logit_bias": True},
        "experts": {"count": n_experts, "weight_layout": "stacked", "quantization": "none",
                    "activation": "swiglu_clamped", "bias": True,
                    "swiglu_limit": float(c.get(config, "swiglu_limit", 7.0, kind=float)),
                    "swiglu_alpha": float(c.get(config, "swiglu_alpha", 1.702, kind=float))},
    }


def plan(desc, ckpt):
    hp, E = desc["hparams"], desc["experts"]["count"]
    D, F, H = hp["hidden_size"], hp["intermediate_size"], hp["num_heads"]
    if "model.layers.0.mlp.experts.gate_up_proj_blocks" in ckpt:
        raise c.unsupported("gpt_oss", "MXFP4 expert weights (gate_up_proj_blocks): dequantize to bf16 first")

    def mlp(i, src, dst):
        ex = src + "mlp.experts."
        return [direct(dst + "attn.sinks", (H,), src + "self_attn.sinks"),
                direct(dst + "router", (E, D), src + "mlp.router.weight"),
                direct(dst + "router.bias", (E,), src + "mlp.router.bias"),
                _alternate(dst + "experts.w1", (E, F, D), ex + "gate_up_proj", (E, D, 2 * F), 0, True),
                _alternate(dst + "experts.w3", (E, F, D), ex + "gate_up_proj", (E, D, 2 * F), 1, True),
                _transposed(dst + "experts.w2", (E, D, F), ex + "down_proj", (E, F, D)),
                _alternate(dst + "experts.b1", (E, F), ex + "gate_up_proj_bias", (E, 2 * F), 0, False),
                _alternate(dst + "experts.b3", (E, F), ex + "gate_up_proj_bias", (E, 2 * F), 1, False),
                direct(dst + "experts.b2", (E, D), ex + "down_proj_bias")]

    return _decoder.plan(desc, mlp)

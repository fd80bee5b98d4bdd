"""Llama 4 text models (llama4_text; Llama-4-Scout's language model) -> colibri.

  router     top-k on the raw logits; the chosen experts' weights are sigmoid(logit), applied to
             the expert's INPUT (x * w), not renormalised; a shared expert always added
  layers     MoE at moe_layers (else dense, intermediate_size_mlp); RoPE (interleaved pairs, Llama 3
             frequency scaling) on the layers no_rope_layers marks 1, which also attend within
             chunks of attention_chunk_size and RMS-normalise q and k per head (no weight); the
             NoPE layers attend to everything and scale q by 1 + attn_scale *
             log(1 + floor((pos + 1) / floor_scale))
Checkpoint: model.layers.{i}.feed_forward.router.weight [E, D], feed_forward.experts.gate_up_proj
[E, D, 2F] (gate columns first; transposed here), down_proj [E, F, D], feed_forward.shared_expert.*,
dense feed_forward.{gate,up,down}_proj.  The hub's multimodal checkpoints prefix the text model
with language_model.: convert the text model saved on its own.
"""

from ..errors import ConvertError
from ..layout import Entry, direct
from . import _config as c
from . import _decoder


def _columns(name, shape, source, source_shape, start, stop):
    """Columns start:stop of a [E, in, out] source, as [E, out, in]."""
    return Entry(name, tuple(shape), ((source, tuple(source_shape)),),
                 lambda arrays: arrays[0][:, :, start:stop].transpose(0, 2, 1))


def _rope(config, family):
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise c.unsupported(family, f"rope_type {kind!r}")
    return {"type": "llama3", "factor": float(c.get(rope, "factor", kind=float)),
            "original_max_position_embeddings": c.dim(rope, "original_max_position_embeddings"),
            "low_freq_factor": float(c.get(rope, "low_freq_factor", kind=float)),
            "high_freq_factor": float(c.get(rope, "high_freq_factor", kind=float))}


def _layer_list(config, key, n_layers, allowed):
    value = config.get(key)
    if not isinstance(value, list) or len(value) != n_layers or \
            not all(isinstance(v, (int, str)) and v in allowed for v in value):
        raise c.unsupported("llama4_text", f"{key} {value!r} (expected {n_layers} of {sorted(allowed)})")
    return value


def describe(config, family):
    config = {"rope_theta": 5e5, **config}
    plain = {**config, "rope_parameters": {"rope_type": "default",
                                           "rope_theta": (config.get("rope_parameters") or {}).get("rope_theta",
                                                                                                  config["rope_theta"])},
             "rope_scaling": None}
    hp = c.attention_hparams(plain, family, c.dim(config, "intermediate_size"), eps_default=1e-5)
    L = hp["num_layers"]
    n_experts, top_k = c.experts(config, ("num_local_experts",))
    scaling = _rope(config, family)
    if scaling:
        hp["rope_scaling"] = scaling
    moe_layers = config.get("moe_layers")
    if moe_layers is None:
        step = c.dim(config, "interleave_moe_layer_step", 1)
        moe_layers = list(range(step - 1, L, step))
    if not isinstance(moe_layers, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in moe_layers):
        raise ConvertError(f"config.json: `moe_layers` = {moe_layers!r:.60} is not a list of layer indices")
    rope_layers = _layer_list(config, "no_rope_layers", L, {0, 1})
    types = _layer_list(config, "layer_types", L, {"full_attention", "chunked_attention"})
    hp.update(rope_interleaved=True, position_layers=["rope" if r else "nope" for r in rope_layers],
              attention_layers=["chunked" if t == "chunked_attention" else "full" for t in types])
    if "chunked_attention" in types:
        hp["attention_chunk"] = c.dim(config, "attention_chunk_size")
    kinds = ["moe" if i in moe_layers else "dense" for i in range(L)]
    if "dense" in kinds:
        hp.update(mlp_layers=kinds, dense_intermediate_size=c.dim(config, "intermediate_size_mlp"))
    if c.get(config, "use_qk_norm", True, kind=bool):
        hp["qk_norm"] = "head_plain"
    if config.get("attn_temperature_tuning", True):   # old hub configs say 4: any true value turns it on
        hp["nope_temperature"] = {"floor_scale": float(c.get(config, "floor_scale", 8192, kind=float)),
                                  "attn_scale": float(c.get(config, "attn_scale", 0.1, kind=float))}
    bias = c.get(config, "attention_bias", False, kind=bool)
    hp.update(attention_bias=bias, attention_out_bias=bias)
    return {
        "architecture": family,
        "hparams": hp,
        "routing": {"type": "topk", "top_k": top_k, "score": "logits", "weights": "sigmoid_of_selected",
                    "normalize": False, "gate_on_input": True},
        "experts": {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu",
                    "shared": {"intermediate_size": hp["intermediate_size"], "gate": "none"}},
    }


def plan(desc, ckpt):
    hp, E = desc["hparams"], desc["experts"]["count"]
    D, F = hp["hidden_size"], hp["intermediate_size"]
    kinds = hp.get("mlp_layers", ["moe"] * hp["num_layers"])

    def mlp(i, src, dst):
        ff = src + "feed_forward."
        if kinds[i] == "dense":
            return _decoder.gated_mlp(dst + "mlp.", ff, hp["dense_intermediate_size"], D)
        ex = ff + "experts."
        return [direct(dst + "router", (E, D), ff + "router.weight"),
                _columns(dst + "experts.w1", (E, F, D), ex + "gate_up_proj", (E, D, 2 * F), 0, F),
                _columns(dst + "experts.w3", (E, F, D), ex + "gate_up_proj", (E, D, 2 * F), F, 2 * F),
                _columns(dst + "experts.w2", (E, D, F), ex + "down_proj", (E, F, D), 0, D),
                *_decoder.gated_mlp(dst + "shared.", ff + "shared_expert.", F, D)]

    return _decoder.plan(desc, mlp)

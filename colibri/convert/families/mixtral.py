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

from ..errors import ConvertError
from ..layout import dim1_slice, direct, stacked

_MISSING = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false"}


def _get(config, key, default=_MISSING, kind=int):
    """config[key] checked to be of `kind` (float accepts integers too). An optional key that is
    absent or null gives `default`."""
    value = config.get(key, default)
    if value is None and default is not _MISSING:
        return default
    if value is _MISSING or value is None:
        raise ConvertError(f"config.json: `{key}` missing")
    ok = isinstance(value, bool) if kind is bool else (
        isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool))
    if not ok:
        raise ConvertError(f"config.json: `{key}` = {value!r} is not {_KINDS[kind]}")
    return value


def _dim(config, key, default=_MISSING):
    value = _get(config, key, default)
    if value is not None and value < 1:
        raise ConvertError(f"config.json: `{key}` = {value} must be at least 1")
    return value


def _rope_theta(config):
    """v5 configs nest it in rope_parameters; older ones have top-level rope_theta."""
    rope = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", scaling.get("rope_type", scaling.get("type", "default")))
    if rope_type != "default":
        raise ConvertError(f"config.json: rope_type {rope_type!r} is not supported (only plain RoPE)")
    theta = _get(rope if "rope_theta" in rope else config, "rope_theta", 1e6, kind=float)
    if theta <= 0:
        raise ConvertError(f"config.json: rope_theta = {theta!r} is not a positive number")
    return float(theta)


def _token_id(config, key, default):
    value = config.get(key, default)
    if isinstance(value, list):  # several eos ids: colibri stores one, the first
        value = value[0] if value else None
    return -1 if value is None else _get({key: value}, key)


def describe(config):
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise ConvertError(f"config.json: hidden_act {act!r} is not supported (colibri's experts use silu)")
    hidden = _dim(config, "hidden_size")
    heads = _dim(config, "num_attention_heads")
    kv_heads = _dim(config, "num_key_value_heads", heads)
    head_dim = _dim(config, "head_dim", None) or hidden // heads
    n_experts = _dim(config, "num_local_experts")
    top_k = _dim(config, "num_experts_per_tok")
    if heads % kv_heads:
        raise ConvertError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if head_dim % 2:
        raise ConvertError(f"config.json: head_dim {head_dim} is odd; RoPE needs it even")
    if not 1 <= top_k <= n_experts:
        raise ConvertError(f"config.json: num_experts_per_tok {top_k} not in [1, num_local_experts={n_experts}]")
    hparams = {
        "vocab_size": _dim(config, "vocab_size"),
        "hidden_size": hidden,
        "intermediate_size": _dim(config, "intermediate_size"),
        "num_layers": _dim(config, "num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": _dim(config, "max_position_embeddings", 4096 * 32),
        "rope_theta": _rope_theta(config),
        "rms_norm_eps": float(_get(config, "rms_norm_eps", 1e-5, kind=float)),
        "sliding_window": _get(config, "sliding_window", None) or 0,
        "tie_word_embeddings": _get(config, "tie_word_embeddings", False, kind=bool),
        "bos_token_id": _token_id(config, "bos_token_id", 1),
        "eos_token_id": _token_id(config, "eos_token_id", 2),
    }
    return {
        "architecture": "mixtral",
        "hparams": hparams,
        "routing": {"type": "topk_softmax", "top_k": top_k, "normalize": True},
        "experts": {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"},
    }


def plan(desc, ckpt):
    """The colibri tensors in file order, each with the source tensors it is made of."""
    hp, E = desc["hparams"], desc["experts"]["count"]
    V, D, F = hp["vocab_size"], hp["hidden_size"], hp["intermediate_size"]
    q_dim, kv_dim = hp["num_heads"] * hp["head_dim"], hp["num_kv_heads"] * hp["head_dim"]
    entries = [direct("tok_embeddings", (V, D), "model.embed_tokens.weight")]
    for i in range(hp["num_layers"]):
        src, dst = f"model.layers.{i}.", f"layers.{i}."
        entries += [
            direct(dst + "attn_norm", (D,), src + "input_layernorm.weight"),
            direct(dst + "attn.wq", (q_dim, D), src + "self_attn.q_proj.weight"),
            direct(dst + "attn.wk", (kv_dim, D), src + "self_attn.k_proj.weight"),
            direct(dst + "attn.wv", (kv_dim, D), src + "self_attn.v_proj.weight"),
            direct(dst + "attn.wo", (D, q_dim), src + "self_attn.o_proj.weight"),
            direct(dst + "ffn_norm", (D,), src + "post_attention_layernorm.weight"),
        ]
        if src + "mlp.experts.gate_up_proj" in ckpt:
            fused = src + "mlp.experts."
            entries += [
                direct(dst + "router", (E, D), src + "mlp.gate.weight"),
                dim1_slice(dst + "experts.w1", (E, F, D), fused + "gate_up_proj", (E, 2 * F, D), 0),
                dim1_slice(dst + "experts.w3", (E, F, D), fused + "gate_up_proj", (E, 2 * F, D), F),
                direct(dst + "experts.w2", (E, D, F), fused + "down_proj"),
            ]
        else:
            moe = src + "block_sparse_moe."
            experts = [f"{moe}experts.{j}." for j in range(E)]
            entries += [
                direct(dst + "router", (E, D), moe + "gate.weight"),
                stacked(dst + "experts.w1", (E, F, D), [e + "w1.weight" for e in experts]),
                stacked(dst + "experts.w3", (E, F, D), [e + "w3.weight" for e in experts]),
                stacked(dst + "experts.w2", (E, D, F), [e + "w2.weight" for e in experts]),
            ]
    entries.append(direct("norm", (D,), "model.norm.weight"))
    if not hp["tie_word_embeddings"]:
        entries.append(direct("lm_head", (V, D), "lm_head.weight"))
    return entries

"""The ranges colibri's loader accepts for a model's hyper-parameters (c_core/src/model/schema.c),
checked on the description before a plan is built or a byte written: what the core would refuse to
load is refused here, by name, instead of after weights.bin is written.
tests/test_convert_limits.py reads the ranges back from schema.c, so the two cannot drift apart."""

import numpy as np

from .errors import ConvertError

# schema.c's MAX_*: far above any released MoE, low enough that sizes never overflow
MAX_VOCAB, MAX_HIDDEN, MAX_FFN, MAX_LAYERS = 1 << 24, 1 << 16, 1 << 20, 1024
MAX_HEADS, MAX_HEAD_DIM, MAX_EXPERTS, MAX_TOP_K, MAX_POSITIONS = 1024, 1024, 4096, 64, 1 << 24

INTEGERS = {   # field -> (lo, hi): lo <= value <= hi
    "hparams.vocab_size": (1, MAX_VOCAB),
    "hparams.hidden_size": (1, MAX_HIDDEN),
    "hparams.intermediate_size": (1, MAX_FFN),
    "hparams.num_layers": (1, MAX_LAYERS),
    "hparams.num_heads": (1, MAX_HEADS),
    "hparams.num_kv_heads": (1, MAX_HEADS),
    "hparams.head_dim": (2, MAX_HEAD_DIM),
    "hparams.max_position_embeddings": (1, MAX_POSITIONS),
    "hparams.sliding_window": (0, MAX_POSITIONS),
    "hparams.dense_intermediate_size": (1, MAX_FFN),
    "hparams.attention_chunk": (1, MAX_POSITIONS),
    "hparams.conv_kernel": (1, 64),
    "hparams.latent_attention.q_lora_rank": (0, MAX_FFN),
    "hparams.latent_attention.kv_lora_rank": (1, MAX_FFN),
    "hparams.latent_attention.v_head_dim": (1, MAX_HEAD_DIM),
    "hparams.rope_scaling.original_max_position_embeddings": (1, MAX_POSITIONS),
    "experts.count": (1, MAX_EXPERTS),
    "experts.shared.intermediate_size": (1, MAX_FFN),
    "routing.top_k": (1, MAX_TOP_K),
    "routing.groups": (1, MAX_EXPERTS),
}
NUMBERS = {   # field -> (lo, hi): lo < value <= hi, and a normal float32 (1e-50 would be stored as 0)
    "hparams.rope_theta": (0.0, 1e12),
    "hparams.rms_norm_eps": (0.0, 1.0),
    "hparams.clip_qkv": (0.0, 1e30),
    **dict.fromkeys(("hparams.attention_scale", "hparams.embedding_multiplier", "hparams.residual_multiplier",
                     "hparams.logits_divisor", "hparams.nope_temperature.attn_scale",
                     "hparams.rope_scaling.attention_factor", "hparams.rope_scaling.factor",
                     "hparams.rope_scaling.beta_fast", "hparams.rope_scaling.beta_slow",
                     "hparams.rope_scaling.low_freq_factor", "hparams.rope_scaling.high_freq_factor",
                     "hparams.rope_scaling.short_mscale", "hparams.rope_scaling.long_mscale",
                     "experts.swiglu_limit", "experts.swiglu_alpha", "routing.scale", "routing.jitter_eps",
                     "routing.capacity_factor"), (0.0, 1e6)),
    "hparams.nope_temperature.floor_scale": (0.0, 1e12),
    "hparams.latent_attention.norm_eps": (0.0, 1.0),
    "routing.normalize_eps": (-1.0, 1.0),
}
FLT_MIN = float(np.finfo(np.float32).tiny)


def limit_error(field, value, source=None):
    """The ConvertError for `value` of colibri field `field` outside INTEGERS' range; `source` names
    where it came from (a config.json key) when that is not the field itself."""
    lo, hi = INTEGERS[field]
    where = f"config.json: `{source}`" if source else f"`{field}`"
    also = f" (colibri's {field})" if source else ""
    return ConvertError(f"{where} = {value} is outside [{lo}, {hi}], the range colibri's loader accepts{also}")


def _field(desc, field):
    node = desc
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _largest_rope_angle(hp):
    """(max_position_embeddings * the fastest RoPE frequency, "rope_scaling.factor" when the factor
    is what passes 2^31, else None), in float32 parameters as schema.c reckons it."""
    angle = float(hp["max_position_embeddings"])
    theta = float(np.float32(hp["rope_theta"]))
    if theta < 1.0:
        angle /= theta
    if angle > 2.0 ** 31:
        return angle, None
    scaling = hp.get("rope_scaling") or {}
    if scaling.get("type") in ("yarn", "llama3") and "factor" in scaling:
        factor = float(np.float32(scaling["factor"]))
        if factor < 1.0 and angle / factor > 2.0 ** 31:
            return angle / factor, "rope_scaling.factor"
    return angle, None


def check(desc):
    """Raise a ConvertError naming the first field of the description (architecture, hparams,
    routing, experts) outside the range the core loads, or that is not a finite number."""
    for field, (lo, hi) in INTEGERS.items():
        value = _field(desc, field)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConvertError(f"`{field}` = {value!r} is not an integer")
        if not lo <= value <= hi:
            raise limit_error(field, value)
    for field, (lo, hi) in NUMBERS.items():
        value = _field(desc, field)
        if value is None:
            continue
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo < value <= hi \
            and float(np.float32(value)) >= FLT_MIN   # NaN and infinities fail lo < value <= hi
        if not ok:
            raise ConvertError(f"`{field}` = {value!r} is outside ({lo:g}, {hi:g}], the range colibri's loader "
                               f"accepts (a finite number, at least {FLT_MIN:.6g})")
    hp = desc["hparams"]
    if hp["num_heads"] * hp["head_dim"] > MAX_FFN:
        raise ConvertError(f"`hparams.num_heads` * `head_dim` = {hp['num_heads'] * hp['head_dim']} exceeds {MAX_FFN}, "
                           f"the most colibri's loader accepts")
    angle, scaling = _largest_rope_angle(hp)
    if angle > 2.0 ** 31:
        raise ConvertError(f"`hparams.{scaling or 'rope_theta'}` = {_field(desc, 'hparams.' + (scaling or 'rope_theta'))} "
                           f"turns RoPE angles past 2^31 within max_position_embeddings = "
                           f"{hp['max_position_embeddings']} (colibri's loader needs max_position_embeddings * "
                           f"max(1, 1/rope_theta) * max(1, 1/factor) <= 2^31)")
    if desc["routing"]["top_k"] > desc["experts"]["count"]:
        raise ConvertError(f"`routing.top_k` = {desc['routing']['top_k']} exceeds `experts.count` = "
                           f"{desc['experts']['count']}")
    return desc

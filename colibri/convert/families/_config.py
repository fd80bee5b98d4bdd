"""Reading a Hugging Face config.json: typed fields, and what every family's description shares."""
import math
import sys

from ..errors import ConvertError
from ..limits import integer_range, limit_error

MISSING = object()
_KINDS = {int: "an integer", float: "a number", bool: "true or false"}


def get(config, key, default=MISSING, kind=int):
    """config[key] checked to be of `kind` (float accepts integers too). An optional key that is
    absent or null gives `default`. A float must be finite (json reads NaN and Infinity)."""
    value = config.get(key, default)
    if value is None and default is not MISSING:
        return default
    if value is MISSING or value is None:
        raise ConvertError(f"config.json: `{key}` missing")
    ok = isinstance(value, bool) if kind is bool else (
        isinstance(value, (int, float) if kind is float else kind) and not isinstance(value, bool))
    if not ok:
        raise ConvertError(f"config.json: `{key}` = {value!r} is not {_KINDS[kind]}")
    if kind is float and not -math.inf < value < math.inf:
        raise ConvertError(f"config.json: `{key}` = {value!r} is not a finite number")
    return value


def dim(config, key, default=MISSING, limit=None):
    """A size: an integer >= 1 and, with `limit` (an integer field of the core's schema), within the
    range the core loads, checked before anything is sized by it."""
    value = get(config, key, default)
    if value is not None and value < 1:
        raise ConvertError(f"config.json: `{key}` = {value} must be at least 1")
    if value is not None and limit and not integer_range(limit)[0] <= value <= integer_range(limit)[1]:
        raise limit_error(limit, value, key)
    return value


def names(value, n, allowed):
    """Whether `value` is a list of `n` strings, each one of `allowed` (a per-layer list of kinds)."""
    return isinstance(value, list) and len(value) == n and all(isinstance(v, str) and v in allowed for v in value)


def unsupported(family, feature):
    return ConvertError(f"unsupported: {feature} in {family}")


def _yarn_mscale(scale, mscale=1.0):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def rope(config, family, rope_types=("default",)):
    """{"rope_theta": ..., and for YaRN "rope_scaling": {...}}.  v5 configs nest everything in
    rope_parameters; older ones have a top-level rope_theta and rope_scaling.  YaRN's attention
    factor is computed here as transformers computes it (in Python floats, from mscale and
    mscale_all_dim); its frequencies are the core's to compute."""
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in rope_types:
        raise unsupported(family, f"rope_type {rope_type!r}")
    theta = get(rope if "rope_theta" in rope else config, "rope_theta", 1e4, kind=float)
    if theta <= 0:
        raise ConvertError(f"config.json: rope_theta = {theta!r} is not a positive number")
    out = {"rope_theta": float(theta)}
    if rope_type == "yarn":
        original = config.get("original_max_position_embeddings") or rope.get("original_max_position_embeddings") \
            or config.get("max_position_embeddings")
        original = dim({"original_max_position_embeddings": original}, "original_max_position_embeddings")
        factor = rope.get("factor") or dim(config, "max_position_embeddings") / original
        factor = float(get({"factor": factor}, "factor", kind=float))
        attention_factor = get(rope, "attention_factor", None, kind=float)
        if attention_factor is None:
            mscale, mscale_all_dim = get(rope, "mscale", None, kind=float), get(rope, "mscale_all_dim", None, kind=float)
            attention_factor = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
                                if mscale and mscale_all_dim else _yarn_mscale(factor))
        out["rope_scaling"] = {"type": "yarn", "factor": factor, "original_max_position_embeddings": original,
                               "beta_fast": float(get(rope, "beta_fast", 32.0, kind=float) or 32.0),
                               "beta_slow": float(get(rope, "beta_slow", 1.0, kind=float) or 1.0),
                               "truncate": bool(rope.get("truncate", True)),
                               "attention_factor": float(attention_factor)}
    return out


def token_id(config, key, default, vocab):
    ids = token_ids(config, key, default, vocab)
    return ids[0] if ids else -1


def token_ids(config, key, default, vocab):
    """The ids `key` holds (an int or a list of them, as config.json's and generation_config.json's
    eos_token_id), each once, in order; ids outside the vocabulary mean none."""
    value = config.get(key, default)
    values = value if isinstance(value, list) else [value]
    ids = [get({key: v}, key) for v in values if v is not None]
    return list(dict.fromkeys(i for i in ids if 0 <= i < vocab))


def end_ids(config, vocab):
    """hparams.eos_token_ids when a model has several ends (eos, end of turn, ...): absent for one,
    at most the loader's limit (the first ones, said on stderr)."""
    import colibri

    ids, most = token_ids(config, "eos_token_id", None, vocab), colibri.core().MAX_EOS_TOKENS
    if len(ids) > most:
        print(f"colibri convert: {len(ids)} end-of-sequence ids {ids}; colibri keeps the first {most}", file=sys.stderr)
    return {"eos_token_ids": ids[:most]} if len(ids) > 1 else {}


def attention_hparams(config, family, expert_ffn, rope_default=1e4, eps_default=1e-6, rope_types=("default",),
                      activations=("silu",)):
    """hparams every decoder family shares, in docs/FORMAT.md's order: sizes (`expert_ffn` is
    the routed experts' FFN), attention shape, RoPE, norms, token ids."""
    act = config.get("hidden_act", "silu")
    if act not in activations:
        raise unsupported(family, f"hidden_act {act!r}")
    hidden = dim(config, "hidden_size", limit="hparams.hidden_size")
    heads = dim(config, "num_attention_heads", limit="hparams.num_heads")
    kv_heads = dim(config, "num_key_value_heads", heads, limit="hparams.num_kv_heads")
    head_dim = dim(config, "head_dim", None, limit="hparams.head_dim") or hidden // heads
    vocab = dim(config, "vocab_size", limit="hparams.vocab_size")
    if heads % kv_heads:
        raise ConvertError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if head_dim % 2:
        raise ConvertError(f"config.json: head_dim {head_dim} is odd; RoPE needs it even")
    config = dict(config)
    if "rope_theta" not in (config.get("rope_parameters") or {}) and "rope_theta" not in config:
        config["rope_theta"] = rope_default
    positional = rope(config, family, rope_types)
    hp = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": expert_ffn,
        "num_layers": dim(config, "num_hidden_layers", limit="hparams.num_layers"),   # before any per-layer list
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": dim(config, "max_position_embeddings", 4096 * 32,
                                       limit="hparams.max_position_embeddings"),
        "rope_theta": positional["rope_theta"],
        "rms_norm_eps": float(get(config, "rms_norm_eps", eps_default, kind=float)),
        "sliding_window": 0,
        "tie_word_embeddings": get(config, "tie_word_embeddings", False, kind=bool),
        "bos_token_id": token_id(config, "bos_token_id", None, vocab),
        "eos_token_id": token_id(config, "eos_token_id", None, vocab),
        **end_ids(config, vocab),
    }
    if "rope_scaling" in positional:
        hp["rope_scaling"] = positional["rope_scaling"]
    return hp


ACTIVATIONS = {"silu": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
               "relu": "relu"}   # transformers' hidden_act -> colibri's gated-MLP activation


def experts(config, count_keys, top_k_key="num_experts_per_tok"):
    """(n_experts, top_k) from the first of `count_keys` present."""
    key = next((k for k in count_keys if config.get(k) is not None), count_keys[0])
    n_experts, top_k = dim(config, key, limit="experts.count"), dim(config, top_k_key, limit="routing.top_k")
    if not 1 <= top_k <= n_experts:
        raise ConvertError(f"config.json: {top_k_key} {top_k} not in [1, {key}={n_experts}]")
    return n_experts, top_k

"""The MoE architectures llama.cpp writes as GGUF, beyond `llama` and `qwen3moe`: each GGUF's
metadata read back into the Hugging Face config its family module (families/) describes, so a GGUF
model and the checkpoint it came from get the same colibri description; then what llama.cpp's
format fixes differently (its router, its RoPE layout) set on top, and the tensor names mapped.

Every `<arch>.` key is either read or listed here as not changing the maths; every tensor maps
onto the colibri tensor the family's plan expects, with its shape; anything else is refused by
name (`unsupported: <key or tensor> in gguf <arch>`), never run as a different model.  Each value
read is checked for its type and range where it is read (KEYS, Meta; gguf_import's `llama` and
`qwen3moe` read through Meta too), so that a wrong one is named there, not met as a traceback later.

What llama.cpp's converter leaves out of the file is what llama.cpp itself assumes (its
src/models/<arch>.cpp), so it is assumed here too:
  qwen2moe, olmoe  every layer MoE, no window, top-k never renormalised
  granitemoe  q and k rows reordered for RoPE on adjacent pairs (as Mixtral's)
  phimoe    the sparsemixer with Phi-3.5-MoE's jitter 0.01; LongRoPE with the short factors and
            rope.scaling.attn_factor, up to original_context_length (llama.cpp takes the long
            factors for longer contexts, at every position: the model's context stops there)
  deepseek2, glm4moe, dots1  llama.cpp's router: softmax or sigmoid (expert_gating_func),
            groups ranked by the sum of their best two, renormalised when expert_weights_norm
  deepseek2  kv_b as llama.cpp splits it (k_b transposed, v_b) is joined back (float types only);
            YaRN's cos/sin factor rope.scaling.attn_factor, the softmax scale
            (1 + yarn_log_multiplier ln factor)^2 / sqrt(head_dim)
  llama4    Scout's constants: chunks of 8192 on three layers of four, NoPE every fourth layer,
            temperature tuning (8192, 0.1), weightless QK-norm; rope_freqs as LongRoPE divisors
  gpt-oss   SwiGLU limit 7 and alpha 1.702; YaRN not truncated, as transformers computes it
"""

import numpy as np

from .errors import ConvertError
from .limits import check as check_limits
from .families import FAMILIES

MISSING = object()
LAYER_TENSORS = {   # GGUF name after blk.N. (".weight" dropped) -> colibri name after layers.N.
    "attn_norm": "attn_norm", "attn_norm.bias": "attn_norm_bias", "ffn_norm": "ffn_norm",
    "ffn_norm.bias": "ffn_norm_bias", "post_attention_norm": "ffn_norm",
    "attn_q": "attn.wq", "attn_k": "attn.wk", "attn_v": "attn.wv", "attn_output": "attn.wo",
    "attn_q.bias": "attn.bq", "attn_k.bias": "attn.bk", "attn_v.bias": "attn.bv", "attn_output.bias": "attn.bo",
    "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm", "attn_sinks": "attn.sinks",
    "attn_q_a": "attn.wq_a", "attn_q_a.bias": "attn.bq_a", "attn_q_a_norm": "attn.q_a_norm", "attn_q_b": "attn.wq_b",
    "attn_kv_a_mqa": "attn.wkv_a", "attn_kv_a_mqa.bias": "attn.bkv_a", "attn_kv_a_norm": "attn.kv_a_norm",
    "attn_kv_b": "attn.wkv_b",
    "shortconv.in_proj": "conv.in_proj", "shortconv.conv": "conv.kernel", "shortconv.out_proj": "conv.out_proj",
    "ffn_gate": "mlp.w1", "ffn_up": "mlp.w3", "ffn_down": "mlp.w2",
    "ffn_gate_inp": "router", "ffn_gate_inp.bias": "router.bias", "exp_probs_b.bias": "router.selection_bias",
    "ffn_gate_exps": "experts.w1", "ffn_up_exps": "experts.w3", "ffn_down_exps": "experts.w2",
    "ffn_gate_exps.bias": "experts.b1", "ffn_up_exps.bias": "experts.b3", "ffn_down_exps.bias": "experts.b2",
    "ffn_gate_shexp": "shared.w1", "ffn_up_shexp": "shared.w3", "ffn_down_shexp": "shared.w2",
    "ffn_gate_inp_shexp": "shared.gate",
}
GLOBAL_TENSORS = {"token_embd": "tok_embeddings", "output_norm": "norm", "output_norm.bias": "norm_bias",
                  "output": "lm_head", "output.bias": "lm_head_bias"}
EXTRA_GLOBAL = {"lfm2moe": {"token_embd_norm": "norm"},   # llama.cpp's name for LFM2's final norm
                "phimoe": {"rope_factors_short": "rope.factors"}, "llama4": {"rope_freqs": "rope.factors"}}
# keys that do not change the maths (llama.cpp's own bookkeeping)
IGNORED = {"vocab_size"}
INT_MAX = 2**31 - 1   # the core's hyperparameters are int32
# What each `<arch>.` key read must hold: "count" an integer from 1, "size" one from 0 (both up to
# INT_MAX), "number" a finite number, "positive" one > 0, "flag" a boolean, "name" a string.
KEYS = {
    **dict.fromkeys(("context_length", "embedding_length", "block_count", "expert_feed_forward_length",
                     "attention.head_count", "attention.head_count_kv", "attention.key_length",
                     "attention.value_length", "attention.key_length_mla", "attention.value_length_mla",
                     "attention.kv_lora_rank", "attention.q_lora_rank", "rope.dimension_count", "expert_used_count",
                     "expert_group_count", "expert_group_used_count", "interleave_moe_layer_step",
                     "shortconv.l_cache", "rope.scaling.original_context_length"), "count"),
    **dict.fromkeys(("feed_forward_length", "expert_count", "expert_shared_feed_forward_length", "expert_shared_count",
                     "leading_dense_block_count", "nextn_predict_layers", "attention.sliding_window",
                     "expert_gating_func"), "size"),
    **dict.fromkeys(("attention.layer_norm_rms_epsilon", "rope.scaling.factor", "rope.scaling.yarn_beta_fast",
                     "rope.scaling.yarn_beta_slow", "rope.scaling.attn_factor", "rope.scaling.yarn_log_multiplier",
                     "expert_weights_scale", "attention.scale", "embedding_scale", "residual_scale", "logit_scale",
                     "attention.clamp_kqv"), "number"),
    "rope.freq_base": "positive", "expert_weights_norm": "flag", "rope.scaling.type": "name",
}
AT_MOST = {"expert_used_count": "expert_count", "expert_group_used_count": "expert_group_count",   # key -> its bound
           "attention.head_count_kv": "attention.head_count", "nextn_predict_layers": "block_count",
           "leading_dense_block_count": "block_count"}
PER_LAYER = {("lfm2moe", "attention.head_count_kv")}   # may be an array, a value a layer (0: a convolution layer)
EXPECTED = {"count": "an integer", "size": "an integer", "id": "an integer", "number": "a number",
            "positive": "a number", "flag": "a boolean", "name": "a string"}


def _f32(value):
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def _found(value):
    """A metadata value's type and value, in words."""
    if isinstance(value, list):
        return f"an array ({value[:4]}{'...' if len(value) > 4 else ''})" if value else "an empty array"
    for kind, name in ((bool, "a boolean"), (str, "a string"), (float, "a float"), (int, "an integer")):
        if isinstance(value, kind):
            return f"{name} ({value!r})"
    return repr(value)


def checked(key, value, kind, per_layer=False):
    """`value`, the value of metadata key `key`, if it is what `kind` (KEYS, or "id": any integer)
    says; a ConvertError naming the key, what it holds and what it should, if not."""
    if per_layer and isinstance(value, list) and value:
        return [checked(f"{key}[{i}]", v, "size") for i, v in enumerate(value)]
    integer = isinstance(value, int) and not isinstance(value, bool)
    number = integer or isinstance(value, float)
    if not {"flag": isinstance(value, bool), "name": isinstance(value, str), "number": number,
            "positive": number}.get(kind, integer):
        raise ConvertError(f"GGUF: `{key}` is {_found(value)}, expected {EXPECTED[kind]}"
                           f"{' or an array of them' if per_layer else ''}")
    low = 1 if kind == "count" else 0
    if kind in ("count", "size") and not low <= value <= INT_MAX:
        raise ConvertError(f"GGUF: `{key}` is {value}, expected an integer from {low} to {INT_MAX}")
    if kind in ("number", "positive") and not (np.isfinite(value) and (kind == "number" or value > 0)):
        raise ConvertError(f"GGUF: `{key}` is {value}, expected a finite number{' > 0' if kind == 'positive' else ''}")
    return value


def token_id(meta, key):
    """The token id metadata `key` holds (an integer, its range the caller's to check), or None."""
    return None if key not in meta else checked(key, meta[key], "id")


def end_token_ids(meta):
    """Every id that ends a turn: the eos, end-of-turn and end-of-message ids, those present, eos first."""
    ids = (token_id(meta, f"tokenizer.ggml.{key}") for key in ("eos_token_id", "eot_token_id", "eom_token_id"))
    return [i for i in ids if i is not None]


class Meta:
    """`<arch>.` metadata, each value checked for what KEYS says it holds, recording which keys were read."""

    def __init__(self, meta, arch):
        self.meta, self.arch, self.used = meta, arch, set()

    def __call__(self, key, default=MISSING):
        self.used.add(key)
        name = f"{self.arch}.{key}"
        if name not in self.meta:
            if default is MISSING:
                raise ConvertError(f"GGUF: `{name}` missing")
            return default
        value = checked(name, self.meta[name], KEYS[key], (self.arch, key) in PER_LAYER)
        if key in AT_MOST and self.has(AT_MOST[key]):
            bound = self(AT_MOST[key])
            if (max(value) if isinstance(value, list) else value) > bound:
                raise ConvertError(f"GGUF: `{name}` is {value}, more than `{self.arch}.{AT_MOST[key]}` ({bound})")
        return _f32(value) if isinstance(value, float) else value

    def has(self, key):
        return f"{self.arch}.{key}" in self.meta

    def unread(self):
        prefix = self.arch + "."
        return sorted(k[len(prefix):] for k in self.meta if k.startswith(prefix)
                      and k[len(prefix):] not in self.used | IGNORED)


def unsupported(what, arch):
    return ConvertError(f"unsupported: {what} in gguf {arch}")


def _common(m, tensors, heads_kv=None):
    """The config keys every decoder family reads."""
    heads = m("attention.head_count")
    cfg = {"vocab_size": int(tensors["token_embd.weight"].data.shape[0]), "hidden_size": m("embedding_length"),
           "num_hidden_layers": m("block_count"), "num_attention_heads": heads,
           "num_key_value_heads": heads_kv if heads_kv is not None else m("attention.head_count_kv", heads),
           "max_position_embeddings": m("context_length"), "rms_norm_eps": m("attention.layer_norm_rms_epsilon"),
           "rope_parameters": {"rope_type": "default", "rope_theta": m("rope.freq_base", 10000.0)},
           "tie_word_embeddings": "output.weight" not in tensors, "hidden_act": "silu"}
    if m.has("attention.key_length") and m.arch != "deepseek2":   # deepseek2's are its MQA form (_config)
        if m("attention.value_length", m("attention.key_length")) != m("attention.key_length"):
            raise unsupported("attention.value_length != attention.key_length", m.arch)
        cfg["head_dim"] = m("attention.key_length")
    if m("rope.scaling.type", "none") not in ("none", "yarn") or (
            m("rope.scaling.type", "none") == "yarn" and m.arch not in ("deepseek2", "gpt-oss")):
        raise unsupported(f"{m.arch}.rope.scaling.type {m('rope.scaling.type')!r}", m.arch)
    return cfg


def _has(tensors, suffix):
    return any(name.endswith(suffix) for name in tensors)


def _yarn(m):
    return {"rope_type": "yarn", "rope_theta": m("rope.freq_base", 10000.0), "factor": m("rope.scaling.factor"),
            "original_max_position_embeddings": m("rope.scaling.original_context_length"),
            "beta_fast": m("rope.scaling.yarn_beta_fast", 32.0), "beta_slow": m("rope.scaling.yarn_beta_slow", 1.0)}


def _llamacpp_routing(m, tensors, default_gating, top_k):
    """llama.cpp's build_moe_ffn as deepseek2, glm4moe and dots1 call it."""
    gating = m("expert_gating_func", default_gating)
    if gating not in (1, 2):
        raise unsupported(f"{m.arch}.expert_gating_func {gating!r}" if gating is not None
                          else f"{m.arch}.expert_gating_func missing", m.arch)
    routing = {"type": "topk", "top_k": top_k, "score": "softmax" if gating == 1 else "sigmoid",
               "normalize": bool(m("expert_weights_norm", False)), "scale": float(m("expert_weights_scale", 1.0))}
    if routing["normalize"]:
        routing["normalize_eps"] = 1e-20
    if _has(tensors, "exp_probs_b.bias"):
        routing["selection_bias"] = True
    groups, used = m("expert_group_count", 1), m("expert_group_used_count", 1)
    if groups > 1:
        routing.update(groups=groups, topk_groups=used, group_score="top2_sum")
    return routing


def _config(arch, m, tensors, meta):
    """(HF model_type, the config dict its family module reads) for the GGUF architecture `arch`."""
    if not m("expert_count"):
        raise unsupported(f"a dense model ({arch}.expert_count 0)", arch)
    experts = {"expert_count": m("expert_count"), "expert_used_count": m("expert_used_count")}
    if arch == "qwen2moe":
        cfg = _common(m, tensors)
        return "qwen2_moe", {**cfg, "intermediate_size": m("feed_forward_length"),
                             "moe_intermediate_size": m("expert_feed_forward_length"),
                             "shared_expert_intermediate_size": m("expert_shared_feed_forward_length", 0),
                             "num_experts": experts["expert_count"], "num_experts_per_tok": experts["expert_used_count"],
                             "norm_topk_prob": False, "decoder_sparse_step": 1, "use_sliding_window": False,
                             "qkv_bias": _has(tensors, "attn_q.bias")}
    if arch == "olmoe":
        cfg = {**_common(m, tensors), "intermediate_size": m("feed_forward_length"),
               "num_experts": experts["expert_count"], "num_experts_per_tok": experts["expert_used_count"],
               "norm_topk_prob": False, "attention_bias": _has(tensors, "attn_q.bias")}
        if m.has("attention.clamp_kqv"):
            cfg["clip_qkv"] = m("attention.clamp_kqv")
        return "olmoe", cfg
    if arch == "granitemoe":
        cfg = {**_common(m, tensors), "intermediate_size": m("feed_forward_length"),
               "num_local_experts": experts["expert_count"], "num_experts_per_tok": experts["expert_used_count"],
               "attention_bias": _has(tensors, "attn_q.bias"), "attention_multiplier": m("attention.scale", 1.0),
               "embedding_multiplier": m("embedding_scale", 1.0), "residual_multiplier": m("residual_scale", 1.0),
               "logits_scaling": m("logit_scale", 1.0)}
        if m("expert_shared_feed_forward_length", 0):
            return "granitemoeshared", {**cfg, "shared_intermediate_size": m("expert_shared_feed_forward_length")}
        return "granitemoe", cfg
    if arch == "phimoe":
        cfg = {**_common(m, tensors), "intermediate_size": m("feed_forward_length"),
               "num_local_experts": experts["expert_count"], "num_experts_per_tok": experts["expert_used_count"],
               "attention_bias": _has(tensors, "attn_q.bias"), "lm_head_bias": "output.bias" in tensors,
               "sliding_window": m("attention.sliding_window", 0) or None, "router_jitter_noise": 0.01}
        if "rope_factors_short.weight" in tensors:
            original = m("rope.scaling.original_context_length")
            scale = float(m("rope.scaling.attn_factor", 1.0))
            short = np.asarray(tensors["rope_factors_short.weight"].data, dtype=np.float32).tolist()
            cfg["rope_parameters"] = {"rope_type": "longrope", "rope_theta": cfg["rope_parameters"]["rope_theta"],
                                      "short_factor": short, "original_max_position_embeddings": original,
                                      "short_mscale": scale, "long_mscale": scale}
            cfg["max_position_embeddings"] = min(cfg["max_position_embeddings"], original)
        return "phimoe", cfg
    if arch == "deepseek2":
        heads, rope_dim = m("attention.head_count"), m("rope.dimension_count")
        if m("attention.head_count_kv", 1) != 1:   # MLA as llama.cpp writes it: MQA over the latent
            raise unsupported(f"{arch}.attention.head_count_kv {m('attention.head_count_kv')}", arch)
        cfg = {**_common(m, tensors, heads_kv=heads), "intermediate_size": m("feed_forward_length"),
               "num_hidden_layers": m("block_count") - m("nextn_predict_layers", 0),
               "moe_intermediate_size": m("expert_feed_forward_length"), "n_routed_experts": experts["expert_count"],
               "num_experts_per_tok": experts["expert_used_count"], "n_shared_experts": m("expert_shared_count", 0),
               "first_k_dense_replace": m("leading_dense_block_count", 0), "kv_lora_rank": m("attention.kv_lora_rank"),
               "q_lora_rank": m("attention.q_lora_rank", None), "qk_rope_head_dim": rope_dim,
               "qk_nope_head_dim": m("attention.key_length_mla") - rope_dim,
               "v_head_dim": m("attention.value_length_mla"), "rope_interleave": True,
               "attention_bias": _has(tensors, "attn_kv_a_mqa.bias")}
        rank = cfg["kv_lora_rank"]
        if (m("attention.key_length", rank + rope_dim), m("attention.value_length", rank)) != (rank + rope_dim, rank):
            raise unsupported(f"{arch}.attention.key_length / value_length other than kv_lora_rank (+ rope)", arch)
        if m("rope.scaling.type", "none") == "yarn":
            if m("rope.scaling.attn_factor", 1.0) != 1.0:
                raise unsupported(f"{arch}.rope.scaling.attn_factor {m('rope.scaling.attn_factor')}", arch)
            cfg["rope_parameters"] = {**_yarn(m), "attention_factor": 1.0,
                                      "mscale_all_dim": _f32(m("rope.scaling.yarn_log_multiplier", 0.0) / 0.1)}
            cfg["rope_parameters"]["mscale"] = cfg["rope_parameters"]["mscale_all_dim"]
        return ("deepseek_v3" if _has(tensors, "exp_probs_b.bias") else "deepseek_v2"), cfg
    if arch in ("glm4moe", "dots1"):
        layers = m("block_count") - m("nextn_predict_layers", 0)
        cfg = {**_common(m, tensors), "num_hidden_layers": layers, "intermediate_size": m("feed_forward_length"),
               "moe_intermediate_size": m("expert_feed_forward_length"), "n_routed_experts": experts["expert_count"],
               "num_experts_per_tok": experts["expert_used_count"], "n_shared_experts": m("expert_shared_count", 0),
               "first_k_dense_replace": m("leading_dense_block_count", 0),
               "attention_bias": _has(tensors, "attn_q.bias")}
        if arch == "dots1":
            return "dots1", cfg
        head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        cfg["partial_rotary_factor"] = m("rope.dimension_count", head_dim) / head_dim
        cfg["use_qk_norm"] = _has(tensors, "attn_q_norm.weight")
        return "glm4_moe", cfg
    if arch == "ernie4_5-moe":
        m("expert_shared_feed_forward_length", 0)   # the shared tensors' own shape is what counts
        return "ernie4_5_moe", {**_common(m, tensors), "intermediate_size": m("feed_forward_length"),
                                "moe_intermediate_size": m("expert_feed_forward_length"),
                                "moe_num_experts": experts["expert_count"], "moe_k": experts["expert_used_count"],
                                "moe_num_shared_experts": m("expert_shared_count", 0),
                                "moe_layer_start_index": m("leading_dense_block_count", 0),
                                "moe_layer_interval": m("interleave_moe_layer_step", 1)}
    if arch == "lfm2moe":
        kv = m("attention.head_count_kv")
        kv = kv if isinstance(kv, list) else [kv] * m("block_count")
        if len(kv) != m("block_count"):
            raise ConvertError(f"GGUF: `{arch}.attention.head_count_kv` has {len(kv)} values, "
                               f"`{arch}.block_count` is {m('block_count')}")
        if len(set(kv) - {0}) != 1:
            raise unsupported(f"{arch}.attention.head_count_kv {kv}", arch)
        return "lfm2_moe", {**_common(m, tensors, heads_kv=max(kv)), "intermediate_size": m("feed_forward_length"),
                            "moe_intermediate_size": m("expert_feed_forward_length"),
                            "num_experts": experts["expert_count"], "num_experts_per_tok": experts["expert_used_count"],
                            "layer_types": ["conv" if n == 0 else "full_attention" for n in kv],
                            "num_dense_layers": m("leading_dense_block_count", 0), "conv_L_cache": m("shortconv.l_cache"),
                            "conv_bias": False, "use_expert_bias": _has(tensors, "exp_probs_b.bias"),
                            "norm_topk_prob": True, "routed_scaling_factor": 1.0}
    if arch == "gpt-oss":
        cfg = {**_common(m, tensors), "intermediate_size": m("expert_feed_forward_length"),
               "num_local_experts": experts["expert_count"], "num_experts_per_tok": experts["expert_used_count"],
               "sliding_window": m("attention.sliding_window", 0) or None, "hidden_act": "silu"}
        if m("feed_forward_length", cfg["intermediate_size"]) != cfg["intermediate_size"]:
            raise unsupported(f"{arch}.feed_forward_length != expert_feed_forward_length", arch)
        if m("rope.scaling.type", "none") == "yarn":
            cfg["rope_parameters"] = {**_yarn(m), "truncate": False}
        return "gpt_oss", cfg
    if arch == "llama4":
        cfg = {**_common(m, tensors), "intermediate_size": m("expert_feed_forward_length"),
               "intermediate_size_mlp": m("feed_forward_length"), "num_local_experts": experts["expert_count"],
               "num_experts_per_tok": experts["expert_used_count"],
               "interleave_moe_layer_step": m("interleave_moe_layer_step"),
               "use_qk_norm": experts["expert_count"] != 128}
        L = cfg["num_hidden_layers"]
        for key in ("attention.sliding_window", "rope.freq_base_swa"):   # attention other than Scout's chunks
            if m.has(key):
                raise unsupported(f"{arch}.{key}", arch)
        cfg.update(no_rope_layers=[int((i + 1) % 4 != 0) for i in range(L)],
                   layer_types=["chunked_attention" if (i + 1) % 4 else "full_attention" for i in range(L)],
                   attention_chunk_size=8192, attn_temperature_tuning=True, floor_scale=8192, attn_scale=0.1)
        if m("rope.dimension_count", cfg.get("head_dim")) != cfg.get("head_dim"):
            raise unsupported(f"{arch}.rope.dimension_count != attention.key_length", arch)
        return "llama4_text", cfg
    raise AssertionError(arch)


ARCHS = ("qwen2moe", "olmoe", "granitemoe", "phimoe", "deepseek2", "glm4moe", "dots1", "ernie4_5-moe", "lfm2moe",
         "gpt-oss", "llama4")


class _Shapes:
    """What a family's plan asks of a checkpoint, answered without one: only the names and shapes
    of the colibri tensors it lists are used. The experts are said to be fused (the same colibri
    tensors as per-expert ones), so that the plan does not name each of E experts in each layer."""

    def __init__(self, config):
        self.config = config

    def __contains__(self, name):
        return name.endswith(".gate_up_proj")

    def __len__(self):
        return 0


def describe(meta, arch, tensors):
    """(colibri description, {colibri name: shape}) for the GGUF of architecture `arch`."""
    m = Meta(meta, arch)
    family, config = _config(arch, m, tensors, meta)
    config["bos_token_id"] = token_id(meta, "tokenizer.ggml.bos_token_id")
    config["eos_token_id"] = end_token_ids(meta)
    module = FAMILIES[family]
    desc = check_limits(module.describe(config, family))
    hp = desc["hparams"]
    if arch == "granitemoe":
        hp["rope_interleaved"] = True   # q and k rows reordered by llama.cpp's converter for adjacent-pair RoPE
        if m("rope.dimension_count", hp["head_dim"]) != hp["head_dim"]:
            raise unsupported(f"{arch}.rope.dimension_count != head_dim", arch)
    if arch in ("qwen2moe", "olmoe", "phimoe", "dots1", "gpt-oss", "lfm2moe"):
        if m("rope.dimension_count", hp["head_dim"]) != hp["head_dim"]:
            raise unsupported(f"{arch}.rope.dimension_count {m('rope.dimension_count')} (partial RoPE)", arch)
    if arch in ("deepseek2", "glm4moe", "dots1"):
        desc["routing"] = _llamacpp_routing(m, tensors, {"glm4moe": 2, "deepseek2": 1}.get(arch), desc["routing"]["top_k"])
    if arch == "lfm2moe":
        m("expert_gating_func")
        if m("expert_gating_func") != 2:
            raise unsupported(f"{arch}.expert_gating_func {m('expert_gating_func')}", arch)
    if arch == "llama4":
        hp.pop("rope_scaling", None)
        if "rope_freqs.weight" in tensors:   # llama 3's frequency divisors, as LongRoPE's short factors
            hp["rope_scaling"] = {"type": "longrope", "original_max_position_embeddings": hp["max_position_embeddings"],
                                  "short_mscale": 1.0, "long_mscale": 1.0}
    unread = m.unread()
    if unread:
        raise unsupported(f"{arch}.{unread[0]}", arch)
    shapes = {e.name: tuple(e.shape) for e in module.plan(desc, _Shapes(config))}
    if arch == "llama4" and "rope_freqs.weight" in tensors:
        shapes["rope.factors"] = (hp["head_dim"] // 2,)
    return desc, shapes


def colibri_name(arch, name, n_layers):
    """The colibri name of GGUF tensor `name`; "" for one the model does not use (the
    next-token-prediction layers past n_layers of GLM's files), None for one colibri does not know."""
    stem = name[:-len(".weight")] if name.endswith(".weight") else name
    table = {**GLOBAL_TENSORS, **EXTRA_GLOBAL.get(arch, {})}
    if stem in table:
        return table[stem]
    if arch == "phimoe" and stem == "rope_factors_long":
        return ""   # used by llama.cpp only past original_context_length, where the imported model stops
    parts = stem.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit():
        if arch in ("glm4moe", "deepseek2") and int(parts[1]) >= n_layers:
            return ""
        if parts[2] in LAYER_TENSORS:
            return f"layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
        if arch == "deepseek2" and parts[2] in ("attn_k_b", "attn_v_b"):
            return f"layers.{parts[1]}.attn.wkv_b"
    return None


def join_kv_b(name, k_b, v_b, kinds, arch):
    """llama.cpp's k_b [H, R, nope] (transposed) and v_b [H, dv, R] -> kv_b [H * (nope + dv), R], each
    head's key rows then its value rows.  Only float types can be transposed without dequantizing."""
    if set(kinds) - {"F32", "F16", "BF16"} or len(set(kinds)) != 1:
        raise unsupported(f"tensor `{name}` as {'/'.join(kinds)} (k_b and v_b must be one float type to rejoin kv_b)",
                          arch)
    k_b, v_b = np.asarray(k_b), np.asarray(v_b)
    if k_b.ndim != 3 or v_b.ndim != 3 or k_b.shape[0] != v_b.shape[0] or k_b.shape[1] != v_b.shape[2]:
        raise unsupported(f"tensor `{name}` shapes k_b {list(k_b.shape)}, v_b {list(v_b.shape)}", arch)
    joined = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
    return np.ascontiguousarray(joined.reshape(-1, joined.shape[-1]))

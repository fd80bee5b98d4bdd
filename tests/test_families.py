"""Every supported MoE family against transformers' own implementation: a tiny checkpoint with
random weights is built here from the family's config class (norm weights and biases moved away
from their initial 1 and 0, so an ignored tensor fails), saved with save_pretrained, converted by
colibri, and run on the same tokens.  Each config turns on what its family adds to Mixtral: dense
and MoE layers, sliding windows, shared experts, biases, QK-norm, multipliers."""
import os
import re
import subprocess
from collections import Counter, defaultdict

import numpy as np
import pytest

import colibri
from colibri.convert import ConvertError, convert
from colibri.targets import TARGETS, env_for, infer_binary
from conftest import require_reference
from test_targets import prompt_logits

torch, transformers = require_reference()

COMMON = dict(vocab_size=128, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, tie_word_embeddings=False)
# family -> (real models, what the tiny config exercises, config class, kwargs)
FAMILIES = {
    "mixtral": ("Mixtral-8x7B, Mixtral-8x22B", "softmax top-2 of 4 renormalised, GQA, a window on every layer",
                "MixtralConfig", dict(intermediate_size=32, num_hidden_layers=2, num_local_experts=4,
                                      num_experts_per_tok=2, sliding_window=5,
                                      rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen3_moe": ('Qwen3-30B-A3B, Qwen3-Coder-30B-A3B', 'per-head QK-norm, a dense layer, a window on every layer, q/k/v/o biases, renormalised top-3 of 8, head_dim != hidden/heads', "Qwen3MoeConfig", dict(
        intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4, head_dim=32, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=True, mlp_only_layers=[1], attention_bias=True,
        use_sliding_window=True, sliding_window=5, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "qwen2_moe": ('Qwen1.5-MoE-A2.7B', 'sigmoid-gated shared expert, q/k/v biases, dense and MoE layers alternating, sliding and full layers', "Qwen2MoeConfig", dict(
        intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_hidden_layers=4,
        num_experts=8, num_experts_per_tok=3, norm_topk_prob=False, decoder_sparse_step=2, qkv_bias=True,
        use_sliding_window=True, sliding_window=5, max_window_layers=3,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "olmoe": ('OLMoE-1B-7B', 'QK-norm over the whole projection, clip_qkv, top-3 of 8 not renormalised', "OlmoeConfig", dict(
        intermediate_size=32, num_hidden_layers=3, num_experts=8, num_experts_per_tok=3, norm_topk_prob=False,
        clip_qkv=0.8, attention_bias=True, pad_token_id=1, eos_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    "granitemoe": ('granite-3.x 1b-a400m, 3b-a800m', 'top-k on logits then softmax, embedding/residual/attention/logits multipliers, q/k/v/o biases', "GraniteMoeConfig", dict(
        intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2, attention_bias=True,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.3, logits_scaling=4.0,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    "granitemoeshared": ('granite-3.x MoE with a shared MLP', 'as granitemoe plus an ungated shared MLP, tied embeddings', "GraniteMoeSharedConfig", dict(
        intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2, attention_bias=True,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.3, logits_scaling=4.0,
        shared_intermediate_size=48, rope_parameters={"rope_type": "default", "rope_theta": 1e4},
        tie_word_embeddings=True)),
    "glm4_moe": ('GLM-4.5-Air', 'sigmoid router with selection bias, 4 groups (top-2 sums), renormalise, scale 2.5, partial RoPE (half), per-head QK-norm, q/k/v biases, shared expert, a dense first layer', "Glm4MoeConfig", dict(
        intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, head_dim=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2, first_k_dense_replace=1,
        norm_topk_prob=True, routed_scaling_factor=2.5, use_qk_norm=True, attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5})),
    "dots1": ('dots.llm1', "as glm4_moe's router, per-head QK-norm, o bias, two shared experts, sliding and full layers", "Dots1Config", dict(
        intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, head_dim=32, n_routed_experts=8,
        num_experts_per_tok=2, n_shared_experts=2, n_group=4, topk_group=2, first_k_dense_replace=1,
        norm_topk_prob=True, routed_scaling_factor=2.5, attention_bias=True, sliding_window=3, max_window_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    "ernie4_5_moe": ('ERNIE-4.5-21B-A3B', 'softmax router with selection bias, renormalised, interleaved RoPE, shared expert, MoE every second layer, tied embeddings', "Ernie4_5_MoeConfig", dict(
        num_hidden_layers=4, intermediate_size=96, moe_intermediate_size=32, moe_num_experts=8, moe_k=3,
        moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_interval=2, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5e5})),
    # multi-head latent attention: q through its LoRA, YaRN with mscale != mscale_all_dim (both the
    # cos/sin factor and the softmax scale), interleaved RoPE, 4 groups of 2 experts
    "deepseek_v3": ('DeepSeek-V3, Moonlight-16B-A3B', 'multi-head latent attention with q-LoRA, YaRN (mscale != mscale_all_dim), interleaved RoPE, sigmoid router with selection bias and 4 groups, shared expert, a dense first layer', "DeepseekV3Config", dict(
        intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4,
        topk_group=2, first_k_dense_replace=1, norm_topk_prob=True, routed_scaling_factor=2.5, q_lora_rank=24,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 64,
                         "mscale": 1.0, "mscale_all_dim": 0.8, "beta_fast": 32.0, "beta_slow": 1.0})),
    "glm4_moe_lite": ("GLM-4.7-Flash", "DeepSeek-V3's latent attention with GLM's MoE, dense layers by mlp_layer_types",
                      "Glm4MoeLiteConfig", dict(
        intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=4, topk_group=2,
        routed_scaling_factor=1.8, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=12, mlp_layer_types=["dense", "sparse", "sparse"],
        rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    # q straight from q_proj, biases, group-limited greedy routing (k 3 > 2 kept groups)
    "deepseek_v2": ('DeepSeek-V2-Lite, DeepSeek-Coder-V2-Lite', 'latent attention without q-LoRA, biases, group-limited greedy softmax router (k 3 > 2 groups), scale 2, two shared experts', "DeepseekV2Config", dict(
        intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=3, n_shared_experts=2, n_group=4,
        topk_group=2, topk_method="group_limited_greedy", first_k_dense_replace=1, routed_scaling_factor=2.0,
        q_lora_rank=None, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    # LayerNorm with biases, attention and lm_head biases, a window, the sparsemixer (jitter 0.3 so
    # that second experts often stay in the softmax), LongRoPE short factors and mscale
    "phimoe": ('Phi-3.5-MoE', 'LayerNorm with biases, sparsemixer router, LongRoPE, attention and lm_head biases, a window', "PhimoeConfig", dict(
        intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2, attention_bias=True,
        lm_head_bias=True, sliding_window=5, router_jitter_noise=0.3,
        rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                         "short_factor": [1.0 + 0.1 * i for i in range(8)],
                         "long_factor": [2.0 + 0.3 * i for i in range(8)],
                         "short_mscale": 1.2, "long_mscale": 1.35, "original_max_position_embeddings": 64})),
    "llama4_text": ("Llama-4-Scout (its text model)", "expert input scaled by sigmoid(logit), shared expert, MoE every second layer, NoPE layers with temperature tuning, chunked attention (chunks of 8), weightless QK RMS-norm, Llama 3 RoPE scaling",
                    "Llama4TextConfig", dict(
        intermediate_size=48, intermediate_size_mlp=80, num_hidden_layers=6, head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, interleave_moe_layer_step=2, no_rope_layer_interval=3, attention_chunk_size=8,
        use_qk_norm=True, attn_temperature_tuning=True, floor_scale=6, attn_scale=0.5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "lfm2_moe": ("LFM2-8B-A1B", "short-convolution layers (kernel 3, biases) beside attention with per-head QK-norm, sigmoid router with selection bias, renormalise, scale 1.7, two dense layers, tied embeddings",
                 "Lfm2MoeConfig", dict(
        intermediate_size=80, moe_intermediate_size=40, num_hidden_layers=6,
        layer_types=["conv", "full_attention", "conv", "conv", "full_attention", "conv"], num_dense_layers=2,
        conv_L_cache=3, conv_bias=True, num_experts=6, num_experts_per_tok=3, use_expert_bias=True,
        routed_scaling_factor=1.7, norm_topk_prob=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    # YaRN (factor 32, not truncated: with head_dim 16 the ramp spans dimensions 2..4), sinks,
    # sliding/full layers, the clamps hit (limit lowered to 1.5)
    "gpt_oss": ('gpt-oss-20b (dequantized)', 'attention sinks, YaRN, sliding and full layers, router bias, clamped SwiGLU with biases, q/k/v/o biases', "GptOssConfig", dict(
        intermediate_size=32, num_hidden_layers=3, num_local_experts=4, num_experts_per_tok=2, head_dim=16,
        sliding_window=4, max_position_embeddings=131072, swiglu_limit=1.5)),
}
N_TOKENS = 24
N_GREEDY = 12
# Out of scope here: families whose non-MoE layers are not attention; each needs its primitive.
NOT_YET = {
    "jamba, granitemoehybrid, nemotron_h": ("Jamba, Granite-4.0-H, Nemotron-H", "Mamba (selective state space) layers"),
    "qwen3_next, qwen3_5_moe": ("Qwen3-Next", "Gated DeltaNet (linear attention) layers"),
    "minimax": ("MiniMax-Text-01", "lightning (linear) attention layers"),
}
RESULTS = defaultdict(dict)   # family -> what passed, for the README's table


@pytest.fixture(scope="module", autouse=True)
def family_table():
    """With $COLIBRI_FAMILY_TABLE set, writes the README's family table from this run's results."""
    yield
    path = os.environ.get("COLIBRI_FAMILY_TABLE")
    if not path:
        return
    rows = ["| family (model_type) | real models | status | verified against transformers 5.24 (f32, tiny random checkpoint) |",
            "|---|---|---|---|"]
    for name, (models, exercised, _, _) in FAMILIES.items():
        r = RESULTS[name]
        done = "logits" in r and r.get("greedy") and r.get("cache")
        checks = [f"logits max \\|Δ\\| {r['logits']:.1e}" if "logits" in r else "logits FAILED",
                  "greedy tokens equal" if r.get("greedy") else "greedy FAILED",
                  "KV cache and chunked prefill = recompute" if r.get("cache") else "KV cache FAILED"]
        if r.get("targets"):
            checks.append("strict mode bit-identical on " + ", ".join(r["targets"]))
        rows.append(f"| {name} | {models} | {'runs' if done else 'FAILING'} | {'; '.join(checks)}; exercises {exercised} |")
    for name, (models, missing) in NOT_YET.items():
        rows.append(f"| {name} | {models} | not yet | needs {missing} |")
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")


def build(family, seed=0, **overrides):
    """The family's tiny model: every weight random (norms around 1), in eval mode, float32."""
    _, _, class_name, kwargs = FAMILIES[family]
    config = getattr(transformers, class_name)(**{**COMMON, **kwargs, **overrides})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    rng = np.random.default_rng(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                w = rng.uniform(0.5, 1.5, size=p.shape)
            else:
                w = rng.standard_normal(size=p.shape) * (0.5 if name.endswith("bias") else 0.1)
            p.copy_(torch.from_numpy(w.astype(np.float32)))
        for name, b in model.named_buffers():   # the experts' selection bias is a buffer, zero at init
            if name.endswith(("e_score_correction_bias", "expert_bias")):
                b.copy_(torch.from_numpy((rng.standard_normal(size=b.shape) * 0.1).astype(np.float32)))
    return model


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(tokens, dtype=np.int64))[None]).logits[0].float().numpy()


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, transformers model, colibri model, tokens)"""
    name = request.param
    model = build(name)
    root = tmp_path_factory.mktemp(name)
    model.save_pretrained(root / "hf")
    tokens = np.random.default_rng(1).integers(0, COMMON["vocab_size"], N_TOKENS).astype(np.int32)
    return name, model, colibri.Model(convert(root / "hf", root / "colibri", dtype="f32", progress=False)), tokens


def test_logits_match_transformers(family):
    name, hf, model, tokens = family
    ours = model.session(ctx=64).forward(tokens)
    ref = hf_logits(hf, tokens)
    print(f"{name}: max |colibri - transformers| = {np.abs(ours - ref).max():.2e} over {ours.size} logits")
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
    RESULTS[name]["logits"] = float(np.abs(ours - ref).max())


def test_greedy_tokens_match_transformers(family):
    name, hf, model, tokens = family
    prompt, seq = list(tokens[:8]), list(tokens[:8])
    for _ in range(N_GREEDY):
        seq.append(int(np.argmax(hf_logits(hf, seq)[-1])))
    ours = model.session(ctx=64).generate(prompt, max_tokens=N_GREEDY, temperature=0.0, stop_at_eos=False)
    assert ours == seq[len(prompt):]
    RESULTS[name]["greedy"] = True


def test_kv_cache_decode_equals_recompute(family):
    """Position by position through the KV cache, and in uneven chunks: the same logits as one
    forward over the whole sequence."""
    name, hf, model, tokens = family
    full = model.session(ctx=64, kernels="reference").forward(tokens)
    s = model.session(ctx=64, kernels="reference")
    stepped = np.concatenate([s.forward(tokens[i:i + 1]) for i in range(N_TOKENS)])
    s = model.session(ctx=64, batch=5, kernels="reference")
    chunked = np.concatenate([s.forward(tokens[:7]), s.forward(tokens[7:])])
    np.testing.assert_array_equal(stepped, full)
    np.testing.assert_array_equal(chunked, full)
    RESULTS[name]["cache"] = True


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "native"] + ["sanitize"])
def test_strict_mode_is_bit_identical_on_every_target(family, target, tmp_path):
    """colibri-infer built for the target (under QEMU), strict mode: the host's logits, bit for bit,
    and those are transformers' within 1e-4.  "sanitize" is the host build with AddressSanitizer and
    UBSan, which fail the run on any out-of-bounds access or undefined behaviour in the family's path."""
    name, hf, model, tokens = family
    host = prompt_logits("native", model.path, tokens, tmp_path, "--reference")
    other = prompt_logits(target, model.path, tokens, tmp_path, "--reference")
    np.testing.assert_allclose(host, hf_logits(hf, tokens), atol=1e-4, rtol=0)
    assert np.array_equal(host.view(np.uint32), other.view(np.uint32)), \
        f"{np.count_nonzero(host.view(np.uint32) != other.view(np.uint32))} logits differ in their bits"
    if target != "sanitize":
        RESULTS[name].setdefault("targets", ["x86_64"]).append(target)


def test_memdump_lists_every_layer_under_sanitizers(family):
    """colibri-infer --memdump in the AddressSanitizer + UBSan build reads every record of the arena
    (latent attention's buffers and the convolution layers' included): it exits 0 and lists each
    layer's two cache buffers."""
    name, hf, model, tokens = family
    r = subprocess.run([str(infer_binary("sanitize")), "--model", str(model.path), "--memdump", "--ctx", "64"],
                       capture_output=True, text=True, env=env_for("sanitize"), timeout=120)
    assert r.returncode == 0, r.stderr
    arena = r.stdout.split("\narena")[1].split("\nmetadata")[0]
    per_layer = Counter(int(layer) for layer in re.findall(r"layers\.(\d+)\.", arena))
    assert per_layer == {layer: 2 for layer in range(model.config["num_layers"])}, arena


@pytest.mark.parametrize("dtype", ["f32", "q8_0"])
def test_latent_attention_heads_share_threads_bit_for_bit(dtype, tmp_path):
    """Latent attention's heads run on the session's threads, each with its own scratch rows (and its
    own quantized input for q8_0's int8 path): prefill and decode give the same bits on any thread
    count, in strict and fast mode.  8 heads of rank 128: big enough that the heads are shared."""
    hf = build("deepseek_v2", num_attention_heads=8, num_key_value_heads=8, kv_lora_rank=128, qk_nope_head_dim=32)
    hf.save_pretrained(tmp_path / "hf")
    path = convert(tmp_path / "hf", tmp_path / "colibri", dtype=dtype, progress=False)
    tokens = np.random.default_rng(5).integers(0, COMMON["vocab_size"], 32)
    for kernels in ("auto", "reference"):
        def run(threads):
            s = colibri.Model(path, threads=threads).session(ctx=64, batch=16, kernels=kernels)
            return np.concatenate([s.forward(tokens[:24])] + [s.forward(tokens[i:i + 1]) for i in range(24, 32)])
        one = run(1)
        for threads in (2, 3):
            assert np.array_equal(one.view(np.uint32), run(threads).view(np.uint32)), (kernels, threads)


@pytest.mark.parametrize("family, overrides", [
    ("qwen3_moe", dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=8)),           # Qwen3's top-8 of 128
    ("deepseek_v3", dict(n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4,       # DeepSeek-V3's
                         moe_intermediate_size=8)),                                                 # 256 in 8 groups
])
def test_expert_counts_are_runtime_values(family, overrides, tmp_path):
    """Nothing in the core limits the experts at compile time: DeepSeek-V3's and Qwen3's counts run."""
    hf = build(family, **overrides)
    hf.save_pretrained(tmp_path / "hf")
    model = colibri.Model(convert(tmp_path / "hf", tmp_path / "colibri", dtype="f32", progress=False))
    tokens = np.random.default_rng(3).integers(0, COMMON["vocab_size"], N_TOKENS)
    s = model.session(ctx=64)
    np.testing.assert_allclose(s.forward(tokens), hf_logits(hf, tokens), atol=1e-4, rtol=0)
    assert (s.expert_load().sum(axis=1)[s.expert_load().sum(axis=1) > 0] == N_TOKENS * overrides["num_experts_per_tok"]).all()


@pytest.mark.parametrize("activation", ["gelu", "gelu_pytorch_tanh", "relu"])
def test_gated_experts_with_other_activations(activation, tmp_path):
    """GeGLU and ReGLU experts (transformers' Mixtral with another hidden_act is the reference): the
    GELU uses an erf of colibri's own, so every target still computes the same bits."""
    hf = build("mixtral", hidden_act=activation)
    hf.save_pretrained(tmp_path / "hf")
    model = colibri.Model(convert(tmp_path / "hf", tmp_path / "colibri", dtype="f32", progress=False))
    tokens = np.random.default_rng(4).integers(0, COMMON["vocab_size"], N_TOKENS)
    np.testing.assert_allclose(model.session(ctx=64).forward(tokens), hf_logits(hf, tokens), atol=1e-4, rtol=0)
    host = prompt_logits("native", model.path, tokens, tmp_path, "--reference")
    assert np.array_equal(host.view(np.uint32), prompt_logits("riscv64", model.path, tokens, tmp_path, "--reference").view(np.uint32))


@pytest.mark.parametrize("family, change, feature", [
    ("qwen3_moe", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "rope_type 'yarn'"),
    ("olmoe", {"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ("qwen2_moe", {"layer_types": ["sliding_attention", "chunked", "full_attention", "full_attention"]}, "layer_types"),
    ("granitemoe", {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type 'longrope'"),
])
def test_an_unsupported_feature_is_refused_at_convert_time(family, change, feature, tmp_path):
    import json

    build(family).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    config.update(change)
    path.write_text(json.dumps(config))
    with pytest.raises(ConvertError, match=f"unsupported: {feature}.* in {family}"):
        convert(tmp_path / "hf", tmp_path / "out", progress=False)


def test_longrope_switches_to_the_long_factor_past_the_trained_context(tmp_path):
    """Phi-3.5-MoE's LongRoPE multiplies cos/sin by short_mscale, or long_mscale once a call reaches
    past original_max_position_embeddings (64 here).  transformers decides per call, colibri per
    position: the two agree when the positions past 64 come one at a time, as in generation.
    Reference: transformers prefilling 60 tokens, then decoding 16 through its KV cache."""
    hf = build("phimoe")
    hf.save_pretrained(tmp_path / "hf")
    model = colibri.Model(convert(tmp_path / "hf", tmp_path / "colibri", dtype="f32", progress=False))
    tokens = np.random.default_rng(2).integers(0, COMMON["vocab_size"], 76)
    with torch.no_grad():
        out = hf(torch.from_numpy(tokens[None, :60]), use_cache=True)
        ref, cache = [out.logits[0, -1].numpy()], out.past_key_values
        for t in tokens[60:]:
            out = hf(torch.tensor([[t]]), cache=cache, use_cache=True)
            ref.append(out.logits[0, -1].numpy())
            cache = out.past_key_values
    s = model.session(ctx=128)
    ours = [s.forward(tokens[:60])[-1]] + [s.forward(tokens[i:i + 1])[-1] for i in range(60, 76)]
    np.testing.assert_allclose(np.array(ours), np.array(ref), atol=1e-4, rtol=0)

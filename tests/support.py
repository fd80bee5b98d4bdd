"""What several test files share: the fixture paths and lists, the transformers reference (skipped
without it), the fixture generator, the tiny model of every family, and colibri-infer on any
target.  The pytest fixtures built from these are in conftest.py."""
import importlib
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from colibri.targets import env_for, infer_command

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
# colibri.targets builds the core for other targets from this checkout
os.environ.setdefault("COLIBRI_SOURCE", str(TESTS.parent))
HF_MODELS = ("tiny-mixtral", "tiny-mixtral-b")  # HF checkpoints with reference.npz
DTYPES = ("f32", "f16", "bf16")


# ------------------------------------------------------------------------------- the reference

def require_reference():
    """torch and transformers, the reference the fixtures come from.  ./run-tests installs them;
    without them the committed fixtures still test everything else, so a developer's run skips
    only the tests that need them, while CI (CI set) fails: there a missing reference is a bug."""
    try:
        return importlib.import_module("torch"), importlib.import_module("transformers")
    except ImportError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"needs torch and transformers: {e}", allow_module_level=True)


def load_make_fixtures():
    """The fixture generator module, fixtures/make_fixtures.py (needs torch and transformers)."""
    require_reference()
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hf_model(path, cls="MixtralForCausalLM"):
    """The checkpoint at `path` in transformers, float32, eager attention, eval mode."""
    torch, transformers = require_reference()
    return getattr(transformers, cls).from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()


def hf_logits(model, tokens):
    """float32 [len(tokens), V]: a transformers model's logits over the whole sequence."""
    torch, _ = require_reference()
    with torch.no_grad():
        return model(torch.from_numpy(np.asarray(tokens, dtype=np.int64))[None]).logits[0].float().numpy()


def transformers_expert_load(name, tokens):
    """int [n_layers, n_experts]: tokens transformers routes to each expert of the HF fixture `name`."""
    torch, _ = require_reference()
    hf = hf_model(FIXTURES / name)
    with torch.no_grad():
        out = hf(torch.from_numpy(np.asarray(tokens, dtype=np.int64))[None], output_router_logits=True)
    k, E = hf.config.num_experts_per_tok, hf.config.num_local_experts
    return np.stack([np.bincount(g.topk(k, dim=-1).indices.reshape(-1).numpy(), minlength=E) for g in out.router_logits])


# ------------------------------------------------------------------------------- family models

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


def build(family, seed=0, **overrides):
    """The family's tiny transformers model: every weight random (norms around 1), in eval mode, float32."""
    torch, transformers = require_reference()
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


# -------------------------------------------------------------------------- colibri-infer driver

def infer(target, *args, check=True):
    """colibri-infer built for `target`, run with `args` (under QEMU for a cross target)."""
    r = subprocess.run([*infer_command(target), *map(str, args)], capture_output=True, timeout=300, env=env_for(target))
    if check and r.returncode != 0:
        raise AssertionError(r.stderr.decode(errors="replace"))
    return r


def prompt_logits(target, model_dir, tokens, tmp_path, *flags):
    """float32 [len(tokens), V]: colibri-infer's logits over `tokens` on `target`."""
    out = tmp_path / f"{target}{''.join(map(str, flags))}.logits"
    infer(target, "--model", model_dir, "--tokens", ",".join(map(str, tokens)), "--max_tokens", 0,
          "--ids", "--logits", out, *flags)
    return np.fromfile(out, dtype="<f4").reshape(len(tokens), -1)


# -------------------------------------------------------------------------- TLS

def self_signed(tmp_path):
    """(cert.pem, key.pem) for localhost and 127.0.0.1, with cryptography or the openssl CLI."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    try:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if not shutil.which("openssl"):
            pytest.skip("needs the cryptography package or the openssl command to make a certificate")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "1", "-subj", "/CN=localhost", "-addext",
                        "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True)
        return cert, key
    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(private.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                               x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(private, hashes.SHA256()))
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    return cert, key

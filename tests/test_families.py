"""Every supported MoE family against transformers' own implementation: a tiny checkpoint with
random weights is built here from the family's config class (norm weights and biases moved away
from their initial 1 and 0, so an ignored tensor fails), saved with save_pretrained, converted by
colibri, and run on the same tokens.  Each config turns on what its family adds to Mixtral: dense
and MoE layers, sliding windows, shared experts, biases, QK-norm, multipliers."""
import os
import re
import subprocess
import warnings
from collections import Counter, defaultdict

import numpy as np
import pytest

import colibri
from colibri.convert import ConvertError, convert
from colibri.targets import TARGETS, env_for, infer_binary
from support import COMMON, FAMILIES, build, hf_logits, prompt_logits, require_reference

torch, transformers = require_reference()

N_TOKENS = 24
N_GREEDY = 12
# Out of scope here: families whose non-MoE layers are not attention; each needs its primitive.
NOT_YET = {
    "jamba, granitemoehybrid, nemotron_h": ("Jamba, Granite-4.0-H, Nemotron-H", "Mamba (selective state space) layers"),
    "qwen3_next, qwen3_5_moe": ("Qwen3-Next", "Gated DeltaNet (linear attention) layers"),
    "minimax": ("MiniMax-Text-01", "lightning (linear) attention layers"),
}
STRICT_TARGETS = [t for t in TARGETS if t != "native"] + ["sanitize"]
# What the README's table reports for each family: these tests, each run on every family.
TABLE_TESTS = {("test_logits_match_transformers", None), ("test_greedy_tokens_match_transformers", None),
               ("test_kv_cache_decode_equals_recompute", None)} | \
    {("test_strict_mode_is_bit_identical_on_every_target", t) for t in STRICT_TARGETS}
RAN = defaultdict(set)        # family -> the TABLE_TESTS that ran on it, passed or not
RESULTS = defaultdict(dict)   # family -> what passed


@pytest.fixture(autouse=True)
def record_run(request):
    params = getattr(request.node, "callspec", None)
    params = params.params if params else {}
    if params.get("family") in FAMILIES:
        RAN[params["family"]].add((request.node.originalname, params.get("target")))


@pytest.fixture(scope="module", autouse=True)
def family_table():
    """With $COLIBRI_FAMILY_TABLE set, writes the README's family table from this run's results,
    once every family ran every test the table reports (passed or not); a run that selected fewer
    (-k, -x) writes nothing rather than report what it did not run as failing."""
    yield
    path = os.environ.get("COLIBRI_FAMILY_TABLE")
    if not path:
        return
    unrun = {name: len(TABLE_TESTS - RAN[name]) for name in FAMILIES if TABLE_TESTS - RAN[name]}
    if unrun:
        warnings.warn(f"COLIBRI_FAMILY_TABLE: {path} not written; tests that did not run, by family: {unrun}")
        return
    version = ".".join(transformers.__version__.split(".")[:2])
    rows = [f"| family (model_type) | real models | status | verified against transformers {version} (f32, tiny random checkpoint) |",
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


@pytest.mark.parametrize("target", STRICT_TARGETS)
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

"""The bundled Shakespeare model (colibri/demo/shakespeare, trained by
colibri/demo/train_shakespeare.py): it ships with the package, validates, matches transformers
on its own Hugging Face checkpoint (tests/fixtures/shakespeare-hf), generates reproducible
text, and its experts all carry load."""
import json
import subprocess
import sys

import numpy as np
import pytest

import colibri
from colibri.demo import MODEL_DIR
from support import FIXTURES, hf_model, require_reference

HF_DIR = FIXTURES / "shakespeare-hf"


@pytest.fixture(scope="module")
def model():
    return colibri.Model(MODEL_DIR, verify=True)


@pytest.fixture(scope="module")
def reference():
    with np.load(HF_DIR / "reference.npz") as z:
        return {k: z[k] for k in z.files}


def test_ships_inside_the_installed_package(model):
    import colibri.demo

    assert "site-packages" in str(colibri.demo.MODEL_DIR) or "dist-packages" in str(colibri.demo.MODEL_DIR)
    cfg = model.config
    assert (cfg["num_experts"], cfg["top_k"], cfg["max_position_embeddings"]) == (8, 2, 256)
    params = sum(int(np.prod(t["shape"])) for t in model.tensors() if t["dtype"] == "f16")
    assert 1_000_000 <= params <= 4_000_000
    assert model.token_bytes(model.tokenizer.token_to_id("the")) == b"the"


def test_logits_match_transformers(model, reference):
    """Real text, a trained model, meaningful routing: the foundation's parity bar."""
    s = model.session(ctx=256)
    logits = s.forward(reference["tokens"])
    print(f"bundled model: max |colibri - transformers| = {np.abs(logits - reference['logits']).max():.2e}")
    np.testing.assert_allclose(logits, reference["logits"], atol=1e-4, rtol=0)
    s.reset()
    greedy = s.generate(reference["tokens"][:16], max_tokens=len(reference["greedy"]), temperature=0.0,
                        stop_at_eos=False)
    assert greedy == list(reference["greedy"])


def float64_hidden_state(hf, tokens):
    """float64 [T, D]: the normed last hidden state of `hf` computed in float64 throughout: the
    experts through the per-expert loop (which float64 needs) and RoPE's cos and sin, which
    transformers takes in float32 whatever the model's dtype, from float64 angles."""
    torch, _ = require_reference()
    hf.to(torch.float64)
    hf.config._experts_implementation_internal = "eager"
    hd, theta = 2 * hf.model.rotary_emb.inv_freq.numel(), hf.config.rope_parameters["rope_theta"]
    inv_freq = theta ** -(torch.arange(0, hd, 2, dtype=torch.float64) / hd)

    def rope(x, position_ids):
        angles = position_ids[..., None].double() * inv_freq
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    hf.model.rotary_emb.forward = rope
    with torch.no_grad():
        out = hf(torch.from_numpy(tokens.astype(np.int64))[None], output_hidden_states=True)
    return out.hidden_states[-1][0].numpy()


def test_reference_is_what_transformers_computes(reference):
    """The committed reference is recomputed from the committed checkpoint, so it cannot go stale:
    both are float32 runs of transformers, which may round in other orders (another CPU, ISA or
    thread count), and they differ by no more than that explains, logit by logit."""
    torch, _ = require_reference()
    hf = hf_model(HF_DIR)
    tokens = reference["tokens"]
    with torch.no_grad():
        out = hf(torch.from_numpy(tokens.astype(np.int64))[None], output_hidden_states=True)
    logits, h32 = out.logits[0].numpy(), out.hidden_states[-1][0].double().numpy()
    W = hf.lm_head.weight.detach().double().numpy()   # [V, D], the tied embedding
    # Each logit is W[v] . h[t], D = 128 terms (h[t] the normed last hidden state).  Two runs differ in it by
    # - the head's own rounding: a float32 dot product of n terms, summed in any order, is within
    #   gamma_n sum |terms| of the exact one, gamma_n = n u / (1 - n u), u = 2^-24 (Higham, Accuracy and Stability
    #   of Numerical Algorithms, 3.1), so two runs from the same h are within 2 gamma_D sum_d |W[v, d] h[t, d]|;
    # - W[v] . (h_a[t] - h_b[t]), the rounding of the four layers below, at most ||W[v]||_1 max_d |h_a - h_b|[t, d].
    #   That bound derived through attention and routing is orders of magnitude too loose (in the first layer
    #   already wider than a router's top-2 margin), so the drift of h is measured: this run's h against
    #   transformers' in float64, once for each run (the committed one rounded the same sums in float32 too).
    # On x86-64 with AVX-512 and with AVX2 only the runs differ by at most 1/30 of the sum.
    D = W.shape[1]
    gamma = D * 2.0 ** -24 / (1 - D * 2.0 ** -24)
    drift = 2 * np.abs(h32 - float64_hidden_state(hf, tokens)).max(axis=1, keepdims=True)   # [T, 1]
    bound = 2 * gamma * (np.abs(h32) @ np.abs(W).T) + drift * np.abs(W).sum(axis=1)
    diff = np.abs(logits - reference["logits"])
    print(f"bundled model: max |transformers here - committed| = {diff.max():.2e}, "
          f"at most {(diff / bound).max():.3f} of what float32 rounding explains")
    assert (diff <= bound).all(), f"{np.count_nonzero(diff > bound)} logits beyond float32 rounding"


def test_colibri_format_is_the_checkpoint_converted(tmp_path):
    from colibri.convert import convert

    out = convert(HF_DIR, tmp_path / "m", dtype="f16", progress=False)
    assert (out / "weights.bin").read_bytes() == (MODEL_DIR / "weights.bin").read_bytes()


def run_colibri(*args):
    return subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True, text=True, check=True,
                          cwd="/").stdout


def test_generate_out_of_the_box_is_reproducible():
    a = run_colibri("generate", "--prompt", "ROMEO:", "--max-tokens", "48", "--seed", "7")
    b = run_colibri("generate", "--prompt", "ROMEO:", "--max-tokens", "48", "--seed", "7")
    c = run_colibri("generate", "--prompt", "ROMEO:", "--max-tokens", "48", "--seed", "8")
    assert a == b and a != c
    assert a.startswith("ROMEO:") and len(a) > 60


def test_c_cli_prints_the_same_text(model):
    """colibri-infer decodes ids to bytes in C; greedy, it writes what the Python CLI writes."""
    py = run_colibri("generate", "--prompt", "JULIET:", "--max-tokens", "40", "--temperature", "0")
    ids = model.tokenizer.encode("JULIET:").ids
    c = subprocess.run(["colibri-infer", "--model", str(MODEL_DIR), "--tokens", ",".join(map(str, ids)),
                        "--max_tokens", "40", "--temperature", "0"], capture_output=True, check=True).stdout
    assert c.decode("utf-8") == py


def test_every_expert_carries_load(model):
    report = json.loads((MODEL_DIR / "training.json").read_text())
    share = np.array(report["validation"]["expert_share_per_layer"])
    assert share.shape == (model.config["num_layers"], 8)
    assert (share > 0.02).all() and (share < 0.5).all(), share   # none dead, none taking everything
    out = run_colibri("stats")
    assert "share of routed tokens per expert" in out and "unigram baseline" in out


def test_stats_on_a_text_runs_in_the_core(tmp_path, model):
    text = tmp_path / "t.txt"
    text.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n" * 8)
    out = run_colibri("stats", "--text", str(text))
    assert "loss" in out and "share of routed tokens per expert (top-2 of 8)" in out

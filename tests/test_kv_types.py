"""KV cache types (Session's kv_type): f32, f16 and q8_0 keys and values.

The plan counts each type's bytes exactly; an f16 or q8_0 session's logits are those of a float64
numpy forward pass whose keys and values are rounded the same way (numpy's float16, and a numpy
q8_0 quantizer written from llama.cpp's quantize_row_q8_0); a bad type and a q8_0 cache over heads
of no multiple of 32 are refused; the command lines take --kv-type."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import colibri
from colibri.demo import MODEL_DIR
from support import COMMON, FAMILIES, FIXTURES, build

KV_TYPES = ("f32", "f16", "q8_0")


@pytest.fixture(scope="module")
def model():
    return colibri.Model(MODEL_DIR)


@pytest.fixture(scope="module")
def tokens():
    with np.load(FIXTURES / "shakespeare-hf" / "reference.npz") as z:
        return z["tokens"]


def row_bytes(kv_type, width):
    """Bytes of one cached position's keys (or values): f32 4, f16 2, q8_0 34 a block of 32."""
    return {"f32": 4 * width, "f16": 2 * width, "q8_0": width // 32 * 34}[kv_type]


# --------------------------------------------------------------------------------- numpy reference

def q8_0_round_trip(x):
    """x (..., n) float32 through llama.cpp's quantize_row_q8_0 and back: per block of 32,
    d = max|x| / 127 (float32), q = roundf(x * (1 / d)) (halves away from zero), stored d as f16."""
    blocks = x.astype(np.float32).reshape(*x.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(-1, keepdims=True)
    d = amax / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    scaled = (blocks * inv).astype(np.float64)
    q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)
    return (q * d.astype(np.float16).astype(np.float64)).reshape(x.shape)


ROUND = {"f32": lambda x: x,
         "f16": lambda x: x.astype(np.float32).astype(np.float16).astype(np.float64),
         "q8_0": q8_0_round_trip}


def read_weights(path):
    """{name: float64 array} of a colibri model directory's f16/f32 tensors."""
    doc = json.loads((path / "colibri_model.json").read_text())
    blob = (path / "weights.bin").read_bytes()
    out = {}
    for t in doc["tensors"]:
        if t["dtype"] in ("f16", "f32"):
            raw = blob[t["file_offset"]:t["file_offset"] + t["file_size"]]
            dtype = {"f16": "<f2", "f32": "<f4"}[t["dtype"]]
            out[t["name"]] = np.frombuffer(raw, dtype).astype(np.float64).reshape(t["shape"])
    return doc, out


def numpy_logits(path, tokens, kv_type):
    """Logits (T, V) of a Mixtral-format model in float64, each layer's keys (after RoPE) and values
    rounded as a `kv_type` cache stores them."""
    doc, w = read_weights(path)
    hp, top_k = doc["hparams"], doc["routing"]["top_k"]
    H, KV, hd, eps = hp["num_heads"], hp["num_kv_heads"], hp["head_dim"], hp["rms_norm_eps"]
    T, rnd = len(tokens), ROUND[kv_type]

    def rms(x, g):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g

    def softmax(s):
        e = np.exp(s - s.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    ang = np.arange(T)[:, None] * hp["rope_theta"] ** (-np.arange(0, hd, 2) / hd)
    cos, sin = np.cos(np.concatenate([ang, ang], -1))[:, None], np.sin(np.concatenate([ang, ang], -1))[:, None]

    def rope(x):   # (T, heads, hd): pairs j, j + hd/2
        return x * cos + np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin

    causal = np.arange(T)[None, :] <= np.arange(T)[:, None]
    x = w["tok_embeddings"][tokens]
    for i in range(hp["num_layers"]):
        L = lambda n: w[f"layers.{i}.{n}"]  # noqa: E731
        h = rms(x, L("attn_norm"))
        q = rope((h @ L("attn.wq").T).reshape(T, H, hd))
        k, v = rope((h @ L("attn.wk").T).reshape(T, KV, hd)).reshape(T, KV * hd), h @ L("attn.wv").T
        k, v = rnd(k).reshape(T, KV, hd), rnd(v).reshape(T, KV, hd)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        s = np.where(causal, np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd), -np.inf)
        x = x + np.einsum("hqk,khd->qhd", softmax(s), v).reshape(T, H * hd) @ L("attn.wo").T
        h = rms(x, L("ffn_norm"))
        probs = softmax(h @ L("router").T)
        moe = np.zeros_like(x)
        for t in range(T):
            top = np.argsort(-probs[t])[:top_k]
            for e, g in zip(top, probs[t, top] / probs[t, top].sum()):
                a = h[t] @ L("experts.w1")[e].T
                moe[t] += g * (L("experts.w2")[e] @ (a / (1 + np.exp(-a)) * (h[t] @ L("experts.w3")[e].T)))
        x = x + moe
    head = w["tok_embeddings"] if hp["tie_word_embeddings"] else w["lm_head"]
    return rms(x, w["norm"]) @ head.T


# ------------------------------------------------------------------------------------------- tests

@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_plan_counts_the_types_bytes_exactly(model, kv_type):
    """Each attention layer's keys and values: n_ctx rows of the type's bytes; an f16 or q8_0
    session also holds the new positions' f32 rows (2, n_batch, kv width) before it stores them.
    The plan is the arena the session uses, byte for byte."""
    cfg, ctx, batch = model.config, 256, 64
    width = cfg["num_kv_heads"] * cfg["head_dim"]
    s, base = model.session(ctx=ctx, batch=batch, kv_type=kv_type), model.session(ctx=ctx, batch=batch)
    mem, mem32 = s.memory(), base.memory()
    assert model.memory_plan(ctx, batch, kv_type=kv_type) == mem["arena_used"]
    assert mem32["kv_cache"] - mem["kv_cache"] == 2 * cfg["num_layers"] * ctx * (row_bytes("f32", width) - row_bytes(kv_type, width))
    assert mem["activations"] - mem32["activations"] == (0 if kv_type == "f32" else 2 * batch * width * 4)
    report = s.memdump()
    assert f"kv cache {kv_type}" in report
    assert f"layers.0.k                  (n_seq * n_ctx, n_kv_heads * head_dim) {kv_type}" in report
    assert f"{ctx * row_bytes(kv_type, width):,} B" in report


def test_logits_match_numpy_with_the_same_rounding(model, tokens):
    """f16 and q8_0 sessions against the float64 forward pass that rounds its keys and values the
    same way.  The budget is the f32 session's own distance from the float64 forward pass (its
    float32 summation) times 4: the typed sessions add the same float32 arithmetic and one rounding
    of values the oracle rounds too; the rounding itself moves the logits far more than that
    (checked: the test can fail).

    The reference kernels, which compute the same bits on every machine (the SIMD variants' typed
    caches are tested against them in c_core/tests/test_kernels.c), over the text's first 16
    positions.  Float32's error can round a value lying within it of a rounding boundary the other
    way from the float64 oracle, and one value rounded the other way moves the logits by about 1e-3:
    over these positions none is; further into this text one f16 key is (position 17)."""
    tokens = tokens[:16]
    exact = {kv: numpy_logits(MODEL_DIR, tokens, kv) for kv in KV_TYPES}
    got = {kv: model.session(ctx=256, kernels="reference", kv_type=kv).forward(tokens) for kv in KV_TYPES}
    budget = 4 * np.abs(got["f32"] - exact["f32"]).max()
    for kv in ("f16", "q8_0"):
        err = np.abs(got[kv] - exact[kv]).max()
        moved = np.abs(exact[kv] - exact["f32"]).max()
        print(f"{kv}: max |colibri - numpy| {err:.2e} (budget {budget:.2e}); the rounding moves the logits by {moved:.2e}")
        assert err <= budget, (kv, err, budget)
        assert moved > 10 * budget, (kv, moved, budget)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_decodes_through_an_f16_cache_as_it_prefills(family, tmp_path):
    """Position by position through an f16 cache: the logits of one forward over the whole
    sequence, bit for bit (the reference kernels), in every family (sliding windows, chunked
    attention, sinks, QK-norms, biases, clamps).  Latent attention's cache and the short
    convolution's inputs stay f32: a latent-attention family's logits are the f32 cache's."""
    from colibri.convert import convert

    build(family).save_pretrained(tmp_path / "hf")
    m = colibri.Model(convert(tmp_path / "hf", tmp_path / "colibri", dtype="f32", progress=False))
    tokens = np.random.default_rng(1).integers(0, COMMON["vocab_size"], 24).astype(np.int32)
    full = m.session(ctx=64, kernels="reference", kv_type="f16").forward(tokens)
    s = m.session(ctx=64, kernels="reference", kv_type="f16", batch=1)
    np.testing.assert_array_equal(np.concatenate([s.forward(tokens[i:i + 1]) for i in range(len(tokens))]), full)
    f32 = m.session(ctx=64, kernels="reference").forward(tokens)
    latent = ".latent " in s.memdump()   # the memory report's latent caches
    assert np.array_equal(full, f32) == latent


def test_bad_kv_type_is_refused(model):
    with pytest.raises(ValueError, match="kv_type must be one of f32, f16, q8_0, not 'q4_0'"):
        model.session(kv_type="q4_0")
    with pytest.raises(ValueError, match="kv_type"):
        model.memory_plan(64, kv_type="bf16")


def test_q8_0_needs_heads_of_whole_blocks():
    """tiny-mixtral's heads are 16 wide: a q8_0 cache is refused by the core, naming head_dim."""
    tiny = colibri.Model(FIXTURES / "tiny-mixtral.colibri")
    assert tiny.config["head_dim"] % 32
    with pytest.raises(colibri.Error, match="head_dim = 16 is no multiple of 32"):
        tiny.session(kv_type="q8_0")
    with pytest.raises(colibri.Error, match="head_dim = 16"):
        tiny.memory_plan(64, kv_type="q8_0")
    tiny.session(kv_type="f16").forward([1, 2, 3])


def cli(*args):
    return subprocess.run([sys.executable, "-m", "colibri", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kv_type", KV_TYPES)
def test_cli_kv_type(model, kv_type, tokens):
    """colibri generate --kv-type prints the greedy tokens of a session of that type; memdump names it."""
    ids = ",".join(map(str, tokens[:16]))
    r = cli("generate", "--tokens", ids, "--max-tokens", "8", "--temperature", "0", "--ignore-eos", "--kv-type", kv_type)
    assert r.returncode == 0, r.stderr
    want = model.session(ctx=256, kv_type=kv_type).generate(list(tokens[:16]), max_tokens=8, temperature=0.0,
                                                            stop_at_eos=False)
    assert [int(t) for t in r.stdout.strip().split(",")] == want
    r = cli("memdump", "--ctx", "128", "--kv-type", kv_type)
    assert r.returncode == 0 and f"kv cache {kv_type}" in r.stdout
    r = cli("chat", "--help")
    assert "--kv-type" in r.stdout


def test_cli_refuses_a_bad_kv_type():
    r = cli("generate", "--prompt", "x", "--kv-type", "q4_0")
    assert r.returncode == 2 and "--kv-type: 'q4_0' is not one of f32, f16, q8_0" in r.stderr


def test_firmware_plan_and_image_take_the_kv_type(model):
    """colibri firmware plan --kv-type: the board's arena is the core's plan of that session
    (test_plan_counts_the_types_bytes_exactly checks that plan); the q8_0 image generates, under QEMU, the text the host's
    reference kernels generate with a q8_0 cache."""
    from colibri.targets import firmware as fw

    ctx, batch = 256, 16
    plans = {kv: fw.plan("mps2-an386", MODEL_DIR, ctx=ctx, batch=batch, kv_type=kv) for kv in KV_TYPES}
    for kv, p in plans.items():
        assert p.arena == -(-model.memory_plan(ctx, batch, kv_type=kv) // 64) * 64
        assert (f"kv cache {kv}" in p.table().splitlines()[0]) == (kv != "f32")
    r = cli("firmware", "plan", "--board", "mps2-an386", "--kv-type", "f16")
    assert r.returncode == 0 and f"  {'session arena':<34}{plans['f16'].arena:>12,}\n" in r.stdout
    args = ["--prompt", "ROMEO:", "--max-tokens", "12", "--temperature", "0", "--kv-type", "q8_0"]
    board = cli("firmware", "run", "--board", "mps2-an386", *args)
    assert board.returncode == 0, board.stderr
    host = subprocess.run([sys.executable, "-m", "colibri", "generate", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLIBRI_KERNELS": "reference"})
    assert host.returncode == 0 and board.stdout == host.stdout


@pytest.mark.parametrize("kv_type", ("f16", "q8_0"))
def test_typed_cache_with_several_sequences(model, tokens, kv_type):
    """Slots of a typed cache: two sequences in one forward, and a third copied from the first then
    continued, each bit for bit the one-sequence session's logits (the reference kernels)."""
    a, b, more = list(tokens[:12]), list(tokens[20:29]), list(tokens[40:44])

    def alone(ids):
        return model.session(ctx=64, kernels="reference", kv_type=kv_type).forward(ids)[-1]

    s = model.session(ctx=64, n_seq=3, kernels="reference", kv_type=kv_type)
    s.forward_batch([(0, a, True), (1, b, True)])
    np.testing.assert_array_equal(s.seq_logits(0), alone(a))
    np.testing.assert_array_equal(s.seq_logits(1), alone(b))
    s.seq_copy(0, 2)
    s.forward_batch([(2, more, True), (1, more, True)])
    np.testing.assert_array_equal(s.seq_logits(2), alone(a + more))
    np.testing.assert_array_equal(s.seq_logits(1), alone(b + more))

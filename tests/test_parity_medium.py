"""Parity on a Mixtral-shaped model of realistic vocabulary (32000) and width, built here with
transformers: a 100-token prefill in several chunks, KV-cache decoding, and a bf16 checkpoint
(what real Mixtral checkpoints are) converted as bf16.

At this size float32 rounding alone moves logits by ~5e-5 (transformers' own float32 forward
differs that much from its float64 one), so the reference is transformers in float64 on the same
weights, and colibri must be at least about as accurate as transformers' float32 forward."""
import numpy as np
import pytest

import colibri
from colibri.convert import convert
from support import load_make_fixtures, require_reference

torch, _ = require_reference()

CONFIG = dict(vocab_size=32000, hidden_size=256, intermediate_size=640, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
              max_position_embeddings=1024, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 1e6})
N_TOKENS = 100


def _logits(model, tokens, dtype):
    """transformers' logits in `dtype` arithmetic (experts through the plain per-expert loop, which
    float64 needs)."""
    model = model.to(dtype)
    model.config._experts_implementation_internal = "eager"
    with torch.no_grad():
        return model(torch.from_numpy(tokens.astype(np.int64))[None]).logits[0].double().numpy()


@pytest.fixture(scope="module")
def medium(tmp_path_factory):
    mf = load_make_fixtures()
    model = mf.build_model(CONFIG, seed=3)
    tokens = np.random.default_rng(3).integers(0, CONFIG["vocab_size"], N_TOKENS).astype(np.int32)
    root = tmp_path_factory.mktemp("medium")
    model.save_pretrained(root / "hf-f32")
    model.to(torch.bfloat16).save_pretrained(root / "hf-bf16")
    ref = {}
    for name, weights in (("f32", mf.build_model(CONFIG, seed=3)),
                          ("bf16", mf.rounded_copy(mf.build_model(CONFIG, seed=3), torch.bfloat16))):
        ref[name] = {"f64": _logits(weights, tokens, torch.float64),
                     "f32": _logits(weights, tokens, torch.float32)}
    out = {"f32": convert(root / "hf-f32", root / "f32", dtype="f32", progress=False),
           "bf16": convert(root / "hf-bf16", root / "bf16", dtype="bf16", progress=False)}
    return tokens, ref, out


def check(logits, ref, label):
    ours = np.abs(logits - ref["f64"]).max()
    theirs = np.abs(ref["f32"] - ref["f64"]).max()
    print(f"{label}: max |colibri - float64| = {ours:.2e}, max |transformers float32 - float64| = {theirs:.2e}, "
          f"max |colibri - transformers float32| = {np.abs(logits - ref['f32']).max():.2e}")
    assert ours <= 1.5 * theirs, (ours, theirs)
    assert (logits.argmax(-1) == ref["f64"].argmax(-1)).all()


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_prefill_in_chunks_matches_transformers(medium, dtype):
    tokens, ref, out = medium
    s = colibri.Model(out[dtype], verify=True).session(ctx=128, batch=32)   # chunks of 32, 32, 32, 4
    check(s.forward(tokens), ref[dtype], f"medium {dtype}")


def test_kv_cache_decoding_matches_transformers(medium):
    tokens, ref, out = medium
    s = colibri.Model(out["f32"]).session(ctx=128)
    rows = [s.forward(tokens[:60])]
    rows += [s.forward(tokens[i:i + 1]) for i in range(60, N_TOKENS)]
    check(np.concatenate(rows), ref["f32"], "medium f32, 60-token prefill + 40 decode steps")

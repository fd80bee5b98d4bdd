"""Per-expert load counted by the core's router against transformers' own routing decisions."""
import numpy as np
import pytest

import colibri
from conftest import FIXTURES, HF_MODELS, require_reference


@pytest.mark.parametrize("name", HF_MODELS)
def test_expert_load_matches_transformers_routing(converted, references, name):
    torch, transformers = require_reference()
    tokens = references[name]["tokens"]
    hf = transformers.MixtralForCausalLM.from_pretrained(FIXTURES / name).eval()
    with torch.no_grad():
        out = hf(torch.from_numpy(tokens.astype(np.int64))[None], output_router_logits=True)
    k, E = hf.config.num_experts_per_tok, hf.config.num_local_experts
    want = np.stack([np.bincount(logits.topk(k, dim=-1).indices.reshape(-1).numpy(), minlength=E)
                     for logits in out.router_logits])

    s = colibri.Model(converted[(name, "f32")]).session(ctx=64, batch=7)
    s.forward(tokens)
    np.testing.assert_array_equal(s.expert_load(), want)
    assert (s.expert_load().sum(axis=1) == len(tokens) * k).all()


def test_counts_survive_reset_until_cleared(converted):
    s = colibri.Model(converted[("tiny-mixtral", "f32")]).session(ctx=16)
    s.forward([1, 2, 3, 4])
    s.reset()
    s.forward([5, 6])
    load = s.expert_load(clear=True)
    assert load.sum() == 6 * 2 * 2            # 6 tokens, 2 layers, top-2
    assert s.expert_load().sum() == 0

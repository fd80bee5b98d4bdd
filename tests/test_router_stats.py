"""Per-expert load counted by the core's router against transformers' own routing decisions."""
import numpy as np
import pytest

import colibri
from support import HF_MODELS, transformers_expert_load


@pytest.mark.parametrize("name", HF_MODELS)
def test_expert_load_matches_transformers_routing(converted, references, name):
    tokens = references[name]["tokens"]
    want = transformers_expert_load(name, tokens)
    k = colibri.Model(converted[(name, "f32")]).config["top_k"]

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

"""Threads share a big matmul's rows (one token) or tokens (several), or in decode the routed experts
(each whole on one thread, added in id order); each output is computed by the same kernel calls as
with one thread, so any thread count gives the same bits."""
import numpy as np
import pytest

import colibri
from colibri.convert import convert
from support import load_make_fixtures
from test_interleaved import to_x8

CONFIG = dict(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
              tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6})


@pytest.fixture(scope="module", params=["f32", "q4_0", "q4_0x8"])
def model(tmp_path_factory, request):
    """lm_head is 4096 x 128: above the size where a matmul is shared.  q4_0: the int8 path;
    q4_0x8: its rows split among the threads by whole groups of 8."""
    root = tmp_path_factory.mktemp("threads")
    load_make_fixtures().build_model(CONFIG, seed=2).save_pretrained(root / "hf")
    out = convert(root / "hf", root / "colibri", dtype=request.param.replace("x8", ""), progress=False, repack=False)
    if request.param.endswith("x8"):
        assert to_x8(root / "colibri", "q4_0")
    return out


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_any_thread_count_gives_the_same_bits(model, kernels):
    tokens = np.random.default_rng(8).integers(0, CONFIG["vocab_size"], 40)

    def run(threads):
        s = colibri.Model(model, threads=threads).session(ctx=64, batch=16, kernels=kernels)
        prefill = s.forward(tokens[:32])
        decode = np.concatenate([s.forward(tokens[i:i + 1]) for i in range(32, 40)])
        s.reset()
        return prefill, decode, s.generate(list(tokens[:4]), max_tokens=8, temperature=0.0, stop_at_eos=False)

    one = run(1)
    for threads in (2, 3, 7):
        other = run(threads)
        assert np.array_equal(one[0], other[0]) and np.array_equal(one[1], other[1]) and one[2] == other[2], threads


def test_thread_counts_are_checked(model):
    with pytest.raises(ValueError, match=r"threads must lie in \[0, 256\]"):
        colibri.Model(model, threads=-1)
    with pytest.raises(ValueError, match=r"threads must lie in \[0, 256\].*300"):
        colibri.Model(model, threads=300)

"""The research routers (colibri_session_options.routing): each does what it states, and none is on
unless a session asks for it, since each changes what the model computes."""
import numpy as np
import pytest

import colibri
from support import FIXTURES

TOKENS = np.array([1, 5, 9, 200, 17, 3, 3, 88, 140, 7, 61, 2, 33, 90, 12, 45, 7, 7, 301, 8], dtype=np.int32)


@pytest.fixture(scope="module")
def model():
    return colibri.Model(FIXTURES / "tiny-mixtral.colibri")


def logits(model, tokens=TOKENS, **routing):
    return model.session(ctx=64, kernels="reference", **routing).forward(tokens)


def test_the_models_own_router_unless_asked(model):
    default = logits(model)
    assert np.array_equal(default, logits(model, routing="model"))
    for other in (dict(routing="noisy"), dict(routing="hash"), dict(routing="capacity", capacity_factor=0.25)):
        assert not np.allclose(default, logits(model, **other), atol=1e-3), other


def test_noisy_routing_is_seeded_and_zero_noise_is_the_model(model):
    a = logits(model, routing="noisy", noise=0.5, noise_seed=7)
    assert np.array_equal(a, logits(model, routing="noisy", noise=0.5, noise_seed=7))
    assert not np.array_equal(a, logits(model, routing="noisy", noise=0.5, noise_seed=8))
    assert np.array_equal(logits(model, routing="noisy", noise=0.0, noise_seed=7), logits(model))
    # the noise belongs to (seed, layer, position, expert): the same token by token as in one chunk
    s = model.session(ctx=64, kernels="reference", routing="noisy", noise=0.5, noise_seed=7)
    stepped = np.concatenate([s.forward(TOKENS[i:i + 1]) for i in range(len(TOKENS))])
    assert np.array_equal(stepped, a)


def test_hash_routing_sends_a_token_to_fixed_experts(model):
    hp = model.config
    E, K = hp["num_experts"], hp["top_k"]
    s = model.session(ctx=64, routing="hash")
    s.forward(TOKENS)
    first = (TOKENS.astype(np.uint64) * np.uint64(2654435761) % np.uint64(2 ** 32)) % np.uint64(E)
    ids = (first[:, None] + np.arange(K, dtype=np.uint64)[None, :]) % np.uint64(E)
    expected = np.bincount(ids.reshape(-1).astype(np.int64), minlength=E)
    assert (s.expert_load() == expected).all()   # every layer: the same experts, whatever the hidden state


def test_capacity_drops_what_an_expert_cannot_take(model):
    hp = model.config
    E, K, n = hp["num_experts"], hp["top_k"], len(TOKENS)
    roomy = model.session(ctx=64, kernels="reference", routing="capacity", capacity_factor=float(E))
    assert np.array_equal(roomy.forward(TOKENS), logits(model)) and roomy.expert_dropped().sum() == 0

    s = model.session(ctx=64, routing="capacity", capacity_factor=0.5)   # one chunk of n tokens
    s.forward(TOKENS)
    capacity = int(np.ceil(0.5 * n * K / E))
    kept, dropped = s.expert_load(), s.expert_dropped()
    assert (kept <= capacity).all() and dropped.sum() > 0
    assert ((kept + dropped).sum(axis=1) == n * K).all()   # every routed pair either kept or dropped
    assert ((dropped > 0) <= (kept == capacity)).all()     # only full experts drop


@pytest.mark.parametrize("options, message", [
    (dict(routing="capacity", capacity_factor=0.0), "capacity_factor"),
    (dict(routing="noisy", noise=-1.0), "routing_noise"),
])
def test_bad_research_options_are_refused(model, options, message):
    with pytest.raises(colibri.Error, match=message):
        model.session(ctx=16, **options)
    with pytest.raises(ValueError, match="routing must be one of"):
        model.session(ctx=16, routing="random")


@pytest.mark.parametrize("flags, routing", [
    ([], dict()),
    (["--routing", "hash"], dict(routing="hash")),
    (["--routing", "noisy", "--routing_noise", "0.5", "--routing_seed", "7"], dict(routing="noisy", noise=0.5, noise_seed=7)),
    (["--routing", "capacity", "--capacity_factor", "0.5"], dict(routing="capacity", capacity_factor=0.5)),
])
def test_the_c_cli_asks_for_the_same_routers(model, flags, routing):
    import subprocess

    from colibri.targets import infer_command

    out = subprocess.run([*infer_command("native"), "--model", str(FIXTURES / "tiny-mixtral.colibri"), "--tokens",
                          ",".join(map(str, TOKENS)), "--max_tokens", "8", "--temperature", "0", "--ids",
                          "--ignore_eos", *flags], capture_output=True, text=True, check=True).stdout
    ours = model.session(ctx=64, **routing).generate(TOKENS, max_tokens=8, temperature=0.0, stop_at_eos=False)
    assert [int(t) for t in out.split(",")] == ours

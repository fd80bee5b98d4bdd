"""Expert streaming computes what the resident session computes, bit for bit: every family with routed
experts, in both weight layouts, with the experts read into a cache of slots at every budget from the
smallest a session accepts to one holding them all, one pool or a share per layer, guesses on and
off, on 1 and 3 threads.  The reference is the same model with its experts resident (the same
kernels); that session is itself checked against transformers by test_families.py.  Then what a bad
weights file does to a streaming session: a clear error, the session usable afterwards."""
import os
import re

import numpy as np
import pytest

import colibri
from colibri.convert import convert
from support import FAMILIES, build

N_PROMPT, N_DECODE = 10, 6


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_models(request, tmp_path_factory):
    """The family's tiny model, converted stacked and interleaved."""
    root = tmp_path_factory.mktemp(request.param)
    build(request.param, seed=3).save_pretrained(root / "hf")
    return {layout: convert(root / "hf", root / layout, progress=False, layout=layout)
            for layout in ("stacked", "interleaved")}


def run(path, threads, **options):
    """The prompt's logits in chunks of 4 (prefill), then greedy decode steps' (one token each)."""
    model = colibri.Model(path, threads=threads)
    s = model.session(ctx=32, batch=4, **options)
    tokens = list(np.random.default_rng(5).integers(0, model.config["vocab_size"], N_PROMPT))
    logits = [s.forward(tokens)]
    for _ in range(N_DECODE):
        tokens = [int(np.argmax(logits[-1][-1]))]
        logits.append(s.forward(tokens))
    stats = s.expert_cache_stats() if options.get("expert_budget") else None
    return np.concatenate(logits), stats


def budgets(model, scope):
    """From the minimum (one layer's top_k slots, each MoE layer's with a per-layer cache) to every expert."""
    slot, least = model.expert_slots(expert_cache=scope)
    layers = least // slot // model.config["top_k"]
    every = slot * model.config["num_experts"] * (model.config["num_layers"] if scope == "global" else layers)
    return sorted({least, least + slot * layers, 2 * least, every})


@pytest.mark.parametrize("layout", ["stacked", "interleaved"])
def test_streamed_logits_are_the_resident_logits(family_models, layout):
    path = family_models[layout]
    model = colibri.Model(path)
    for threads in (1, 3):
        resident, _ = run(path, threads)
        for scope in ("global", "per_layer"):
            for budget in budgets(model, scope):
                for prefetch in (False, True):
                    streamed, stats = run(path, threads, expert_budget=budget, expert_cache=scope, prefetch=prefetch)
                    where = f"{threads} threads, {scope} cache, budget {budget}, prefetch {prefetch}"
                    assert streamed.view(np.uint32).tobytes() == resident.view(np.uint32).tobytes(), where
                    assert stats["hits"] + stats["misses"] > 0 and stats["bytes_read"] > 0, where


def test_both_layouts_compute_the_same(family_models):
    stacked, _ = run(family_models["stacked"], 1)
    interleaved, _ = run(family_models["interleaved"], 1)
    assert np.array_equal(stacked.view(np.uint32), interleaved.view(np.uint32))


def test_a_budget_below_the_minimum_is_refused_naming_it(family_models):
    model = colibri.Model(family_models["interleaved"])
    slot, least = model.expert_slots()
    with pytest.raises(colibri.Error, match=f"at least {least} bytes"):
        model.session(ctx=16, expert_budget=least - 1)
    assert model.memory_plan(16, expert_budget=least) > model.memory_plan(16) + least


@pytest.fixture(scope="module")
def interleaved_mixtral(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-reads")
    build("mixtral", seed=4).save_pretrained(root / "hf")
    return convert(root / "hf", root / "colibri", progress=False, layout="interleaved")


def test_a_file_truncated_after_open_is_a_clear_error(interleaved_mixtral, tmp_path):
    """The interleaved layout writes the routed experts last: cutting weights.bin short after the
    model is open loses only experts, which the session reads with pread (the rest stays mapped).
    The call that needs a lost expert fails naming it and leaves the context as it was; with the
    bytes back, the same call gives the resident logits, and so does every call after it."""
    import shutil
    path = shutil.copytree(interleaved_mixtral, tmp_path / "m")
    model = colibri.Model(path)
    tokens = [int(t) for t in np.random.default_rng(6).integers(0, model.config["vocab_size"], 24)]
    resident = model.session(ctx=32)
    expected = [resident.forward([t]) for t in tokens]
    lost = resident.expert_load()[-1, -1]   # tokens that route to the expert cut short
    assert lost > 0
    slot, least = model.expert_slots()
    s = model.session(ctx=32, expert_budget=least, prefetch=False)
    weights = path / "weights.bin"
    tail = weights.read_bytes()[-slot // 2:]
    os.truncate(weights, weights.stat().st_size - len(tail))   # half of the last layer's last expert gone
    failed = 0
    for t, want in zip(tokens, expected):
        try:
            got = s.forward([t])
        except colibri.Error as e:
            assert e.status == "COLIBRI_E_IO"
            assert re.search(r"layer \d+ expert \d+: reading bytes \[\d+, \d+\) of weights.bin \(layers\.\d+\."
                             r"experts\.w1 and the expert's other tensors\) returned \d+ bytes: the file is shorter "
                             r"than its table says", str(e)), str(e)
            position = s.position
            with open(weights, "ab") as f:   # the bytes are back
                f.write(tail)
            got = s.forward([t])
            assert s.position == position + 1
            failed += 1
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert failed == 1   # the first token that routes to it; the bytes are back for the others

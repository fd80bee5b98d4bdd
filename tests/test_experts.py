"""colibri.experts: where experts lie, what a budget holds, which are hottest, each against a
reference outside the module: the format's rules read from colibri_model.json, a session's own
cache, numpy's sort."""
import json

import numpy as np
import pytest

import colibri
from colibri import experts
from colibri.demo import MODEL_DIR
from support import FIXTURES

MODELS = [FIXTURES / "tiny-mixtral.colibri", MODEL_DIR]


def format_expert_bytes(model_dir, layer, expert):
    """Expert `expert` of `layer` as docs/FORMAT.md lays it out, from the JSON alone: stacked,
    its slice of each of the layer's expert tensors in file order; interleaved, its extent."""
    doc = json.loads((model_dir / "colibri_model.json").read_text())
    data = (model_dir / "weights.bin").read_bytes()
    tensors = sorted((t for t in doc["tensors"] if t["name"].startswith(f"layers.{layer}.experts.")),
                     key=lambda t: t["file_offset"])
    if not tensors:
        return None
    if doc["experts"]["weight_layout"] == "interleaved":
        stride = tensors[0]["expert_stride"]
        return data[tensors[0]["file_offset"] + expert * stride:][:stride]
    part = [t["file_size"] // doc["experts"]["count"] for t in tensors]
    return b"".join(data[t["file_offset"] + expert * n:][:n] for t, n in zip(tensors, part))


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.name)
def test_layout_locates_each_experts_bytes_as_the_format_does(path):
    model = colibri.Model(path)
    data = (path / "weights.bin").read_bytes()
    cfg = model.config
    layout = experts.layout(model)
    assert experts.moe_layers(model) == sorted(layout)
    for layer in range(cfg["num_layers"]):
        for expert in (0, cfg["num_experts"] - 1):
            want = format_expert_bytes(path, layer, expert)
            if want is None:
                assert layer not in layout and model.expert_location(layer, expert) == []
                continue
            got = b"".join(data[o + expert * step:][:size] for o, size, step in layout[layer])
            assert got == want
            assert model.expert_location(layer, expert) == [(o + expert * step, size, step)
                                                            for o, size, step in layout[layer]]
    assert experts.tensor_names(model) == {t["name"] for t in model.tensors() if ".experts." in t["name"]}
    with pytest.raises(IndexError):
        model.expert_location(cfg["num_layers"], 0)
    with pytest.raises(IndexError):
        model.expert_location(0, cfg["num_experts"])


@pytest.mark.parametrize("cache", ["global", "per_layer"])
def test_slot_count_is_the_sessions_pool(cache):
    model = colibri.Model(MODEL_DIR)
    slot_bytes, least = model.expert_slots(expert_cache=cache)
    assert experts.routed_bytes(model, expert_cache=cache) == slot_bytes * experts.routed_count(model)
    for budget in (least, least + slot_bytes, least + 5 * slot_bytes - 1, 10 * least, 1 << 40):
        session = model.session(ctx=8, expert_budget=budget, expert_cache=cache)
        assert experts.slot_count(model, budget, expert_cache=cache) == session.expert_cache_stats()["slots"]
    with pytest.raises(colibri.Error, match="at least"):
        experts.slot_count(model, least - 1, expert_cache=cache)


def test_hottest_is_numpys_stable_descending_order():
    rng = np.random.default_rng(0)
    for _ in range(200):
        load = rng.integers(0, 4, size=(3, 5)) * (rng.random((3, 5)) < 0.6)
        count = int(rng.integers(0, 16))
        flat = load.reshape(-1)
        order = np.argsort(-flat, kind="stable")   # ties keep the lower id first
        assert experts.hottest(load, count) == [int(i) for i in order if flat[i] > 0][:count]
        assert experts.hottest({int(i): float(x) for i, x in enumerate(flat)}, count) == \
            experts.hottest(load, count)
        among = sorted(rng.choice(15, size=6, replace=False).tolist())
        assert experts.hottest(load, count, among=among) == [int(i) for i in order if i in among][:count]
        room, left, want = {0: 1, 2: 2}, {0: 1, 2: 2}, []   # at most one of layer 0, two of layer 2
        for i in order:
            if flat[i] > 0 and left.get(i // 5, 0) > 0 and len(want) < count:
                want.append(int(i))
                left[i // 5] -= 1
        assert experts.hottest(load, count, per_layer=room) == want

def test_ids_and_pairs_convert_both_ways():
    assert experts.ids([(0, 3), (2, 1)], 4) == [3, 9]
    assert experts.pairs([3, 9], 4) == [(0, 3), (2, 1)]

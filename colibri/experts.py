"""A model's routed experts: which layers have them, where each lies in weights.bin, how many a
cache budget holds, and which are the hottest under a budget.

The facts are the core's (colibri_expert_location, colibri_expert_slots, colibri_expert_slot_count),
asked through Model; nothing here recomputes them.  Experts are numbered one way: the id
``layer * n_experts + expert``, an expert's index in a flattened (n_layers, n_experts) load, as
heartbeats and placements carry it; ids() and pairs() convert to and from (layer, expert) pairs
(Session's pins).
"""
import json

from colibri.tokenizer import read_regular_text


def moe_layers(model):
    """The layers with routed experts, ascending."""
    return [layer for layer in range(model.config["num_layers"]) if model.expert_location(layer, 0)]


def routed_count(model):
    """How many routed experts the model has: n_experts in each MoE layer."""
    return len(moe_layers(model)) * model.config["num_experts"]


def routed_bytes(model, **streaming):
    """Bytes of cache slots for every routed expert (what an expert budget of 100% is), with
    these streaming options (those of Model.expert_slots)."""
    return model.expert_slots(**streaming)[0] * routed_count(model)


def slot_count(model, budget, **streaming):
    """The slots of a cache of `budget` bytes, as a session with these streaming options makes it."""
    return model.expert_slot_count(expert_budget=budget, **streaming)


def layout(model):
    """{layer: [(offset, size, step), ...]} for every layer with routed experts: expert e's bytes
    are the parts (offset + e * step, size) of weights.bin joined in this order (file order), the
    order FetchExpert serves them."""
    return {layer: model.expert_location(layer, 0) for layer in moe_layers(model)}


def tensor_names(model):
    """The names of the routed experts' tensors: those that start where an expert lies."""
    parts = [(offset, size) for layer_parts in layout(model).values() for offset, size, _ in layer_parts]
    return {t["name"] for t in model.tensors() if any(o <= t["file_offset"] < o + n for o, n in parts)}


def ids(pairs, n_experts):
    """Expert ids of (layer, expert) pairs."""
    return [layer * n_experts + expert for layer, expert in pairs]


def pairs(ids, n_experts):
    """(layer, expert) pairs of expert ids."""
    return [divmod(int(i), n_experts) for i in ids]


def hottest(load, count, among=None, per_layer=None):
    """The ids of the `count` most loaded experts of `load` (an (n_layers, n_experts) array, or
    {id: tokens}), hottest first, ties to the lower id: among the ids `among` (default: every
    expert that routed a token), at most per_layer[layer] of a layer when `per_layer` ({layer:
    room}, an array load only; a layer it lacks has none).  The one choice of which experts are
    hot: cache pins, an edge's first placement and the orchestrator's placements all make it."""
    if isinstance(load, dict):
        tokens = lambda i: load.get(i, 0)   # noqa: E731
        candidates = [i for i, x in load.items() if x > 0] if among is None else among
    else:
        import numpy as np

        flat, n_experts = np.asarray(load).reshape(-1), np.shape(load)[-1]
        tokens = flat.__getitem__
        candidates = np.flatnonzero(flat > 0).tolist() if among is None else among
    chosen, left = [], dict(per_layer or {})
    for i in sorted(candidates, key=lambda i: (-tokens(i), i)):
        if len(chosen) >= count:
            break
        if per_layer is not None:
            layer = i // n_experts
            if left.get(layer, 0) <= 0:
                continue
            left[layer] -= 1
        chosen.append(int(i))
    return chosen


def choose_pins(load, top_k, slots, moe_layers, per_layer=False, count=None, share=None):
    """The most loaded (layer, expert) pairs of `load` to pin in a cache of `slots` (whole; or split
    evenly among `moe_layers` when `per_layer`): `count` of them, or `share` of the slots, or by
    default the hot ones, those that took at least twice an even share of their layer's tokens (a
    model that routes evenly gains nothing from pins: they only take slots from the cache), as many
    as fit: the slots less one layer's top_k (per layer when `per_layer`).  Pairs that routed no
    token are left out.  ValueError when `count` does not fit."""
    import numpy as np

    load = np.asarray(load)
    per = slots // max(len(moe_layers), 1) if per_layer else slots
    room = max(per - top_k, 0) * (len(moe_layers) if per_layer else 1)
    if count is None and share is None:
        layer_tokens = load.sum(axis=1, keepdims=True)
        hot = load * load.shape[1] >= 2 * np.maximum(layer_tokens, 1)
        load = np.where(hot, load, 0)
        count = room
    elif count is None:
        count = min(int(share * slots), room)
    elif not 0 <= count <= room:
        raise ValueError(f"{count} pins do not fit: at most {room} of the {slots} slots can be pinned "
                         f"(one layer's top_k {top_k} stay free{' in each layer' if per_layer else ''})")
    rooms = {layer: per - top_k for layer in moe_layers} if per_layer else None
    return pairs(hottest(load, count, per_layer=rooms), load.shape[1])


def read_load(path, model):
    """int64 (n_layers, n_experts): the expert load `colibri stats --save-load` wrote, checked
    against `model`.  ValueError says what does not fit."""
    import numpy as np

    try:
        text = read_regular_text(path)
    except OSError as e:
        raise ValueError(f"cannot read the expert load {path}: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
        shape = (int(doc["n_layers"]), int(doc["n_experts"]))
        load = np.array(doc["load"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not an expert load written by colibri stats --save-load ({e})") from None
    cfg = model.config
    if shape != (cfg["num_layers"], cfg["num_experts"]):
        raise ValueError(f"{path}: the load of a model with {shape[0]} layers of {shape[1]} experts "
                         f"({doc.get('model', '?')}), not this one's {cfg['num_layers']} of {cfg['num_experts']} "
                         f"({model.path})")
    if load.shape != shape or load.dtype.kind not in "iu" or (load < 0).any():
        raise ValueError(f"{path}: \"load\" must be {shape[0]} rows of {shape[1]} token counts >= 0, "
                         f"got shape {load.shape} of {load.dtype}")
    return load.astype(np.int64)

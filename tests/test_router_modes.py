"""The C top-k router (c_core/src/moe/router.c, run through c_core/tests/router_cli) against a numpy
reference written from the transformers routers, for every family's mode, and against the
stated rules where transformers leaves things open: ties go to the lowest id, ids come out best
first, the selection bias only chooses, and experts outside the best groups are never chosen."""
import subprocess

import numpy as np
import pytest

from colibri.targets import build

SCORES = {"softmax": 0, "sigmoid": 1, "logits": 2}
WEIGHTS = {"scores": 0, "softmax_of_selected": 1}
GROUP_SCORES = {"max": 0, "top2_sum": 1}


@pytest.fixture(scope="module")
def router_cli():
    return build("native") / "c_core" / "tests" / "router_cli"


def route(cli, logits, k, score="softmax", weights="scores", groups=1, topk_groups=1, group_score="max",
          normalize=False, eps=0.0, scale=1.0, bias=None):
    """(ids (n, k) int, gates (n, k) float32) from the C router, for logits (n, E) float32."""
    n, E = logits.shape
    header = [E, k, SCORES[score], WEIGHTS[weights], groups, topk_groups, GROUP_SCORES[group_score],
              int(normalize), eps, scale, int(bias is not None), n]
    rows = [header] + ([bias] if bias is not None else []) + list(logits)
    text = "\n".join(" ".join(f"{float(x):.9g}" for x in row) for row in rows) + "\n"
    out = subprocess.run([str(cli)], input=text, capture_output=True, text=True, check=True).stdout.split()
    table = np.array(out, dtype=np.float64).reshape(n, 2 * k)
    return table[:, :k].astype(np.int64), table[:, k:].astype(np.float32)


def reference(logits, k, score="softmax", weights="scores", groups=1, topk_groups=1, group_score="max",
              normalize=False, eps=0.0, scale=1.0, bias=None):
    """The same, in float32 as transformers computes it; ties to the lowest id (a stable sort)."""
    ids, gates = [], []
    for l in logits.astype(np.float32):
        if score == "softmax":   # Mixtral, Qwen, ERNIE: F.softmax(logits, dtype=float)
            e = np.exp(l - l.max())
            s = e / e.sum()
        elif score == "sigmoid":   # DeepSeek-V3, GLM-4, dots1
            s = np.float32(1) / (np.float32(1) + np.exp(-l))
        else:   # Granite, gpt-oss: topk of the logits themselves
            s = l
        choice = s + bias if bias is not None else s.copy()
        if groups > 1:
            per_group = np.sort(choice.reshape(groups, -1), axis=1)[:, ::-1]
            value = per_group[:, :2].sum(axis=1) if group_score == "top2_sum" else per_group[:, 0]
            kept = np.zeros(groups, bool)
            kept[np.argsort(-value, kind="stable")[:topk_groups]] = True
            choice[~np.repeat(kept, choice.size // groups)] = -np.inf
        chosen = np.argsort(-choice, kind="stable")[:k]
        if weights == "softmax_of_selected":
            e = np.exp(l[chosen] - l[chosen].max())
            w = e / e.sum()
        else:
            w = s[chosen]
        if normalize:
            w = w / (w.sum() + np.float32(eps))
        ids.append(chosen)
        gates.append(w * np.float32(scale))
    return np.array(ids), np.array(gates, dtype=np.float32)


def check(cli, logits, **mode):
    """Routes with both, asserts they agree, returns the C router's (ids, gates)."""
    ids, gates = route(cli, logits, **mode)
    want_ids, want_gates = reference(logits, **mode)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(gates, want_gates, rtol=1e-6, atol=1e-7)
    return ids, gates


DEEPSEEK = dict(score="sigmoid", normalize=True, eps=1e-20, scale=2.5)
MODES = {   # name: (n_experts, mode, bias scale)
    "mixtral": (8, dict(k=2, normalize=True), 0),
    "qwen, not renormalised": (16, dict(k=4), 0),
    "k=1": (8, dict(k=1, normalize=True), 0),
    "k=1, not renormalised": (8, dict(k=1), 0),
    "k=E": (8, dict(k=8, normalize=True), 0),
    "k=E, not renormalised": (8, dict(k=8), 0),
    "granite": (8, dict(k=2, score="logits", weights="softmax_of_selected"), 0),
    "gpt-oss": (32, dict(k=4, score="logits", weights="softmax_of_selected"), 0),
    "deepseek-v3": (16, dict(k=4, groups=4, topk_groups=2, group_score="top2_sum", **DEEPSEEK), 0.5),
    "glm4/dots1, no groups": (32, dict(k=8, **DEEPSEEK), 0.5),
    "groups ranked by max": (16, dict(k=3, groups=8, topk_groups=3, group_score="max", **DEEPSEEK), 0.5),
    "groups, k=E of the kept": (16, dict(k=8, groups=4, topk_groups=2, group_score="top2_sum", **DEEPSEEK), 0.5),
    "ernie": (16, dict(k=4, normalize=True), 0.05),
}


@pytest.mark.parametrize("name", MODES)
def test_random_logits_match_reference(router_cli, name):
    E, mode, bias_scale = MODES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    logits = (rng.standard_normal((64, E)) * 2).astype(np.float32)
    bias = (rng.standard_normal(E) * bias_scale).astype(np.float32) if bias_scale else None
    ids, gates = check(router_cli, logits, bias=bias, **mode)
    assert all(len(set(row)) == mode["k"] for row in ids.tolist())   # never the same expert twice
    if bias is not None:   # the bias changed some choice, so the case exercises it
        assert (ids != reference(logits, **mode)[0]).any()


TIES = {   # name: (logits of one token, mode, expected ids)
    "all equal, softmax": ([0.0] * 8, dict(k=3), [0, 1, 2]),
    "all equal, k=E": ([0.0] * 8, dict(k=8, normalize=True), list(range(8))),
    "repeated values": ([1, 3, 3, 0, 3, 1, 2, 2], dict(k=5), [1, 2, 4, 6, 7]),
    "repeated logits, softmax_of_selected": ([1, 3, 3, 0, 3, 1, 2, 2], dict(k=4, score="logits",
                                                                         weights="softmax_of_selected"), [1, 2, 4, 6]),
    "repeated values, sigmoid": ([-1, 2, -1, 2, 0, 0, 2, -1], dict(k=4, **DEEPSEEK), [1, 3, 6, 4]),
    # groups 1 and 2 tie on top2_sum: group 1 (the lower) is kept; inside it 6 and 7 tie
    "tied groups": ([0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0],
                    dict(k=3, groups=4, topk_groups=1, group_score="top2_sum", **DEEPSEEK), [4, 5, 6]),
}


@pytest.mark.parametrize("name", TIES)
def test_ties_go_to_the_lowest_id_in_chosen_order(router_cli, name):
    logits, mode, expected = TIES[name]
    ids, _ = check(router_cli, np.array([logits], np.float32), **mode)
    assert ids[0].tolist() == expected


@pytest.mark.parametrize("score, bias, flipped_score", [
    ("sigmoid", 1.5, 1 / (1 + np.exp(-1.0))),          # DeepSeek-V3's correction bias
    ("softmax", 0.5, np.exp(1.0) / (np.exp(2.0) + np.exp(1.0) + 2)),   # ERNIE's moe_statics
])
def test_selection_bias_chooses_but_does_not_weigh(router_cli, score, bias, flipped_score):
    logits = np.array([[2.0, 1.0, 0.0, 0.0]], np.float32)
    selection_bias = np.array([0.0, bias, 0.0, 0.0], np.float32)
    assert route(router_cli, logits, k=1, score=score)[0][0].tolist() == [0]   # unbiased: expert 0
    ids, gates = check(router_cli, logits, k=1, score=score, bias=selection_bias)
    assert ids[0].tolist() == [1]                                        # the bias flips the choice ...
    np.testing.assert_allclose(gates[0, 0], flipped_score, rtol=1e-6)    # ... but the gate is the plain score


@pytest.mark.parametrize("group_score, expected", [("top2_sum", [2, 3]), ("max", [0, 1])])
def test_experts_of_losing_groups_are_never_chosen(router_cli, group_score, expected):
    # 4 groups of 2.  By score alone the top 2 are 0 (sigmoid 5) and 2 (sigmoid 2); group 1 {2, 3}
    # has the best top-2 sum, group 0 {0, 1} the best single expert.
    logits = np.array([[5, -5, 2, 2, -1, -1, -2, -2]], np.float32)
    mode = dict(k=2, groups=4, topk_groups=1, group_score=group_score, **DEEPSEEK)
    assert reference(logits, **{**mode, "groups": 1})[0][0].tolist() == [0, 2]
    ids, _ = check(router_cli, logits, **mode)
    assert ids[0].tolist() == expected

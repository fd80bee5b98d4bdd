"""The Router-Expert-Aggregator triad made public (c_core/include/colibri/moe.h).

A program's own routers, registered by name (c_core/examples/mixtral_router.c, the spec's example),
route the tiny Mixtral fixture when its colibri_model.json names them in routing.type: a top-1
router computes the logits of the core's top-k router with top_k 1 bit for bit, and Mixtral's
top-2 router routes as numpy says it should.  The spec-named experts and aggregator
(colibri_expert_linear, colibri_expert_mlp, colibri_aggr_sparse), found in the registry by name
through c_core/tests/triad_cli, against numpy."""
import json
import math
import re
import shutil
import subprocess

import numpy as np
import pytest

import colibri
from bad_models import FIXTURE
from colibri.targets import build

TOKENS = [1, 5, 9, 200, 17, 3, 88, 140, 7, 61]
ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2, "relu": 3}


@pytest.fixture(scope="module")
def programs():
    tests = build("native") / "c_core" / "tests"
    return tests / "mixtral_router", tests / "triad_cli"


def _model(tmp_path, name, experts=None, **routing):
    d = tmp_path / name
    shutil.copytree(FIXTURE, d)
    doc = json.loads((d / "colibri_model.json").read_text())
    doc["routing"].update(routing)
    doc["experts"].update(experts or {})
    (d / "colibri_model.json").write_text(json.dumps(doc))
    return d


def _run(program, model, tmp_path, name, counted=None):
    """(logits (len(TOKENS) - half + 1, vocab), expert counts, the route log's lines); counted: a
    list given the rows the counting expert and aggregator saw"""
    prefix = tmp_path / name
    r = subprocess.run([str(program), str(model), str(prefix), *map(str, TOKENS)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    vocab = json.loads((model / "colibri_model.json").read_text())["hparams"]["vocab_size"]
    logits = np.fromfile(f"{prefix}.logits", np.float32).reshape(-1, vocab)
    log = (tmp_path / f"{name}.log").read_text().splitlines()
    counts, rows = r.stdout.splitlines()
    if counted is not None:
        counted += map(int, rows.split())
    return logits, np.array(counts.split(), np.int64), log


def test_a_registered_router_runs_the_model_as_the_cores_own(programs, tmp_path):
    """user_top1 (best expert, gate 1) is what the core's top-k router computes with top_k 1 and
    renormalised gates (p / p = 1): the same logits, bit for bit, at every step."""
    mixtral_router, _ = programs
    own, own_counts, _ = _run(mixtral_router, _model(tmp_path, "own", type="topk", top_k=1, normalize=True),
                              tmp_path, "own")
    user, user_counts, _ = _run(mixtral_router, _model(tmp_path, "user", type="user_top1", top_k=1), tmp_path, "user")
    assert own.shape[0] == len(TOKENS) - len(TOKENS) // 2 + 1
    assert np.array_equal(own.view(np.uint32), user.view(np.uint32))
    assert own_counts.sum() == 0   # the core's router ran there, not ours
    layers = json.loads((FIXTURE / "colibri_model.json").read_text())["hparams"]["num_layers"]
    assert user_counts.sum() == layers * len(TOKENS)   # every token of every layer, once


def test_mixtral_top2_routes_as_numpy_says(programs, tmp_path):
    """Each call's ids are the two best logits (lowest id on ties) and its gates a softmax over the
    two; every layer and position routes once; the counts are the ids'; and it changes the
    logits from the top-1 router's."""
    mixtral_router, _ = programs
    top2, counts, log = _run(mixtral_router, _model(tmp_path, "top2", type="mixtral_top2", top_k=2), tmp_path, "top2")
    top1, _, _ = _run(mixtral_router, _model(tmp_path, "top1", type="user_top1", top_k=1), tmp_path, "top1")
    hp = json.loads((FIXTURE / "colibri_model.json").read_text())
    E, layers = hp["experts"]["count"], hp["hparams"]["num_layers"]
    rows = np.array([line.split() for line in log], np.float64)
    assert sorted(map(tuple, rows[:, :2].astype(int).tolist())) == [(l, p) for l in range(layers) for p in range(len(TOKENS))]
    logits = rows[:, 2:2 + E].astype(np.float32)
    ids, gates = rows[:, 2 + E:4 + E].astype(np.int64), rows[:, 4 + E:].astype(np.float32)
    want = np.argsort(-logits, axis=1, kind="stable")[:, :2]
    assert np.array_equal(ids, want)
    chosen = np.take_along_axis(logits, want, axis=1)
    e = np.exp(chosen - chosen[:, :1])
    assert np.allclose(gates, e / e.sum(axis=1, keepdims=True), rtol=1e-6, atol=0)
    assert np.array_equal(counts, np.bincount(ids.ravel(), minlength=E))
    assert not np.allclose(top1, top2)


def test_a_registered_expert_and_aggregator_run_the_model(programs, tmp_path):
    """experts.type and routing.aggregator name the example's counting expert and aggregator, which
    hand each call on to the core's swiglu and weighted_sum: the model's logits bit for bit, every
    routed (token, expert) pair through both once."""
    mixtral_router, _ = programs
    own, _, _ = _run(mixtral_router, _model(tmp_path, "own"), tmp_path, "own")
    counted = []
    user, _, _ = _run(mixtral_router, _model(tmp_path, "user", {"type": "counting_swiglu"}, aggregator="counting_sum"),
                      tmp_path, "user", counted)
    assert np.array_equal(own.view(np.uint32), user.view(np.uint32))
    doc = json.loads((FIXTURE / "colibri_model.json").read_text())
    pairs = doc["hparams"]["num_layers"] * len(TOKENS) * doc["routing"]["top_k"]
    assert counted == [pairs, pairs]


def _fixture_logits(d):
    return colibri.Model(d).session(ctx=16, kernels="reference").forward(TOKENS)


def test_the_core_components_by_name_compute_the_fixture(tmp_path):
    """Naming the defaults, and the sparse aggregator (softmax gates are never 0), changes no bit."""
    want = _fixture_logits(FIXTURE)
    for name, experts, routing in [("defaults", {"type": "swiglu"}, {"aggregator": "weighted_sum"}),
                                   ("sparse", {}, {"aggregator": "sparse"})]:
        got = _fixture_logits(_model(tmp_path, name, experts, **routing))
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32)), name


@pytest.mark.parametrize("experts, routing, message", [
    ({"type": "nobody"}, {}, 'experts.type: unsupported value "nobody" (expected "swiglu", "swiglu_clamped", '
                             '"linear" or "mlp")'),
    ({}, {"aggregator": "nobody"}, 'routing.aggregator: unsupported value "nobody" (expected "weighted_sum" or '
                                   '"sparse")'),
    ({"type": "linear"}, {}, 'experts.type "linear" multiplies by experts.w1 alone: it needs intermediate_size = '
                             'hidden_size (96 != 64)'),
])
def test_unknown_or_unfit_components_are_refused_at_load(tmp_path, experts, routing, message):
    with pytest.raises(colibri.Error) as e:
        colibri.Model(_model(tmp_path, "refused", experts, **routing))
    assert message in str(e.value)


def test_registry_refuses_taken_names_a_full_table_and_unknown_types(programs, tmp_path):
    mixtral_router, _ = programs
    r = subprocess.run([str(mixtral_router), "--registry", str(_model(tmp_path, "unknown", type="nobody"))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "registry ok\n", r.stderr


def test_a_router_choosing_past_the_last_expert_is_an_error(programs, tmp_path):
    """A registered router's ids index the dispatch: one past the last is refused, naming the router."""
    _, triad_cli = programs
    r = subprocess.run([str(triad_cli), "stray-router", str(_model(tmp_path, "stray", type="stray"))],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    status, experts, message = re.match(r"(\S+) (\d+): (.*)", r.stdout.strip()).groups()
    assert status == "COLIBRI_E_VALUE"
    assert message == f'layer 0: router "stray" chose expert {experts}, outside [0, {experts})'


def _numbers(*arrays):
    return "\n".join(" ".join(f"{float(x):.9g}" for x in np.ravel(a)) for a in arrays) + "\n"


def _triad(cli, kind, name, text, shape):
    r = subprocess.run([str(cli), kind, name], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return np.array(r.stdout.split(), np.float64).reshape(shape)


def _act(name, h):
    h = h.astype(np.float64)
    if name == "silu":
        return h / (1 + np.exp(-h))
    if name == "relu":
        return np.maximum(h, 0)
    if name == "gelu":
        return 0.5 * h * (1 + np.vectorize(math.erf)(h / math.sqrt(2)))
    return 0.5 * h * (1 + np.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))


def test_expert_linear_is_w1_x(programs):
    _, cli = programs
    rng = np.random.default_rng(1)
    dim, m = 24, 5
    w1 = rng.standard_normal((dim, dim)).astype(np.float32)
    x = rng.standard_normal((m, dim)).astype(np.float32)
    y = _triad(cli, "expert", "linear", _numbers([dim, 7, m, 0, 0], w1, x), (m, dim))
    # float32 dots of 24 terms against float64's: a few ulps of the largest partial sum
    assert np.allclose(y, x.astype(np.float64) @ w1.T.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("bias", [False, True])
def test_expert_mlp_is_w2_act_w1_x(programs, activation, bias):
    _, cli = programs
    rng = np.random.default_rng(2)
    dim, ffn, m = 16, 40, 3
    w1 = rng.standard_normal((ffn, dim)).astype(np.float32) / 4
    w2 = rng.standard_normal((dim, ffn)).astype(np.float32) / 4
    b1 = rng.standard_normal(ffn).astype(np.float32)
    b2 = rng.standard_normal(dim).astype(np.float32)
    x = rng.standard_normal((m, dim)).astype(np.float32)
    parts = [w1, w2] + ([b1, b2] if bias else []) + [x]
    y = _triad(cli, "expert", "mlp", _numbers([dim, ffn, m, ACTIVATIONS[activation], int(bias)], *parts), (m, dim))
    h = x.astype(np.float64) @ w1.T + (b1 if bias else 0)
    want = _act(activation, h) @ w2.T.astype(np.float64) + (b2 if bias else 0)
    assert np.allclose(y, want, rtol=1e-5, atol=1e-5)


def test_aggr_sparse_skips_zero_gates(programs):
    """Rows with gate 0 hold inf and NaN: the sparse aggregator never reads them (the sum of the
    others, added in order in float32, bit for bit), where the weighted sum takes 0 * inf = NaN."""
    _, cli = programs
    rng = np.random.default_rng(3)
    n, dim, m = 4, 6, 7
    rows = np.array([0, 2, 1, 2, 3, 0, 1])
    gates = rng.uniform(0.1, 1, m).astype(np.float32)
    gates[[1, 4]] = 0
    y = rng.standard_normal((m, dim)).astype(np.float32)
    y[1, :] = np.inf
    y[4, :] = np.nan
    out = rng.standard_normal((n, dim)).astype(np.float32)
    text = _numbers([n, dim, m], rows, gates, y, out)
    want = out.copy()
    for i in range(m):
        if gates[i] != 0:
            want[rows[i]] += y[i] * gates[i]
    got = _triad(cli, "aggregate", "sparse", text, (n, dim)).astype(np.float32)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    weighted = _triad(cli, "aggregate", "weighted_sum", text, (n, dim))
    assert np.isnan(weighted[rows[1]]).all() and np.isnan(weighted[rows[4]]).all()

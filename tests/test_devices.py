"""Devices: experts computed by a registered Python driver give bit for bit the logits of the all-cpu
session, for every family with routed experts, any placement, 1 and 2 threads, resident and streamed;
at most one call per MoE layer and forward chunk; a failing driver falls back to the cpu for the same
tokens, strict mode fails naming the device; placements and driver objects are checked.  The driver
computes through a second session's cpu driver (Session.compute_experts), whose own correctness is
the all-cpu session's, itself checked against transformers by test_families.py."""
import time

import numpy as np
import pytest

import colibri
from colibri.convert import convert
from support import FAMILIES, build

N_PROMPT, N_DECODE = 9, 5


class CpuBehind:
    """A driver that computes through another session's compute_experts, failing on request."""

    def __init__(self, model, name="other", fail=(), latency=1e-4):   # reported: a loaded machine stays under 5 ms
        self.cpu = model.session(ctx=4)
        self.name = name
        self.fail = set(fail)
        self.latency = latency
        self.calls = 0
        self.layers_called = []

    def compute(self, layer, experts, rows, gates, x):
        self.calls += 1
        self.layers_called.append(layer)
        self.job = (layer, experts.copy(), rows.copy(), x.copy())
        assert gates.shape == (x.shape[0],) and rows[-1] == x.shape[0]

    def sync(self, y):
        if self.calls in self.fail:
            raise ConnectionError(f"call {self.calls} lost")
        y[:] = self.cpu.compute_experts(*self.job)
        return self.latency


def run(model, **options):
    """The prompt's logits in chunks of 4, then greedy decode steps'; and the session."""
    s = model.session(ctx=32, batch=4, **options)
    tokens = list(np.random.default_rng(5).integers(0, model.config["vocab_size"], N_PROMPT))
    logits = [s.forward(tokens)]
    for _ in range(N_DECODE):
        logits.append(s.forward([int(np.argmax(logits[-1][-1]))]))
    return np.concatenate(logits), s


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_model(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    build(request.param, seed=4).save_pretrained(root / "hf")
    return convert(root / "hf", root / "interleaved", progress=False, layout="interleaved")


@pytest.mark.parametrize("threads", [1, 2])
def test_device_experts_are_the_cpu_experts(family_model, threads):
    model = colibri.Model(family_model, threads=threads)
    want, _ = run(model)
    L, E = model.config["num_layers"], model.config["num_experts"]
    chunks = -(-N_PROMPT // 4) + N_DECODE
    for placement in (np.ones((L, E), np.uint8), (np.arange(E) % 2 == 0)[None].repeat(L, 0).astype(np.uint8)):
        driver = CpuBehind(model)
        got, s = run(model, devices=[driver], placement=placement)
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
        stats = s.device_stats()
        # one call per MoE layer and chunk at most (a layer's experts on the device all go in one)
        per_chunk = np.bincount(driver.layers_called, minlength=L)
        assert per_chunk.max() <= chunks and stats[1]["calls"] == driver.calls > 0
        assert stats[1]["errors"] == stats[1]["fallbacks"] == 0
        if placement.all():
            assert stats[0]["experts"] == 0


def test_streamed_experts_beside_a_device(family_model):
    """The cpu's experts read into a budgeted cache while a device computes the others."""
    model = colibri.Model(family_model, threads=2)
    want, _ = run(model)
    slot, least = model.expert_slots()
    L, E = model.config["num_layers"], model.config["num_experts"]
    placement = (np.arange(E) % 2 == 1)[None].repeat(L, 0).astype(np.uint8)
    got, s = run(model, expert_budget=least + slot, devices=[CpuBehind(model)], placement=placement)
    assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
    assert s.expert_cache_stats()["misses"] > 0 and s.device_stats()[1]["experts"] > 0


def test_a_failing_device_falls_back_to_the_same_tokens(family_model):
    model = colibri.Model(family_model)
    ids = list(range(3, 3 + N_PROMPT))
    want = model.session(ctx=32).generate(ids, max_tokens=12, stop_at_eos=False)
    driver = CpuBehind(model, fail={2, 6})
    s = model.session(ctx=32, devices=[driver], placement="""{"format": "colibri-placement", "version": 1,
                      "default": "other"}""", device_probe_ms=0.001)
    assert s.generate(ids, max_tokens=12, stop_at_eos=False) == want
    dev = s.device_stats()[1]
    assert dev["errors"] == 2 and dev["fallbacks"] > 0 and dev["probes"] >= 2 and not dev["bypassed_now"]
    assert s.device_stats()[0]["fallbacks"] == dev["fallbacks"]


def test_strict_fails_naming_the_device_and_keeps_the_position(family_model):
    model = colibri.Model(family_model)
    driver = CpuBehind(model, fail={1})
    L, E = model.config["num_layers"], model.config["num_experts"]
    s = model.session(ctx=32, devices=[driver], placement=np.ones((L, E), np.uint8), strict=True,
                      device_probe_ms=100)
    with pytest.raises(colibri.Error) as e:
        s.forward([1, 2, 3])
    assert e.value.status == "COLIBRI_E_DEVICE"
    assert "device other failed to compute layer" in str(e.value) and "ConnectionError: call 1 lost" in str(e.value)
    assert s.position == 0
    with pytest.raises(colibri.Error, match="bypassed .* strict"):   # within its back-off: no fallback either
        s.forward([1, 2, 3])
    time.sleep(0.11)
    s.forward([1, 2, 3])   # the probe after the back-off succeeds: the session is usable
    assert s.position == 3


def test_a_slow_device_is_bypassed_at_its_fourth_slow_call_and_returns(family_model):
    """latency 8 ms against 5 ms: with a full ring of fast calls, the P90 (the 29th smallest of 32)
    passes the threshold at the 4th slow call; after the back-off a fast probe brings it back."""
    model = colibri.Model(family_model)
    driver = CpuBehind(model, latency=0.0001)
    L, E = model.config["num_layers"], model.config["num_experts"]
    s = model.session(ctx=128, devices=[driver], placement=np.ones((L, E), np.uint8), device_probe_ms=50)
    token = 3
    while s.device_stats()[1]["samples"] < 32:
        s.forward([token])
    driver.latency = 0.008
    slow_before_bypass = 0
    while not s.device_stats()[1]["bypassed_now"]:
        before = driver.calls
        s.forward([token])
        slow_before_bypass += driver.calls - before
    assert s.device_stats()[1]["slow"] == slow_before_bypass == 4
    calls = driver.calls
    s.forward([token])
    assert driver.calls == calls   # bypassed: the cpu computes
    driver.latency = 0.0001
    time.sleep(0.06)
    s.forward([token])
    dev = s.device_stats()[1]
    # the probe (the token's first MoE layer) came back fast: the ring starts over, later layers use it too
    assert driver.calls > calls and dev["probes"] == 1 and not dev["bypassed_now"]
    assert dev["samples"] == driver.calls - calls


def test_placements_and_drivers_are_checked(family_model):
    model = colibri.Model(family_model)
    L, E = model.config["num_layers"], model.config["num_experts"]
    s = model.session(ctx=8, devices=[CpuBehind(model)])
    assert s.devices == ["cpu", "other"] and not s.placement.any()
    s.place(-1, 1, "other")
    assert (s.placement[:, 1] == (s.placement.sum(1) > 0)).all() and s.placement[:, 1].any()
    before = s.placement
    for bad, status in [('{"format": "colibri-placement", "version": 1, "experts": [{"device": "gpu", '
                         '"layer": 0, "experts": [0]}]}', "COLIBRI_E_VALUE"),
                        ('{"format": "colibri-placement", "version": 1, "experts": [{"device": "other", '
                         f'"layer": {L}, "experts": [0]}}]}}', "COLIBRI_E_VALUE"),
                        ('{"format": "colibri-placement", "version": 1, "experts": [{"device": "other", '
                         f'"layer": "all", "experts": [{E}]}}]}}', "COLIBRI_E_VALUE"),
                        ('{"format": "colibri-placement", "version": 1, "extra": 0}', "COLIBRI_E_VALUE"),
                        ('{"format": "colibri-placement", "version": 1, "experts": [', "COLIBRI_E_JSON")]:
        with pytest.raises(colibri.Error) as e:
            s.load_placement(bad)
        assert e.value.status == status and "placement" in str(e.value)
    assert np.array_equal(s.placement, before)
    with pytest.raises(colibri.Error, match="device 2"):
        s.set_placement(np.full((L, E), 2, np.uint8))
    with pytest.raises(ValueError, match="shape"):
        s.set_placement(np.zeros((L + 1, E), np.uint8))
    with pytest.raises(colibri.Error, match="out of range"):
        s.place(0, E, 1)
    with pytest.raises(ValueError, match="no device 'gpu'"):
        s.place(0, 0, "gpu")
    with pytest.raises(TypeError, match="needs name, compute and sync"):
        model.session(ctx=8, devices=[object()])
    for name in ("cpu", "", "x" * 16):
        driver = CpuBehind(model, name=name)
        with pytest.raises(ValueError, match="1 to 15 characters"):
            model.session(ctx=8, devices=[driver])
    with pytest.raises(colibri.Error, match="both named"):
        model.session(ctx=8, devices=[CpuBehind(model), CpuBehind(model)])
    with pytest.raises(ValueError, match="needs devices"):
        model.session(ctx=8, placement=np.zeros((L, E), np.uint8))


def test_holds_limits_what_a_device_may_take(family_model):
    model = colibri.Model(family_model)
    L, E = model.config["num_layers"], model.config["num_experts"]
    driver = CpuBehind(model)
    driver.holds = lambda n_layers, n_experts: np.arange(n_experts)[None].repeat(n_layers, 0) < 1
    s = model.session(ctx=8, devices=[driver])
    layer = next(l for l in range(L) if _is_moe(model, l))
    s.place(layer, 0, "other")
    with pytest.raises(colibri.Error, match="does not hold"):
        s.place(layer, 1, "other")


def test_compute_experts_refuses_bad_tasks_by_name(family_model):
    model = colibri.Model(family_model)
    s = model.session(ctx=4)
    d, E, L = model.config["hidden_size"], model.config["num_experts"], model.config["num_layers"]
    layer = next(l for l in range(L) if _is_moe(model, l))
    x = np.ones((2, d), np.float32)
    y = s.compute_experts(layer, [0, 1], [0, 1, 2], x)
    assert y.shape == x.shape and np.isfinite(y).all()
    for args, match in [((layer, [1, 0], [0, 1, 2], x), "ascending"), ((L, [0], [0, 2], x), "layer"),
                        ((layer, [E], [0, 2], x), "ascending"), ((layer, [0, 1], [0, 2, 2], x), "at least one row"),
                        ((layer, [0], [0, 3], x), "n_rows"), ((layer, [0], [0, 2], np.ones((2, d + 1), np.float32)),
                                                               "hidden_size")]:
        with pytest.raises(colibri.Error, match=match) as e:
            s.compute_experts(*args)
        assert e.value.status == "COLIBRI_E_ARG"
        if match == "n_rows":   # check_experts' task has rows[-1] rows: x is not its to check
            continue
        with pytest.raises(colibri.Error) as checked:   # the same checks without computing (the expert server's)
            s.check_experts(*args[:3], args[3].shape[1])
        assert str(checked.value) == str(e.value)
    s.check_experts(layer, [0, 1], [0, 1, 2], d)


def _is_moe(model, layer):
    try:
        model.session(ctx=4, devices=[CpuBehind(model)]).place(layer, 0, 1)
        return True
    except colibri.Error:
        return False


def test_colibri_infer_device_and_placement(tmp_path):
    from support import FIXTURES, infer
    model = FIXTURES / "tiny-mixtral.colibri"
    args = ["--model", model, "--tokens", "1,2,3", "--max_tokens", "6", "--temperature", "0", "--ids"]
    plain = infer("native", *args).stdout
    assert infer("native", *args, "--device", "cpu").stdout == plain
    cpu_file = tmp_path / "cpu.json"
    cpu_file.write_text('{"format": "colibri-placement", "version": 1, "default": "cpu", '
                        '"experts": [{"device": "cpu", "layer": "all", "experts": [0, 1]}]}')
    assert infer("native", *args, "--placement", cpu_file).stdout == plain
    r = infer("native", *args, "--device", "gpu", check=False)
    assert r.returncode == 2 and b"--device gpu: no such driver in this build (it has: cpu)" in r.stderr
    remote_file = tmp_path / "remote.json"
    remote_file.write_text('{"format": "colibri-placement", "version": 1, "default": "remote"}')
    r = infer("native", *args, "--placement", remote_file, check=False)
    assert r.returncode == 2 and b'no device "remote" in this session (it has: cpu)' in r.stderr

"""Expert streaming's front ends: the size parser, the saved expert load and the pins chosen from
it, `colibri generate` / `memdump` with --expert-budget on the bundled model (the same text as
resident), the cache's counters from Python and with --verbose, and colibri-infer's flags."""
import json
import subprocess
import sys

import numpy as np
import pytest

import colibri
from colibri.cli.options import parse_size
from colibri.demo import MODEL_DIR
from colibri.experts import choose_pins, read_load
from support import infer

PROMPT = "ROMEO:"
TEXT = "ROMEO:\nBut soft, what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n" * 6


@pytest.fixture(scope="module")
def model():
    return colibri.Model(MODEL_DIR)


def colibri_cli(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "colibri", *map(str, args)], capture_output=True, text=True, cwd="/")
    if check and r.returncode != 0:
        raise AssertionError(r.stderr)
    return r


def refused(*args):
    """stderr of a colibri command that must fail with a message, not a traceback."""
    r = colibri_cli(*args, check=False)
    assert r.returncode != 0 and r.stderr and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    return r.stderr


# ------------------------------------------------------------------------------- no core needed

@pytest.mark.parametrize("text, size", [
    ("1048576", 1048576), ("0", 0), ("512K", 512 << 10), ("512k", 512 << 10), ("1M", 1 << 20),
    ("512M", 512 << 20), ("2G", 2 << 30), ("1T", 1 << 40), ("1.5G", 3 << 29), ("1MiB", 1 << 20),
    ("1MB", 1 << 20), ("100B", 100), (" 2 G ", 2 << 30), ("50%", 500), ("12.5%", 125), ("100%", 1000)])
def test_size_parser(text, size):
    assert parse_size(text, 1000) == size


@pytest.mark.parametrize("text", ["", "M", "12X", "-1", "1.5", "1e6", "0x10", "5%%", "1 M B"])
def test_size_parser_refuses(text):
    with pytest.raises(ValueError, match="size|whole"):
        parse_size(text, 1000)


def test_size_parser_asks_for_the_whole_only_for_a_percentage():
    def whole():
        raise AssertionError("called")

    assert parse_size("2M", whole) == 2 << 20
    assert parse_size("25%", lambda: 400) == 100
    with pytest.raises(ValueError, match="percentage"):
        parse_size("25%")


def test_pins_are_the_most_loaded_pairs():
    load = np.array([[5, 0, 9, 1], [7, 3, 0, 2]])
    # 6 slots, top-2: 4 fit, by load; ties keep (layer, expert) order
    assert choose_pins(load, 2, 6, [0, 1], count=4) == [(0, 2), (1, 0), (0, 0), (1, 1)]
    assert choose_pins(load, 2, 6, [0, 1], count=2) == [(0, 2), (1, 0)]
    assert choose_pins(load, 2, 6, [0, 1], share=0.5) == [(0, 2), (1, 0), (0, 0)]
    assert choose_pins(load, 2, 6, [0, 1], share=1.0) == choose_pins(load, 2, 6, [0, 1], count=4)   # capped at what fits
    # by default only the hot ones: at least twice an even share of the layer's tokens (9 of 15, 7 of 12)
    assert choose_pins(load, 2, 20, [0, 1]) == [(0, 2), (1, 0)]
    assert choose_pins(np.full((2, 4), 5), 2, 20, [0, 1]) == []   # even routing: nothing to gain
    # per layer: 3 slots each, one pinnable in each
    assert choose_pins(load, 2, 6, [0, 1], per_layer=True, count=2) == [(0, 2), (1, 0)]
    # experts that routed nothing are not pinned
    assert choose_pins(load, 2, 20, [0, 1], count=6) == [(0, 2), (1, 0), (0, 0), (1, 1), (1, 3), (0, 3)]
    with pytest.raises(ValueError, match="at most 4 of the 6 slots"):
        choose_pins(load, 2, 6, [0, 1], count=5)


def test_stats_saves_the_load_it_measures(tmp_path, model):
    text, path = tmp_path / "t.txt", tmp_path / "load.json"
    text.write_text(TEXT)
    out = colibri_cli("stats", "--text", text, "--save-load", path).stdout
    assert str(path) in out
    doc = json.loads(path.read_text())
    cfg = model.config
    assert (doc["model"], doc["architecture"]) == ("shakespeare", model.architecture)
    assert (doc["n_layers"], doc["n_experts"], doc["top_k"]) == (cfg["num_layers"], cfg["num_experts"], cfg["top_k"])
    load = read_load(path, model)
    assert load.shape == (cfg["num_layers"], cfg["num_experts"])
    assert (load.sum(axis=1) == doc["tokens"] * cfg["top_k"]).all()   # every token routed top_k times a layer
    # what a session counts on the same windows
    ids = model.tokenizer.encode(TEXT).ids
    s = model.session(ctx=256)
    for i in range(0, len(ids) - 1, 256):
        if len(ids[i:i + 257]) > 1:
            s.reset()
            s.forward(ids[i:i + 256 + 1][:-1])
    assert np.array_equal(s.expert_load(), load)


def test_save_load_needs_a_text():
    assert "--text" in refused("stats", "--save-load", "/nonexistent/load.json")


def test_pin_refuses_a_load_of_another_model(tmp_path, model):
    path = tmp_path / "load.json"
    cfg = model.config
    path.write_text(json.dumps({"model": "other", "n_layers": cfg["num_layers"], "n_experts": 16, "top_k": 2,
                                "tokens": 1, "load": [[1] * 16] * cfg["num_layers"]}))
    err = refused("generate", "--expert-budget", "1M", "--pin", path)
    assert "16 experts" in err and f"{cfg['num_experts']}" in err and str(path) in err
    with pytest.raises(ValueError, match="16 experts"):
        read_load(path, model)


@pytest.mark.parametrize("content, message", [
    ("{not json", "not an expert load"),
    ('{"n_layers": 4, "n_experts": 8}', "not an expert load"),
    ('[1, 2]', "not an expert load"),
    ('{"n_layers": 4, "n_experts": 8, "load": [[1, 2]]}', "4 rows of 8"),
    ('{"n_layers": 4, "n_experts": 8, "load": ' + json.dumps([[-1] * 8] * 4) + '}', "counts >= 0"),
    ('{"n_layers": 4, "n_experts": 8, "load": ' + json.dumps([[0.5] * 8] * 4) + '}', "counts >= 0")])
def test_pin_refuses_a_malformed_load(tmp_path, content, message):
    path = tmp_path / "load.json"
    path.write_text(content)
    assert message in refused("generate", "--expert-budget", "1M", "--pin", path)


def test_pin_options_need_their_companions(tmp_path):
    assert "--expert-budget" in refused("generate", "--pin", tmp_path / "load.json")
    assert "--pin" in refused("generate", "--expert-budget", "1M", "--pin-count", 2)
    assert "cannot read" in refused("generate", "--expert-budget", "1M", "--pin", tmp_path / "missing.json")
    assert "not a size" in refused("generate", "--expert-budget", "lots")
    assert "[0, 1]" in refused("generate", "--expert-budget", "1M", "--pin", tmp_path / "x", "--pin-share", 2)


def test_session_checks_the_streaming_options(model):
    with pytest.raises(ValueError, match="expert_budget"):
        model.session(expert_budget=-1)
    with pytest.raises(TypeError, match="expert_budget"):
        model.session(expert_budget="1M")
    with pytest.raises(ValueError, match="expert_cache must be one of global, per_layer"):
        model.session(expert_cache="lru")
    with pytest.raises(ValueError, match=r"\(n, 2\)"):
        model.session(expert_budget=1 << 20, pins=[1, 2, 3])
    with pytest.raises(TypeError, match="integers"):
        model.session(expert_budget=1 << 20, pins=[(0.5, 1)])
    with pytest.raises(ValueError, match="need an expert_budget"):
        model.session(pins=[(0, 1)])


# ------------------------------------------------------------------------------- the core streaming

def test_generate_streamed_prints_the_resident_text():
    for sampling in (["--temperature", 0], ["--seed", 3]):
        resident = colibri_cli("generate", "--prompt", PROMPT, "--max-tokens", 40, *sampling).stdout
        for flags in (["--expert-budget", "1M"], ["--expert-budget", "1M", "--no-prefetch"],
                      ["--expert-budget", "25%", "--expert-cache", "per_layer"]):
            assert colibri_cli("generate", "--prompt", PROMPT, "--max-tokens", 40, *sampling, *flags).stdout == resident


def test_verbose_shows_the_cache_counters():
    r = colibri_cli("generate", "--prompt", PROMPT, "--max-tokens", 16, "--expert-budget", "1M", "--verbose")
    for word in ("expert cache:", "slots of", "hits", "misses", "hit rate", "prefetches", "prefetch hits",
                 "read in", "I/O wait"):
        assert word in r.stderr, r.stderr
    assert "expert cache" not in colibri_cli("generate", "--max-tokens", 4, "--verbose").stderr


def test_pinned_run_prints_the_resident_text(tmp_path, model):
    text, path = tmp_path / "t.txt", tmp_path / "load.json"
    text.write_text(TEXT)
    colibri_cli("stats", "--text", text, "--save-load", path)
    resident = colibri_cli("generate", "--prompt", PROMPT, "--max-tokens", 24, "--temperature", 0).stdout
    for pin in (["--pin-count", 3], ["--pin-share", 0.5], [], ["--expert-cache", "per_layer"]):
        r = colibri_cli("generate", "--prompt", PROMPT, "--max-tokens", 24, "--temperature", 0,
                        "--expert-budget", "1M", "--pin", path, *pin, "--verbose")
        assert r.stdout == resident
    assert "pin" in r.stderr


def test_budget_below_the_minimum_is_refused_naming_it(model):
    slot_bytes, minimum = model.expert_slots()
    assert slot_bytes > 0 and minimum >= model.config["top_k"] * slot_bytes
    err = refused("generate", "--max-tokens", 4, "--expert-budget", minimum - 1)
    assert str(minimum) in err.replace(",", "")
    r = infer("native", "--model", MODEL_DIR, "--max_tokens", 4, "--expert_budget", minimum - 1, check=False)
    assert r.returncode != 0 and str(minimum) in r.stderr.decode().replace(",", "")
    with pytest.raises(colibri.Error, match=str(minimum)):
        model.session(expert_budget=minimum - 1)


def test_memdump_shows_the_slot_pool(tmp_path, model):
    slot_bytes, _ = model.expert_slots()
    assert "expert cache" not in colibri_cli("memdump").stdout
    streamed = colibri_cli("memdump", "--expert-budget", "1M").stdout
    assert f"expert cache: {(1 << 20) // slot_bytes} slots of {slot_bytes:,} B" in streamed
    load = tmp_path / "load.json"   # expert 5 of layer 1 the most loaded: pinned, shown in its slot
    load.write_text(json.dumps({"n_layers": 4, "n_experts": 8, "load": [[0] * 8, [0] * 5 + [9, 0, 0], [0] * 8, [0] * 8]}))
    pinned = colibri_cli("memdump", "--expert-budget", "1M", "--pin", load).stdout
    assert "layers.1: experts 5*" in pinned


def test_colibri_infer_streamed_gives_the_resident_tokens(model):
    ids = ",".join(map(str, model.tokenizer.encode(PROMPT).ids))
    args = ("--model", MODEL_DIR, "--tokens", ids, "--max_tokens", 32, "--temperature", 0, "--ids")
    resident = infer("native", *args).stdout
    for flags in (["--expert_budget", "1M"], ["--expert_budget", "1048576", "--no_prefetch"],
                  ["--expert_budget", "2m", "--expert_cache", "per_layer"]):
        assert infer("native", *args, *flags).stdout == resident
    err = infer("native", *args, "--expert_budget", "1M", "--verbose").stderr.decode()
    assert "expert cache:" in err and "hit rate" in err and "I/O wait" in err
    bad = infer("native", *args, "--expert_budget", "12X", check=False)
    assert bad.returncode == 2 and b"--expert_budget" in bad.stderr


def test_python_counters_and_slots(model):
    s = model.session(expert_budget=1 << 20, pins=[(0, 1), (2, 3)])
    assert s.expert_budget == 1 << 20
    s.generate(model.tokenizer.encode(PROMPT).ids, max_tokens=8, temperature=0.0)
    stats = s.expert_cache_stats()
    assert set(stats) == {"hits", "misses", "prefetches", "prefetch_hits", "bytes_read", "reads", "io_wait_ns",
                          "slots", "pinned", "slot_bytes"}
    assert stats["slots"] == (1 << 20) // stats["slot_bytes"] and stats["pinned"] == 2
    assert stats["hits"] + stats["misses"] > 0 and stats["bytes_read"] >= stats["misses"] * stats["slot_bytes"] // 2
    slots = s.expert_cache_slots()
    assert len(slots) == stats["slots"]
    assert {(layer, expert) for layer, expert, pinned in slots if pinned} == {(0, 1), (2, 3)}
    assert s.memory()["expert_cache"] >= stats["slots"] * stats["slot_bytes"]
    assert model.memory_plan(expert_budget=1 << 20) == s.memory()["arena_used"] > model.memory_plan()
    assert "expert_io_wait" in s.profile()
    s.expert_cache_stats_clear()
    assert s.expert_cache_stats()["hits"] == 0
    with pytest.raises(colibri.Error, match="resident"):
        model.session().expert_cache_stats()

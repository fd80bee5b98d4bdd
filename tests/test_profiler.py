"""The per-phase profiler: off, it reads no clock and the counters stay zero; on, every phase the
model has gets time, the results do not change, and the C CLI's profile.json reads back as a table."""
import json
import subprocess
import sys

import numpy as np

import colibri
from colibri.demo import MODEL_DIR
from colibri.targets import infer_command

TOKENS = [1, 591, 47, 39, 49, 28]


def test_profiling_times_every_phase_and_changes_nothing():
    model = colibri.Model(MODEL_DIR)
    quiet, timed = model.session(ctx=64), model.session(ctx=64, profile=True)
    a, b = quiet.forward(TOKENS), timed.forward(TOKENS)
    quiet.sample(), timed.sample()
    assert np.array_equal(a, b)
    assert set(quiet.profile().values()) == {0}
    spent = timed.profile()
    assert spent["dense_mlp"] == 0   # the bundled model has no dense layer
    assert all(spent[p] > 0 for p in ("norms", "attention", "router", "dispatch", "experts", "aggregation",
                                      "lm_head", "sampling")), spent


def test_the_c_cli_writes_a_profile_that_colibri_shows(tmp_path):
    path = tmp_path / "profile.json"
    subprocess.run([*infer_command("native"), "--model", MODEL_DIR, "--tokens", ",".join(map(str, TOKENS)),
                    "--max_tokens", "16", "--temperature", "0", "--profile", path], check=True, capture_output=True)
    doc = json.loads(path.read_text())
    assert doc["prompt_tokens"] == len(TOKENS) and sum(doc["phases_ns"].values()) <= doc["wall_ns"]
    shown = subprocess.run([sys.executable, "-m", "colibri", "profile", "show", str(path)], check=True,
                           capture_output=True, text=True).stdout
    assert "Experts:" in shown and "µs per token" in shown and "%" in shown


def test_profile_without_a_file_writes_profile_json(tmp_path):
    """--profile's file is optional: alone, or followed by another option, it writes profile.json."""
    args = [*infer_command("native"), "--model", MODEL_DIR, "--tokens", ",".join(map(str, TOKENS)), "--temperature", "0"]
    for where, tail in (("last", ["--max_tokens", "4", "--profile"]), ("before", ["--profile", "--max_tokens", "4"])):
        (tmp_path / where).mkdir()
        subprocess.run([*args, *tail], check=True, capture_output=True, cwd=tmp_path / where)
        doc = json.loads((tmp_path / where / "profile.json").read_text())
        assert doc["prompt_tokens"] == len(TOKENS) and doc["generated_tokens"] == 4


def test_profile_show_prints_the_four_headline_lines(tmp_path):
    """Router, Expert Dispatch, Compute and Aggregation, each the sum of the phases it names."""
    from colibri.cli.measure import PROFILE_HEADLINES

    path = tmp_path / "p.json"
    phases = {"norms": 1000, "attention": 2000, "router": 3000, "dispatch": 4000, "experts": 5000, "aggregation": 6000,
              "dense_mlp": 7000, "lm_head": 8000, "sampling": 9000, "expert_io_wait": 500}
    path.write_text(json.dumps({"model": "m", "kernels": "reference", "prompt_tokens": 1, "generated_tokens": 0,
                                "wall_ns": 100_000, "phases_ns": phases}))
    shown = subprocess.run([sys.executable, "-m", "colibri", "profile", "show", str(path)], check=True,
                           capture_output=True, text=True).stdout
    total = sum(phases.values())
    assert [label for label, _ in PROFILE_HEADLINES] == ["Router", "Expert Dispatch", "Compute", "Aggregation"]
    for label, names in PROFILE_HEADLINES:
        ns = sum(phases[n] for n in names)
        line = next(l for l in shown.splitlines() if l.strip().startswith(label + ":"))
        assert f"{ns / 1e3:.1f} µs per token" in line and f"{ns / total:.1%}" in line and " + ".join(names) in line, line

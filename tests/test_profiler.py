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

"""Broken and hostile models: each gives its own status and a message naming the fault,
through Python and through the C CLI (release and ASan/UBSan builds); none crashes."""
import json
import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import pytest

import colibri
from bad_models import CASES, FIXTURE, make_case, mutations
from colibri.targets import env_for, infer_binary

CLI_KINDS = ["native", "sanitize"]

# A named pipe where a file is read: each front end refuses it by name, never waits for a writer.
FIFO_RUNS = {
    "infer_json": ("colibri_model.json", lambda d, f: [str(infer_binary("native")), "--model", str(d), "--validate-model"]),
    "infer_weights": ("weights.bin", lambda d, f: [str(infer_binary("native")), "--model", str(d), "--validate-model"]),
    "python_json": ("colibri_model.json", lambda d, f: [sys.executable, "-c", f"import colibri; colibri.Model({str(d)!r})"]),
    "python_weights": ("weights.bin", lambda d, f: [sys.executable, "-c", f"import colibri; colibri.Model({str(d)!r})"]),
    "validate_weights": ("weights.bin", lambda d, f: [sys.executable, "-m", "colibri", "validate", str(d)]),
    "generate_json": ("colibri_model.json", lambda d, f: [sys.executable, "-m", "colibri", "generate", "--model", str(d),
                                                         "--prompt", "a", "--max-tokens", "1"]),
    "tokenizer": ("tokenizer.json", lambda d, f: [sys.executable, "-c", f"import colibri; colibri.Model({str(d)!r}).tokenizer"]),
    "stats_text": ("text.txt", lambda d, f: [sys.executable, "-m", "colibri", "stats", "--model", str(d), "--text", str(f)]),
}


@pytest.mark.parametrize("run", FIFO_RUNS, ids=list(FIFO_RUNS))
def test_a_fifo_is_refused_not_waited_on(run, tmp_path):
    name, command = FIFO_RUNS[run]
    d = tmp_path / "model"
    shutil.copytree(FIXTURE, d)
    fifo = d / name
    if fifo.exists():
        fifo.unlink()
    os.mkfifo(fifo)
    try:   # a refusal takes well under a second; 30 s is for a loaded 2-core machine starting Python
        r = subprocess.run(command(d, fifo), capture_output=True, text=True, timeout=30, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{run}: blocked on the FIFO {name}")
    assert r.returncode != 0 and f"{name} is not a regular file" in r.stderr, (r.returncode, r.stderr[-2000:])


def _truncate(w):
    os.truncate(w, w.stat().st_size - 4096)


def _rewrite(w):
    """Same size, other bytes, a later modification time (set outright: a write in the same clock
    tick as the open could keep it)."""
    before = w.stat()
    with open(w, "r+b") as f:
        f.write(b"\0" * 64)
    os.utime(w, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))


def _replace(w):
    data = w.read_bytes()
    (w.parent / "new.bin").write_bytes(data)
    os.replace(w.parent / "new.bin", w)


# weights.bin changed after the model was opened: the next session is refused, naming the file.
WEIGHT_CHANGES = {"truncated": (_truncate, "bytes, then"), "rewritten": (_rewrite, "written to"),
                  "replaced": (_replace, "replaced by another file"), "removed": (os.unlink, "No such file")}


@pytest.mark.parametrize("change", WEIGHT_CHANGES, ids=list(WEIGHT_CHANGES))
def test_weights_changed_after_open_refuse_new_sessions(change, tmp_path):
    d = tmp_path / "model"
    shutil.copytree(FIXTURE, d)
    model = colibri.Model(d)
    colibri.Session(model, ctx=8)
    mutate, fragment = WEIGHT_CHANGES[change]
    mutate(d / "weights.bin")
    with pytest.raises(colibri.Error) as e:
        colibri.Session(model, ctx=8)
    assert e.value.status == "COLIBRI_E_IO", str(e.value)
    assert "weights.bin changed since the model was opened" in e.value.detail and fragment in e.value.detail, str(e.value)


def test_a_model_opened_by_a_relative_path_survives_a_change_of_directory(tmp_path, monkeypatch):
    """The weights are checked (and streamed experts read) by the path resolved when the model was opened."""
    shutil.copytree(FIXTURE, tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    model = colibri.Model("model")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    tokens = [1, 2, 3]
    resident = colibri.Session(model, ctx=8, kernels="reference").forward(tokens)
    _, least = model.expert_slots(expert_budget=1)
    streamed = colibri.Session(model, ctx=8, kernels="reference", expert_budget=least).forward(tokens)
    np.testing.assert_array_equal(resident, streamed)


def test_corpus_is_large_enough():
    assert len(CASES) >= 20
    assert len({c.status for c in CASES}) >= 15, "the corpus should cover most distinct statuses"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_python_reports_the_fault(case, tmp_path):
    d = make_case(case, tmp_path)
    with pytest.raises(colibri.Error) as e:
        colibri.Model(d, verify=True)
    assert e.value.status == case.status, str(e.value)
    assert case.fragment in e.value.detail, str(e.value)
    if case.verify:
        colibri.Model(d)   # only validate mode reads every byte; a plain load maps and trusts them
    else:
        with pytest.raises(colibri.Error) as e2:
            colibri.Model(d)
        assert e2.value.status == case.status


@pytest.mark.parametrize("kind", CLI_KINDS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cli_reports_the_fault(case, kind, tmp_path):
    d = make_case(case, tmp_path)
    r = subprocess.run([str(infer_binary(kind)), "--model", str(d), "--validate-model"],
                       capture_output=True, text=True, env=env_for(kind), timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert case.status in r.stderr and case.fragment in r.stderr, r.stderr


def test_architecture_is_only_a_name(tmp_path):
    """The hyper-parameters decide the computation: a family name the core has never heard of loads,
    is reported as given, and computes what the fixture computes."""
    d = tmp_path / "renamed"
    shutil.copytree(FIXTURE, d)
    doc = json.loads((d / "colibri_model.json").read_text())
    doc["architecture"] = "my-moe_v2.1"
    (d / "colibri_model.json").write_text(json.dumps(doc))
    renamed, original = colibri.Model(d, verify=True), colibri.Model(FIXTURE)
    assert renamed.architecture == "my-moe_v2.1"
    tokens = [1, 2, 3, 5, 8]
    a = renamed.session(ctx=8, kernels="reference").forward(tokens)
    b = original.session(ctx=8, kernels="reference").forward(tokens)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


def _logits(d, **options):
    return colibri.Model(d, verify=True).session(ctx=16, kernels="reference", **options).forward([1, 2, 3, 5, 8, 13])


def test_the_spec_fields_load_and_change_nothing(tmp_path):
    """The spec's descriptive fields (routing.type "topk" and capacity_factor, experts.weight_layout
    "contiguous", experts.quantization as an object) load and compute the fixture's logits bit for
    bit; capacity routing with capacity_factor 0 takes the model's routing.capacity_factor."""
    d = tmp_path / "spec"
    shutil.copytree(FIXTURE, d)
    doc = json.loads((d / "colibri_model.json").read_text())
    doc["routing"].update(type="topk", capacity_factor=0.5)
    doc["experts"].update(weight_layout="contiguous", quantization={"enabled": False, "bits": 16, "group_size": 1})
    (d / "colibri_model.json").write_text(json.dumps(doc))
    assert colibri.Model(d).config["weight_layout"] == "stacked"
    assert np.array_equal(_logits(d).view(np.uint32), _logits(FIXTURE).view(np.uint32))
    by_model = _logits(d, routing="capacity", capacity_factor=0.0)
    assert np.array_equal(by_model.view(np.uint32), _logits(d, routing="capacity", capacity_factor=0.5).view(np.uint32))
    assert not np.array_equal(by_model, _logits(d, routing="capacity", capacity_factor=4.0))   # 0.5 drops tokens
    with pytest.raises(colibri.Error, match="capacity_factor"):
        _logits(FIXTURE, routing="capacity", capacity_factor=0.0)   # the fixture gives none


def test_fp16_is_f16(tmp_path):
    """dtype "fp16" (the spec's spelling) reads as f16: a router stored as f16 under either name
    gives the same logits, and the model reports it as f16."""
    models = {}
    for spelling in ("f16", "fp16"):
        d = models[spelling] = tmp_path / spelling
        shutil.copytree(FIXTURE, d)
        doc = json.loads((d / "colibri_model.json").read_text())
        t = next(t for t in doc["tensors"] if t["name"] == "layers.0.router")
        blob = bytearray((d / "weights.bin").read_bytes())
        half = np.frombuffer(bytes(blob[t["file_offset"]:t["file_offset"] + t["file_size"]]), "<f4").astype("<f2").tobytes()
        blob[t["file_offset"]:t["file_offset"] + len(half)] = half   # in the f32 tensor's place, half its size
        t.update(dtype=spelling, file_size=len(half), checksum="crc32:%08x" % zlib.crc32(half))
        (d / "weights.bin").write_bytes(bytes(blob))
        (d / "colibri_model.json").write_text(json.dumps(doc))
    assert {t["name"]: t["dtype"] for t in colibri.Model(models["fp16"]).tensors()}["layers.0.router"] == "f16"
    assert np.array_equal(_logits(models["fp16"]).view(np.uint32), _logits(models["f16"]).view(np.uint32))


@pytest.mark.parametrize("kind", CLI_KINDS)
def test_cli_runs_the_valid_fixture_cleanly(kind):
    r = subprocess.run([str(infer_binary(kind)), "--model", str(FIXTURE), "--tokens", "1,2,3",
                        "--max_tokens", "6", "--temperature", "0", "--ids"],
                       capture_output=True, text=True, env=env_for(kind), timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip().split(",")) == 6


def _mutant_dirs(tmp_path, n):
    weights = FIXTURE / "weights.bin"
    for i, text in enumerate(mutations(n)):
        d = tmp_path / f"m{i}"
        d.mkdir()
        (d / "colibri_model.json").write_bytes(text)
        (d / "weights.bin").symlink_to(weights)
        yield d


def test_random_json_edits_never_crash_python(tmp_path):
    outcomes = {}
    for d in _mutant_dirs(tmp_path, 400):
        try:
            colibri.Model(d, verify=True)
            outcomes["ok"] = outcomes.get("ok", 0) + 1
        except colibri.Error as e:
            assert e.detail, "an error must say what is wrong"
            outcomes[e.status] = outcomes.get(e.status, 0) + 1
    assert sum(outcomes.values()) == 400
    assert len(outcomes) >= 5, outcomes   # the edits reach many different checks


def test_random_json_edits_under_sanitizers(tmp_path):
    binary = infer_binary("sanitize")
    for d in _mutant_dirs(tmp_path, 150):
        r = subprocess.run([str(binary), "--model", str(d), "--validate-model"], capture_output=True,
                           text=True, env=env_for("sanitize"), timeout=60)
        assert r.returncode in (0, 1), (d, r.returncode, r.stderr[-2000:])


# ---- bad input at run time ----

@pytest.fixture(scope="module")
def model():
    return colibri.Model(FIXTURE)


def test_token_out_of_range_changes_nothing(model):
    s = model.session(ctx=32)
    s.forward([1, 2, 3])
    for bad in ([5, model.vocab_size], [-1]):
        with pytest.raises(colibri.Error) as e:
            s.forward(bad)
        assert e.value.status == "COLIBRI_E_TOKEN"
        assert str(bad[-1]) in e.value.detail
    assert s.position == 3


def test_context_overflow_is_an_error(model):
    s = model.session(ctx=8)
    s.forward(np.arange(6))
    with pytest.raises(colibri.Error) as e:
        s.forward(np.arange(3))
    assert e.value.status == "COLIBRI_E_CONTEXT" and "6 of 8" in e.value.detail
    assert s.position == 6
    s.forward(np.arange(2))
    assert s.position == 8


def test_bad_session_arguments(model):
    with pytest.raises(colibri.Error) as e:
        model.session(ctx=model.config["max_position_embeddings"] + 1)
    assert e.value.status == "COLIBRI_E_ARG" and "n_ctx" in e.value.detail
    with pytest.raises(colibri.Error):
        model.session(batch=-3)
    s = model.session(ctx=4)
    with pytest.raises(ValueError):
        s.forward([])
    with pytest.raises(ValueError):
        s.forward([[1, 2], [3, 4]])
    with pytest.raises(TypeError):
        s.forward([1.5, 2.0])
    with pytest.raises(ValueError):
        s.forward(np.array([2**32 + 5], dtype=np.int64))   # a cast would silently make it token 5
    assert s.position == 0
    with pytest.raises(colibri.Error) as e:
        model.session(ctx=4).sample()
    assert "forward first" in e.value.detail
    with pytest.raises(TypeError):
        colibri.Session(None)
    with pytest.raises(ValueError):
        colibri.Model(str(FIXTURE) + "\0/x")

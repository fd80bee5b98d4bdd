"""Hostile arguments to the front ends: a Python session survives a bad argument, the `colibri`
command answers bad input with one line naming what is wrong (never a traceback), colibri-infer
says why it fails and never succeeds quietly, and a model's "tokenizer" stays in its directory."""
import json
import os
import shutil
import subprocess
import sys

import pytest

import colibri
from colibri.demo import MODEL_DIR
from colibri.targets import infer_command
from colibri.tokenizer import load_tokenizer
from support import FIXTURES, infer

PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def model():
    return colibri.Model(MODEL_DIR)


def colibri_cli(*args, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, "-m", "colibri", *map(str, args)], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, cwd="/")


def refused(*args, status=1, naming=None, stdout=subprocess.PIPE):
    """stderr of a colibri command that must fail with `status` and one line (argparse's usage
    lines before it for status 2) naming `naming`, not a traceback."""
    r = colibri_cli(*args, stdout=stdout)
    err = r.stderr.strip()
    assert r.returncode == status and err and "Traceback" not in err and "Exception" not in err, (r.returncode, err)
    last = err.splitlines()[-1]
    assert status == 2 or len(err.splitlines()) == 1, err
    assert last.startswith("colibri"), err
    if naming is not None:
        assert naming in last, err
    return last


# ------------------------------------------------------------------------ a session's busy flag

def test_a_bad_seed_leaves_the_session_usable(model):
    s = model.session(ctx=64)
    with pytest.raises(TypeError, match="seed"):
        s.seed("x")
    with pytest.raises(TypeError, match="seed"):
        s.generate(model.tokenize(PROMPT), max_tokens=2, seed=float("nan"))
    s.reset()
    s.seed(3)
    assert len(s.generate(model.tokenize(PROMPT), max_tokens=2, temperature=0.0, stop_at_eos=False)) == 2


def test_every_flag_taking_method_releases_it_on_error(model):
    s = model.session(ctx=64)
    for call in (lambda: s.seed(2 ** 80 + 0.5), lambda: s.forward([10 ** 12]), lambda: s.forward([model.vocab_size]),
                 lambda: s.prefill([-1]), lambda: s.place(0, 0, "nowhere"), lambda: s.place(0, 0, 2 ** 40),
                 lambda: s.set_placement([[0]]), lambda: s.load_placement("{"), lambda: s.step(-5),
                 lambda: s.compute_experts(0, [0], [0], [[0.0]])):
        with pytest.raises(Exception):
            call()
        s.reset()
        assert s.forward([1]).shape == (1, model.vocab_size)


def test_session_threads_is_one_rule(model):
    with pytest.raises(ValueError, match="threads"):
        colibri.Model(MODEL_DIR, threads=-1)
    with pytest.raises((ValueError, colibri.Error), match="threads"):
        model.session(ctx=8, threads=-1)
    with pytest.raises((ValueError, colibri.Error), match="threads"):
        model.session(ctx=8, threads=100000)


# ------------------------------------------------------------------------ colibri convert

@pytest.mark.parametrize("config", [b"[1, 2]", b"null", b"7", b"[" * 100000 + b"]" * 100000,
                                    b'{"model_type": "mixtral", "x": "\xff\xfe"}', b'{"model_type": ["mixtral"]}'],
                         ids=["list", "null", "number", "deep", "not-utf8", "model-type-list"])
def test_convert_refuses_a_hostile_config(tmp_path, config):
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_bytes(config)
    shutil.copy(FIXTURES / "tiny-mixtral" / "model.safetensors", src)
    refused("convert", src, tmp_path / "out", "--quiet", naming="config.json")


def test_convert_refuses_the_source_as_output(tmp_path):
    src = tmp_path / "hf"
    shutil.copytree(FIXTURES / "tiny-mixtral", src)
    before = sorted(p.name for p in src.iterdir())
    refused("convert", src, src, "--quiet", naming=str(src))
    refused("convert", src, src / ".." / "hf", "--quiet")
    assert sorted(p.name for p in src.iterdir()) == before


# ------------------------------------------------------------------------ bad arguments

@pytest.mark.parametrize("args, status, naming", [
    (["generate", "--tokens", "", "--max-tokens", "1"], 1, "--tokens"),
    (["generate", "--tokens", "1099511627776", "--max-tokens", "1"], 1, "--tokens"),
    (["generate", "--tokens", "1,-3", "--max-tokens", "1"], 1, "--tokens"),
    (["generate", "--tokens", "1", "--ctx", str(2 ** 40)], 2, "--ctx"),
    (["generate", "--tokens", "1", "--max-tokens", str(2 ** 40)], 2, "--max-tokens"),
    (["generate", "--tokens", "1", "--batch", "-1"], 2, "--batch"),
    (["generate", "--tokens", "1", "--threads", "-1"], 2, "--threads"),
    (["generate", "--tokens", "1", "--seed", str(2 ** 40), "--target", "aarch64"], 2, "--seed"),   # argparse, before any build
    (["memdump", "--ctx", str(2 ** 40)], 2, "--ctx"),
    (["stats", "--ctx", str(2 ** 40), "--text", "/dev/null"], 2, "--ctx"),
])
def test_bad_arguments_are_one_line(args, status, naming):
    refused(*args, status=status, naming=naming)


def test_a_prompt_that_is_not_utf8_passes_through():
    """argv's bytes as given, as colibri-infer takes them: both print the same bytes back, and the
    same continuation of the byte-fallback tokens."""
    prompt = b"ROMEO: \xff\xfe"
    flags = ["--max-tokens", "12", "--temperature", "0"]
    r = subprocess.run([sys.executable, "-m", "colibri", "generate", "--prompt", prompt, *flags],
                       capture_output=True, cwd="/")
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    peer = infer("native", "--model", MODEL_DIR, "--prompt", os.fsdecode(prompt), "--max_tokens", 12, "--temperature", 0)
    assert r.stdout.startswith(prompt) and r.stdout == peer.stdout


@pytest.mark.parametrize("text", [3, None, 2.5, ["ROMEO:"]])
def test_tokenize_takes_text_only(model, text):
    with pytest.raises(TypeError, match="str or bytes"):
        model.tokenize(text)


def test_tokenize_bytes_are_the_texts_utf8(model):
    assert model.tokenize(bytearray("Ärger ROMEO".encode())) == model.tokenize("Ärger ROMEO")


def test_stats_text_that_is_a_directory(tmp_path):
    refused("stats", "--text", tmp_path, naming=str(tmp_path))


def test_stats_text_that_is_not_utf8(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe\xfa" * 10)
    refused("stats", "--text", bad, naming=str(bad))


@pytest.mark.parametrize("doc", [
    {"phases_ns": {"router": 0}, "prompt_tokens": 1, "generated_tokens": 0, "wall_ns": 0},
    {"phases_ns": {"router": 5}, "prompt_tokens": 1, "generated_tokens": 0, "wall_ns": "x"},
    {"phases_ns": [1], "prompt_tokens": 1, "generated_tokens": 0, "wall_ns": 10},
    [1, 2]], ids=["zero-wall", "wall-text", "phases-list", "list"])
def test_profile_show_of_odd_profiles(tmp_path, doc):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    r = colibri_cli("profile", "show", path)
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode:
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1 and str(path) in r.stderr, r.stderr


def test_profile_show_of_zero_wall_time_shows_it(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"phases_ns": {"router": 0}, "prompt_tokens": 1, "generated_tokens": 0, "wall_ns": 0}))
    r = colibri_cli("profile", "show", path)
    assert r.returncode == 0 and "0.0 ms" in r.stdout, r.stderr


def test_stdout_on_a_full_device():
    with open("/dev/full", "w") as full:
        refused("validate", stdout=full, naming="No space left")


def test_debug_shows_the_traceback(tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text('{"model_type": "mixtral"}')
    shutil.copy(FIXTURES / "tiny-mixtral" / "model.safetensors", src)
    refused("convert", src, tmp_path / "out", "--quiet", naming="config.json")
    r = colibri_cli("--debug", "convert", src, tmp_path / "out", "--quiet")
    assert r.returncode == 1 and "Traceback" in r.stderr, r.stderr


# ------------------------------------------------------------------------ colibri-infer

def test_infer_profile_on_a_full_device():
    r = infer("native", "--model", MODEL_DIR, "--tokens", "1", "--max_tokens", 1, "--ids", "--profile", "/dev/full",
              check=False)
    assert r.returncode == 1 and b"/dev/full" in r.stderr, r.stderr


def test_infer_stdout_on_a_full_device():
    with open("/dev/full", "wb") as full:
        r = subprocess.run([*infer_command("native"), "--model", str(MODEL_DIR), "--tokens", "1", "--max_tokens", "2",
                            "--ids"], stdout=full, stderr=subprocess.PIPE, timeout=300)
    assert r.returncode == 1 and b"standard output" in r.stderr, r.stderr


def test_infer_stdout_on_a_full_device_with_memdump():
    with open("/dev/full", "wb") as full:
        r = subprocess.run([*infer_command("native"), "--model", str(MODEL_DIR), "--memdump"], stdout=full,
                           stderr=subprocess.PIPE, timeout=300)
    assert r.returncode == 1 and b"standard output" in r.stderr, r.stderr


def test_infer_logits_only_on_success(tmp_path):
    out = tmp_path / "x.logits"
    r = infer("native", "--model", MODEL_DIR, "--tokens", "1,99999", "--max_tokens", 0, "--ids", "--logits", out,
              check=False)
    assert r.returncode == 1 and b"prefill" in r.stderr, r.stderr
    assert not out.exists()
    infer("native", "--model", MODEL_DIR, "--tokens", "1,5", "--max_tokens", 0, "--ids", "--logits", out)
    assert out.stat().st_size == 2 * 1024 * 4


def test_infer_trailing_unknown_flag():
    r = infer("native", "--model", MODEL_DIR, "--bogus", check=False)
    assert r.returncode == 2 and b"unknown" in r.stderr and b"--bogus" in r.stderr and b"needs a value" not in r.stderr
    r = infer("native", "--model", MODEL_DIR, "--tokens", check=False)
    assert r.returncode == 2 and b"--tokens needs a value" in r.stderr, r.stderr


@pytest.mark.parametrize("threads", ["-1", "257"])
def test_infer_threads_out_of_range(threads):
    r = infer("native", "--model", MODEL_DIR, "--tokens", "1", "--threads", threads, check=False)
    assert r.returncode == 2 and b"--threads" in r.stderr, r.stderr


def test_infer_threads_zero_is_the_default():
    r = infer("native", "--model", MODEL_DIR, "--tokens", "1", "--max_tokens", 1, "--ids", "--threads", 0,
              "--temperature", 0)
    assert r.stdout.strip()


# ------------------------------------------------------------------------ the tokenizer's path

@pytest.mark.parametrize("name", ["../outside/tokenizer.json", "/ABS/tokenizer.json", "sub/../../outside/tokenizer.json"])
def test_tokenizer_stays_in_the_model_directory(tmp_path, name):
    d = tmp_path / "model"
    shutil.copytree(MODEL_DIR, d)
    (tmp_path / "outside").mkdir()
    shutil.copy(MODEL_DIR / "tokenizer.json", tmp_path / "outside" / "tokenizer.json")
    name = name.replace("/ABS", str(tmp_path))
    meta = json.loads((d / "colibri_model.json").read_text())
    meta["tokenizer"] = name
    (d / "colibri_model.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="tokenizer"):
        load_tokenizer(d)
    with pytest.raises((ValueError, colibri.Error), match="tokenizer"):
        colibri.Model(d).tokenizer
    r = infer("native", "--model", d, "--validate-model", check=False)
    assert r.returncode == 1 and b"tokenizer" in r.stderr, r.stderr


def test_tokenizer_in_a_subdirectory_is_fine(tmp_path):
    d = tmp_path / "model"
    shutil.copytree(MODEL_DIR, d)
    (d / "tok").mkdir()
    shutil.move(d / "tokenizer.json", d / "tok" / "tokenizer.json")
    meta = json.loads((d / "colibri_model.json").read_text())
    meta["tokenizer"] = "tok/tokenizer.json"
    (d / "colibri_model.json").write_text(json.dumps(meta))
    assert load_tokenizer(d) is not None
    assert colibri.Model(d).tokenizer is not None


def test_a_source_tree_without_the_built_core_says_so(tmp_path):
    """`python -m colibri` run where Python imports the package's sources first (a checkout, in
    place): one line that names the missing colibri._core and what to do, not a traceback."""
    from support import TESTS
    shutil.copytree(TESTS.parent / "colibri", tmp_path / "colibri",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    r = subprocess.run([sys.executable, "-m", "colibri", "generate", "--prompt", PROMPT], capture_output=True,
                       text=True, cwd=tmp_path)
    err = r.stderr.strip()
    assert r.returncode == 1 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "colibri._core" in err and f"not built in {tmp_path / 'colibri'}" in err and "pip install ." in err

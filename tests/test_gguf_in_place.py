"""A GGUF file run in place: `colibri.Model(x.gguf)`, `colibri generate --model x.gguf` and
`colibri-infer --model x.gguf` map the file's tensors where they lie, from a description of a
few kilobytes (the tensor table, the vocabulary's tables) kept in a sidecar directory that the
core names; the reference is the same GGUF converted with `colibri convert` (a copy of its bytes),
whose strict logits and texts the in-place run must give bit for bit.  The GGUFs are llama.cpp's
converter's (tests/test_gguf_families.py), some quantized Q4_K_M-style (tests/kquant.py), and one
with a byte-level BPE vocabulary so that text runs end to end (tests/test_gguf_tokenizer.py)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri import experts
from colibri._core import gguf_sidecar
from colibri.convert import convert
from support import infer
from test_gguf_families import CASES as FAMILY_CASES, gguf_of, q4_k_m
from test_gguf_tokenizer import byte_level_vocab, write_gguf

N_TOKENS = 24
RUN = dict(capture_output=True, text=True, timeout=300, cwd="/")   # the installed colibri, not the source tree


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """Each test's own cache of descriptions (COLIBRI_CACHE, read by the core)."""
    monkeypatch.setenv("COLIBRI_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def gguf_root(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-in-place")


def sidecar_bytes(cache):
    return sum(f.stat().st_size for f in cache.rglob("*") if f.is_file())


# (family, what the GGUF holds): qwen2_moe in f16; deepseek_v2 in f32 (its kv_b is joined from two
# of the file's tensors: made, so it goes to extra.bin); olmoe and glm4_moe at Q4_K_M
CASES = [("qwen2_moe", "f16"), ("deepseek_v2", "f32"), ("olmoe", "q4_k_m"), ("glm4_moe", "q4_k_m")]


def case_gguf(family, kind, root):
    if kind != "q4_k_m":
        return gguf_of(family, kind, root)[0]
    out = root / family / "q4_k_m.gguf"
    if not out.exists():
        q4_k_m(gguf_of(family, "f32", root, wider=True)[0], out)
    return out


@pytest.mark.parametrize("family,kind", CASES)
def test_a_gguf_runs_in_place_as_its_conversion_bit_for_bit(family, kind, gguf_root, cache, tmp_path):
    """As a user runs it: the file opened with no options against `colibri convert` with none (each
    matrix in the form this machine's kernels run faster: rewritten at open in place, written so
    by the converter)."""
    path = case_gguf(family, kind, gguf_root)
    convert(path, tmp_path / "converted", progress=False)
    converted = colibri.Model(tmp_path / "converted", verify=True)
    before = path.stat()
    in_place = colibri.Model(path, verify=True)   # the first open describes it

    assert path.stat().st_mtime_ns == before.st_mtime_ns and path.stat().st_size == before.st_size
    sidecar = Path(in_place.directory)
    assert sidecar.parent.parent == cache and sidecar == Path(gguf_sidecar(path))
    written = sidecar_bytes(cache)
    print(f"{family} {kind}: {path.stat().st_size:,} B GGUF, {written:,} B of description "
          f"({100 * written / path.stat().st_size:.2f}%); converted weights.bin "
          f"{(tmp_path / 'converted' / 'weights.bin').stat().st_size:,} B")
    # what lies in extra.bin is only what colibri made (no tensor the file holds as it is), and the
    # rest is the JSON: a fixed cost per tensor (these tiny files are 0.6-2 MB; the 2% bound on the
    # description is for models of real size, shown on the bench pipeline's in the closing note)
    doc = json.loads((sidecar / "colibri_model.json").read_text())
    made = [t for t in doc["tensors"] if t["file_offset"] >= doc["weights"]["extra_at"]]
    assert all(t["name"].startswith("tokenizer.") or t["name"].endswith("attn.wkv_b") for t in made), made
    assert (sidecar / "extra.bin").stat().st_size <= sum(t["file_size"] + 64 for t in made)
    assert written - (sidecar / "extra.bin").stat().st_size <= 1024 * len(doc["tensors"]) + 8192
    assert {t["name"]: t["dtype"] for t in converted.tensors()} == {t["name"]: t["run_dtype"] for t in in_place.tensors()}

    tokens = np.random.default_rng(3).integers(0, converted.config["vocab_size"], N_TOKENS)
    for kernels in ("reference", "auto"):   # strict mode, and the fast kernels (the same layout: the same bits)
        ours = in_place.session(ctx=64, kernels=kernels).forward(tokens)
        ref = converted.session(ctx=64, kernels=kernels).forward(tokens)
        assert np.array_equal(ours, ref), f"{kernels}: max |in place - converted| {np.abs(ours - ref).max()}"
    copied = colibri.Model(path, copy=True).session(ctx=64, kernels="reference").forward(tokens)   # read, not mapped
    assert np.array_equal(copied, converted.session(ctx=64, kernels="reference").forward(tokens))

    prompt = ",".join(map(str, tokens[:6]))
    flags = ["--tokens", prompt, "--max-tokens", "8", "--temperature", "0.8", "--seed", "7", "--ignore-eos"]
    texts = [subprocess.run([sys.executable, "-m", "colibri", "generate", "--model", str(m), *flags], **RUN)
             for m in (path, tmp_path / "converted")]
    assert texts[0].returncode == 0 and texts[0].stdout == texts[1].stdout, (texts[0].stderr, texts[1].stdout)
    c_texts = [infer("native", "--model", str(m), *flags, check=False) for m in (path, tmp_path / "converted")]
    assert c_texts[0].returncode == 0, c_texts[0].stderr.decode()
    assert c_texts[0].stdout == c_texts[1].stdout and c_texts[0].stdout.strip()   # it prints the text, not ids
    # streamed from the GGUF itself through a cache of half the experts: the same text
    streamed = subprocess.run([sys.executable, "-m", "colibri", "generate", "--model", str(path),
                               "--expert-budget", "50%", "--verbose", *flags], **RUN)
    assert streamed.returncode == 0 and streamed.stdout == texts[1].stdout, streamed.stderr
    assert int(re.search(r"(\d+) misses", streamed.stderr).group(1)) > 0, streamed.stderr   # read from the file


def rss_after(script):
    """The resident bytes of a fresh interpreter before and after `script` runs (the installed colibri)."""
    code = ("import colibri, numpy as np\n"
            "rss = lambda: int(open('/proc/self/status').read().split('VmRSS:')[1].split()[0]) * 1024\n"
            f"before = rss()\n{script}\nprint(before, rss())")
    r = subprocess.run([sys.executable, "-c", code], **RUN)
    assert r.returncode == 0, r.stderr
    return [int(v) for v in r.stdout.split()[-2:]]


def test_a_gguf_is_repacked_at_open_in_its_own_pages(gguf_root, cache, tmp_path):
    """A Q4_K_M GGUF opened with no options runs each matrix in the row-interleaved form this machine's
    kernels multiply faster, rewritten at open in the private mapping's own pages: the file unchanged,
    the memory the file's size (no copy beside the mapping), the logits those of the file converted
    with the same forms (and, opened with repack=False, those of its byte-for-byte conversion); an
    expert streamed from the file is rewritten in its slot, whether or not the mapping's were."""
    path = case_gguf("glm4_moe", "q4_k_m", gguf_root)
    forms = {colibri._core.interleaved_form(d, fast_here=True) for d in ("q4_k", "q6_k")}
    if forms == {"q4_k", "q6_k"}:
        pytest.skip("this machine's kernels run no interleaved K-quant form faster (the reference kernels)")
    fast = colibri.Model(convert(path, tmp_path / "fast", progress=False))
    plain = colibri.Model(convert(path, tmp_path / "plain", progress=False, repack=False, layout="interleaved"),
                          repack=False)
    data = path.read_bytes()
    in_place, as_stored = colibri.Model(path), colibri.Model(path, repack=False)
    assert path.read_bytes() == data   # never written: the pages written are the process's own

    runs = {t["name"]: t["run_dtype"] for t in in_place.tensors()}
    assert runs == {t["name"]: t["dtype"] for t in fast.tensors()}
    assert {t["run_dtype"] for t in in_place.tensors() if t["name"].endswith("experts.w1")} & forms   # x8: something moved
    assert all(t["run_dtype"] == t["dtype"] for t in as_stored.tensors())
    assert {t["name"]: t["dtype"] for t in as_stored.tensors()} == {t["name"]: t["dtype"] for t in plain.tensors()}

    tokens = np.random.default_rng(5).integers(0, fast.config["vocab_size"], N_TOKENS)
    steps = [int(t) for t in np.random.default_rng(6).integers(0, fast.config["vocab_size"], 4)]

    def run(model, **options):   # a prompt, then decode steps (the workers' own waits on streamed slots)
        s = model.session(ctx=64, **options)
        return [s.forward(tokens)] + [s.forward([t]) for t in steps]

    for kernels in ("auto", "reference"):
        for ours, ref in ((in_place, fast), (as_stored, plain)):
            for a, b in zip(run(ours, kernels=kernels), run(ref, kernels=kernels)):
                assert np.array_equal(a, b), f"{kernels}: max |in place - converted| {np.abs(a - b).max()}"
    reference = run(fast)
    for stream_experts in (False, True):   # the mapping's experts rewritten at open, or left to their slots
        model = colibri.Model(path, stream_experts=stream_experts)
        expert_runs = {t["run_dtype"] for t in model.tensors() if ".experts." in t["name"]}
        assert expert_runs == ({runs[n] for n in runs if ".experts." in n} if not stream_experts else
                               {t["dtype"] for t in model.tensors() if ".experts." in t["name"]})
        for verify in (False, True):   # checked against the extents' CRCs first: a converted file's
            source = model if not verify else colibri.Model(tmp_path / "plain", stream_experts=stream_experts)
            streamed = run(source, expert_budget=experts.routed_bytes(source) // 2, verify=verify)
            for a, b in zip(streamed, reference):
                assert np.array_equal(a, b), f"streamed: max |slot - resident| {np.abs(a - b).max()}"

    # in place: the pages the rewrite writes replace the file's in the mapping, so the whole run's
    # memory stays the file's size; run as stored, the same (nothing to compare against but the file)
    open_run = (f"m = colibri.Model({str(path)!r}{{}})\n"
                "m.session(ctx=128).forward(np.arange(128) % m.config['vocab_size'])")
    size, grown = path.stat().st_size, {}
    for option in ("", ", repack=False"):
        before, after = rss_after(open_run.format(option))
        grown[option] = after - before
        print(f"repack{option or '=True'}: {after - before:,} B more resident for a {size:,} B file")
        assert after - before <= 1.1 * size + (4 << 20), (option, after - before, size)   # the session's arena
    assert grown[""] <= grown[", repack=False"] + 0.1 * size   # a copy beside the mapping would add the file


def test_interleaved_forms_the_kernels_here_lack_run_plain(gguf_root, cache, tmp_path, monkeypatch):
    """A file stored in the row-interleaved forms (converted on x86) opened where the kernels have no
    kernels of their own for those forms (NEON, RVV, MVE for the K-quants; here the reference-int8
    kernels, which would run them through the reference) is rewritten back into the plain forms at
    open: the file unchanged, the logits those of its plain conversion, bit for bit, whether the
    experts are rewritten at open or in their slots."""
    path = case_gguf("glm4_moe", "q4_k_m", gguf_root)
    x8_path = convert(path, tmp_path / "x8", progress=False, repack=True)   # every form that has one
    plain_path = convert(path, tmp_path / "plain", progress=False, repack=False)
    monkeypatch.setenv("COLIBRI_KERNELS", "reference-int8")   # what sessions and the open pick here
    plain = colibri.Model(plain_path)   # nothing to rewrite: these kernels have no interleaved form
    assert all(t["run_dtype"] == t["dtype"] for t in plain.tensors())
    data = (Path(x8_path) / "weights.bin").read_bytes()
    stored = {t["name"]: t["dtype"] for t in colibri.Model(x8_path, repack=False).tensors()}
    assert {d for d in stored.values() if d.endswith("x8")} >= {"q4_kx8", "q6_kx8"}

    model = colibri.Model(x8_path)
    assert {t["name"]: t["run_dtype"] for t in model.tensors()} == {t["name"]: t["dtype"] for t in plain.tensors()}
    tokens = np.random.default_rng(7).integers(0, plain.config["vocab_size"], N_TOKENS)

    sessions = []

    def run(m, **options):
        sessions.append(m.session(ctx=64, **options))
        return [sessions[-1].forward(tokens), sessions[-1].forward([3])]

    reference = run(plain)
    streamed = colibri.Model(x8_path, stream_experts=True)   # half the experts in slots: each read, then rewritten
    for ours in (run(model), run(streamed, expert_budget=experts.routed_bytes(model) // 2),
                 run(colibri.Model(x8_path, repack=False))):   # as stored: the reference computes the plain sums
        for a, b in zip(ours, reference):
            assert np.array_equal(a, b), f"max |x8 file - plain file| {np.abs(a - b).max()}"
    assert sessions[2].expert_cache_stats()["misses"] > 0   # the slots' rewrite ran
    assert (Path(x8_path) / "weights.bin").read_bytes() == data   # never written


@pytest.mark.parametrize("family", [f for f in FAMILY_CASES if f not in dict(CASES)])
def test_every_family_llama_cpp_writes_runs_in_place(family, gguf_root, tmp_path):
    """The other families of tests/test_gguf_families.py, at F16: strict logits as the conversion's."""
    path = case_gguf(family, "f16", gguf_root)
    converted = colibri.Model(convert(path, tmp_path / "converted", progress=False))
    tokens = np.random.default_rng(4).integers(0, converted.config["vocab_size"], N_TOKENS)
    ours = colibri.Model(path, verify=True).session(ctx=64, kernels="reference").forward(tokens)
    assert np.array_equal(ours, converted.session(ctx=64, kernels="reference").forward(tokens))


def test_text_runs_in_place_with_the_files_vocabulary(tmp_path):
    """A GGUF with a byte-level BPE vocabulary: `colibri generate --prompt` and tokenize run from
    the tables the description made."""
    tokens, types, merges = byte_level_vocab("gpt-2")
    path = write_gguf(tmp_path / "bpe.gguf", tokens, types, merges=merges, pre="gpt-2")
    convert(path, tmp_path / "converted", progress=False)
    in_place, converted = colibri.Model(path), colibri.Model(tmp_path / "converted")
    text = "Hello world, héllo again"
    assert in_place.tokenize(text) == converted.tokenize(text)
    flags = ["--prompt", text, "--max-tokens", "12", "--temperature", "0", "--ignore-eos"]
    out = [subprocess.run([sys.executable, "-m", "colibri", "generate", "--model", str(m), *flags], **RUN)
           for m in (path, tmp_path / "converted")]
    assert out[0].returncode == 0 and out[0].stdout == out[1].stdout, out[0].stderr


def test_a_changed_gguf_is_described_anew_and_a_stale_description_refused(gguf_root, cache, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(case_gguf("qwen2_moe", "f16", gguf_root).read_bytes())
    first = colibri.Model(path).directory
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))   # written to, say
    second = colibri.Model(path).directory
    assert first != second and Path(second) == Path(gguf_sidecar(path))
    # the old description names a file that is not the one on disk: its weights are not mapped
    doc = json.loads((Path(first) / "colibri_model.json").read_text())
    assert doc["weights"]["mtime_ns"] != path.stat().st_mtime_ns


def test_what_cannot_open_in_place_says_why(gguf_root, cache, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(case_gguf("qwen2_moe", "f16", gguf_root).read_bytes())
    # colibri-infer needs the description Python writes
    r = infer("native", "--model", str(path), "--tokens", "1,2", "--max-tokens", "2", check=False)
    assert r.returncode != 0 and b"no description of this GGUF yet" in r.stderr, r.stderr
    sidecar = colibri.Model(path).directory
    r = infer("native", "--model", str(path), "--tokens", "1,2", "--max-tokens", "2", check=False)
    assert r.returncode == 0, r.stderr
    # the sidecar opened as a model directory names the GGUF it describes
    with pytest.raises(colibri.Error, match="describes the GGUF file m.gguf, used in place: open that file"):
        colibri.Model(sidecar)
    # a file that is not a GGUF
    other = tmp_path / "notes.txt"
    other.write_text("not a model")
    with pytest.raises(colibri.Error, match="not a GGUF file"):
        colibri._core.gguf_sidecar(other)
    # a GGUF cut short after it was described: the description is not used for another file
    colibri.Model(path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(Exception, match="not a readable GGUF|runs to byte|past the end"):
        colibri.Model(path)
    # images link a model directory's weights.bin
    path.write_bytes(data)
    r = subprocess.run([sys.executable, "-m", "colibri", "firmware", "export", "--model", str(path), "--board",
                        "mps2-an386", "--out", str(tmp_path / "fw")], **RUN)
    assert r.returncode != 0 and "convert the GGUF first" in r.stderr, r.stderr

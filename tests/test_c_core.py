"""The C core's own tests (meson test), in the release and the ASan/UBSan builds, and
the arena accounting seen from Python."""
import re
import subprocess

import pytest

import colibri
from bad_models import FIXTURE
from colibri.targets import build, env_for


@pytest.mark.parametrize("kind", ["native", "clang", "sanitize", "clang-sanitize"])
def test_meson_tests_pass(kind):
    out = build(kind)
    # ASan and UBSan make the kernel sweeps 2-3 times slower; their timeouts scale with that
    slower = ["--timeout-multiplier", "3"] if "sanitize" in kind else []
    r = subprocess.run(["meson", "test", "-C", str(out), "--print-errorlogs", *slower], capture_output=True, text=True,
                       env=env_for(kind), timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert re.search(r"Fail:\s+0", r.stdout), r.stdout


def test_every_exported_symbol_is_prefixed():
    """A program links colibri beside other C libraries (json-c has a json_object_get): every symbol
    the core's libraries define for others carries colibri_."""
    out = build("native") / "c_core"
    libraries = sorted(out.glob("libcolibri_*.a"))
    assert libraries
    for library in libraries:
        r = subprocess.run(["nm", "-g", "--defined-only", str(library)], capture_output=True, text=True, check=True)
        symbols = [line.split()[2] for line in r.stdout.splitlines() if len(line.split()) == 3]
        assert symbols, library
        assert [s for s in symbols if not s.startswith("colibri_")] == [], library.name


def test_decoding_allocates_nothing():
    """64 decode steps (greedy and top-k/top-p sampling), every allocator call in the process counted,
    with the experts resident and then streamed through the expert cache (reads and guesses made)."""
    binary = build("native") / "c_core" / "tests" / "test_no_alloc"
    r = subprocess.run([str(binary), str(FIXTURE)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "allocator calls during 64 resident decode steps: 0 (position 72)" in r.stdout
    assert "allocator calls during 64 streamed decode steps: 0 (position 72)" in r.stdout
    assert "allocator calls during 64 device decode steps: 0 (position 72)" in r.stdout


@pytest.mark.parametrize("ctx,batch", [(256, 0), (17, 5), (1, 1)])
def test_memdump_accounts_for_every_arena_byte(ctx, batch):
    m = colibri.Model(FIXTURE)
    plan = m.memory_plan(ctx=ctx, batch=batch)
    s = m.session(ctx=ctx, batch=batch)
    totals = s.memory()
    assert totals["arena_used"] == plan                 # the plan is exact, made before allocating
    assert totals["arena_reserved"] >= plan
    assert totals["weights"] == sum(t["file_size"] for t in m.tensors())

    report = s.memdump()
    rows = re.findall(r"(?:├──|└──) (\S+) .*?([\d,]+) B\s+@0x[0-9a-f]+$", report, re.M)
    named = {name: int(size.replace(",", "")) for name, size in rows}
    for t in m.tensors():                               # every weight, by tensor
        assert named[t["name"]] == t["file_size"]
    arena_rows = report.split("\narena")[1].split("\nmetadata")[0].split("\n", 1)[1]   # below the header
    buffers = [int(b.replace(",", "")) for b in re.findall(r"([\d,]+) B\s+@0x", arena_rows)]
    padding = int(re.search(r"alignment padding ([\d,]+) B", report).group(1).replace(",", ""))
    assert sum(buffers) + padding == totals["arena_used"]
    cfg = m.config
    kv = 2 * cfg["num_layers"] * ctx * cfg["num_kv_heads"] * cfg["head_dim"] * 4
    assert named["layers.0.k"] * 2 * cfg["num_layers"] == kv
    assert re.search(r"high-water ([\d,]+) B", report).group(1).replace(",", "") == str(plan)
    total = totals["weights"] + totals["arena_used"] + totals["metadata"]
    assert f"= {total:,} B" in report


EXPERT_TENSOR = re.compile(r"layers\.\d+\.experts\.(?:w1|w3|w2|b1|b3|b2)$")
ROW = re.compile(r"^[│├└─ ]*(\S+)(?:  +(\S.*?))?  +([\d,]+) B  +@(0x[0-9a-f]+)$")   # name, shape, bytes, address


def expert_rows(report, tensor):
    """(name, bytes, address) of the lines listed under `tensor`'s line, up to the next tensor."""
    lines = report.split("\nweights")[1].split("\n\narena")[0].splitlines()
    at = next(i for i, text in enumerate(lines) if f" {tensor} " in text)
    rows = []
    for text in lines[at + 1:]:
        if not text.lstrip("│ ").startswith(("├── expert", "└── expert", "├── (experts")):
            break
        m = ROW.match(text)
        rows.append((m.group(1), int(m.group(3).replace(",", "")), int(m.group(4), 16)) if m
                    else (text.lstrip("│├└─ "), None, None))
    return rows


def test_memdump_lists_each_expert_under_its_tensor():
    """Under each routed-expert tensor, one line per expert: expert e's part, of file_size / E bytes
    (stacked: at the tensor's address + e parts).  Every line's columns are apart (two spaces at least)."""
    m = colibri.Model(FIXTURE)
    report = m.session(ctx=16).memdump()
    E = m.config["num_experts"]
    tensors = [t for t in m.tensors() if EXPERT_TENSOR.match(t["name"])]
    assert tensors
    for t in tensors:
        line = next(text for text in report.splitlines() if f" {t['name']} " in text)
        base, part = int(ROW.match(line).group(4), 16), t["file_size"] // E
        assert expert_rows(report, t["name"]) == [(f"expert_{e}", part, base + e * part) for e in range(E)]


def test_memdump_columns_never_run_together(tmp_path):
    """Each weight and buffer line: name, shape, bytes and address two spaces apart at least, however
    long the shape (q8_0's "(n_batch, widest q8_0/q4_0 input / 32) q8 blocks" passes its column)."""
    from colibri.convert import convert
    from support import FIXTURES

    q8 = convert(FIXTURES / "tiny-mixtral", tmp_path / "q8", dtype="q8_0", progress=False)
    for path in (FIXTURE, q8):
        report = colibri.Model(path).session(ctx=16).memdump()
        body = report.split("\nweights")[1].split("\nmetadata")[0]
        rows = [text for text in body.splitlines()[1:] if text.startswith(("├", "└", "│", " "))
                and re.search(r" B +@0x", text)]
        assert rows and all(ROW.match(text) for text in rows), [text for text in rows if not ROW.match(text)]
        assert path == FIXTURE or "q8 blocks  " in report


def test_memdump_folds_the_experts_past_64(tmp_path):
    """With more than 64 experts a tensor lists its first and last 4 and one line counting the rest."""
    from colibri.convert import convert
    from support import build as build_hf

    build_hf("mixtral", num_local_experts=80, num_hidden_layers=1, intermediate_size=32).save_pretrained(tmp_path / "hf")
    m = colibri.Model(convert(tmp_path / "hf", tmp_path / "m", progress=False))
    E, report = m.config["num_experts"], m.session(ctx=16).memdump()
    for t in (t for t in m.tensors() if EXPERT_TENSOR.match(t["name"])):
        rows, part = expert_rows(report, t["name"]), t["file_size"] // E
        assert [r[0] for r in rows] == [f"expert_{e}" for e in range(4)] + [
            f"(experts 4 .. {E - 5}: {E - 8} more of {part:,} B each)"] + [f"expert_{e}" for e in range(E - 4, E)]
        assert all(r[1] == part for r in rows if r[1] is not None)


def test_plan_grows_with_the_context():
    m = colibri.Model(FIXTURE)
    assert m.memory_plan(ctx=64) < m.memory_plan(ctx=128) < m.memory_plan(ctx=256)


def test_json_numbers_read_like_python(tmp_path):
    """The core's own decimal reader (no strtod: it depends on the locale) against Python's,
    on rms_norm_eps and rope_theta written in many spellings; both end as float32."""
    import json
    import shutil

    import numpy as np

    rng = np.random.default_rng(5)
    values = ["1e-05", "0.00001", "1E-5", "10e-6", "1.0e-5", "1000000.0", "1e6", "10000", "0.5",
              "500000", "1.5e-06", "3.14159265358979", "0.000001"]
    values += [repr(float(v)) for v in 10.0 ** rng.uniform(-7, 0, 40)]
    values += [f"{v:.9e}" for v in 10.0 ** rng.uniform(0, 9, 40)]
    d = tmp_path / "m"
    shutil.copytree(FIXTURE, d)
    doc = json.loads((d / "colibri_model.json").read_text())
    text = json.dumps(doc)
    for v in values:
        key = "rms_norm_eps" if float(v) <= 1 else "rope_theta"
        edited = re.sub(f'"{key}": [^,}}]+', f'"{key}": {v}', text, count=1)
        assert f'"{key}": {v},' in edited
        (d / "colibri_model.json").write_text(edited)
        got = colibri.Model(d).config[key]
        assert np.float32(got) == np.float32(float(v)), (v, got)

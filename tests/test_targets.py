"""The same tests on every Linux target: the core cross-built for aarch64 and riscv64
(toolchains/*.ini) and run under QEMU user mode, driven from here through colibri-infer
(token ids in, logits to a file, ids or errors out).  `native` is the host build."""
import re
import subprocess

import numpy as np
import pytest

from bad_models import CASES, make_case
from colibri import targets
from colibri.targets import RUNNER, TARGETS, build, env_for, machine_file, source_dir
from support import FIXTURES, HF_MODELS, infer, prompt_logits, transformers_expert_load

BUNDLED_HF = FIXTURES / "shakespeare-hf"


@pytest.mark.parametrize("target", [t for t in TARGETS if t != "native"])   # native's: test_c_core.py
def test_c_tests_pass(target):
    """The core's own C tests: allocation count, caller arena, loading from memory, a run, and
    every kernel variant of the target (NEON on aarch64, RVV on riscv64-rvv) against the reference."""
    r = subprocess.run(["meson", "test", "-C", str(build(target)), "--print-errorlogs"], capture_output=True,
                       text=True, env=env_for(target), timeout=600)
    assert r.returncode == 0 and re.search(r"Fail:\s+0", r.stdout), r.stdout[-3000:]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("model", HF_MODELS)
@pytest.mark.parametrize("target", TARGETS)
def test_logits_match_transformers(target, model, dtype, converted, references, tmp_path):
    ref = references[model]
    logits = prompt_logits(target, converted[(model, dtype)], ref["tokens"], tmp_path)
    want = ref["logits" if dtype == "f32" else f"logits_{dtype}"]
    np.testing.assert_allclose(logits, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("model", HF_MODELS)
@pytest.mark.parametrize("target", TARGETS)
def test_greedy_tokens_match_transformers(target, model, converted, references):
    ref = references[model]
    r = infer(target, "--model", converted[(model, "f32")], "--tokens", ",".join(map(str, ref["tokens"][:8])),
              "--max_tokens", len(ref["greedy"]), "--temperature", 0, "--ignore_eos", "--ids")
    assert [int(t) for t in r.stdout.decode().split(",")] == list(ref["greedy"])


@pytest.mark.parametrize("model", HF_MODELS)
@pytest.mark.parametrize("target", TARGETS)
def test_router_matches_transformers(target, model, converted, references, tmp_path):
    """Router semantics on the target: tokens per expert per layer equal transformers' top-k."""
    tokens = references[model]["tokens"]
    want = transformers_expert_load(model, tokens)
    path = tmp_path / "load.bin"
    infer(target, "--model", converted[(model, "f32")], "--tokens", ",".join(map(str, tokens)), "--max_tokens", 0,
          "--ids", "--batch", 5, "--expert_load", path)
    np.testing.assert_array_equal(np.fromfile(path, dtype="<u8").reshape(want.shape), want)


@pytest.mark.parametrize("target", TARGETS)
def test_bundled_model_matches_transformers(target, tmp_path):
    from colibri.demo import MODEL_DIR

    with np.load(BUNDLED_HF / "reference.npz") as z:
        tokens, want = z["tokens"], z["logits"]
    np.testing.assert_allclose(prompt_logits(target, MODEL_DIR, tokens, tmp_path), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("target", ["aarch64", "riscv64", "riscv64-rvv"])
def test_targets_agree_with_the_host(target, converted, references, tmp_path):
    """Fast mode (AVX2 on the host, NEON on aarch64, the reference on riscv64, RVV on riscv64-rvv)
    promises agreement within 1e-5 of the host's logits on this model; only summation order differs."""
    model, ref = converted[("tiny-mixtral-b", "f32")], references["tiny-mixtral-b"]
    host = prompt_logits("native", model, ref["tokens"], tmp_path)
    other = prompt_logits(target, model, ref["tokens"], tmp_path)
    print(f"{target}: {np.count_nonzero(host.view(np.uint32) == other.view(np.uint32))} of {host.size} "
          f"logits bit-identical to the host, max |diff| {np.abs(host - other).max():.2e}")
    np.testing.assert_allclose(other, host, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model", ["bundled", "tiny-mixtral-b"])
def test_deterministic_mode_is_bit_identical_everywhere(model, converted, references, tmp_path):
    """The strict mode (--reference: fixed summation order, no FMA, our own exp/log/sin/cos)
    gives the same float bits on x86-64, AArch64 and RISC-V, whatever the prefill chunking."""
    from colibri.demo import MODEL_DIR

    if model == "bundled":
        with np.load(BUNDLED_HF / "reference.npz") as z:
            model_dir, tokens = MODEL_DIR, z["tokens"]
    else:
        model_dir, tokens = converted[(model, "f32")], references[model]["tokens"]
    runs = {(t, b): prompt_logits(t, model_dir, tokens, tmp_path, "--reference", "--batch", b).view(np.uint32)
            for t in TARGETS for b in (1, 64)}
    first = runs[("native", 64)]
    for key, bits in runs.items():
        assert np.array_equal(bits, first), f"{key}: {np.count_nonzero(bits != first)} logits differ in their bits"


def test_deterministic_sampling_agrees_across_targets():
    """Same seed, same tokens on every target: logits, exp and the integer RNG are all exact."""
    from colibri.demo import MODEL_DIR

    args = ["--model", MODEL_DIR, "--tokens", "1,591,47,39,49,28", "--max_tokens", 48, "--temperature", 0.9,
            "--top_k", 50, "--top_p", 0.9, "--seed", 5, "--reference"]
    outputs = {t: infer(t, *args).stdout for t in TARGETS}
    assert len(set(outputs.values())) == 1, outputs


@pytest.mark.parametrize("target", TARGETS)
def test_seeded_sampling_repeats(target, converted):
    args = ["--model", converted[("tiny-mixtral", "f32")], "--tokens", "1,5,9", "--max_tokens", 24,
            "--temperature", 0.9, "--top_k", 50, "--top_p", 0.9, "--seed", 11, "--ids"]
    assert infer(target, *args).stdout == infer(target, *args).stdout


@pytest.mark.parametrize("target", ["aarch64", "riscv64"])
def test_one_flag_runs_the_cli_on_a_target(target):
    """`colibri generate --target T` is the host run, on T: the same text, greedy."""
    import sys

    def run(*extra):
        return subprocess.run([sys.executable, "-m", "colibri", "generate", "--prompt", "ROMEO:", "--max-tokens", "40",
                               "--temperature", "0", *extra], capture_output=True, check=True, timeout=300).stdout

    assert run("--target", target) == run()


@pytest.mark.parametrize("target", ["aarch64", "riscv64"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_models_on_target(target, case, tmp_path):
    r = infer(target, "--model", make_case(case, tmp_path), "--validate-model", check=False)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 1 and case.status in err and case.fragment in err, err


def test_the_cross_files_read_as_meson_reads_them():
    """colibri.targets takes every target's facts from toolchains/*.ini with a reader of its own:
    the same values as Meson's."""
    meson = pytest.importorskip("mesonbuild.machinefile")
    made = targets.constants_file()   # what colibri.targets gives Meson before each cross file
    for path in sorted((source_dir() / "toolchains").glob("*.ini")):
        ours = machine_file.read(path, constants=targets.made_constants())
        assert ours == machine_file.read(made, path) == meson.parse_machine_files([str(made), str(path)],
                                                                                  str(source_dir())), path


# ---- RISC-V Vector: one binary, every VLEN

VLENS = [128, 256, 512, 1024]


def at_vlen(vlen, program, *args):
    """A riscv64-rvv program under its exe_wrapper with the vector registers VLEN bits wide."""
    runner = [re.sub(r"vlen=\d+", f"vlen={vlen}", a) for a in RUNNER["riscv64-rvv"]]
    return [*runner, str(program), *map(str, args)]


# the cross file's own VLEN: test_c_tests_pass[riscv64-rvv] runs the kernel tests there
CROSS_VLEN = int(re.search(r"vlen=(\d+)", " ".join(RUNNER["riscv64-rvv"])).group(1))


@pytest.mark.parametrize("vlen", [v for v in VLENS if v != CROSS_VLEN])
def test_rvv_kernels_at_every_vlen(vlen):
    """The rvv variant takes its vector length from vsetvl: the kernel tests (every variant against
    the reference, every tail 1..385, its int8 path bit for bit the scalar one) pass at each VLEN
    (at the cross file's, as part of the C tests)."""
    r = subprocess.run(at_vlen(vlen, build("riscv64-rvv") / "c_core" / "tests" / "test_kernels", "--emulated"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"^rvv kernels: \d+ outputs compared with the reference, 0 outside", r.stdout, re.M), r.stdout
    assert re.search(r"^rvv tails 1\.\.385: \d+ outputs compared with the reference, 0 outside", r.stdout, re.M), r.stdout


@pytest.mark.parametrize("vlen", VLENS)
@pytest.mark.parametrize("dtype", ["q8_0", "q4_0"])
def test_rvv_int8_path_is_the_scalar_one_at_every_vlen(dtype, vlen, bundled_quantized, tmp_path):
    """rvv's int8 path (rvv-int8: its quantize_q8 and matmul_q8, the rest the reference) gives the
    bundled model's logits bit for bit as the scalar int8 path does, on the host and at every VLEN:
    integer block reductions, scales applied in the same order."""
    with np.load(BUNDLED_HF / "reference.npz") as z:
        tokens = ",".join(map(str, z["tokens"][:24]))

    def logits(command, kernels):
        out = tmp_path / f"{kernels}.logits"
        args = ["--model", bundled_quantized[dtype], "--tokens", tokens, "--max_tokens", 0, "--ids", "--logits", out,
                "--kernels", kernels]
        subprocess.run([*command, *map(str, args)], check=True, capture_output=True, timeout=600)
        return np.fromfile(out, dtype="<u4")

    host = logits([str(build("native") / "c_core" / "colibri-infer")], "reference-int8")
    program = build("riscv64-rvv") / "c_core" / "colibri-infer"
    scalar, vector = (logits(at_vlen(vlen, program), k) for k in ("reference-int8", "rvv-int8"))
    assert np.array_equal(scalar, host), f"{np.count_nonzero(scalar != host)} logits differ from the host's"
    assert np.array_equal(vector, scalar), f"{np.count_nonzero(vector != scalar)} logits differ from the scalar int8 path's"

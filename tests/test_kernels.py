"""Kernel selection: the fastest variant this CPU runs is the default, the reference is one
flag (or COLIBRI_KERNELS=reference) away, and whole-model logits agree between them.  The
kernels themselves are compared with the reference in c_core/tests/test_kernels.c, on every
target (tests/test_targets.py runs it under QEMU)."""
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import colibri
from colibri.demo import MODEL_DIR
from support import FIXTURES


def cpu_flags():
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


def expected_variants():
    """The kernel variants this machine should run, from /proc/cpuinfo (an outside witness of the
    CPU probe), best last."""
    flags = cpu_flags()
    if platform.machine() == "x86_64" and {"avx2", "fma", "f16c"} <= flags:
        if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:   # avx512-bf16: a numerics choice, named only
            return ["reference", "reference-int8", "avx2", "avx512"] + (["avx512-bf16"] if "avx512_bf16" in flags else [])
        return ["reference", "reference-int8", "avx2"]
    if platform.machine() == "aarch64":
        return ["reference", "reference-int8", "neon"] + (["neon-dotprod"] if "asimddp" in flags else [])
    return ["reference", "reference-int8"]


def test_the_fastest_variant_is_the_default():
    expected = expected_variants()
    assert [k for k, runs in colibri.kernel_variants().items() if runs] == expected
    # in a process without COLIBRI_KERNELS, which would choose instead (as it does to run the suite on another variant)
    code = "import colibri; from colibri.demo import MODEL_DIR; print(colibri.Model(MODEL_DIR).session(ctx=16).kernels)"
    env = {k: v for k, v in os.environ.items() if k != "COLIBRI_KERNELS"}
    default = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/", env=env)
    fastest = [k for k in expected if k != "avx512-bf16"][-1]   # never picked by itself: it moves the numbers
    assert default.stdout.strip() == (fastest if len(expected) > 2 else "reference")
    for name in expected:
        assert colibri.Model(MODEL_DIR).session(ctx=16, kernels=name).kernels == name
    with pytest.raises(ValueError, match="kernels must be"):
        colibri.Model(MODEL_DIR).session(kernels="fast")


@pytest.mark.parametrize("variant", expected_variants())
def test_environment_forces_a_variant(variant):
    code = "import colibri; from colibri.demo import MODEL_DIR; print(colibri.Model(MODEL_DIR).session(ctx=8).kernels)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/",
                         env=dict(os.environ, COLIBRI_KERNELS=variant)).stdout
    assert out.strip() == variant


def test_environment_names_an_unknown_variant():
    code = "import colibri; from colibri.demo import MODEL_DIR; colibri.Model(MODEL_DIR).session(ctx=8)"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                         env=dict(os.environ, COLIBRI_KERNELS="sse9"))
    assert run.returncode != 0
    assert 'COLIBRI_KERNELS "sse9": no such kernel variant runs here' in run.stderr
    assert "reference" in run.stderr


@pytest.mark.parametrize("model_dir", [MODEL_DIR, FIXTURES / "tiny-mixtral.colibri"], ids=["bundled", "tiny"])
def test_variants_agree_on_whole_models(model_dir):
    """Fast mode differs from the reference only by float summation order: within 1e-4 here."""
    m = colibri.Model(model_dir)
    tokens = np.arange(1, 65) % m.vocab_size
    fast = m.session(ctx=64).forward(tokens)
    ref = m.session(ctx=64, kernels="reference").forward(tokens)
    print(f"{model_dir.name}: max |auto - reference| = {np.abs(fast - ref).max():.2e}")
    np.testing.assert_allclose(fast, ref, atol=1e-4, rtol=0)

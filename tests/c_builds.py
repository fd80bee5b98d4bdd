"""Meson builds of the C core alone, made once per test run under build/ and reused:
`native` (the release flags, for the C tests), `clang`, `sanitize` (AddressSanitizer + UBSan),
and the Linux cross targets `aarch64` and `riscv64` (toolchains/*.ini), whose programs run under
QEMU user mode."""
import functools
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {
    "native": ["-Dpython=false"],
    "clang": ["-Dpython=false", "--native-file", "toolchains/clang.ini"],   # same -Werror flags
    "sanitize": ["-Dpython=false", "-Db_sanitize=address,undefined", "-Db_lundef=false",
                 "--buildtype=debugoptimized"],
    "aarch64": ["-Dpython=false", "--cross-file", "toolchains/aarch64-linux-gnu.ini"],
    "riscv64": ["-Dpython=false", "--cross-file", "toolchains/riscv64-linux-gnu.ini"],
}

# How a target's programs run on this x86_64 host.
RUNNER = {
    "aarch64": ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"],
    "riscv64": ["qemu-riscv64", "-L", "/usr/riscv64-linux-gnu"],
}
TARGETS = ["native", "aarch64", "riscv64"]

# Sanitizer findings must fail the run, never scroll past.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=86",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
}


@functools.lru_cache(maxsize=None)
def build(kind):
    """Configures (once) and builds build/<kind>; returns its directory."""
    out = ROOT / "build" / kind
    if not (out / "build.ninja").exists():
        r = subprocess.run(["meson", "setup", str(out), *OPTIONS[kind]], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"configuring build/{kind} failed:\n{r.stdout[-4000:]}")
    r = subprocess.run(["ninja", "-C", str(out)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building build/{kind} failed:\n{r.stdout[-4000:]}")
    return out


def infer_binary(kind):
    return build(kind) / "c_core" / "colibri-infer"


def infer_command(kind):
    """colibri-infer of a build, as a command list (under QEMU for a cross target)."""
    return [*RUNNER.get(kind, []), str(infer_binary(kind))]


def env_for(kind):
    env = dict(os.environ)
    if kind == "sanitize":
        env.update(SANITIZER_ENV)
    return env

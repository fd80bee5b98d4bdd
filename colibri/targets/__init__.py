"""The C core built for other targets from a source checkout, and run there.

    colibri generate --target riscv64 --prompt "ROMEO:"       # the same run, under QEMU

A target is a Meson build of the core alone under <source>/build/<target>, made on first use
and rebuilt (incrementally) on each: `native` (release flags), `clang`, `sanitize` (AddressSanitizer
+ UBSan), the Linux cross targets `aarch64` and `riscv64` (toolchains/*.ini), whose programs
run under QEMU user mode, and the bare-metal boards (`mps2-an386`, `mps2-an500`, `virt-rv32`),
whose firmware images colibri.targets.firmware plans, builds and runs.  The source checkout is $COLIBRI_SOURCE, else the current directory or
the one this package was imported from, whichever holds meson.build and c_core/."""
import functools
import os
import subprocess
from pathlib import Path

class TargetError(RuntimeError):
    """A target could not be built or run: what failed, with the tool's own output."""


def source_dir():
    """The colibri source checkout that targets are built from."""
    candidates = [os.environ.get("COLIBRI_SOURCE"), os.getcwd(), Path(__file__).resolve().parents[2]]
    for c in candidates:
        if c and (Path(c) / "meson.build").is_file() and (Path(c) / "c_core").is_dir():
            return Path(c).resolve()
    raise TargetError("building for a target needs the colibri sources: run from a checkout or set COLIBRI_SOURCE")
OPTIONS = {
    "native": ["-Dpython=false"],
    "clang": ["-Dpython=false", "--native-file", "toolchains/clang.ini"],   # same -Werror flags
    "sanitize": ["-Dpython=false", "-Db_sanitize=address,undefined", "-Db_lundef=false",
                 "--buildtype=debugoptimized"],
    "aarch64": ["-Dpython=false", "--cross-file", "toolchains/aarch64-linux-gnu.ini"],
    "riscv64": ["-Dpython=false", "--cross-file", "toolchains/riscv64-linux-gnu.ini"],
    # bare-metal boards (the firmware image of the bundled model: colibri.targets.firmware)
    "mps2-an386": ["-Dpython=false", "--cross-file", "toolchains/mps2-an386.ini"],
    "mps2-an500": ["-Dpython=false", "--cross-file", "toolchains/mps2-an500.ini"],
    "virt-rv32": ["-Dpython=false", "--cross-file", "toolchains/virt-rv32.ini"],
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
    if kind not in OPTIONS:
        raise ValueError(f"unknown target {kind!r}: one of {', '.join(OPTIONS)}")
    return meson_build(source_dir() / "build" / kind, OPTIONS[kind])


def meson_build(out, options):
    """Configures `out` with `options` (once) and builds it; returns `out`."""
    root = source_dir()
    if not (out / "build.ninja").exists():
        r = subprocess.run(["meson", "setup", str(out), *options], cwd=root,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise TargetError(f"configuring {out} failed:\n{r.stdout[-4000:]}")
    r = subprocess.run(["ninja", "-C", str(out)], cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    if r.returncode != 0:
        raise TargetError(f"building {out} failed:\n{r.stdout[-4000:]}")
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

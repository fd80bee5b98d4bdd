"""Meson builds of the C core alone, made once per test run under build/ and reused:
`native` (the release flags, for the C tests) and `sanitize` (AddressSanitizer + UBSan)."""
import functools
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {
    "native": ["-Dpython=false"],
    "clang": ["-Dpython=false"],   # the second host compiler, same -Werror flags
    "sanitize": ["-Dpython=false", "-Db_sanitize=address,undefined", "-Db_lundef=false",
                 "--buildtype=debugoptimized"],
}

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
        env = dict(os.environ, CC="clang") if kind == "clang" else None
        r = subprocess.run(["meson", "setup", str(out), *OPTIONS[kind]], cwd=ROOT, env=env,
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


def env_for(kind):
    env = dict(os.environ)
    if kind == "sanitize":
        env.update(SANITIZER_ENV)
    return env

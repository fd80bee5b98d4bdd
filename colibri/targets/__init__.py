"""The C core built for other targets from its sources, and run there.

    colibri generate --target riscv64 --prompt "ROMEO:"       # the same run, under QEMU

A target is a Meson build of the core alone under <builds>/<target>, made on first use
and rebuilt (incrementally) on each: `native` (release flags), `clang`, `sanitize` (AddressSanitizer
+ UBSan), `clang-sanitize` (the same with clang's UBSan), and one for each cross file in toolchains/ that names a target: the Linux targets
(`colibri_target`, e.g. aarch64 and riscv64), whose programs run under the file's exe_wrapper
(QEMU user mode), and the bare-metal boards (`colibri_board`, e.g. mps2-an386), whose firmware
images colibri.targets.firmware plans, builds and runs.  The cross files are the one place a
target's facts are written: a new one is a new file there.  The sources are $COLIBRI_SOURCE,
else the current directory if it is a checkout, else colibri.source_root(): the checkout this
package was imported from, or the copy an installed wheel carries.  The builds (<builds>) go to
$COLIBRI_BUILD_DIR (`--build-dir`), else build/ of a checkout, else, for the wheel's read-only
copy, a per-user cache: $XDG_CACHE_HOME/colibri/<version>-<hash of the sources' path>."""
import fcntl
import functools
import hashlib
import os
import subprocess
from pathlib import Path

import colibri
from colibri.targets import machine_file


class TargetError(RuntimeError):
    """A target could not be built or run: what failed, with the tool's own output."""


def source_dir():
    """The colibri sources that targets are built from."""
    for c in (os.environ.get("COLIBRI_SOURCE"), os.getcwd()):
        if c and (Path(c) / "meson.build").is_file() and (Path(c) / "c_core").is_dir():
            return Path(c).resolve()
    try:
        return colibri.source_root()
    except FileNotFoundError as e:
        raise TargetError(f"building for a target needs the colibri sources: {e}; set COLIBRI_SOURCE") from None


def build_dir():
    """The folder the builds go to, one sub-folder each (never the wheel's copy in site-packages)."""
    if os.environ.get("COLIBRI_BUILD_DIR"):
        return Path(os.environ["COLIBRI_BUILD_DIR"]).resolve()
    root = source_dir()
    if root != colibri._SOURCE_COPY:
        return root / "build"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "colibri" / f"{colibri.__version__}-{hashlib.sha1(str(root).encode()).hexdigest()[:8]}"


HOST_OPTIONS = {
    "native": ["-Dpython=false"],
    "clang": ["-Dpython=false", "--native-file", "toolchains/clang.ini"],   # same -Werror flags
    "sanitize": ["-Dpython=false", "-Db_sanitize=address,undefined", "-Db_lundef=false",
                 "--buildtype=debugoptimized"],
    # clang's UBSan: its `undefined` has float-cast-overflow, which gcc's lacks (named to be sure);
    # every finding stops the program
    "clang-sanitize": ["-Dpython=false", "--native-file", "toolchains/clang.ini", "-Db_sanitize=address,undefined",
                       "-Db_lundef=false", "--buildtype=debugoptimized",
                       "-Dc_args=['-fsanitize=float-cast-overflow', '-fno-sanitize-recover=all']",
                       "-Dc_link_args=['-fsanitize=float-cast-overflow']"],
}


# What colibri makes for the cross files at build time, named in a machine file given before each
# of them: `gcc_toolchains`, a folder of GCC installations, one per triple a cross file names in
# [properties] `clang_gcc`, each holding that triple's GCC alone.  clang takes the newest GCC of any
# triple it counts as the target's (riscv64-unknown-elf's for riscv64-linux-gnu), and a folder made
# here, rather than a link in toolchains/, works from the wheel's copy and on a machine without the
# compiler (where it is an error naming the package, at build time).
def made_constants():
    return {"gcc_toolchains": str(build_dir() / "gcc-toolchains")}


def constants_file():
    """The machine file of made_constants(), written into the build directory."""
    path = build_dir() / "made-constants.ini"
    text = "[constants]\n" + "".join(f"{k} = {v!r}\n" for k, v in made_constants().items())
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        fresh = path.with_name(f".{path.name}.{os.getpid()}")   # renamed over: another process may read it
        fresh.write_text(text)
        fresh.replace(path)
    return path


def gcc_toolchain(triple):
    """Makes gcc_toolchains/<triple>, a prefix as clang reads one: lib/gcc-cross/<triple>/<version>,
    a link to the newest such GCC in /usr, and <triple>, a link to its C library beside it (what clang
    names as <version>/../../../../<triple>/include in the dependency files, which must exist, or
    ninja takes every object for out of date)."""
    found = sorted(Path("/usr/lib/gcc-cross", triple).glob("*/crtbegin.o"),
                   key=lambda p: [int(n) for n in p.parent.name.split(".") if n.isdigit()])
    if not found:
        raise TargetError(f"no GCC for {triple} (/usr/lib/gcc-cross/{triple}/<version>/crtbegin.o): "
                          f"apt-get install gcc-{triple}")
    gcc = found[-1].parent
    prefix = Path(made_constants()["gcc_toolchains"], triple)
    for link, to in ((prefix / "lib" / "gcc-cross" / triple / gcc.name, gcc), (prefix / triple, Path("/usr", triple))):
        if not (link.is_symlink() and link.resolve() == to.resolve()):
            link.parent.mkdir(parents=True, exist_ok=True)
            fresh = link.with_name(f".{link.name}.{os.getpid()}")   # renamed over: another process may read it
            fresh.unlink(missing_ok=True)
            fresh.symlink_to(to)
            fresh.replace(link)
    return prefix


@functools.lru_cache(maxsize=None)
def cross_files(prop):
    """{name: the machine file's sections, and its path} of the cross files in toolchains/ whose
    [properties] name a target with `prop`: `colibri_target` (Linux) or `colibri_board` (bare metal)."""
    out = {}
    for path in sorted((source_dir() / "toolchains").glob("*.ini")):
        sections = machine_file.read(path, constants=made_constants())
        name = sections.get("properties", {}).get(prop)
        if name:
            out[name] = {"path": path, **sections}
    return out


def _options():
    """{target: its `meson setup` options}."""
    cross = {name: ["-Dpython=false", "--cross-file", str(constants_file()), "--cross-file", f"toolchains/{f['path'].name}"]
             for prop in ("colibri_target", "colibri_board") for name, f in cross_files(prop).items()}
    return {**HOST_OPTIONS, **cross}


def _runners():
    """{Linux target: the command its programs run under on this host, the exe_wrapper}."""
    return {name: f["binaries"]["exe_wrapper"] for name, f in cross_files("colibri_target").items()}


def _targets():
    """The targets colibri-infer runs on: the host's build and the Linux targets'."""
    return ["native", *cross_files("colibri_target")]


def __getattr__(name):
    """OPTIONS, RUNNER and TARGETS, read from toolchains/ when first asked for: importing this
    module needs no checkout."""
    get = {"OPTIONS": _options, "RUNNER": _runners, "TARGETS": _targets}.get(name)
    if get is None:
        raise AttributeError(f"module 'colibri.targets' has no attribute {name!r}")
    return get()


# Sanitizer findings must fail the run, never scroll past.
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=86",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
}


@functools.lru_cache(maxsize=None)
def build(kind):
    """Configures (once) and builds build/<kind>; returns its directory."""
    known = _options()
    if kind not in known:
        raise TargetError(f"unknown target {kind!r}: one of {', '.join(known)}")
    cross = {**cross_files("colibri_target"), **cross_files("colibri_board")}.get(kind, {})
    if "clang_gcc" in cross.get("properties", {}):
        gcc_toolchain(cross["properties"]["clang_gcc"])
    return meson_build(build_dir() / kind, known[kind])


def meson_build(out, options):
    """Configures `out` with `options` (once) and builds it; returns `out`.  One process at a time
    configures and builds a folder (parallel test workers, two terminals): the others wait."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _meson_build(out, options)


def _meson_build(out, options):
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
    return [*_runners().get(kind, []), str(infer_binary(kind))]


def env_for(kind):
    """The environment a target's programs run in.  COLIBRI_KERNELS names a variant of this host's
    CPU (e.g. avx2 to run as an AVX2-only machine would): a program built for another CPU picks its
    own, so the variable stays on the host."""
    env = dict(os.environ)
    if kind in ("sanitize", "clang-sanitize"):
        env.update(SANITIZER_ENV)
    if kind not in HOST_OPTIONS:
        env.pop("COLIBRI_KERNELS", None)
    return env

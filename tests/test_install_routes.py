"""Every install route, on a bare machine: what ./run-tests installed is hidden (a private mount
namespace with an empty tmpfs over the cross compilers', QEMU's, clang's and picolibc's folders, and
a PATH without their programs or any Python tool of this machine's), and each route starts from the
files a fresh clone holds, in a fresh virtual environment, with pip's build isolation:

    pip install . && colibri generate --prompt "ROMEO:"      (the README's first command, as written)
    pip wheel .            then pip install of that wheel, colibri generate
    python -m build --sdist   then pip install of that sdist, colibri generate

Each prints the text of the installed package of this test run.  They need root (unshare, mount)
and PyPI (the build tools and numpy); each takes a few minutes, as a user's install does."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import TESTS

ROOT = TESTS.parent
PROMPT = ["--prompt", "ROMEO:"]
# what ./run-tests installs beside a bare machine's gcc and Python: its folders and its programs
HIDDEN_DIRS = ["/usr/lib/gcc-cross", "/usr/aarch64-linux-gnu", "/usr/riscv64-linux-gnu", "/usr/lib/picolibc",
               "/usr/lib/gcc/arm-none-eabi", "/usr/lib/gcc/riscv64-unknown-elf", "/usr/lib/arm-none-eabi",
               "/usr/lib/riscv64-unknown-elf", "/usr/lib/llvm-14"]
HIDDEN_PROGRAMS = re.compile(r"^(aarch64-linux-gnu-|riscv64-linux-gnu-|arm-none-eabi-|riscv64-unknown-elf-|qemu-|"
                             r"clang|llvm-|ld\.lld|lld|mmdebstrap|cmake|ctest|cpack|meson|ninja|cython)")
ROUTES = {
    "readme": 'cd src && {readme}',
    "wheel": 'cd src && pip wheel --no-deps -w ../dist . && cd .. && pip install dist/colibri_moe-*.whl && '
             'colibri generate --prompt "ROMEO:"',
    "sdist": 'pip install build && cd src && python -m build --sdist -o ../dist . && cd .. && '
             'pip install dist/colibri_moe-*.tar.gz && colibri generate --prompt "ROMEO:"',
}


def readme_first_command():
    """The first line of README.md's first code block: the one that installs and runs."""
    block = re.search(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M).group(1)
    return block.splitlines()[0]


def require_root():
    why = ("needs root (a mount namespace and tmpfs mounts)" if os.geteuid() != 0 else
           "needs unshare (util-linux)" if not shutil.which("unshare") else None)
    if why and os.environ.get("CI"):
        pytest.fail(why)
    if why:
        pytest.skip(why)


def fresh_clone(dest):
    """A clone of this checkout's next commit: the tracked files and the untracked ones git does not
    ignore, as they are now, committed into a new repository (an sdist is made from a commit)."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                       capture_output=True, check=True)
    for rel in filter(None, r.stdout.decode().split("\0")):
        src = ROOT / rel
        if src.is_file() or src.is_symlink():   # a deleted, not yet staged file is gone from the commit too
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)
    git = ["git", "-C", str(dest), "-c", "user.name=colibri tests", "-c", "user.email=tests@colibri.invalid"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the checkout as it is"]):
        subprocess.run([*git, *args], check=True, capture_output=True)


def bare_path(bin_dir):
    """A folder of links to this machine's programs less the hidden ones, with the interpreter that
    runs this test as python3: the PATH of a bare machine of this kind."""
    bin_dir.mkdir()
    for folder in ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        for program in sorted(Path(folder).glob("*")) if Path(folder).is_dir() else []:
            name = program.name
            if not HIDDEN_PROGRAMS.match(name) and not (bin_dir / name).exists() and os.access(program, os.X_OK):
                (bin_dir / name).symlink_to(program)
    for name in ("python3", "python"):
        (bin_dir / name).unlink(missing_ok=True)
        (bin_dir / name).symlink_to(Path(sys.executable).resolve())
    return bin_dir


def on_a_bare_machine(script, cwd, timeout=1800):
    """Runs `script` with bash in a private mount namespace where what ./run-tests installed is hidden."""
    hide = "".join(f"[ -d {d} ] && mount -t tmpfs none {d}\n" for d in HIDDEN_DIRS)
    checks = ("for p in aarch64-linux-gnu-gcc riscv64-linux-gnu-gcc arm-none-eabi-gcc clang qemu-aarch64 meson ninja; do\n"
              "  if command -v $p >/dev/null; then echo \"$p is not hidden\" >&2; exit 97; fi\n"
              "done\n"
              "[ -z \"$(ls -A /usr/lib/gcc-cross 2>/dev/null)\" ] || { echo 'gcc-cross is not hidden' >&2; exit 97; }\n")
    env = {"PATH": f"{cwd / 'venv' / 'bin'}:{cwd / 'bin'}", "HOME": os.environ.get("HOME", "/root"),
           "LANG": "C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_ROOT_USER_ACTION": "ignore",
           "VIRTUAL_ENV": str(cwd / "venv")}
    return subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-euo", "pipefail", "-c",
                           hide + checks + script], cwd=cwd, env=env, capture_output=True, timeout=timeout)


@pytest.mark.parametrize("route", ROUTES)
def test_each_install_route_works_on_a_bare_machine(route, tmp_path):
    require_root()
    fresh_clone(tmp_path / "src")
    bare_path(tmp_path / "bin")
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)   # no system packages
    script = ROUTES[route].format(readme=readme_first_command())
    r = on_a_bare_machine(script, tmp_path)
    assert r.returncode == 0, f"{script}\n{r.stderr.decode(errors='replace')[-6000:]}"

    host = subprocess.run([sys.executable, "-m", "colibri", "generate", *PROMPT], capture_output=True,
                          check=True, timeout=300).stdout
    assert r.stdout.endswith(host) and host.startswith(b"ROMEO:"), r.stdout.decode(errors="replace")[-3000:]

    # what such an install does beyond running the bundled model: its version, and the commands of
    # the parts it does not carry naming what brings them
    colibri = str(tmp_path / "venv" / "bin" / "colibri")
    r = on_a_bare_machine(f"{colibri} --version", tmp_path)
    from importlib.metadata import version
    assert r.stdout.decode() == f"colibri {version('colibri-moe')}\n"
    if route == "readme":
        r = on_a_bare_machine(f"{colibri} convert src/tests/fixtures/tiny-mixtral out", tmp_path)
        assert r.returncode == 1 and r.stderr.decode() == (
            "colibri convert: needs the safetensors package: pip install 'colibri-moe[convert]'\n")
        r = on_a_bare_machine(f"{colibri} generate --target riscv64-rvv --build-dir build {' '.join(PROMPT)}", tmp_path)
        assert r.returncode == 1 and "apt-get install gcc-riscv64-linux-gnu" in r.stderr.decode(), r.stderr.decode()


def test_one_version_everywhere():
    """meson.build's project() version is the package's, `colibri --version`'s, colibri-infer's and
    colibri.__version__: written once, read by each."""
    from importlib.metadata import version

    import colibri

    written = re.search(r"project\([^)]*?version\s*:\s*'([^']+)'", (ROOT / "meson.build").read_text(), re.S).group(1)
    infer = shutil.which("colibri-infer", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    printed = [subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout
               for command in ([sys.executable, "-m", "colibri", "--version"], [infer, "--version"])]
    assert printed == [f"colibri {written}\n", f"colibri-infer {written}\n"]
    assert version("colibri-moe") == colibri.__version__ == written

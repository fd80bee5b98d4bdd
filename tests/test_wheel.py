"""The package's own copy of the C sources: colibri.get_include and colibri.c_sources for a C
program, and colibri.source_root for the firmware builds of an installed wheel, outside any
checkout (the builds in a per-user cache, never in site-packages)."""
import os
import re
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import colibri
from colibri import targets
from colibri.demo import MODEL_DIR
from colibri.targets import firmware as fw
from support import TESTS

BOARD = "virt-rv32"
PROGRAM = r"""
#include <stdio.h>
#include <colibri/colibri.h>

int main(int argc, char **argv) {
    colibri_model *model;
    colibri_error err;
    if (argc != 2 || colibri_model_open(argv[1], 0, &model, &err) != COLIBRI_OK) return 1;
    printf("%s %llu\n", colibri_model_architecture(model), (unsigned long long)colibri_model_weight_bytes(model));
    colibri_model_close(model);
    return 0;
}
"""


def test_the_headers_and_sources_build_a_c_program(tmp_path):
    include = Path(colibri.get_include())
    assert (include / "colibri" / "colibri.h").is_file()
    sources = colibri.c_sources()
    assert all(Path(s).is_absolute() and s.endswith(".c") for s in sources)
    # the same translation units as the Meson build of the core for an OS, less the SIMD variants
    meson = (colibri.source_root() / "c_core" / "meson.build").read_text()
    listed = re.findall(r"'((?:src|platform/posix|arch)/[\w/]+\.c)'", meson.split("kernel_variants")[0])
    listed.append("arch/dispatch.c")
    core = colibri.source_root() / "c_core"
    assert sorted(sources) == sorted(str(core / s) for s in listed)
    assert str(core / "platform" / "baremetal" / "baremetal.c") in colibri.c_sources("baremetal")

    (tmp_path / "app.c").write_text(PROGRAM)
    exe = tmp_path / "app"
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1", "-I", str(include),
                    str(tmp_path / "app.c"), *sources, "-o", str(exe), "-lm", "-lpthread"], check=True, timeout=600)
    r = subprocess.run([str(exe), str(MODEL_DIR)], capture_output=True, text=True, check=True, timeout=60)
    model = colibri.Model(MODEL_DIR)
    assert r.stdout == f"{model.architecture} {model.weight_bytes}\n"


def test_builds_go_to_a_cache_for_the_wheels_copy_and_to_build_of_a_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv("COLIBRI_BUILD_DIR", raising=False)
    assert targets.build_dir() == targets.source_dir() / "build"   # this checkout ($COLIBRI_SOURCE)
    if not colibri._SOURCE_COPY.is_dir():
        pytest.skip("the package is not installed from a wheel: it has no copy of the sources")
    monkeypatch.setenv("COLIBRI_SOURCE", str(colibri._SOURCE_COPY))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert targets.build_dir().parent == tmp_path / "colibri"
    monkeypatch.setenv("COLIBRI_BUILD_DIR", str(tmp_path / "mine"))
    assert targets.build_dir() == tmp_path / "mine"


def test_the_installed_wheel_plans_builds_and_runs_firmware_outside_a_checkout(tmp_path):
    root = TESTS.parent
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w",
                    str(tmp_path / "dist"), str(root)], check=True, timeout=1200)
    wheel, = (tmp_path / "dist").glob("colibri_moe-*.whl")
    with zipfile.ZipFile(wheel) as z:   # plain files only: a link out of the tree broke every install
        assert not [i.filename for i in z.infolist() if stat.S_ISLNK(i.external_attr >> 16)]
    # numpy and the rest from the system; the package itself only from the wheel
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(tmp_path / "venv")], check=True)
    bin_ = tmp_path / "venv" / "bin"
    subprocess.run([str(bin_ / "python"), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall",
                    str(wheel)], check=True, timeout=600)
    env = {k: v for k, v in os.environ.items() if k not in ("COLIBRI_SOURCE", "COLIBRI_BUILD_DIR", "PYTHONPATH")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    away = tmp_path / "elsewhere"
    away.mkdir()

    def installed(*args):
        r = subprocess.run([str(bin_ / "colibri"), *map(str, args)], cwd=away, env=env, capture_output=True,
                           timeout=1200)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        return r.stdout

    where = subprocess.run([str(bin_ / "python"), "-c", "import colibri; print(colibri.source_root())"], cwd=away,
                           env=env, capture_output=True, text=True, check=True).stdout.strip()
    copy = Path(where)
    assert copy.is_relative_to(tmp_path / "venv") and copy.name == "_source"
    before = sorted(copy.rglob("*"))

    plan = installed("firmware", "plan", "--board", BOARD)
    assert plan.decode() == fw.plan(BOARD, MODEL_DIR).table() + "\n"   # the checkout's plan
    text = installed("firmware", "run", "--board", BOARD, "--prompt", "ROMEO:", "--max-tokens", 20,
                     "--temperature", 0)
    host = subprocess.run([sys.executable, "-m", "colibri", "generate", "--prompt", "ROMEO:", "--max-tokens", "20",
                           "--temperature", "0"], capture_output=True, check=True, timeout=300).stdout
    assert text == host
    # a Linux target too, into a folder of one's choosing: riscv64-rvv, whose clang is pointed at a
    # GCC folder colibri.targets makes there (the wheel holds no link)
    on_target = installed("generate", "--target", "riscv64-rvv", "--build-dir", tmp_path / "mine", "--prompt",
                          "ROMEO:", "--max-tokens", 20, "--temperature", 0)
    assert on_target == host and (tmp_path / "mine" / "riscv64-rvv" / "build.ninja").is_file()
    assert (tmp_path / "mine" / "gcc-toolchains" / "riscv64-linux-gnu").is_dir()
    # a firmware folder, built with CMake alone into an image that prints the same text (the
    # Cortex-M55: its Helium kernels, the model in its QSPI flash)
    installed("firmware", "export", "--board", "mps3-an547", "--out", tmp_path / "fw")
    for command in (["cmake", "-S", ".", "-B", "build", "--toolchain", "cmake/toolchain.cmake"],
                    ["cmake", "--build", "build"]):   # the README's commands
        subprocess.run(command, cwd=tmp_path / "fw", capture_output=True, check=True, timeout=600)
    image = fw.run("mps3-an547", tmp_path / "fw" / "build" / "colibri-example.elf", [], timeout=300)
    assert image.status == 0 and image.output == host
    assert sorted(copy.rglob("*")) == before   # nothing written into site-packages
    assert list((tmp_path / "cache" / "colibri").glob(f"*/{BOARD}/build.ninja"))

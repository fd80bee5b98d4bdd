"""`colibri firmware export` (colibri.targets.export): a folder a firmware project of its own takes
colibri from.  The proof is such a project, tests/firmware_export/: its own start-up, linker
script, port and toolchain (newlib-nano, not the picolibc of colibri's images), building the
export's example with CMake (add_subdirectory) and with Meson (a subproject), run on mps2-an386
under QEMU, printing what the host's `colibri generate` prints."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import colibri
from colibri.demo import MODEL_DIR
from colibri.targets import export
from colibri.targets import firmware as fw
from support import TESTS

BOARD = "mps2-an386"
PROJECT = TESTS / "firmware_export"
TOKENS = 20   # example/main.c's default: "ROMEO:", greedy

pytestmark = pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed (./run-tests installs it)")


def colibri_cli(*args):
    r = subprocess.run([sys.executable, "-m", "colibri", *map(str, args)], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


def host_text():
    return colibri_cli("generate", "--prompt", "ROMEO:", "--max-tokens", TOKENS, "--temperature", 0)


def run(*command, cwd):
    r = subprocess.run([*map(str, command)], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"{command}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def on_board(elf):
    result = fw.run(BOARD, elf, [], timeout=300)
    assert result.status == 0, result.output.decode(errors="replace")
    return result.output


def test_cmake_builds_a_firmware_of_its_own_that_prints_the_hosts_text(tmp_path):
    out = tmp_path / "colibri"
    colibri_cli("firmware", "export", "--board", BOARD, "--ctx", 256, "--out", out)
    run("cmake", "-S", PROJECT, "-B", tmp_path / "build", "--toolchain", PROJECT / "cortex-m4.cmake",
        f"-DCOLIBRI_DIR={out}", cwd=tmp_path)
    run("cmake", "--build", tmp_path / "build", cwd=tmp_path)
    elf = tmp_path / "build" / "firmware.elf"
    assert on_board(elf) == host_text()
    # the model where the project's linker script put it: its own section, 64-byte aligned
    size, address = fw.sections(BOARD, elf)[".colibri_model"]
    assert address % 64 == 0 and size >= (MODEL_DIR / "weights.bin").stat().st_size


def test_meson_takes_the_export_as_a_subproject_with_the_model_as_a_c_array(tmp_path):
    project = tmp_path / "project"
    shutil.copytree(PROJECT, project)
    colibri_cli("firmware", "export", "--cpu", "cortex-m4f", "--out", project / "subprojects" / "colibri")
    run("meson", "setup", "build", "--cross-file", "cortex-m4.ini", "-Dcolibri:model_data=c-array", cwd=project)
    run("ninja", "-C", "build", cwd=project)
    assert on_board(project / "build" / "firmware.elf") == host_text()


@pytest.mark.parametrize("board", list(fw.BOARDS))
def test_the_readmes_commands_build_the_boards_example(board, tmp_path):
    """The README's own commands, from the exported folder: picolibc's start-up, the board's port."""
    out = tmp_path / "fw"
    colibri_cli("firmware", "export", "--board", board, "--out", out)
    readme = (out / "README.md").read_text().split("## The board's example")[1]
    commands = [line.strip() for line in readme.splitlines() if line.startswith("    ")]
    assert len(commands) == 3 and commands[2].startswith(" ".join(fw.BOARDS[board].qemu[:3]))
    # the Cortex-M55's export computes with its Helium kernels (the image's best, as colibri's own)
    assert (out / "core" / "arch" / "arm" / "matmul_mve.c").is_file() == (board == "mps3-an547")
    for command in commands[:2]:
        run("sh", "-c", command, cwd=out)
    r = subprocess.run(["sh", "-c", commands[2]], cwd=out, stdin=subprocess.DEVNULL, capture_output=True, timeout=300)
    assert r.returncode == 0 and r.stdout == host_text(), r.stderr


def test_the_folder_holds_the_bare_metal_core_the_model_and_the_plan(tmp_path):
    out = tmp_path / "fw"
    sizes = export.export(out, MODEL_DIR, ctx=64, batch=8, cpu="cortex-m7")
    model = colibri.Model(MODEL_DIR)
    plan = (out / "colibri_plan.h").read_text()
    value = {k: int(v) for k, v in re.findall(r"#define COLIBRI_PLAN_(\w+) (\d+)u?\b", plan)}
    assert value["META_BYTES"] == sizes["meta"] == -(-model.metadata_bytes // 64) * 64
    assert value["ARENA_BYTES"] == sizes["arena"] == -(-model.memory_plan(64, 8) // 64) * 64
    assert (value["N_CTX"], value["N_BATCH"], value["STACK_BYTES"]) == (64, 8, fw.DEFAULT_STACK)
    core = Path(colibri.source_root()) / "c_core"
    assert sorted(str(p.relative_to(out / "core")) for p in (out / "core").rglob("*.c")) == sorted(
        str(Path(s).relative_to(core)) for s in colibri.c_sources("baremetal"))
    assert "-mcpu=cortex-m7;-mthumb;-mfloat-abi=hard;-mfpu=fpv5-d16" in (out / "CMakeLists.txt").read_text()
    assert not (out / "port" / "port_board.c").exists() and "## The board's example" not in (out / "README.md").read_text()
    assert (out / "model" / "weights.bin").read_bytes() == (MODEL_DIR / "weights.bin").read_bytes()
    # colibri's sources go into the user's product: each says its license, whose text comes along
    copied = [p for p in out.rglob("*") if p.suffix in (".c", ".h", ".S") and p.name != "colibri_plan.h"
              and p.parent.name != "model"]
    assert copied and [p for p in copied if not p.read_text().startswith("/* SPDX-License-Identifier: MIT */\n")] == []
    assert (out / "core" / "LICENSE").read_text() == (Path(colibri.source_root()) / "LICENSE").read_text()
    assert (out / "core" / "LICENSE").read_text().startswith("MIT License")

    # colibri_plan_matches knows its model's JSON from any other (host gcc: the header is plain C99)
    (tmp_path / "check.c").write_text(
        '#include <stdio.h>\n#include "colibri_plan.h"\nstatic char json[COLIBRI_PLAN_JSON_BYTES];\n'
        'int main(int argc, char **argv) {\n  FILE *f = fopen(argv[1], "rb");\n'
        '  size_t n = fread(json, 1, sizeof json, f);\n  (void)argc;\n  if (n == sizeof json) json[n / 2] ^= argv[2][0] == \'1\';\n'
        '  return colibri_plan_matches(json, n) ? 0 : 3;\n}\n')
    run("gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I", out, tmp_path / "check.c", "-o",
        tmp_path / "check", cwd=tmp_path)
    json_file = out / "model" / "colibri_model.json"
    assert subprocess.run([tmp_path / "check", json_file, "0"]).returncode == 0
    assert subprocess.run([tmp_path / "check", json_file, "1"]).returncode == 3


def test_bad_requests_are_refused(tmp_path):
    with pytest.raises(export.ExportError, match="one of --board or --cpu"):
        export.export(tmp_path / "a", MODEL_DIR, board=BOARD, cpu="cortex-m4f")
    with pytest.raises(export.ExportError, match="unknown CPU"):
        export.export(tmp_path / "a", MODEL_DIR, cpu="cortex-a53")
    with pytest.raises(export.ExportError, match="does not fit mps2-an386: .* of RAM for 16,777,216 B"):
        export.export(tmp_path / "a", MODEL_DIR, stack=16 << 20, board=BOARD)
    with pytest.raises(export.ExportError, match=r"n_ctx = 8192 must lie in \[1, 256\]"):
        export.export(tmp_path / "a", MODEL_DIR, ctx=8192, cpu="cortex-m4f")
    assert not (tmp_path / "a").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(export.ExportError, match="not an empty folder"):
        export.export(tmp_path / "full", MODEL_DIR, cpu="rv32imac")


# In the command's own process, before colibri runs: a file may not grow past 256 KiB, and writing
# past it fails (EFBIG) instead of killing the process: a disk that fills up mid-export.  Not a
# preexec_fn: that would fork() the test process, whose gRPC (other tests' servers) runs its fork
# handlers in the child.
LIMITED = ("import resource, runpy, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
           "resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 10, 256 << 10)); "
           "runpy.run_module('colibri', run_name='__main__', alter_sys=True)")


@pytest.mark.parametrize("out_exists", [False, True])
def test_a_failed_export_leaves_nothing_and_the_next_one_works(tmp_path, out_exists):
    out = tmp_path / "fw"
    if out_exists:   # an empty folder given as the output stays as it was
        out.mkdir()
    args = [sys.executable, "-c", LIMITED, "firmware", "export", "--cpu", "cortex-m4f", "--out", out]
    failed = subprocess.run(args, capture_output=True, text=True, timeout=600)
    err = failed.stderr.strip()
    assert failed.returncode == 1 and len(err.splitlines()) == 1, err
    assert err.startswith(f"colibri firmware export: {out}: ") and "nothing written" in err, err
    assert sorted(tmp_path.iterdir()) == ([out] if out_exists else []), list(tmp_path.iterdir())
    assert not out_exists or not any(out.iterdir())
    colibri_cli("firmware", "export", "--cpu", "cortex-m4f", "--out", out)
    assert (out / "CMakeLists.txt").is_file() and (out / "colibri_plan.h").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fw"]

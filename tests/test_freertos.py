"""colibri in a FreeRTOS task (firmware/freertos): the bundled model's generation run by a task
created with static memory, while a higher-priority heartbeat task keeps running, on QEMU.

The image is built against a FreeRTOS-Kernel checkout named by $COLIBRI_FREERTOS_KERNEL
(-Dfreertos_kernel); the kernel is never part of this repository."""
import os
import subprocess
from pathlib import Path

import pytest

from colibri.demo import MODEL_DIR
from colibri.targets import OPTIONS, infer_command, meson_build, source_dir
from colibri.targets import firmware as fw

KERNEL = os.environ.get("COLIBRI_FREERTOS_KERNEL")
pytestmark = pytest.mark.skipif(
    not KERNEL, reason="the FreeRTOS image needs a FreeRTOS-Kernel checkout (-Dfreertos_kernel), which no package "
                       "registry ships: set COLIBRI_FREERTOS_KERNEL to one")
PROMPT = [1, 591, 47, 39, 49, 28]   # <s> ROMEO:


def freertos_image(board, *options, name=""):
    kernel = str(Path(KERNEL).resolve())
    out = source_dir() / "build" / f"freertos-{board}{name}"
    if (out / "build.ninja").exists():   # follow the variable if it names another checkout now
        subprocess.run(["meson", "configure", str(out), f"-Dfreertos_kernel={kernel}"], check=True,
                       capture_output=True)
    return meson_build(out, [*OPTIONS[board], f"-Dfreertos_kernel={kernel}", *options]) / "firmware" / \
        "colibri-freertos.elf"


@pytest.mark.parametrize("board", [b.name for b in fw.BOARDS.values() if b.freertos])
def test_a_task_encodes_text_as_the_host(board):
    """text= encoded in the task (the encoder's frames on the task's stack) prints what the host's
    `colibri generate` prints, and the stack stays inside its budget."""
    import sys

    text = "ROMEO: café 😀 日本\nJULIET,"
    r = fw.run(board, freertos_image(board), fw.arguments(text, 16, ignore_eos=True), timeout=120)
    host = subprocess.run([sys.executable, "-m", "colibri", "generate", "--prompt", text, "--max-tokens", "16",
                           "--temperature", "0", "--ignore-eos"], capture_output=True, check=True, timeout=300).stdout
    assert r.status == 0 and r.output == host, (r.status, r.output, host)
    assert 0 < r.report["stack_used"] < r.report["stack_reserved"], r.report


def test_a_task_stack_too_small_for_the_encoder_is_reported():
    """4 KiB holds a generation from ids, not the encoder's frames: the kernel's check (or the
    guard below the stack) stops the image with a message, never a silent run."""
    elf = freertos_image("mps2-an386", "-Dfirmware_stack=4096", name="-stack4k")
    assert fw.run("mps2-an386", elf, fw.arguments(PROMPT, 2), timeout=120).status == 0
    r = fw.run("mps2-an386", elf, fw.arguments("ROMEO:", 2), timeout=120)
    assert r.status != 0 and (b"overflowed its stack" in r.output or b"outgrew its budget" in r.output), r.output


@pytest.mark.parametrize("board", [b.name for b in fw.BOARDS.values() if b.freertos])
def test_a_task_prints_the_host_text_while_the_heartbeat_runs(board):
    elf = freertos_image(board)
    r = fw.run(board, elf, fw.arguments(PROMPT, 20, ignore_eos=True), timeout=120)
    host = subprocess.run([*infer_command("native"), "--model", MODEL_DIR, "--tokens", ",".join(map(str, PROMPT)),
                           "--max_tokens", "20", "--temperature", "0", "--reference", "--ignore_eos"],
                          capture_output=True, check=True, timeout=300).stdout
    assert r.status == 0 and r.output == host, (r.status, r.output, host)
    # the image itself exits 3 if a token passed without a heartbeat; the report says how many ran
    assert r.report["heartbeats"] > 0 and r.report["heartbeats_min_per_token"] > 0, r.report
    assert 0 < r.report["stack_used"] < r.report["stack_reserved"], r.report
    symbols = set(fw._run_tool(board, "nm", elf).split())
    assert not {"malloc", "free", "pvPortMalloc", "vPortFree"} & symbols   # static allocation only

"""The board table: each bare-metal image of the bundled model (n_ctx 256) under QEMU, its flash and
RAM as the linker placed them, and its speed by the board's own clock.  QEMU emulates; these are
not real-hardware speeds, only a comparison between boards on one host.

    python benchmarks/boards.py [--rounds 3] [--tokens 64] [--freertos-kernel PATH]

Rounds interleave the boards, so host load drifts over all of them alike; the table gives medians
and the host's load average before and after."""
import argparse
import os
import statistics
from pathlib import Path

from colibri.targets import OPTIONS, build, meson_build, source_dir
from colibri.targets import firmware as fw

PROMPT = [1, 591, 47, 39, 49, 28]   # <s> ROMEO:


def images(freertos_kernel):
    out = [(board, "bare metal", build(board) / "firmware" / "colibri-firmware.elf") for board in fw.BOARDS]
    if freertos_kernel:
        for board in [name for name, b in fw.BOARDS.items() if b.freertos]:
            d = meson_build(source_dir() / "build" / f"freertos-{board}",
                            [*OPTIONS[board], f"-Dfreertos_kernel={Path(freertos_kernel).resolve()}"])
            out.append((board, "FreeRTOS task", d / "firmware" / "colibri-freertos.elf"))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--freertos-kernel", help="a FreeRTOS-Kernel checkout: also time the FreeRTOS images")
    args = p.parse_args()

    runs = images(args.freertos_kernel)
    load_before = os.getloadavg()[0]
    decode, prefill = {i: [] for i in range(len(runs))}, {i: [] for i in range(len(runs))}
    kernels = {}
    for _ in range(args.rounds):
        for i, (board, _, elf) in enumerate(runs):
            r = fw.run(board, elf, fw.arguments(PROMPT, args.tokens, ignore_eos=True))
            assert r.status == 0, r.output
            decode[i].append(r.tokens_per_second())
            kernels[i] = r.report["kernels"]   # the image's best: the reference but where a board has vectors
            prefill[i].append(r.report["prompt_tokens"] * r.report["ticks_per_second"] / r.report["prefill_ticks"])
    load_after = os.getloadavg()[0]

    print(f"bundled model, n_ctx 256, prompt of {len(PROMPT)} tokens, {args.tokens} generated (greedy); "
          f"median of {args.rounds} interleaved rounds; load average {load_before:.2f} -> {load_after:.2f}\n")
    print("| board | CPU | float | image | kernels | flash used | RAM used | prefill tok/s (emulated) "
          "| decode tok/s (emulated) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for i, (board, kind, elf) in enumerate(runs):
        b, mm = fw.BOARDS[board], fw.memory_map(board)
        flash, ram = fw.image_usage(board, elf)
        if mm["model_flash_size"]:   # two flashes: the code's, the model's
            model = fw.sections(board, elf)[".colibri_model"][0]
            where = (f"{flash - model:,} B of {mm['flash_size'] >> 10} KiB + model {model:,} B of "
                     f"{mm['model_flash_size'] >> 20} MiB")
        else:
            where = f"{flash:,} B of {mm['flash_size'] >> 20} MiB"
        print(f"| {board} | {b.cpu} | {b.float} | {kind} | {kernels[i]} | {where} "
              f"| {ram:,} B of {mm['ram_size'] >> 20} MiB | {statistics.median(prefill[i]):.1f} "
              f"| {statistics.median(decode[i]):.2f} |")


if __name__ == "__main__":
    main()

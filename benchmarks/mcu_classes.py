"""Which common microcontroller classes hold the bundled model, and at which context length: the
firmware plan (colibri.targets.firmware.plan, exact: what the linker places and the core reserves)
for the model as shipped and converted to q8_0 and q4_0, against each class's flash and RAM.

    python benchmarks/mcu_classes.py [--board mps2-an386] [--out FILE]

The code is the board's image's (its CPU's build of the core and firmware, measured with the size
tool); the model lies in the same flash.  A cell gives the longest n_ctx (up to the model's 256
positions) that fits at n_batch 16 and at n_batch 1 (a smaller prefill chunk, a smaller arena), or
what does not fit."""
import argparse
import tempfile
from pathlib import Path

from colibri.convert import convert
from colibri.demo import MODEL_DIR
from colibri.targets import firmware as fw

CLASSES = [(512 << 10, 128 << 10), (1 << 20, 256 << 10), (2 << 20, 512 << 10), (4 << 20, 1 << 20),
           (8 << 20, 2 << 20)]   # (flash, RAM) bytes
CHECKPOINT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "shakespeare-hf"
NO_LIMIT = 1 << 40


def size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def cell(board, model, flash, ram):
    p = fw.for_memory(fw.plan(board, model, ctx=1, batch=1), flash, ram)
    holds = [fw.largest_ctx(board, model, NO_LIMIT, ram, batch=b) for b in (16, 1)]   # what the RAM alone holds
    ctx = "RAM too small at n_ctx 1" if not holds[1] else f"n_ctx {holds[0] or '-'} / {holds[1]}"
    if p.flash > flash:
        return f"no: flash over by {p.flash - flash:,} B (RAM: {ctx})"
    return ctx


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--board", default="mps2-an386", help="whose code size to count (default mps2-an386, Cortex-M4F)")
    ap.add_argument("--out", help="also write the table to FILE")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        models = [("as shipped (f16)", MODEL_DIR)] + [
            (dt, convert(CHECKPOINT, Path(tmp) / dt, dtype=dt, progress=False)) for dt in ("q8_0", "q4_0")]
        code = fw.plan(args.board, MODEL_DIR, ctx=1, batch=1).code_flash
        b = fw.BOARDS[args.board]
        lines = [f"The bundled model on MCU classes: the longest n_ctx that fits at n_batch 16 / n_batch 1 "
                 f"(code {code:,} B as built for {args.board}, {b.cpu}; stack {fw.DEFAULT_STACK:,} B)\n",
                 "| model | flash: code + model | " + " | ".join(f"{size(f)} flash / {size(r)} RAM"
                                                           for f, r in CLASSES) + " |",
                 "|---|---|" + "---|" * len(CLASSES)]
        for name, model in models:
            p = fw.plan(args.board, model, ctx=1, batch=1)
            lines.append(f"| {name} | {p.flash:,} B | " + " | ".join(cell(args.board, model, f, r) for f, r in CLASSES)
                         + " |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

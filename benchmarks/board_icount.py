"""Instructions retired per decoded token on each board, by kernel variant: the bundled model as
shipped (f16) and converted to q8_0 and q4_0, the scalar kernels against each board's vector ones
(mve on mps3-an547).  Prints a markdown table (benchmarks/results/board_icount.md is its output).

    python benchmarks/board_icount.py [--tokens 9] [--out FILE]

Counting: QEMU's `-icount shift=0` advances the virtual clock one nanosecond per instruction
retired, and the image times its steps with the board's own clock, which QEMU drives from that
virtual clock: a decode's ticks are its instructions (colibri.targets.firmware.ICOUNT).  A decode
token is one forward and one sample: (decode of N tokens - decode of 1) / (N - 1).  The count does
not depend on the host's load; it is not a cycle count, and not what any silicon takes: cycles per
instruction differ by core and by instruction (a Cortex-M55 takes two cycles for most 128-bit Helium
instructions, and overlaps them with the next), and so do memories' wait states."""
import argparse
import tempfile
from pathlib import Path

from colibri.convert import convert
from colibri.demo import MODEL_DIR
from colibri.targets import firmware as fw

PROMPT = [1, 591, 47, 39, 49, 28]   # <s> ROMEO:
CHECKPOINT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "shakespeare-hf"
VECTOR = {"mps3-an547": "mve"}   # the boards with a vector variant


def per_token(board, image, kernels, tokens):
    decode = []
    for n in (1, tokens):
        r = fw.run(board, image, fw.arguments(PROMPT, n, ignore_eos=True, kernels=kernels), qemu_options=fw.ICOUNT)
        assert r.status == 0 and r.report["kernels"] == kernels, r.output
        decode.append(fw.instructions(r, r.report["decode_ticks"]))
    return (decode[1] - decode[0]) / (tokens - 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=9)
    ap.add_argument("--out", help="also write the table to FILE")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        models = [("f16", MODEL_DIR)] + [(dt, convert(CHECKPOINT, Path(tmp) / dt, dtype=dt, progress=False))
                                         for dt in ("q8_0", "q4_0")]
        lines = [f"Instructions retired per decoded token (QEMU -icount; the bundled model, n_ctx 256, decode after "
                 f"a {len(PROMPT)}-token prompt, mean of {args.tokens - 1} tokens)\n",
                 "| board | CPU | weights | reference (strict) | reference-int8 (scalar int8) | vector | "
                 "scalar / vector |", "|---|---|---|---|---|---|---|"]
        for board, b in fw.BOARDS.items():
            for name, model in models:
                image = fw.build_image(board, model)
                strict = per_token(board, image, "reference", args.tokens)
                int8 = per_token(board, image, "reference-int8", args.tokens) if name != "f16" else None
                vector = per_token(board, image, VECTOR[board], args.tokens) if board in VECTOR else None
                scalar = int8 or strict   # the int8 path's scalar kernels are what the vector ones replace
                cells = [f"{strict / 1e6:.2f} M", f"{int8 / 1e6:.2f} M" if int8 else "-",
                         f"{vector / 1e6:.2f} M ({VECTOR[board]})" if vector else "-",
                         f"{scalar / vector:.1f}x" if vector else "-"]
                lines.append(f"| {board} | {b.cpu} | {name} | " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    text = "\n".join(lines)
    print("\n" + text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

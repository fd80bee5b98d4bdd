"""Retired instructions of the rvv kernels against the scalar ones, under QEMU user mode at one VLEN;
prints a markdown table (benchmarks/results/rvv_icount.md is its output).

    python benchmarks/rvv_icount.py [--vlen 256] [--no-decode] [--out FILE]

Counting: Debian's QEMU 7.2 ships no TCG plugins (no libinsn.so), and rdinstret in user mode reads a
host clock there, not retired instructions.  `-singlestep -d exec,nochain` makes every guest
instruction its own translation block and logs each one executed: the log's "Trace" lines are the
retired instructions, exactly (a 3-instruction asm loop of N more iterations logs 3N more lines;
a vector instruction counts one, whatever its vl).  A kernel's count is its program's less the
same program doing all but the call (benchmarks/kernel_icount.c `setup`).  Matmuls: every row is a
copy of the first (the kernels have no data-dependent branches but the reference's f16 conversion,
which then costs each row the same), so the count is linear in the rows; it is measured at 16 and
32 rows and extended to the table's rows.  A decode token: colibri-infer generating 2 tokens less
generating 1 (one decode step, the sampling of one token included)."""
import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

from colibri import targets

MATMULS = [(dt, 768, 2048) for dt in ("q8_0", "q4_0", "q8_0x8", "q4_0x8", "q4_1", "q5_0", "q5_1", "iq4_nl", "mxfp4",
                                      "q4_k", "q6_k", "q3_k", "q2_k", "f32", "f16")]
ROWS = (16, 32)


def qemu(vlen):
    return [re.sub(r"vlen=\d+", f"vlen={vlen}", a) for a in targets.RUNNER["riscv64-rvv"]] + ["-singlestep", "-d", "exec,nochain"]


def count(command):
    """Instructions the command retires under QEMU: its exec log's lines, counted as they stream."""
    p = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    n, tail = 0, b""
    while chunk := p.stderr.read(1 << 20):
        n += (tail + chunk).count(b"Trace ")   # 5 bytes of tail: a "Trace " split over two chunks, once
        tail = chunk[-5:]
    if p.wait() != 0:
        raise RuntimeError(f"{command} failed")
    return n


def kernel(vlen, program, kernels, op, rows, cols):
    args = [str(program), kernels, op, str(rows), str(cols)]
    return count(qemu(vlen) + args) - count(qemu(vlen) + args + ["setup"])


def matmul(vlen, program, kernels, op, rows, cols):
    a, b = (kernel(vlen, program, kernels, op, r, cols) for r in ROWS)
    return a + (b - a) * (rows - ROWS[0]) // (ROWS[1] - ROWS[0])


def decode(vlen, infer, kernels, model):
    def run(n):
        return count(qemu(vlen) + [str(infer), "--model", str(model), "--tokens", "1,591", "--max_tokens", str(n),
                                   "--temperature", "0", "--ids", "--kernels", kernels])
    return run(2) - run(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vlen", type=int, default=256)
    ap.add_argument("--no-decode", action="store_true")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    out = targets.build("riscv64-rvv")
    program, infer = out / "benchmarks" / "kernel_icount", out / "c_core" / "colibri-infer"
    rows = []
    for op, r, c in MATMULS:
        scalar = "reference" if op in ("f32", "f16") else "reference-int8"
        what = f"matmul {op} {r} x {c}" + (" (int8 path: matmul_q8)" if scalar == "reference-int8" else "")
        rows.append((what, scalar, matmul(a.vlen, program, scalar, op, r, c), matmul(a.vlen, program, "rvv", op, r, c)))
        print(rows[-1], file=sys.stderr)
    for op, n in (("quantize", 2048), ("softmax", 1024)):
        scalar = "reference-int8" if op == "quantize" else "reference"
        what = "quantize_q8 of 2048" if op == "quantize" else "softmax over 1024"
        rows.append((what, scalar, kernel(a.vlen, program, scalar, op, 1, n), kernel(a.vlen, program, "rvv", op, 1, n)))
        print(rows[-1], file=sys.stderr)
    if not a.no_decode:
        from colibri.demo import MODEL_DIR
        rows.append(("one decode token, bundled model (f16)", "reference",
                     decode(a.vlen, infer, "reference", MODEL_DIR), decode(a.vlen, infer, "rvv", MODEL_DIR)))
        print(rows[-1], file=sys.stderr)
    lines = [f"Retired instructions at VLEN {a.vlen} (qemu-riscv64 7.2, `-singlestep -d exec,nochain`; "
             "see benchmarks/rvv_icount.py for the method)", "",
             "| kernel call | scalar kernels | scalar | rvv | scalar / rvv |", "|---|---|---:|---:|---:|"]
    lines += [f"| {w} | {s} | {x:,} | {y:,} | {x / y:.1f}x |" for w, s, x, y in rows]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    os.environ.setdefault("COLIBRI_SOURCE", str(Path(__file__).resolve().parents[1]))   # the checkout it is in
    main()

"""Encoding speed: the core's encoder (colibri_tokenize through Model.tokenize) against the
`tokenizers` library on the same text, which both encode to the same ids.

    python benchmarks/tokenizer.py [--model DIR] [--kib 100]

The text: this checkout's README, docs and C sources (English prose, code, whitespace runs), cut
to --kib KiB.  Each side encodes it whole, best of --repeat runs, on one thread."""
import argparse
import os
import time
from pathlib import Path

import colibri
from colibri.demo import MODEL_DIR

REPO = Path(__file__).resolve().parents[1]


def text(kib):
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "c_core" / "src").rglob("*.c"))]
    data = "".join(f.read_text(encoding="utf-8") for f in files if f.is_file())
    while len(data.encode()) < kib * 1024:
        data += data
    return data.encode()[:kib * 1024].decode("utf-8", "ignore")


def best(f, repeat):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=MODEL_DIR)
    p.add_argument("--kib", type=int, default=100)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    model = colibri.Model(args.model)
    tok = model.tokenizer
    s = text(args.kib)
    mb = len(s.encode()) / 1e6
    ids = model.tokenize(s)
    assert ids == tok.encode(s).ids, "the core and tokenizers disagree on this text"
    core = best(lambda: model.tokenize(s), args.repeat)
    lib = best(lambda: tok.encode(s), args.repeat)
    print(f"{len(s.encode())} bytes, {len(ids)} tokens ({args.model.name})")
    print(f"{'encoder':<24}{'ms':>10}{'MB/s':>10}")
    print(f"{'colibri_tokenize':<24}{core * 1e3:>10.2f}{mb / core:>10.1f}")
    print(f"{'tokenizers ' + __import__('tokenizers').__version__:<24}{lib * 1e3:>10.2f}{mb / lib:>10.1f}")


if __name__ == "__main__":
    main()

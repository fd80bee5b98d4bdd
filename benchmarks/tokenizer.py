"""Encoding speed: the core's encoder (colibri_tokenize through Model.tokenize) against the
`tokenizers` library on the same text, which both encode to the same ids, for each pre-tokenizer
family the core has.

    python benchmarks/tokenizer.py [--kib 100]

The text: this checkout's README, docs and C sources (English prose, code, whitespace runs), cut
to --kib KiB.  gpt2 is the bundled model's tokenizer; llama3, qwen2 (its NFC normalizer too) and
deepseek are byte-level BPE tokenizers of 1024 tokens trained on the text with those families'
pre-tokenizers, sentencepiece
one of Llama 2's kind (spaces as U+2581, byte fallback) (the bundled checkpoint converted with each).
Each side encodes the text whole, one thread, the two interleaved --repeat times: medians, and the
ratio as the median of each pair's.  Prints a markdown table and writes it to --out."""
import argparse
import datetime
import json
import os
import shutil
import statistics
import tempfile
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


def interleaved(a, b, repeat):
    """Seconds of a() and of b(), run one after the other `repeat` times."""
    times = ([], [])
    for _ in range(repeat):
        for f, out in ((a, times[0]), (b, times[1])):
            t = time.perf_counter()
            f()
            out.append(time.perf_counter() - t)
    return times


def trained(family, data, tmp):
    """The bundled checkpoint with a tokenizer of `family` trained on `data`, converted."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    from colibri.convert import convert
    from colibri.convert.vocab import DEEPSEEK_REGEXES, LLAMA3_REGEX, QWEN2_REGEX

    if family == "sentencepiece":   # Llama 2's layout: <unk> <s> </s>, the 256 byte tokens, the pieces
        from tokenizers import normalizers

        spaces = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        t = Tokenizer(models.BPE(unk_token="<unk>"))
        t.normalizer, t.pre_tokenizer = spaces, pre_tokenizers.Split("\u2581", "merged_with_next")
        t.train_from_iterator([data], trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                                          special_tokens=["<unk>", "<s>", "</s>"]))
        trained = json.loads(t.to_str())["model"]
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
        for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
            vocab.setdefault(piece, len(vocab))
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = spaces
        tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    else:
        from tokenizers import normalizers

        regexes = {"llama3": [LLAMA3_REGEX], "qwen2": [QWEN2_REGEX], "deepseek": DEEPSEEK_REGEXES}[family]
        tok = Tokenizer(models.BPE(ignore_merges=family == "llama3"))
        if family == "qwen2":
            tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), "isolated") for r in regexes] +
                                                    [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        tok.train_from_iterator([data], trainers.BpeTrainer(vocab_size=1024, show_progress=False,
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    src = tmp / family
    shutil.copytree(REPO / "tests" / "fixtures" / "shakespeare-hf", src)
    tok.save(str(src / "tokenizer.json"))
    return convert(src, tmp / f"{family}.colibri", dtype="f16", progress=False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=MODEL_DIR)
    p.add_argument("--kib", type=int, default=100)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "tokenizer.md")
    args = p.parse_args()
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    s = text(args.kib)
    mb = len(s.encode()) / 1e6
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("gpt2", "llama3", "qwen2", "deepseek", "sentencepiece"):
            model = colibri.Model(args.model if family == "gpt2" else trained(family, s, Path(tmp)))
            tok = model.tokenizer
            ids = model.tokenize(s)
            assert ids == tok.encode(s).ids, f"{family}: the core and tokenizers disagree on this text"
            core, lib = interleaved(lambda: model.tokenize(s), lambda: tok.encode(s), args.repeat)
            ratio = statistics.median(b / a for a, b in zip(core, lib))
            rows.append(f"| {family} | {len(ids):,} | {mb / statistics.median(core):.1f} | "
                        f"{mb / statistics.median(lib):.1f} | {ratio:.1f} |")
            print(rows[-1], flush=True)
    table = "\n".join([
        f"# Encoding speed, {datetime.date.today()}", "",
        f"{len(s.encode()):,} bytes of this checkout's README, docs and C sources; one thread (tokenizers "
        f"{__import__('tokenizers').__version__}, RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}); "
        f"{args.repeat} interleaved runs, medians; identical ids.", "",
        "| family | tokens | colibri MB/s | tokenizers MB/s | ratio |", "|---|---|---|---|---|", *rows]) + "\n"
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)

if __name__ == "__main__":
    main()

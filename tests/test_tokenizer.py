"""The core's encoder (colibri_tokenize, Model.tokenize) against the `tokenizers` library: identical
ids for the bundled model and for byte-level BPE tokenizers trained here, on a corpus of English,
code, digits, whitespace runs, emoji, CJK, combining marks and the empty string, and on random
Unicode strings; text the core decodes is what the library decodes."""
import shutil
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri.convert import convert
from colibri.demo import MODEL_DIR
from support import FIXTURES

CASES_FILE = FIXTURES / "tokenize_cases.txt"   # read by c_core/tests/test_tokenize.c

CORPUS = [
    "", " ", "  ", "\n", "a", "JULIET:", "ROMEO:\nBut soft, what light through yonder window breaks?\n",
    "It is the east, and Juliet is the sun.  Arise, fair sun, and kill the envious moon,",
    "I'm sure it's what they'll say: we've seen, you'd know, I've 'd 're 'S 'LL.",
    "def f(x):\n    return x ** 2  # square\n\n\tif a != b:\n\t\tprint('{}'.format(a))\n",
    "for (int i = 0; i < n; i++) { sum += a[i]; }  /* C */ ===== ----- >>> ...",
    "3.14159 2026-12-01 1,000,000 0x1F 42nd 100% $9.99 ½ ² ٣٤ 四",
    "trailing spaces   ", "   leading spaces", "tabs\t\tand\t \tmixed \t", "new\n\nlines\r\n\r\nend\n\n\n",
    "a  b   c    d     e", " \n \n", "\u00a0non\u2009breaking\u3000ideographic\u2028line",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧 flags 🇫🇷", "日本語のテキストと中文文本，한국어 텍스트。",
    "combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 ḗ", "Ελληνικά Кириллица עברית العربية ไทย",
    "special <s> and </s> and <unk> inline<s></s>", "x" * 250 + " " + "ab" * 120, " " * 50 + "z",
    "mixed123abc 456  789\t0", "\u200bzero\u200dwidth\ufeff", "'''quotes''' \"\" `` ''s",
]
TRAIN_TEXT = CORPUS + [
    "The quick brown fox jumps over the lazy dog. " * 3, "import numpy as np\nx = np.zeros((3, 4))\n" * 2,
    "Unicode: café naïve über straße 東京 北京 😀😀 1234567890", "    indented\n        more\n",
]


def random_strings(seed, count=300):
    """Strings of code points drawn from ASCII, Latin, combining marks, other scripts' letters and
    digits, Unicode spaces, CJK and emoji, with runs of spaces."""
    pools = [range(0x20, 0x7f), range(0x09, 0x0e), range(0xa0, 0x250), range(0x300, 0x370), range(0x370, 0x530),
             range(0x600, 0x6ff), range(0x900, 0x97f), range(0x2000, 0x2070), range(0x3000, 0x3100),
             range(0x4e00, 0x4f00), range(0xac00, 0xad00), range(0x1f300, 0x1f650), [0x20] * 8, [0x27] * 2]
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(0, 40))
        chars = []
        for _ in range(n):
            pool = pools[int(rng.integers(len(pools)))]
            chars.append(chr(pool[int(rng.integers(len(pool)))]))
        out.append("".join(c for c in chars if not 0xd800 <= ord(c) < 0xe000))
    return out


@pytest.fixture(scope="module")
def bundled():
    return colibri.Model(MODEL_DIR)


def trained_model(tmp_path_factory, family):
    """The bundled checkpoint with a byte-level BPE tokenizer trained here (small vocabulary, two
    special tokens and a template that puts one first), converted: GPT-2's pre-tokenizer, or Llama 3's
    regex and its ignore_merges."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    from colibri.convert.vocab import DEEPSEEK_REGEXES, LLAMA3_REGEX

    if family == "gpt2":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    elif family == "deepseek":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), "isolated") for r in DEEPSEEK_REGEXES] +
            [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_REGEX), "isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(TRAIN_TEXT * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                       special_tokens=[("<|endoftext|>", 0)])
    src = tmp_path_factory.mktemp(f"trained-{family}-hf")
    for f in (FIXTURES / "shakespeare-hf").iterdir():
        if f.name not in ("tokenizer.json", "reference.npz"):
            shutil.copy(f, src / f.name)
    tok.save(str(src / "tokenizer.json"))
    model = colibri.Model(convert(src, src.parent / f"trained-{family}.colibri", dtype="f16", progress=False))
    import json

    assert json.loads((Path(model.path) / "colibri_model.json").read_text())["encoder"]["pre_tokenizer"] == family
    return model


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_model(tmp_path_factory, "gpt2")


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    return trained_model(tmp_path_factory, "llama3")


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    return trained_model(tmp_path_factory, "deepseek")


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    """A SentencePiece-style BPE tokenizer as Llama 2 and Mixtral's tokenizer.json have it (spaces as
    "▁", one before the text, byte fallback, <unk> <s> </s> then the 256 byte tokens first), its
    pieces trained here on words that start at a "▁", converted with the bundled checkpoint."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    spaces = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.normalizer = spaces
    t.pre_tokenizer = pre_tokenizers.Split("\u2581", "merged_with_next")
    t.train_from_iterator(TRAIN_TEXT * 4, trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                                               show_progress=False))
    trained = json.loads(t.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = spaces
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    src = tmp_path_factory.mktemp("sentencepiece-hf")
    for f in (FIXTURES / "shakespeare-hf").iterdir():
        if f.name not in ("tokenizer.json", "reference.npz"):
            shutil.copy(f, src / f.name)
    tok.save(str(src / "tokenizer.json"))
    model = colibri.Model(convert(src, src.parent / "sentencepiece.colibri", dtype="f16", progress=False))
    assert json.loads((Path(model.path) / "colibri_model.json").read_text())["encoder"]["kind"] == "sentencepiece_bpe"
    return model


@pytest.mark.parametrize("which", ["bundled", "trained", "llama3", "deepseek", "sentencepiece"])
def test_corpus_ids_are_the_tokenizers_library(which, request):
    model = request.getfixturevalue(which)
    texts = CORPUS + (["<|endoftext|>x<|pad|><|pad|> <|endoftext|>", "IT'S 'Re 'VE \r\n\r\n  \n\t x !!word 12345",
                       "#include <x.h> ab12cd 日本語テキスト・カタカナ ゛x a\u0301b \u200b\u200bz 1,2 ++x ..\r\n"]
                      if which != "bundled" else [])
    for text in texts:
        assert model.tokenize(text) == model.tokenizer.encode(text).ids, repr(text)


@pytest.mark.parametrize("which,seed", [("bundled", 1), ("trained", 2), ("llama3", 5), ("deepseek", 6),
                                        ("sentencepiece", 7)])
def test_random_strings_are_the_tokenizers_library(which, seed, request):
    model = request.getfixturevalue(which)
    for text in random_strings(seed):
        assert model.tokenize(text) == model.tokenizer.encode(text).ids, repr(text)


def test_decode_is_the_tokenizers_library(bundled):
    for text in CORPUS + random_strings(3, 50):
        ids = bundled.tokenize(text)
        assert bundled.detokenize(ids) == bundled.tokenizer.decode(ids) == text.replace("<s>", "").replace("</s>", "").replace("<unk>", "")


def test_invalid_utf8_keeps_every_byte(bundled):
    data = b"ok \xff\xfe \xc3( \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf end"
    ids = bundled.tokenize(data)
    assert ids[0] == 1 and b"".join(bundled.token_bytes(t) for t in ids[1:]) == data
    bos, ff = bundled.tokenize(b"\xff")
    assert bos == 1 and bundled.token_bytes(ff) == b"\xff"


def test_model_without_an_encoder_says_so(tmp_path):
    import json

    shutil.copytree(MODEL_DIR, tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "colibri_model.json").read_text())
    del meta["encoder"]
    meta["tensors"] = [t for t in meta["tensors"] if t["name"] in ("tokenizer.token_bytes", "tokenizer.token_offsets")
                       or not t["name"].startswith("tokenizer.")]
    (tmp_path / "m" / "colibri_model.json").write_text(json.dumps(meta))
    model = colibri.Model(tmp_path / "m")
    with pytest.raises(colibri.Error, match="carries no encoder: reconvert it with colibri convert"):
        model.tokenize("hello")
    assert model.session().generate([1, 5], max_tokens=2, temperature=0.0)   # ids still run


def write_cases():
    """The cases file the C test reads: each text's bytes in hex, then its ids from `tokenizers`."""
    tok = colibri.Model(MODEL_DIR).tokenizer
    lines = []
    for text in CORPUS + random_strings(4, 40):
        lines += [text.encode("utf-8").hex(), ",".join(map(str, tok.encode(text).ids))]
    return "\n".join(lines) + "\n"


def test_c_cases_file_is_the_tokenizers_library():
    """c_core/tests/test_tokenize.c (every target's meson test) reads these; regenerate with
    python -c 'import test_tokenizer as t; open(t.CASES_FILE, "w").write(t.write_cases())' in tests/."""
    assert CASES_FILE.read_text() == write_cases()


def run(*command, stdin=None):
    import subprocess

    return subprocess.run(command, capture_output=True, check=True, cwd="/", input=stdin).stdout


@pytest.mark.parametrize("prompt", ["JULIET:", "ROMEO: é — 😀 日本", ""])
def test_c_cli_prompt_is_colibri_generate(prompt):
    """colibri-infer --prompt encodes in C and prints what colibri generate prints, greedy."""
    import sys

    py = run(sys.executable, "-m", "colibri", "generate", "--prompt", prompt, "--max-tokens", "24", "--temperature", "0")
    c = run("colibri-infer", "--model", str(MODEL_DIR), "--prompt", prompt, "--max_tokens", "24", "--temperature", "0")
    assert c == py
    assert run("colibri-infer", "--model", str(MODEL_DIR), "--prompt", "-", "--max_tokens", "24", "--temperature", "0",
               stdin=prompt.encode()) == py


def test_generate_needs_no_tokenizer_library_file(tmp_path):
    """With the encoder and the byte table, colibri generate reads and writes text without tokenizer.json."""
    import json
    import sys

    shutil.copytree(MODEL_DIR, tmp_path / "m")
    (tmp_path / "m" / "tokenizer.json").unlink()
    meta = json.loads((tmp_path / "m" / "colibri_model.json").read_text())
    del meta["tokenizer"]
    (tmp_path / "m" / "colibri_model.json").write_text(json.dumps(meta))
    args = ["generate", "--prompt", "ROMEO: é", "--max-tokens", "24", "--temperature", "0"]
    assert run(sys.executable, "-m", "colibri", *args, "--model", str(tmp_path / "m")) == \
        run(sys.executable, "-m", "colibri", *args)

"""The core's encoder (colibri_tokenize, Model.tokenize) against the `tokenizers` library: identical
ids for the bundled model and for tokenizers trained or put together here (GPT-2's, Llama 3's,
DeepSeek V3's and Qwen2's pre-tokenizers, NFC, a ByteLevel prefix space, SentencePiece-style BPE in
its normalizer and Metaspace forms, added tokens with lstrip, rstrip, single_word and normalized),
on a corpus of English, code, digits, whitespace runs, emoji, CJK, combining marks and the empty
string, on one of what NFC changes (with 100 KB of mixed text), and on random Unicode strings; text
the core decodes is what the library decodes.  The fixtures qwen2, gpt2_nfc, prefix_space,
metaspace_first, metaspace_always and added_options are module-scope colibri.Model objects."""
import functools
import re
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
def _mixed(n_bytes, seed=9):
    """Mixed text of about n_bytes: CORPUS, NFC_CORPUS's short cases and random strings, joined."""
    parts, size, k = [], 0, 0
    pieces = CORPUS + NFC_SHORT + random_strings(seed, 200, nfc=True)
    while size < n_bytes:
        parts.append(pieces[k % len(pieces)])
        size += len(parts[-1].encode()) + 1
        k += 1
    return " ".join(parts)


NFC_SHORT = [
    "cafe\u0301 nai\u0308ve e\u0301\u0301 A\u030a \u212b \u2126 \u212a o\u0308\u0304 \u1e0b\u0323 d\u0323\u0307 d\u0307\u0323",
    "q\u0307\u0323 a\u0328\u0301 \u0345\u0301\u0313 \u03b1\u0313\u0300\u0345 \u1f82 \u0344 \u0f73 \u0f71\u0f72",
    "\u1100\u1161\u11a8 \u1100\u1161 \uac00\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af \u1100\u11a8 \u1161\u1100",
    "\u0958 \u0915\u093c \u09dc \u0b47\u0b3e \u0b4b \u0dd9\u0dcf\u0dca \u2adc \u2add\u0338 \uf900 \U0002f800",
    "\u0041\u0300\u0316 \u0041\u0316\u0300 x\u0301\u0323\u0308 \u00e9\u0323 \u1e9b\u0323 \u0301start",
    "Ṩ s\u0323\u0307 s\u0307\u0323 \u1ea0\u0302 a\u0323\u0302 \U00011935\U00011930 \u1df6e\u0301",
    "e\u0301 \u00e9  e\u0301\n\ne\u0301\t \u00e9\u0301\u0301 x  \u2000\u2001 1\u0301 '\u0301s a\u0301'\u0301re",
]
NFC_CORPUS = NFC_SHORT + [
    "a" + "\u0301\u0316\u0300\u0323" * 300 + " b",   # one chunk longer than the window
    "\u0301" * 700 + "x " + "e" + "\u0308" * 400,
    ("word\u0301 " * 200) + ("\uac00\u11a8" * 300),
    " " * 200 + "e\u0301 " + "\n" + " " * 250 + "\n" + "x\u0301" * 60,   # words of at most 256 bytes (see FORMAT.md)
    "Ελληνικά " * 80 + "1234567890 " * 60,
]


TRAIN_TEXT = CORPUS + [
    "The quick brown fox jumps over the lazy dog. " * 3, "import numpy as np\nx = np.zeros((3, 4))\n" * 2,
    "Unicode: café naïve über straße 東京 北京 😀😀 1234567890", "    indented\n        more\n",
]


def random_strings(seed, count=300, nfc=False):
    """Strings of code points drawn from ASCII, Latin, combining marks, other scripts' letters and
    digits, Unicode spaces, CJK and emoji, with runs of spaces; `nfc`: more of what NFC changes
    (combining marks after letters, Hangul jamo, composition exclusions, singletons, Indic vowel signs).
    The library's NFC tables predate Unicode 10; gen_unicode.py's library_unknown gives its values for
    the marks assigned since, so they may be drawn too."""
    pools = [range(0x20, 0x7f), range(0x09, 0x0e), range(0xa0, 0x250), range(0x300, 0x370), range(0x370, 0x530),
             range(0x600, 0x6ff), range(0x900, 0x97f), range(0x2000, 0x2070), range(0x3000, 0x3100),
             range(0x4e00, 0x4f00), range(0xac00, 0xad00), range(0x1f300, 0x1f650), [0x20] * 8, [0x27] * 2]
    if nfc:
        pools += [range(0x300, 0x370)] * 4 + [range(0x1100, 0x1200), range(0x1e00, 0x2000), range(0x1ab0, 0x1b00),
                                              range(0x1dc0, 0x1e00), range(0x20d0, 0x2100), range(0x0958, 0x0960),
                                              range(0xb3e, 0xb58), range(0x0f70, 0x0f80), [0x212b, 0x2126, 0x212a, 0x0344],
                                              range(0xf900, 0xf940), range(0x11930, 0x11940), range(0x10f46, 0x10f51),
                                              range(0x61, 0x7b)]
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


def hf_dir(tmp_path_factory, name, tok):
    src = tmp_path_factory.mktemp(f"{name}-hf")
    for f in (FIXTURES / "shakespeare-hf").iterdir():
        if f.name not in ("tokenizer.json", "reference.npz"):
            shutil.copy(f, src / f.name)
    tok.save(str(src / "tokenizer.json"))
    return src


def converted(tmp_path_factory, name, tok, **want):
    """The bundled checkpoint with `tok`, converted; its encoder entry has the fields `want`."""
    import json

    src = hf_dir(tmp_path_factory, name, tok)
    model = colibri.Model(convert(src, src.parent / f"{name}.colibri", dtype="f16", progress=False))
    entry = json.loads((Path(model.path) / "colibri_model.json").read_text())["encoder"]
    assert {k: entry.get(k) for k in want} == want, entry
    return model


def byte_level(normalizer, pre_tokenizer, added=(), ignore_merges=False):
    """A byte-level BPE tokenizer trained here (as trained_model's), with `normalizer`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((TRAIN_TEXT + NFC_SHORT) * 4, trainer)
    tok.add_tokens(list(added))
    tok.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)])
    return tok


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    """Qwen2's form: NFC, its regex, ByteLevel without a regex."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    from colibri.convert.vocab import QWEN2_REGEX

    tok = byte_level(normalizers.NFC(), pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(QWEN2_REGEX), "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    return converted(tmp_path_factory, "qwen2", tok, pre_tokenizer="qwen2", normalizer="nfc")


@pytest.fixture(scope="module")
def gpt2_nfc(tmp_path_factory):
    """GPT-NeoX's form (OLMoE): NFC, ByteLevel with GPT-2's regex, runs of spaces and others as
    normalized added tokens (ones NFC cannot make or unmake)."""
    from tokenizers import AddedToken, normalizers, pre_tokenizers

    tok = byte_level(normalizers.NFC(), pre_tokenizers.ByteLevel(add_prefix_space=False),
                     [AddedToken(" " * n, normalized=True) for n in (2, 4, 8)] +
                     [AddedToken(t, normalized=True) for t in ("|||IP_ADDRESS|||", "abq")])
    return converted(tmp_path_factory, "gpt2_nfc", tok, pre_tokenizer="gpt2", normalizer="nfc")


@pytest.fixture(scope="module")
def prefix_space(tmp_path_factory):
    """GPT-2's ByteLevel with add_prefix_space: a space before each stretch that lacks one."""
    from tokenizers import pre_tokenizers

    tok = byte_level(None, pre_tokenizers.ByteLevel(add_prefix_space=True))
    return converted(tmp_path_factory, "prefix_space", tok, pre_tokenizer="gpt2", prefix_space=True)


@pytest.fixture(scope="module")
def added_options(tmp_path_factory):
    """Added tokens with lstrip, rstrip and single_word, special and not, normalized and not."""
    from tokenizers import AddedToken, pre_tokenizers

    tok = byte_level(None, pre_tokenizers.ByteLevel(add_prefix_space=False))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True), AddedToken("<|im_end|>", rstrip=True, special=True)])
    tok.add_tokens([AddedToken("[X]", lstrip=True, rstrip=True), AddedToken("ab", normalized=True),
                    AddedToken("bc", normalized=False), AddedToken("cat", single_word=True),
                    AddedToken("<w>", single_word=True, lstrip=True, normalized=False)])
    return converted(tmp_path_factory, "added_options", tok, pre_tokenizer="gpt2")


def metaspace_model(tmp_path_factory, scheme, split):
    """The sentencepiece fixture's vocabulary and merges with no normalizer and a Metaspace pre-tokenizer."""
    import json

    from tokenizers import Tokenizer, pre_tokenizers

    doc = json.loads((Path(tmp_path_factory.getbasetemp()) / "sentencepiece-hf0" / "tokenizer.json").read_text())
    doc["normalizer"] = None
    tok = Tokenizer.from_str(json.dumps(doc))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)
    return converted(tmp_path_factory, f"metaspace_{scheme}", tok, kind="sentencepiece_bpe", prepend_scheme=scheme,
                     split=split)


@pytest.fixture(scope="module")
def metaspace_first(tmp_path_factory, sentencepiece):
    return metaspace_model(tmp_path_factory, "first", True)


@pytest.fixture(scope="module")
def metaspace_always(tmp_path_factory, sentencepiece):
    return metaspace_model(tmp_path_factory, "always", False)


NEW = ["qwen2", "gpt2_nfc", "prefix_space", "metaspace_first", "metaspace_always", "added_options"]
EXTRA = ["<|endoftext|>x<|pad|><|pad|> <|endoftext|>", "IT'S 'Re 'VE \r\n\r\n  \n\t x !!word 12345",
         "#include <x.h> ab12cd 日本語テキスト・カタカナ ゛x a\u0301b \u200b\u200bz 1,2 ++x ..\r\n",
         "a  <mask> b <mask>  c<mask>\u3000<mask>\n", "<|im_end|>  \n x<|im_end|>y [X] [X]  z\t[X]\t", "abc bc ab", "cat cats cat. xcat _cat \u24d0cat \u00bdcat 2cat cat\u0301 \u200dcat <w>x <w> ,<w>, a <w>",
         "<s>a<s> b</s>  c", " <s>", "<s> x",
         "|||IP_ADDRESS|||\u0301 ab\u0301q abq\u0307 \u0301abq x|||IP_ADDRESS|||y a\u0308bq abq   \u00e9  "]


@pytest.mark.parametrize("which", ["bundled", "trained", "llama3", "deepseek", "sentencepiece"] + NEW)
def test_corpus_ids_are_the_tokenizers_library(which, request):
    model = request.getfixturevalue(which)
    texts = CORPUS + (EXTRA if which != "bundled" else [])
    for text in texts:
        assert model.tokenize(text) == model.tokenizer.encode(text).ids, repr(text)


@pytest.mark.parametrize("which,seed", [("bundled", 1), ("trained", 2), ("llama3", 5), ("deepseek", 6),
                                        ("sentencepiece", 7)] + [(w, 10 + k) for k, w in enumerate(NEW)])
def test_random_strings_are_the_tokenizers_library(which, seed, request):
    model = request.getfixturevalue(which)
    for text in random_strings(seed):
        assert model.tokenize(text) == model.tokenizer.encode(text).ids, repr(text)


@pytest.mark.parametrize("which", ["qwen2", "gpt2_nfc", "trained"])
def test_nfc_corpus_is_the_tokenizers_library(which, request):
    """What NFC changes, a combining run longer than the core's window, and 100 KB of mixed text."""
    model = request.getfixturevalue(which)
    for text in NFC_CORPUS + random_strings(20, 300, nfc=True):
        assert model.tokenize(text) == model.tokenizer.encode(text).ids, (len(text), repr(text[:100]))


TABLES = Path(__file__).resolve().parent.parent / "c_core" / "src" / "text" / "unicode_tables.h"
CLASSES = {"other": 0, "letter": 1, "number": 2, "space": 3, "mark": 4, "punct": 5, "symbol": 6}
EVERY_CP = np.array([c for c in range(0x110000) if not 0xd800 <= c < 0xe000])


@functools.lru_cache(maxsize=None)
def library_classes():
    """Each of EVERY_CP's class (CLASSES) as the `tokenizers` library's Oniguruma sees it: one split
    by all the classes' runs, then each run's first character tested against each class alone."""
    from tokenizers import Regex, pre_tokenizers

    patterns = {"letter": r"\p{L}", "number": r"\p{N}", "space": r"\s", "mark": r"\p{M}", "punct": r"\p{P}",
                "symbol": r"\p{S}"}
    every = "".join(map(chr, EVERY_CP))
    runs = [a for _, (a, _) in pre_tokenizers.Split(Regex("|".join(p + "+" for p in patterns.values())),
                                                      "isolated").pre_tokenize_str(every)]
    firsts = "".join(every[a] for a in runs)
    run_class = np.zeros(len(runs), np.int8)
    for name, p in patterns.items():
        kept = set()
        for _, (a, b) in pre_tokenizers.Split(Regex(p), "removed").pre_tokenize_str(firsts):
            kept.update(range(a, b))
        run_class[[k for k in range(len(runs)) if k not in kept]] = CLASSES[name]
    return np.repeat(run_class, np.diff(runs + [len(every)]))


def library_word_characters():
    """Whether each of EVERY_CP is a word character (\\w) to the library's single_word added tokens:
    one is put after each code point, and is a token of its own only after a non-word character."""
    from tokenizers import AddedToken, Tokenizer, models

    tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tok.add_tokens([AddedToken("\x00", single_word=True)])
    enc = tok.encode("".join(chr(c) + "\x00 " for c in EVERY_CP), add_special_tokens=False)
    word = np.ones(len(EVERY_CP), bool)
    word[[a // 3 for i, (a, _) in zip(enc.ids, enc.offsets) if i == 1]] = False
    word[0] = False   # U+0000 is the token itself
    return word


def header_table(name):
    """The numbers of the initializer `name` in unicode_tables.h."""
    text = TABLES.read_text()
    body = text[text.index(name):]
    body = body[body.index("{") + 1:body.index("};")]
    return [int(x.rstrip("u"), 16) for x in re.findall(r"0x[0-9a-f]+u?", body)]


def test_unicode_tables_are_the_tokenizers_library():
    """unicode_tables.h's class of every code point (gen_unicode.py's Unicode version) is the class the
    library's regular expressions see, and its \\w is the library's: a newer library (a newer
    Unicode) fails here, naming the code points, until the tables are regenerated."""
    runs = np.array(header_table("colibri_unicode_runs"), np.int64)
    core = (runs & 7)[np.searchsorted(runs >> 3, EVERY_CP, side="right") - 1]
    lib = library_classes()
    names = {v: k for k, v in CLASSES.items()}
    wrong = np.flatnonzero(core != lib)
    assert not len(wrong), f"{len(wrong)} code points differ, first " + ", ".join(
        f"U+{EVERY_CP[k]:04X} core {names[core[k]]} library {names[lib[k]]}" for k in wrong[:8])

    flips = np.array(header_table("colibri_word_flips"), np.int64).reshape(-1, 2)
    k = np.searchsorted(flips[:, 0], EVERY_CP, side="right") - 1
    flipped = (k >= 0) & (EVERY_CP <= flips[np.maximum(k, 0), 1])
    core_word = np.isin(core, [CLASSES["letter"], CLASSES["mark"], CLASSES["number"]]) != flipped
    wrong = np.flatnonzero(core_word != library_word_characters())
    assert not len(wrong), f"{len(wrong)} code points differ in \\w, first " + ", ".join(
        f"U+{EVERY_CP[k]:04X} core {core_word[k]}" for k in wrong[:8])


@pytest.mark.parametrize("which", ["bundled", "trained", "llama3", "deepseek", "qwen2", "gpt2_nfc", "prefix_space",
                                   "added_options"])
def test_every_unicode_class_encodes_as_the_tokenizers_library(which, request):
    """Each code point of a class other than "other" (those the library's classes name: letters of
    Unicode 15 and 16 such as U+1CCF8 among them) in a probe that tells its class, its \\w, its NFC and
    combining class apart: ids the library's, a thousand probes at a time."""
    model = request.getfixturevalue(which)
    probes = [f"{c}'s \u0301{c}\u0334{c}cat {c}1 " for c in map(chr, EVERY_CP[library_classes() != 0])]
    for k in range(0, len(probes), 1000):
        text = "".join(probes[k:k + 1000])
        if model.tokenize(text) != model.tokenizer.encode(text).ids:
            bad = next(p for p in probes[k:k + 1000] if model.tokenize(p) != model.tokenizer.encode(p).ids)
            assert model.tokenize(bad) == model.tokenizer.encode(bad).ids, repr(bad)


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


NFC_CORPUS.append(_mixed(100_000))   # random_strings is defined by now


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


def test_text_depends_on_util_and_the_public_headers_only():
    """c_core/src/text/ encodes with tables it is given: it includes its own headers, util.h and the
    public headers, never the model's (model/encoder.c reads the encoder from the model JSON), and
    only unicode.c includes the generated tables."""
    text = TABLES.parent
    allowed = {p.name for p in text.glob("*.h")} | {"../util.h"}
    for source in sorted([*text.glob("*.c"), *text.glob("*.h")]):
        included = re.findall(r'^#include "([^"]+)"', source.read_text(), re.M)
        assert [i for i in included if i not in allowed and not i.startswith("colibri/")] == [], source.name
        assert ("unicode_tables.h" in included) == (source.name == "unicode.c"), source.name

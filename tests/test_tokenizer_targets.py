"""The core's encoder on the other targets: c_core/tests/test_tokenize, cross-built for aarch64 and
riscv64 (under QEMU user mode) and for each board (under QEMU system emulation, the model read
through semihosting), encodes each tokenizer family's cases to the ids the `tokenizers` library gives and
the host's Model.tokenize gives.  The families are test_tokenizer.py's models (fixtures): a new one
is a new name in FAMILIES."""
import subprocess

import pytest

import test_tokenizer
from colibri.targets import TARGETS, build, cross_files, env_for

FAMILIES = ["bundled", "trained", "llama3", "deepseek", "sentencepiece", "qwen2", "gpt2_nfc", "prefix_space",
            "metaspace_first", "metaspace_always", "added_options"]
globals().update({name: getattr(test_tokenizer, name) for name in FAMILIES})   # the fixtures, by name

BOARDS = list(cross_files("colibri_board"))
EMULATED = [t for t in TARGETS if t != "native"] + BOARDS


def runner(target):
    """The command a target's test programs run under: its cross file's exe_wrapper."""
    files = cross_files("colibri_board") if target in BOARDS else cross_files("colibri_target")
    return files[target]["binaries"]["exe_wrapper"]


INVALID = b"a\xff\xfe b\xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf z"   # as test_tokenize.c's


def round_trips(model):
    """Whether the tokens' bytes (the BOS aside) are the input, invalid UTF-8 too, on the host:
    byte-level BPE, not SentencePiece-style BPE (its "▁" before the text is a token byte)."""
    return b"".join(model.token_bytes(i) for i in model.tokenize(INVALID)[1:]) == INVALID


NFC_FAMILIES = ("qwen2", "gpt2_nfc", "trained")   # test_tokenizer's NFC corpus runs on these


def write_cases(model, family, path):
    """test_tokenize's cases file: each text's bytes in hex, then its ids from the tokenizers library,
    which the host's encoder gives too.  The NFC corpus's texts of a few KB (not the 100 KB one, past
    test_tokenize's line) run through the normalizer's windows."""
    lines = []
    nfc = [t for t in test_tokenizer.NFC_CORPUS if len(t.encode()) < 4096] if family in NFC_FAMILIES else []
    for text in test_tokenizer.CORPUS + test_tokenizer.random_strings(7, 40, nfc=True) + nfc:
        ids = model.tokenizer.encode(text).ids
        assert model.tokenize(text) == ids, text
        lines += [text.encode("utf-8").hex(), ",".join(map(str, ids))]
    path.write_text("\n".join(lines) + "\n")
    return len(lines) // 2


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("target", EMULATED)
def test_the_encoder_is_the_tokenizers_library_on_every_target(target, family, request, tmp_path):
    model = request.getfixturevalue(family)
    n = write_cases(model, family, tmp_path / "cases.txt")
    program = build(target) / "c_core" / "tests" / "test_tokenize"
    only = [] if round_trips(model) else ["--cases-only"]
    r = subprocess.run([*runner(target), str(program), str(model.path), str(tmp_path / "cases.txt"), *only],
                       capture_output=True, text=True, env=env_for(target), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    printed = r.stdout + r.stderr   # a board's semihosting console is QEMU's stderr
    assert f"{n} cases tokenized as the tokenizers library does" in printed, printed

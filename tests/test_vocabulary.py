"""The vocabulary the core carries (tokenizer.token_bytes / token_offsets) against the
`tokenizers` library: the C byte table must spell exactly what the tokenizer encodes, and the C
CLI's text output must be those bytes."""
import subprocess

import pytest

import colibri
from bad_models import FIXTURE
from colibri.targets import infer_binary

TEXTS = ["The capital of France is", "A hummingbird hovers — très vite! 中文 ok\n\n  tabs\tand spaces",
         "int main(void) { return 0; } /* y = W @ x */", "ROMEO:\nBut soft, what light through yonder window breaks?"]


@pytest.fixture(scope="module")
def model():
    return colibri.Model(FIXTURE)


@pytest.mark.parametrize("text", TEXTS)
def test_byte_table_spells_what_the_tokenizer_encodes(model, text):
    ids = model.tokenizer.encode(text).ids
    assert b"".join(model.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_special_tokens_stand_for_no_bytes(model):
    for special in ("<unk>", "<s>", "</s>"):
        assert model.token_bytes(model.tokenizer.token_to_id(special)) == b""
    with pytest.raises(IndexError):
        model.token_bytes(model.vocab_size)


def test_c_cli_prints_the_tokens_bytes(model):
    prompt = model.tokenizer.encode("ROMEO:").ids
    args = [str(infer_binary("native")), "--model", str(FIXTURE), "--tokens", ",".join(map(str, prompt)),
            "--max_tokens", "24", "--temperature", "0.9", "--seed", "3"]
    ids = [int(t) for t in subprocess.run(args + ["--ids"], capture_output=True, text=True, check=True).stdout.split(",")]
    text = subprocess.run(args, capture_output=True, check=True).stdout
    assert text == b"".join(model.token_bytes(i) for i in prompt + ids) + b"\n"


def test_models_without_a_tokenizer_have_no_table(converted):
    m = colibri.Model(converted[("tiny-mixtral-b", "f32")])
    assert m.token_bytes(0) is None

"""Writes the seed corpora of c_core/fuzz/corpus/ from the repository's models.

    python c_core/fuzz/make_corpus.py

fuzz_model's inputs are a 4-byte little-endian length, colibri_model.json, weights.bin: the
fixture model, and smaller ones cut from it (one layer, narrow, f32 and f16) so that most
executions are cheap.  Deterministic: rerunning it gives the same files."""
import json
import struct
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-mixtral.colibri"
DEMO = ROOT / "colibri" / "demo" / "shakespeare"


def model_input(header, weights):
    text = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<I", len(text)) + text + weights


def small_model(dtype, hidden=16, ffn=16, experts=2, top_k=1):
    """The fixture's vocabulary and tokenizer tables around a one-layer model of random weights."""
    header = json.loads((FIXTURE / "colibri_model.json").read_text())
    fixture_weights = (FIXTURE / "weights.bin").read_bytes()
    vocab = header["hparams"]["vocab_size"]
    header["hparams"].update(hidden_size=hidden, intermediate_size=ffn, num_layers=1, num_heads=2,
                             num_kv_heads=1, head_dim=hidden // 2, tie_word_embeddings=True)
    header["routing"]["top_k"] = top_k
    header["experts"]["count"] = experts
    rng = np.random.default_rng(0)
    kv = hidden // 2
    shapes = [("tok_embeddings", [vocab, hidden]), ("layers.0.attn_norm", [hidden]),
              ("layers.0.attn.wq", [hidden, hidden]), ("layers.0.attn.wk", [kv, hidden]),
              ("layers.0.attn.wv", [kv, hidden]), ("layers.0.attn.wo", [hidden, hidden]),
              ("layers.0.ffn_norm", [hidden]), ("layers.0.router", [experts, hidden]),
              ("layers.0.experts.w1", [experts, ffn, hidden]), ("layers.0.experts.w3", [experts, ffn, hidden]),
              ("layers.0.experts.w2", [experts, hidden, ffn]), ("norm", [hidden])]
    tensors, out = [], bytearray()

    def add(name, dt, shape, data):
        out.extend(b"\0" * (-len(out) % 64))
        tensors.append({"name": name, "dtype": dt, "shape": shape, "file_offset": len(out),
                        "file_size": len(data), "checksum": "crc32:%08x" % zlib.crc32(data)})
        out.extend(data)

    for name, shape in shapes:
        values = (rng.standard_normal(shape) * 0.2).astype(np.float32)
        if name.endswith("norm"):
            values = np.ones(shape, np.float32)
        add(name, dtype, shape, values.astype(np.float16 if dtype == "f16" else np.float32).tobytes())
    for t in header["tensors"]:
        if t["name"].startswith("tokenizer."):
            add(t["name"], t["dtype"], t["shape"], fixture_weights[t["file_offset"]:t["file_offset"] + t["file_size"]])
    header["tensors"] = tensors
    return model_input(header, bytes(out))


def write(name, seeds):
    folder = HERE / "corpus" / name
    folder.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        f.unlink()
    for key, data in seeds.items():
        (folder / key).write_bytes(data)


def main():
    fixture_json = (FIXTURE / "colibri_model.json").read_bytes()
    demo_json = (DEMO / "colibri_model.json").read_bytes()
    write("model", {
        "fixture": struct.pack("<I", len(fixture_json)) + fixture_json + (FIXTURE / "weights.bin").read_bytes(),
        "small-f32": small_model("f32"),
        "small-f16": small_model("f16"),
        "small-top2": small_model("f32", hidden=8, ffn=8, experts=3, top_k=2),
    })
    write("json", {
        "fixture-model": fixture_json,
        "demo-model": demo_json,
        "placement": b'{"format": "colibri-placement", "version": 1, "default": "cpu",\n'
                     b' "experts": [{"device": "cpu", "layer": 1, "experts": [0, 3]},\n'
                     b'             {"device": "cpu", "layer": "all", "experts": "all"}]}\n',
        "placement-short": b'{"format":"colibri-placement","version":1,"default":"cpu"}',
        "scalars": b'[0, -0, 1e308, -1.5e-300, 9223372036854775807, -9223372036854775808, 18446744073709551616,'
                   b' "\\u00e9\\ud83d\\ude00\\n\\"", true, false, null, {}, []]',
        "nested": b'{"a": {"b": [[{"c": [1, {"d": "e"}]}]]}, "": ""}',
    })
    texts = {
        "ascii": b"To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n",
        "unicode": "Caf\u00e9 na\u00efve \u2014 \u65e5\u672c\u8a9e \U0001F600  \t\r\n x".encode(),
        "invalid": b"a\xff\xfe b\xc3 \xe2\x82 \xed\xa0\x80 \xf4\x90\x80\x80 \xc0\xaf z",
        "numbers": b"1234567890 3.14159 0x1F 'll 've 're   spaces\n\n\n",
        "special": b"<s></s><unk> <s> text</s>",
        "nfc": "e\u0301 A\u030a \u212b \u1100\u1161\u11a8 \u0344 q\u0307\u0323 \U0001CCF8's \u0301\u0301x".encode(),
    }
    # fuzz_tokenize's first byte: the encoder variant (GPT-2, Llama 3, DeepSeek, Qwen2; NFC, a prefix
    # space, ignore_merges)
    variants = {"gpt2": 0, "llama3": 1, "llama3-ignore-merges": 0x11, "deepseek": 2, "qwen2-nfc": 3 | 4,
                "gpt2-nfc": 4, "gpt2-prefix-space": 8}
    write("tokenize", {f"{name}-{variant}": bytes([v]) + text for name, text in texts.items()
                       for variant, v in variants.items()})

if __name__ == "__main__":
    main()

"""The bytes each token stands for, read from a Hugging Face tokenizer.json, so the C core can
turn ids back into text with no tokenizer library (colibri_token_bytes).

Two vocabularies are understood: byte-level BPE (GPT-2's byte-to-unicode alphabet) and
SentencePiece-style pieces ("▁" for a space, "<0x0A>" byte fallback). Special tokens (<s>, </s>,
...) stand for no bytes. Any other kind gives None: the model then carries no byte table.
"""
import json

import numpy as np


def _byte_level_alphabet():
    """GPT-2's map from the 256 bytes to printable characters, inverted: character -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _uses(component, kind):
    """Whether a tokenizer.json component (or a Sequence of them) is of `kind`."""
    if not component:
        return False
    if component.get("type") == "Sequence":
        parts = component.get("decoders") or component.get("pretokenizers") or component.get("normalizers") or []
        return any(_uses(c, kind) for c in parts)
    return component.get("type") == kind


def token_bytes(tokenizer_json_path, vocab_size):
    """[bytes] * vocab_size, or None when the vocabulary is of a kind not understood here."""
    doc = json.loads(open(tokenizer_json_path, encoding="utf-8").read())
    model = doc.get("model", {})
    vocab = model.get("vocab")
    if model.get("type") not in ("BPE", "WordPiece", "Unigram") or vocab is None:
        return None
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    special = {t["content"] for t in doc.get("added_tokens", []) if t.get("special")}
    byte_level = _uses(doc.get("decoder"), "ByteLevel") or _uses(doc.get("pre_tokenizer"), "ByteLevel")
    alphabet = _byte_level_alphabet()
    out = [b""] * vocab_size
    for piece, i in list(vocab.items()) + [(t["content"], t["id"]) for t in doc.get("added_tokens", [])]:
        if not 0 <= i < vocab_size or piece in special:
            continue
        if byte_level:
            if any(c not in alphabet for c in piece):
                return None
            out[i] = bytes(alphabet[c] for c in piece)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            out[i] = bytes([int(piece[3:5], 16)])
        else:
            out[i] = piece.replace("\u2581", " ").encode("utf-8")
    return out


def byte_table(pieces):
    """(token_bytes u8 [n], token_offsets i32 [vocab + 1]) for the colibri tensors."""
    offsets = np.zeros(len(pieces) + 1, dtype="<i4")
    offsets[1:] = np.cumsum([len(p) for p in pieces])
    return np.frombuffer(b"".join(pieces), dtype=np.uint8).copy(), offsets

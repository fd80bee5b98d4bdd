"""The bytes each token stands for, read from a Hugging Face tokenizer.json, so the C core can
turn ids back into text with no tokenizer library (colibri_token_bytes).

Two vocabularies are understood: byte-level BPE (GPT-2's byte-to-unicode alphabet) and
SentencePiece-style pieces ("▁" for a space, "<0x0A>" byte fallback). Special tokens (<s>, </s>,
...) stand for no bytes. Any other kind gives None: the model then carries no byte table.

The encoder (colibri_tokenize) of such a vocabulary: `encoder` reads it from tokenizer.json;
`encoder_tables` builds its tensors, for tokenizer.json and a GGUF vocabulary (gguf_vocab.py) alike.
"""
import json
import re

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
    added_ids = {t["id"] for t in doc.get("added_tokens", [])}
    for piece, i in list(vocab.items()) + [(t["content"], t["id"]) for t in doc.get("added_tokens", [])]:
        if not 0 <= i < vocab_size or piece in special:
            continue
        if byte_level:   # an added token's characters outside the alphabet decode as themselves (ByteLevel's decoder)
            if any(c not in alphabet for c in piece) and i not in added_ids:
                return None
            out[i] = b"".join(bytes([alphabet[c]]) if c in alphabet else c.encode("utf-8") for c in piece)
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


def _template_bos(processor, added):
    """The id a post-processor puts before every encoding: -1 for none, None for a template the core
    does not reproduce (anything but an optional leading special token, then the text)."""
    if processor is not None and processor.get("type") == "Sequence":   # ByteLevel steps change only offsets
        steps = [p for p in processor.get("processors", []) if p.get("type") != "ByteLevel"]
        processor = steps[0] if len(steps) == 1 else None if not steps else {"type": "unknown"}
    if processor is None or processor.get("type") == "ByteLevel":
        return -1
    if processor.get("type") != "TemplateProcessing":
        return None
    single = processor.get("single", [])
    if single == [{"Sequence": {"id": "A", "type_id": 0}}]:
        return -1
    if len(single) != 2 or "SpecialToken" not in single[0] or "Sequence" not in single[1] or \
            single[1]["Sequence"]["id"] != "A":
        return None
    ids = processor.get("special_tokens", {}).get(single[0]["SpecialToken"]["id"], {}).get("ids", [])
    return ids[0] if len(ids) == 1 else None


# The pre-tokenizers' regular expressions the core scans by hand (c_core/src/text/pretokenize.c).
LLAMA3_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|" \
    r"\s*[\r\n]+|\s+(?!\S)|\s+"

# Qwen2's (Qwen2, Qwen3): Llama 3's with each digit a word of its own.
QWEN2_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|" \
    r"\s*[\r\n]+|\s+(?!\S)|\s+"

# DeepSeek V3's three isolating splits (CR and LF stand in its tokenizer.json as the characters).
DEEPSEEK_REGEXES = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
                    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?"
                    "[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"]


# SentencePiece-style BPE as Llama 2 and Mixtral's tokenizer.json spell it: a normalizer puts "▁" for
# every space and one before the text; no pre-tokenizer; byte fallback.
SPM_NORMALIZER = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                     {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}


def _isolating_split(part, regex):
    return part.get("type") == "Split" and part.get("pattern") == {"Regex": regex} and \
        part.get("behavior") == "Isolated" and not part.get("invert")


def _pre_tokenizer(pre):
    """("gpt2" | "llama3" | "qwen2" | "deepseek", prefix space) for a pre-tokenizer the core reproduces, else
    (None, False).  A prefix space only with ByteLevel alone: in a Sequence it would go before every word."""
    if pre.get("type") == "ByteLevel":
        return ("gpt2", bool(pre.get("add_prefix_space", False))) if pre.get("use_regex", True) else (None, False)
    return _split_pre_tokenizer(pre), False


def _split_pre_tokenizer(pre):
    parts = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if not parts or parts[-1].get("type") != "ByteLevel" or parts[-1].get("use_regex", True) or \
            parts[-1].get("add_prefix_space", False):
        return None
    splits = parts[:-1]
    if len(splits) == 1 and _isolating_split(splits[0], LLAMA3_REGEX):
        return "llama3"
    if len(splits) == 1 and _isolating_split(splits[0], QWEN2_REGEX):
        return "qwen2"
    if len(splits) == 3 and all(_isolating_split(p, r) for p, r in zip(splits, DEEPSEEK_REGEXES)):
        return "deepseek"
    return None


_NFC_SETS = None


def _nfc_stable(text):
    """Whether the library's matching of the normalized added token `text` in NFC text is the core's
    in the raw text: NFC leaves it as it is, and an occurrence is neither made by NFC (none of its
    characters comes from another: no decomposition, no singleton's or excluded composite's part)
    nor unmade (class 0 throughout, its first character composes with nothing before it, its last
    with nothing after it).  Python's tables, newer than the library's: the stricter."""
    global _NFC_SETS
    import unicodedata

    if _NFC_SETS is None:
        made, firsts, seconds = set(), set(), set()
        for cp in range(0x110000):
            c = chr(cp)
            made.update(x for x in unicodedata.normalize("NFC", c) if x != c)
            d = unicodedata.decomposition(c)
            if d and not d.startswith("<") and len(d.split()) == 2 and unicodedata.normalize("NFC", c) == c:
                first, second = (chr(int(x, 16)) for x in d.split())
                firsts.add(first)
                seconds.add(second)
        hangul = {chr(cp) for cp in range(0x1100, 0x1200)} | {chr(cp) for cp in range(0xac00, 0xd7a4)}
        _NFC_SETS = made | hangul, firsts | hangul, seconds | hangul
    made, firsts, seconds = _NFC_SETS
    return bool(text) and unicodedata.normalize("NFC", text) == text and text[0] not in seconds and \
        text[-1] not in firsts and all(not unicodedata.combining(c) and unicodedata.normalize("NFD", c) == c and
                                       c not in made for c in text)


class NoEncoder(Exception):
    """Why a vocabulary gets no encoder: a kind the core does not encode exactly."""


def _metaspace(pre):
    """(prepend_scheme, split) of a Metaspace pre-tokenizer with "▁", else None."""
    if pre.get("type") != "Metaspace" or pre.get("replacement") != "\u2581":
        return None
    scheme = "never" if pre.get("add_prefix_space") is False else pre.get("prepend_scheme", "always")
    return (scheme, bool(pre.get("split", True))) if scheme in ("always", "first", "never") else None


def _added_flags(added, normalizer):
    """Each added token's flags (lstrip 1, rstrip 2, normalized 4: matched in the second pass,
    single_word 8), or None when the core would not match them as the library does: a token
    normalized by the SentencePiece normalizer, or by NFC unless NFC leaves it be, and an rstrip
    token in a pass whose tokens may start with whitespace (the library then overlaps them)."""
    flags = []
    for t in added:
        normalized = t.get("normalized", not t.get("special"))
        if not t["content"] or \
                (normalized and (normalizer == "spm" or (normalizer == "nfc" and not _nfc_stable(t["content"])))):
            return None
        flags.append(bool(t.get("lstrip")) | bool(t.get("rstrip")) << 1 | bool(normalized) << 2 |
                     bool(t.get("single_word")) << 3)
    for p in (0, 4):
        in_pass = [t for t, f in zip(added, flags) if f & 4 == p]
        if any(flags[added.index(t)] & 2 for t in in_pass) and any(t["content"][0].isspace() for t in in_pass):
            return None
    return flags


def encoder(tokenizer_json_path, vocab_size):
    """(the "encoder" entry of colibri_model.json, [(tensor name, array)]) for colibri_tokenize, or
    None when the tokenizer is of a kind the core does not encode exactly.  Byte-level BPE: GPT-2's
    pre-tokenizer (ByteLevel with its regex, a prefix space or not), or Llama 3's, Qwen2's or DeepSeek
    V3's Splits then ByteLevel; no normalizer or NFC.  SentencePiece-style BPE with byte fallback: the
    Prepend and Replace normalizer, or no normalizer and a Metaspace pre-tokenizer.  Added tokens as
    _added_flags takes them, and a template of at most a leading special token."""
    doc = json.loads(open(tokenizer_json_path, encoding="utf-8").read())
    model, pre = doc.get("model", {}), doc.get("pre_tokenizer") or {}
    normalizer = doc.get("normalizer")
    byte_fallback = bool(model.get("byte_fallback")) and not model.get("ignore_merges")
    metaspace = _metaspace(pre) if normalizer is None and byte_fallback else None
    spm = (normalizer == SPM_NORMALIZER and not pre and byte_fallback) or metaspace is not None
    kind, prefix_space = ("metaspace", False) if spm else _pre_tokenizer(pre)
    norm = None
    if normalizer in ({"type": "NFC"}, {"type": "Sequence", "normalizers": [{"type": "NFC"}]}) and not spm:
        norm, normalizer = "nfc", None
    if normalizer == {"type": "Sequence", "normalizers": []} or spm:   # DeepSeek's does nothing; SentencePiece's: the core
        norm = "spm" if normalizer == SPM_NORMALIZER else norm
        normalizer = None
    if model.get("type") != "BPE" or normalizer is not None or kind is None or model.get("dropout") or \
            model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or \
            (model.get("byte_fallback") and not spm):
        return None
    added = doc.get("added_tokens", [])
    flags = _added_flags(added, norm)
    if flags is None:
        return None
    bos = _template_bos(doc.get("post_processor"), added)
    if bos is None:
        return None
    entry = {}
    if norm == "nfc":
        entry["normalizer"] = "nfc"
    if prefix_space:
        entry["prefix_space"] = True
    if metaspace:
        entry["prepend_scheme"], entry["split"] = metaspace
    merges = [m.split(" ", 1) if isinstance(m, str) else m for m in model.get("merges", [])]
    try:
        return encoder_tables(model["vocab"], merges,
                              [(t["content"], t["id"], bool(t.get("special")), f) for t, f in zip(added, flags)],
                              bos, vocab_size, kind, ignore_merges=bool(model.get("ignore_merges")), **entry)
    except NoEncoder:
        return None


def encoder_tables(vocab, merges, added, bos, vocab_size, pre_tokenizer, ignore_merges=False, **entry):
    """The encoder entry and tensors from a BPE vocabulary, for tokenizer.json and GGUF alike.

    vocab: piece -> id, pieces spelled as the tokenizer spells them (GPT-2's byte alphabet, or
    SentencePiece's "▁" and "<0xXX>" when `pre_tokenizer` is "metaspace"); merges: [(left, right)]
    pieces, best first; added: [(text, id, special, flags)] matched in the text before BPE (flags as
    _added_flags gives them); bos: the id put first (-1: none); entry: further keys of the entry
    (normalizer, prefix_space, prepend_scheme, split). Raises NoEncoder."""
    spm = pre_tokenizer == "metaspace"
    if not -1 <= bos < vocab_size:
        raise NoEncoder(f"bos {bos} outside the vocabulary")
    alphabet = _byte_level_alphabet()
    byte_ids = np.full(256, -1, dtype="<i4")
    byte_pieces = {f"<0x{b:02X}>": b for b in range(256)}
    if spm:   # every byte's token for the fallback; words start at each "▁" after another character
        if any(vocab.get(p, vocab_size) >= vocab_size for p in byte_pieces):
            raise NoEncoder("not all 256 byte tokens <0x00>..<0xFF> for the byte fallback")
        spanning = next((p for p in vocab if re.search("[^\u2581]\u2581", p)), None)
        if spanning is not None and not entry.get("split"):   # Metaspace's split cuts there before BPE
            raise NoEncoder(f"token {spanning!r} spans a word start (a \u2581 after another character)")
        for p, b in byte_pieces.items():
            byte_ids[b] = vocab[p]
    for c, b in alphabet.items():
        if not spm and vocab.get(c, vocab_size) < vocab_size:
            byte_ids[b] = vocab[c]
    rows, seen = [], set()
    special = {i for _, i, s, _ in added if s}
    for a, b in merges:
        row = (vocab.get(a), vocab.get(b), vocab.get(a + b))
        if special.intersection(row):   # never reached: the text of a special token is split out before BPE
            continue
        if None in row or max(row) >= vocab_size:
            raise NoEncoder(f"merge {a!r} {b!r} names a token outside the vocabulary")
        if row[:2] in seen:
            raise NoEncoder(f"merge {a!r} {b!r} given twice")
        seen.add(row[:2])
        rows.append(row)
    rows = np.array(rows, dtype="<i4").reshape(-1, 3)
    order = np.lexsort((rows[:, 1], rows[:, 0])).astype("<i4")
    tensors = [("tokenizer.merges", rows), ("tokenizer.merge_order", order), ("tokenizer.byte_ids", byte_ids)]
    if added:
        texts = sorted(((text.encode("utf-8"), i, f) for text, i, _, f in added if i < vocab_size),
                       key=lambda t: -len(t[0]))
        table, at = [], 0
        for text, i, f in texts:   # the flags above the length's 24 bits
            if len(text) >= 1 << 24:
                raise NoEncoder(f"added token {i} is {len(text)} bytes long")
            table.append((i, at, len(text) | f << 24))
            at += len(text)
        tensors += [("tokenizer.added", np.array(table, dtype="<i4").reshape(-1, 3)),
                    ("tokenizer.added_bytes", np.frombuffer(b"".join(t[0] for t in texts), dtype=np.uint8).copy())]
    out = {"kind": "sentencepiece_bpe" if spm else "byte_level_bpe", "pre_tokenizer": pre_tokenizer, "bos": int(bos),
           **entry}
    added_ids = {i for _, i, _, _ in added}   # split out before BPE, and without bytes when special
    if spm:   # each character's token: the vocabulary by bytes ("▁" as " ", as in token_bytes), to find it
        pieces = {p.replace("\u2581", " ").encode("utf-8"): i for p, i in vocab.items()
                  if i < vocab_size and i not in added_ids and p not in byte_pieces}
        tensors.append(("tokenizer.vocab_order", np.array([pieces[b] for b in sorted(pieces)], dtype="<i4")))
    elif ignore_merges:   # a word that is a token is that token: the vocabulary by bytes, to find it
        pieces = {bytes(alphabet[c] for c in piece): i for piece, i in vocab.items()
                  if i < vocab_size and i not in added_ids and all(c in alphabet for c in piece)}
        out["ignore_merges"] = True
        tensors.append(("tokenizer.vocab_order", np.array([pieces[b] for b in sorted(pieces)], dtype="<i4")))
    return out, tensors

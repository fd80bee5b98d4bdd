"""A GGUF file's vocabulary (llama.cpp's `tokenizer.ggml.*` metadata) as colibri's tokenizer
tensors: the byte table (colibri_token_bytes) and, where the core encodes it exactly, the encoder
(colibri_tokenize), built by vocab.encoder_tables as from a tokenizer.json.

- `tokenizer.ggml.model` "gpt2": byte-level BPE with the file's merges; `tokenizer.ggml.pre` names
  the pre-tokenizer (PRE_TOKENIZERS).  Tokens not spelled in GPT-2's byte alphabet are respelled
  as their UTF-8 bytes in it, as transformers does.
- "llama": SentencePiece BPE.  The file has scores, not merges: every split of a token into two
  tokens is a merge, ranked by the merged token's score (transformers' generate_merges).
- Control (and unknown) tokens are special added tokens, user-defined ones plain added tokens:
  both are matched in the text before BPE, as transformers' conversion and llama.cpp do.
- BOS: `tokenizer.ggml.add_bos_token`, or llama.cpp's default for the vocabulary.
"""

import re
import sys
from collections import Counter

from .errors import ConvertError
from .vocab import NoEncoder, _byte_level_alphabet, byte_table, encoder_tables

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6   # tokenizer.ggml.token_type

# tokenizer.ggml.pre -> (the core's pre-tokenizer, llama.cpp's default for add_bos, ignore_merges,
# further keys of the encoder entry), as llama.cpp reads these names (transformers splits deepseek-v3
# text with GPT-2's regex, applies no NFC and keeps merging words that are tokens).
GPT2 = ("gpt2", False, False, {})
LLAMA3 = ("llama3", True, True, {})
QWEN2 = ("qwen2", False, False, {"normalizer": "nfc"})
PRE_TOKENIZERS = {
    "gpt-2": GPT2, "phi-2": GPT2,
    **dict.fromkeys(("llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"), LLAMA3),
    "deepseek-v3": ("deepseek", False, False, {}),
    "qwen2": QWEN2, "deepseek-r1-qwen": QWEN2,
}
BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _array(meta, key, kind, count=None):
    """The values of the GGUF array `key` (None when absent), each of Python type `kind`, and
    `count` of them when given."""
    values = meta.get(key)
    if values is None:
        return None
    if not isinstance(values, list) or not all(isinstance(v, kind) for v in values):
        raise ConvertError(f"gguf `{key}`: not an array of {kind.__name__}")
    if count is not None and len(values) != count:
        raise ConvertError(f"gguf `{key}`: {len(values)} entries for {count} tokens")
    return values


def _merges_from_scores(tokens, scores):
    """[(left, right)] best first: each split of a token into two tokens, ranked by the merged
    token's score, then the longer left part, then the longer right part, ties in token order
    (transformers.tokenization_utils_base.generate_merges).  A token is cut only where both parts
    have the length of some token, and the merges hold the tokens themselves, not new slices: work
    and memory grow with the vocabulary's size, not with the square of its longest token."""
    ids = {t: i for i, t in enumerate(tokens)}   # tokens are unique
    lengths = sorted({len(t) for t in tokens})
    has_length = set(lengths)
    merges = []
    for piece, score in zip(tokens, scores):
        local = []
        for k in lengths:
            if k >= len(piece):
                break
            if len(piece) - k in has_length:
                left, right = ids.get(piece[:k]), ids.get(piece[k:])
                if left is not None and right is not None:
                    local.append((left, right))
        merges += [(tokens[a], tokens[b], score) for a, b in sorted(local)]
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)   # stable: ties keep their order
    return [(a, b) for a, b, _ in merges]


def _file_merges(meta, ids):
    """The file's merges as [(left, right)], each part and their join a token."""
    merges = _array(meta, "tokenizer.ggml.merges", str)
    out = []
    for i, m in enumerate(merges):
        parts = m.split(" ")
        if len(parts) != 2 or not all(parts):
            raise ConvertError(f"gguf `tokenizer.ggml.merges`[{i}] {m!r}: not two tokens separated by a space")
        for p in (*parts, parts[0] + parts[1]):
            if p not in ids:
                raise ConvertError(f"gguf `tokenizer.ggml.merges`[{i}] {m!r}: {p!r} is not in `tokenizer.ggml.tokens`")
        out.append(tuple(parts))
    return out


def gguf_vocabulary(meta, vocab_size, bos_id):
    """(the encoder entry or None, [(tensor name, array)]) from the GGUF tokenizer metadata:
    the byte table for "gpt2" and "llama" vocabularies, the encoder where the core reproduces the
    tokenizer (else the reason is printed and the model runs on ids). Raises ConvertError on a
    malformed vocabulary, naming the key."""
    model = meta.get("tokenizer.ggml.model", None)
    if model is None:
        return None, []
    if model not in ("gpt2", "llama"):
        _say(f"gguf tokenizer.ggml.model {model!r}: the core has no vocabulary table or encoder for it")
        return None, []
    tokens = _array(meta, "tokenizer.ggml.tokens", str)
    if tokens is None:
        raise ConvertError("gguf `tokenizer.ggml.tokens` missing")
    if len(tokens) != vocab_size:
        raise ConvertError(f"gguf `tokenizer.ggml.tokens`: {len(tokens)} tokens for token_embd's {vocab_size} rows")
    counts = Counter(tokens)
    if len(counts) != len(tokens):   # llama.cpp refuses them too
        twice = next(t for t in tokens if counts[t] > 1)
        raise ConvertError(f"gguf `tokenizer.ggml.tokens`: {twice!r} appears twice")
    types = _array(meta, "tokenizer.ggml.token_type", int, len(tokens)) or [NORMAL] * len(tokens)
    if not all(0 <= t <= BYTE for t in types):
        raise ConvertError("gguf `tokenizer.ggml.token_type`: a type outside 0..6")
    spm = model == "llama"
    if spm:
        pieces = tokens
    else:   # every token in GPT-2's byte alphabet, as transformers respells them
        alphabet = _byte_level_alphabet()
        spelling = {b: c for c, b in alphabet.items()}
        pieces = [t if set(t) <= alphabet.keys() else "".join(spelling[b] for b in t.encode("utf-8")) for t in tokens]
    ids = {p: i for i, p in enumerate(pieces)}

    table = []
    for piece, kind in zip(pieces, types):
        byte = BYTE_PIECE.fullmatch(piece) if spm else None
        if kind in (CONTROL, UNKNOWN):
            table.append(b"")
        elif byte:
            table.append(bytes([int(byte.group(1), 16)]))
        elif spm:
            table.append(piece.replace("\u2581", " ").encode("utf-8"))
        else:
            table.append(bytes(alphabet[c] for c in piece))
    token_bytes, offsets = byte_table(table)
    tensors = [("tokenizer.token_bytes", token_bytes), ("tokenizer.token_offsets", offsets)]

    if spm and meta.get("tokenizer.ggml.merges") is None:
        scores = _array(meta, "tokenizer.ggml.scores", float, len(tokens))
        if scores is None:
            raise ConvertError("gguf `tokenizer.ggml.scores` missing: a llama (SentencePiece) vocabulary without "
                               "merges needs them")
        merges = _merges_from_scores(pieces, scores)
    elif meta.get("tokenizer.ggml.merges") is None:
        raise ConvertError("gguf `tokenizer.ggml.merges` missing: a gpt2 (byte-level BPE) vocabulary needs them")
    else:
        merges = _file_merges(meta, ids)
    try:
        entry, more = _encoder(meta, spm, tokens, types, ids, merges, bos_id)
    except NoEncoder as e:
        _say(str(e))
        return None, tensors
    return entry, tensors + more


def _encoder(meta, spm, tokens, types, ids, merges, bos_id):
    """(the encoder entry, its tensors), or NoEncoder saying why the core does not reproduce it."""
    if spm:
        pre, add_bos, ignore_merges, entry = "metaspace", True, False, {}
        if not meta.get("tokenizer.ggml.add_space_prefix", True):
            raise NoEncoder("gguf tokenizer.ggml.add_space_prefix false: the core's SentencePiece encoder puts a "
                            "\u2581 before the text")
    else:
        name = meta.get("tokenizer.ggml.pre", None)
        if not isinstance(name, str) or name not in PRE_TOKENIZERS:
            raise NoEncoder(f"gguf tokenizer.ggml.pre {name!r}: the core has no encoder for it")
        pre, add_bos, ignore_merges, entry = PRE_TOKENIZERS[name]
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
    if meta.get("tokenizer.ggml.add_eos_token", False):
        raise NoEncoder("gguf tokenizer.ggml.add_eos_token: the core's encoder puts no EOS after the text")
    if add_bos and bos_id < 0:
        raise NoEncoder("gguf tokenizer.ggml.add_bos_token without a tokenizer.ggml.bos_token_id in the vocabulary")
    alphabet = set(_byte_level_alphabet())
    # matched as their text; transformers leaves out byte-level ones not spelled in the alphabet
    added = [(t, i, kind != USER_DEFINED, 0) for i, (t, kind) in enumerate(zip(tokens, types))
             if kind in (CONTROL, UNKNOWN, USER_DEFINED) and t and (spm or set(t) <= alphabet)]
    return encoder_tables(ids, merges, added, bos_id if add_bos else -1, len(tokens), pre,
                          ignore_merges=ignore_merges, **entry)


def _say(reason):
    print(f"{reason}; the model runs on ids", file=sys.stderr)

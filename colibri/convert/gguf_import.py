"""A GGUF file (llama.cpp's format) -> a colibri model directory, its weights copied byte for byte.

    colibri convert model.gguf out/model

Tensors keep their bytes and their own type (a Q4_K_M file's Q4_K and Q6_K matrices and F32 norms
stay so), except that by default the matrices of the core's matmuls whose format the kernels here run
faster row-interleaved are stored so (q4_0x8, q4_kx8, ...: the same blocks, moved; `--no-repack`
keeps every byte where it was): llama.cpp's block formats are colibri's dtypes of the same names (STORED), block by
block along each row, so both engines read identical weights.  Architectures: `llama` with experts
(Mixtral; llama.cpp's converter reorders the rows of q and k for its RoPE on adjacent pairs, which
colibri then uses too), `qwen3moe` (rotate-half RoPE, per-head QK-norm), and the other MoE families
llama.cpp writes (gguf_arch.py: their metadata read back into the family's config).  The vocabulary
becomes the byte table and, where the core reproduces the tokenizer, its encoder (gguf_vocab.py);
otherwise the converter says why and the model runs on token ids (`colibri generate --tokens`).
"""

import math
import struct
import sys
from pathlib import Path

import numpy as np

from colibri import chat

from .errors import ConvertError
from . import gguf_arch
from .families._config import end_ids, token_id
from .gguf_vocab import gguf_vocabulary
from .limits import check as check_limits, integer_range
from .writer import INTEGER_DTYPES, Stored, _encoded, _entry, _header_text, write_model

STORED = {"F32": "f32", "F16": "f16", "BF16": "bf16", "Q8_0": "q8_0", "Q4_0": "q4_0",   # GGUF type -> colibri dtype
          "Q4_1": "q4_1", "Q5_0": "q5_0", "Q5_1": "q5_1", "Q2_K": "q2_k", "Q3_K": "q3_k", "Q4_K": "q4_k",
          "Q5_K": "q5_k", "Q6_K": "q6_k", "IQ4_NL": "iq4_nl", "IQ4_XS": "iq4_xs", "MXFP4": "mxfp4"}
LAYER_TENSORS = {   # GGUF name (after blk.N.) -> colibri name (after layers.N.)
    "attn_norm": "attn_norm", "attn_q": "attn.wq", "attn_k": "attn.wk", "attn_v": "attn.wv",
    "attn_output": "attn.wo", "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm", "ffn_norm": "ffn_norm",
    "ffn_gate_inp": "router", "ffn_gate_exps": "experts.w1", "ffn_up_exps": "experts.w3", "ffn_down_exps": "experts.w2",
}
GLOBAL_TENSORS = {"token_embd": "tok_embeddings", "output_norm": "norm", "output": "lm_head"}
# the most tensors a file colibri imports can hold: its layers (at most the schema's hparams.num_layers),
# each of fewer than 64 (gguf_arch.LAYER_TENSORS); the table is refused before its entries are read
# (about 0.1 ms each)
TENSORS_PER_LAYER = 64


def _describe(meta, arch, tensors):
    get = gguf_arch.Meta(meta, arch)   # each value checked for its type and range
    vocab, hidden = tensors["token_embd.weight"].data.shape[0], get("embedding_length")
    heads = get("attention.head_count")
    kv_heads = get("attention.head_count_kv", heads)
    head_dim = get("attention.key_length", hidden // heads)
    n_experts = get("expert_count", 0)
    if not n_experts:
        raise ConvertError(f"unsupported: a dense model (no {arch}.expert_count) in gguf {arch}")
    top_k = get("expert_used_count")
    ffn = get("expert_feed_forward_length") if arch == "qwen3moe" else get("feed_forward_length")
    hp = {
        "vocab_size": int(vocab), "hidden_size": hidden, "intermediate_size": ffn, "num_layers": get("block_count"),
        "num_heads": heads, "num_kv_heads": kv_heads, "head_dim": head_dim,
        "max_position_embeddings": get("context_length"), "rope_theta": float(get("rope.freq_base", 10000.0)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")), "sliding_window": 0,
        "tie_word_embeddings": "output.weight" not in tensors,
    }
    hp["bos_token_id"] = token_id({"bos_token_id": gguf_arch.token_id(meta, "tokenizer.ggml.bos_token_id")},
                                  "bos_token_id", None, int(vocab))
    ends = {"eos_token_id": gguf_arch.end_token_ids(meta)}
    hp.update(eos_token_id=token_id(ends, "eos_token_id", None, int(vocab)), **end_ids(ends, int(vocab)))
    if arch == "llama":
        hp["rope_interleaved"] = True   # q and k rows reordered by llama.cpp's converter for adjacent-pair RoPE
    else:
        hp["qk_norm"] = "head"
    if get("rope.dimension_count", head_dim) != head_dim:
        hp["rope_dim"] = get("rope.dimension_count")
    return {
        "architecture": "mixtral" if arch == "llama" else "qwen3_moe",
        "hparams": hp,
        "routing": {"type": "topk", "top_k": top_k, "score": "softmax", "normalize": True},
        "experts": {"count": n_experts, "weight_layout": "stacked", "quantization": "none", "activation": "silu"},
    }


def _colibri_name(name):
    stem = name[:-len(".weight")] if name.endswith(".weight") else None
    if stem in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[stem]
    parts = (stem or "").split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_TENSORS:
        return f"layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    return None


# GGUF value type -> (its name, its struct format)
VALUE_TYPES = {0: ("uint8", "B"), 1: ("int8", "b"), 2: ("uint16", "H"), 3: ("int16", "h"), 4: ("uint32", "I"),
               5: ("int32", "i"), 6: ("float32", "f"), 7: ("bool", "?"), 8: ("string", None), 9: ("array", None),
               10: ("uint64", "Q"), 11: ("int64", "q"), 12: ("float64", "d")}
BOOL, STRING, ARRAY = 7, 8, 9


def _metadata(buf, offs, count, order):
    """({key: value}, {key: GGUF value type}, the offset after them) of the `count` key/value pairs
    at `offs` of the GGUF bytes `buf` (byte order `order`): strings decoded, arrays as lists of
    Python values.  One pass, one Python object a value: an array's count is checked against the
    bytes left before anything is read (an element takes at least 1 byte, a string its 8-byte
    length), and arrays of arrays are refused, so a file cannot ask for more values than it has bytes."""
    values, kinds = {}, {}

    def need(size):   # where the next `size` bytes start, once the file is known to hold them
        nonlocal offs
        if size > len(buf) - offs:
            raise ValueError(f"the metadata runs to byte {offs + size}, past the end of the file ({len(buf)} bytes)")
        offs += size
        return offs - size

    def take(fmt):
        return struct.unpack_from(order + fmt, buf, need(struct.calcsize(fmt)))[0]

    def text(label):
        size = take("Q")
        at = need(size)
        try:
            return str(buf[at:at + size], "utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{label}: a string that is not UTF-8 (byte {e.start})") from None

    def array(key):
        kind, n = take("I"), take("Q")
        if kind not in VALUE_TYPES or kind == ARRAY:
            raise ValueError(f"`{key}`: an array of {'arrays' if kind == ARRAY else f'value type {kind}'}, which "
                             f"colibri does not read")
        name, fmt = VALUE_TYPES[kind]
        least = 8 if kind == STRING else struct.calcsize(fmt)   # the bytes an element takes, at least
        if n * least > len(buf) - offs:
            raise ValueError(f"`{key}`: {n} {name} elements take at least {n * least} bytes, more than the "
                             f"{len(buf) - offs} left in the file")
        if kind == STRING:
            return [text(f"`{key}`[{i}]") for i in range(n)]
        items = np.frombuffer(buf, np.dtype(order + ("B" if kind == BOOL else fmt)), n, need(n * least))
        return (items != 0).tolist() if kind == BOOL else items.tolist()

    for _ in range(count):
        key = text("a metadata key")
        if key in values:
            raise ValueError(f"`{key}` appears twice in the metadata")
        kinds[key] = kind = take("I")
        if kind not in VALUE_TYPES:
            raise ValueError(f"`{key}`: value type {kind}, not one of GGUF's")
        values[key] = text(f"`{key}`") if kind == STRING else array(key) if kind == ARRAY else take(VALUE_TYPES[kind][1])
    return values, kinds, offs


def _reader(path):
    """gguf's reader, its metadata read by _metadata (into `.meta`), made to say which part of the
    file runs past its end (the header, the metadata, the tensor table, a tensor's data: a file cut
    short) and to name the tensor (and its type) whose table entry it cannot take: an unknown type,
    rows that are not whole blocks, a name given twice."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderField

    class Reader(GGUFReader):
        part = "the header"

        @property
        def data(self):
            return self._mapped

        @data.setter
        def data(self, mapped):   # sliced for each part of each tensor's entry: plain views cost less than memmap's
            self._mapped = mapped.view(np.ndarray)

        def _get(self, offset, dtype, count=1, override_order=None):
            end = int(offset) + np.dtype(dtype).itemsize * int(count)
            if end > len(self.data):
                raise ValueError(f"{self.part} runs to byte {end}, past the end of the file ({len(self.data)} bytes)")
            return super()._get(offset, dtype, count, override_order)

        def _build_fields(self, offs, count):
            self.part = "the metadata"
            order = "<" if (self.byte_order == "I") == (sys.byteorder == "little") else ">"
            self.meta, kinds, offs = _metadata(memoryview(self.data), offs, count, order)
            if "general.alignment" in self.meta:   # the one key gguf's reader reads itself
                if kinds["general.alignment"] != 4:   # uint32
                    raise ValueError("`general.alignment`: not a uint32")
                self.fields["general.alignment"] = ReaderField(
                    0, "general.alignment", [np.array([self.meta["general.alignment"]], np.uint32)], [0],
                    [GGUFValueType.UINT32])
            return offs

        def _build_tensor_info(self, offs, count):
            self.part = "the tensor table"
            max_layers = integer_range("hparams.num_layers")[1]
            if count > max_layers * TENSORS_PER_LAYER:
                raise ValueError(f"the tensor table: {count} tensors, more than the {max_layers * TENSORS_PER_LAYER} of "
                                 f"a model colibri loads ({max_layers} layers of at most {TENSORS_PER_LAYER})")
            return super()._build_tensor_info(offs, count)

        def _build_tensors(self, start_offs, fields):
            tensors, names = [], set()
            for field in fields:
                name, raw = bytes(field.parts[1]).decode("utf-8", "replace"), int(field.parts[4][0])
                known = raw in GGMLQuantizationType._value2member_map_
                kind = GGMLQuantizationType(raw).name if known else f"type {raw}"
                shape = [int(d) for d in reversed(field.parts[3])]
                self.part = f"its data (shape {shape})"
                try:
                    if not all(shape):
                        raise ValueError(f"shape {shape} holds no weights")
                    if known and GGMLQuantizationType(raw) in GGML_QUANT_SIZES:   # its bytes, counted before the
                        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(raw)]   # reader's uint64 product wraps
                        self._get(start_offs + int(field.parts[5][0]), np.uint8, math.prod(shape) // block * size)
                    super()._build_tensors(start_offs, [field])
                except ValueError as e:
                    raise ValueError(f"tensor `{name}` ({kind}): {e}") from None
                if name in names:
                    raise ValueError(f"tensor `{name}` appears twice")
                names.add(name)
                tensors += self.tensors
            self.tensors = tensors
    return Reader(path)


def _check_size(name, kind, shape, data):
    """A tensor's bytes are whole blocks of rows of its shape, as its type stores them."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    if not shape or shape[-1] % block:
        raise ConvertError(f"gguf tensor `{name}` ({kind}): rows of {shape[-1] if shape else 0} weights are not "
                           f"whole blocks of {block}")
    need = int(np.prod(shape, dtype=np.int64)) // block * block_bytes
    if np.asarray(data).nbytes != need:
        raise ConvertError(f"gguf tensor `{name}` ({kind}): {np.asarray(data).nbytes} bytes, but shape "
                           f"{shape} in {kind} takes {need}")


def _array(t):
    """GGUF tensor t's values in their own type, in the shape it names (bf16 as uint16)."""
    data = np.asarray(t.data) if t.tensor_type.name != "BF16" else np.asarray(t.data).view(np.uint16)
    return data.reshape(tuple(int(d) for d in reversed(t.shape)))


def _stored(t):
    """(shape, dtype, load) of GGUF tensor t, its bytes as they are."""
    kind = t.tensor_type.name
    shape = tuple(int(d) for d in reversed(t.shape))   # GGUF lists the fastest dimension first
    _check_size(t.name, kind, shape, t.data)
    data = t.data if kind != "BF16" else np.asarray(t.data).view(np.uint16)
    return shape, STORED[kind], lambda: Stored(data, STORED[kind], at=int(t.data_offset))


def _check_type(t, arch):
    if t.tensor_type.name not in STORED:
        raise ConvertError(f"unsupported: tensor type {t.tensor_type.name} (`{t.name}`) in gguf: import {', '.join(STORED)}")


def _entries(reader, arch, name_of):
    entries = []
    for t in reader.tensors:
        name = name_of(t)
        if name is None:
            raise ConvertError(f"unsupported: tensor `{t.name}` in gguf {arch}")
        _check_type(t, arch)
        shape, dtype, load = _stored(t)
        entries.append((name, shape, load, dtype))
    return entries


def _family_entries(reader, meta, arch, tensors):
    """(description, tensor entries in the family plan's order) for an architecture of gguf_arch:
    every tensor the plan lists comes from the file with its shape, every tensor of the file
    has its place."""
    desc, shapes = gguf_arch.describe(meta, arch, tensors)
    found, kv_b = {}, {}
    for t in reader.tensors:
        name = gguf_arch.colibri_name(arch, t.name, desc["hparams"]["num_layers"])
        if name == "":
            continue
        if name is None or name not in shapes:
            raise ConvertError(f"unsupported: tensor `{t.name}` in gguf {arch}")
        _check_type(t, arch)
        shape, dtype, load = _stored(t)
        if t.name.endswith(("attn_k_b.weight", "attn_v_b.weight")):
            kv_b.setdefault(name, {})[t.name.rsplit(".", 2)[1]] = (t, shape)
            continue
        want = shapes[name]
        # an f32 vector may come as (1, n) or (n,): llama.cpp's quantizer drops the unit dimension
        # that its converter wrote, and either is the same bytes
        vector = dtype == "f32" and 1 in (len(want), len(shape)) and int(np.prod(shape)) == int(np.prod(want))
        if shape != want and not vector:
            raise ConvertError(f"gguf tensor `{t.name}` (for colibri `{name}`): shape {list(shape)} != "
                               f"expected {list(want)}")
        if name in found:
            raise ConvertError(f"gguf {arch}: two tensors for colibri `{name}`")
        found[name] = (name, want, load, dtype)
    for name, parts in kv_b.items():
        if set(parts) != {"attn_k_b", "attn_v_b"}:
            raise ConvertError(f"gguf {arch}: `{name}` needs both attn_k_b and attn_v_b")
        (k, _), (v, _) = parts["attn_k_b"], parts["attn_v_b"]
        kinds = (k.tensor_type.name, v.tensor_type.name)
        joined = gguf_arch.join_kv_b(k.name, _array(k), _array(v), kinds, arch)
        if joined.shape != shapes[name]:
            raise ConvertError(f"gguf tensors `{k.name}`, `{v.name}`: kv_b {list(joined.shape)} != expected "
                               f"{list(shapes[name])}")
        found[name] = (name, shapes[name], lambda x=joined, kind=kinds[0]: Stored(x, STORED[kind]), STORED[kinds[0]])
    missing = [name for name in shapes if name not in found]
    if missing:
        raise ConvertError(f"gguf {arch}: no tensor for colibri `{missing[0]}` (the description needs it)")
    return desc, [found[name] for name in shapes]


def _plan(path):
    """(reader, the model's JSON document without its tensors, tensor entries) of the GGUF at `path`."""
    try:
        reader = _reader(path)
    except Exception as e:   # the gguf package raises ValueError, struct.error, ... on a broken file
        raise ConvertError(f"{path}: not a readable GGUF file: {e}") from None
    meta = reader.meta
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen3moe") + gguf_arch.ARCHS:
        raise ConvertError(f"unsupported: architecture {arch!r} in gguf (supported: llama with experts, qwen3moe, "
                           f"{', '.join(gguf_arch.ARCHS)})")
    tensors = {t.name: t for t in reader.tensors}
    if "token_embd.weight" not in tensors:
        raise ConvertError(f"{path}: no token_embd.weight")
    if arch in ("llama", "qwen3moe"):
        desc, entries = check_limits(_describe(meta, arch, tensors)), _entries(reader, arch, lambda t: _colibri_name(t.name))
    else:
        desc, entries = _family_entries(reader, meta, arch, tensors)
    encoder, vocab_tensors = gguf_vocabulary(meta, desc["hparams"]["vocab_size"], desc["hparams"]["bos_token_id"])
    entries += [(name, x.shape, lambda x=x: x, INTEGER_DTYPES.get(x.dtype, "f32")) for name, x in vocab_tensors]
    doc = {"format": "colibri", "version": 1, **desc, **({"encoder": encoder} if encoder else {}),
           "metadata": {"source": path.name, "source_format": "gguf", "general.name": meta.get("general.name", "")}}
    return reader, doc, entries


def convert_gguf(path, out_dir, progress=True, layout="stacked", repack=False):
    """Import the GGUF file at `path` into the colibri model directory `out_dir`; with layout
    "interleaved" the stacked expert tensors are rewritten into per-expert extents, byte for byte;
    with `repack` (writer.REPACK), the block matrices the core allows in the interleaved forms are
    stored so (the same bytes, rows interleaved in groups of 8: writer.repacked_dtype)."""
    path, out_dir = Path(path), Path(out_dir)
    reader, doc, entries = _plan(path)
    write_model(out_dir, doc, entries, "f32", progress=progress, layout=layout, repack=repack)
    _write_chat(reader, path, out_dir)
    return out_dir


def _write_chat(reader, path, out_dir):
    """The file's chat templates and special tokens' text, stored with the model (colibri.chat)."""
    try:
        chat.write(chat.from_gguf_metadata(reader.meta, str(path)), out_dir)
    except ValueError as e:   # a template's name that is no file name
        raise ConvertError(f"{path}: {e}") from None


# extra.bin starts on a boundary of this many bytes in the file's address range (GGUF data offset
# + extra_at): a page on every system colibri runs on, so the core maps it beside the GGUF's data
EXTRA_BOUNDARY = 1 << 16


def describe_in_place(path, progress=None):
    """The sidecar directory that runs the GGUF file at `path` in place (colibri.Model(path),
    colibri-infer --model path), written when missing: colibri_model.json, whose tensor table points
    into the GGUF's data, and extra.bin, the few tensors colibri makes (the vocabulary's tables, a
    joined kv_b); no byte of the file's weights is copied.  The core names the directory
    (colibri_gguf_sidecar: the file's name, size, modification time and first MiB), so a file
    rewritten or replaced is described anew.  progress: a bar while the tensors' checksums are
    computed (None: on a terminal)."""
    from .._core import gguf_sidecar
    from .output import staged

    path = Path(path)
    sidecar = Path(gguf_sidecar(path))
    if (sidecar / "colibri_model.json").is_file():   # described: running needs none of the convert extra
        return sidecar
    from tqdm import tqdm
    before = path.stat()
    reader, doc, entries = _plan(path)
    start = int(reader.data_offset)
    extra_at = -(-before.st_size // EXTRA_BOUNDARY) * EXTRA_BOUNDARY - start
    table = []
    with staged(sidecar) as work, open(work / "extra.bin", "wb") as extra, \
            tqdm(total=before.st_size - start, unit="B", unit_scale=True, desc=f"describing {path.name}",
                 disable=None if progress is None else not progress) as bar:
        for name, shape, load, dtype in entries:
            x = load()
            if isinstance(x, Stored) and x.at is not None:   # the file's own bytes, used where they lie
                data, stored, offset = memoryview(np.ascontiguousarray(x.data)).cast("B"), x.dtype, x.at - start
                if offset % 32:
                    raise ConvertError(f"{path}: tensor for `{name}` at byte {x.at}, not on a 32-byte boundary "
                                       f"(general.alignment {reader.alignment}): convert the file instead")
                bar.update(len(data))
            else:   # made here: into extra.bin
                data, stored = _encoded(name, shape, lambda: x, "f32")
                extra.write(b"\0" * (-extra.tell() % 64))
                offset = extra_at + extra.tell()
                extra.write(data)
            table.append(_entry(name, stored, shape, offset, data))
        doc = {**doc, "experts": {**doc["experts"], "weight_layout": "stacked"},
               "weights": {"format": "gguf", "name": path.name, "data_offset": start,
                           "data_bytes": before.st_size - start, "file_bytes": before.st_size,
                           "mtime_ns": before.st_mtime_ns, "extra_at": extra_at}}
        (work / "colibri_model.json").write_text(_header_text({**doc, "tensors": table}))
        _write_chat(reader, path, work)
    if path.stat().st_mtime_ns != before.st_mtime_ns:
        raise ConvertError(f"{path} changed while it was described: open it again")
    return sidecar

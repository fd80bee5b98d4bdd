"""A corpus of broken models, each made from the valid tiny-mixtral fixture by one defect.

Every case names the status the core must report and a fragment of its message (the field
or tensor at fault).  `verify` cases are only caught by validate mode (checksums, finiteness).
"""
import json
import random
import shutil
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from support import FIXTURES

FIXTURE = FIXTURES / "tiny-mixtral.colibri"


@dataclass
class Case:
    name: str
    status: str          # colibri.Error.status
    fragment: str        # must appear in the message
    make: Callable       # make(model_dir) breaks the copy in place
    verify: bool = False  # only validate mode sees it


def _edit_json(fn):
    def make(d):
        doc = json.loads((d / "colibri_model.json").read_text())
        fn(doc)
        (d / "colibri_model.json").write_text(json.dumps(doc))
    return make


def _write_json_text(text):
    def make(d):
        (d / "colibri_model.json").write_bytes(text if isinstance(text, bytes) else text.encode())
    return make


def _tensor(doc, name):
    return next(t for t in doc["tensors"] if t["name"] == name)


def _set(path, value):
    def fn(doc):
        *parents, key = path.split(".")
        obj = doc
        for p in parents:
            obj = obj[p]
        obj[key] = value
    return fn


def _delete(path):
    def fn(doc):
        *parents, key = path.split(".")
        obj = doc
        for p in parents:
            obj = obj[p]
        del obj[key]
    return fn


def _truncate_json(d):
    p = d / "colibri_model.json"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garbage_json(d):
    (d / "colibri_model.json").write_bytes(random.Random(7).randbytes(4096))


def _duplicate_key(d):
    p = d / "colibri_model.json"
    p.write_text(p.read_text().replace('"version": 1,', '"version": 1, "version": 1,', 1))


def _bad_escape(d):
    p = d / "colibri_model.json"
    p.write_text(p.read_text().replace('"mixtral"', '"mix\\qtral"', 1))


def _huge_shape(d):
    """200,000 dimensions in one shape: must be refused at once, not walked quadratically."""
    doc = json.loads((d / "colibri_model.json").read_text())
    _tensor(doc, "layers.0.attn.wq")["shape"] = [1] * 200_000
    (d / "colibri_model.json").write_text(json.dumps(doc))


def _invalid_utf8(d):
    p = d / "colibri_model.json"
    p.write_bytes(p.read_bytes().replace(b'"mixtral"', b'"mix\xc3\x28tral"', 1))


def _truncate_weights(d):
    p = d / "weights.bin"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _flip_weight_byte(d):
    p = d / "weights.bin"
    data = bytearray(p.read_bytes())
    data[1000] ^= 0x40
    p.write_bytes(bytes(data))


def _nan_weight(d):
    """A NaN in layers.0.router, with the checksum updated so only the finiteness check sees it."""
    doc = json.loads((d / "colibri_model.json").read_text())
    t = _tensor(doc, "layers.0.router")
    p = d / "weights.bin"
    data = bytearray(p.read_bytes())
    data[t["file_offset"]:t["file_offset"] + 4] = struct.pack("<f", float("nan"))
    t["checksum"] = "crc32:%08x" % zlib.crc32(bytes(data[t["file_offset"]:t["file_offset"] + t["file_size"]]))
    p.write_bytes(bytes(data))
    (d / "colibri_model.json").write_text(json.dumps(doc))


def _edit_offsets(fn):
    """Rewrites tokenizer.token_offsets in weights.bin (its checksum too, so only the table check sees it)."""
    def make(d):
        doc = json.loads((d / "colibri_model.json").read_text())
        t = _tensor(doc, "tokenizer.token_offsets")
        p = d / "weights.bin"
        data = bytearray(p.read_bytes())
        begin, end = t["file_offset"], t["file_offset"] + t["file_size"]
        offsets = list(struct.unpack(f"<{t['shape'][0]}i", data[begin:end]))
        fn(offsets)
        data[begin:end] = struct.pack(f"<{len(offsets)}i", *offsets)
        t["checksum"] = "crc32:%08x" % zlib.crc32(bytes(data[begin:end]))
        p.write_bytes(bytes(data))
        (d / "colibri_model.json").write_text(json.dumps(doc))
    return make


def _edit_table(name, fn):
    """Rewrites an i32 tokenizer table in weights.bin (and its checksum: only the encoder's checks see it)."""
    def make(d):
        doc = json.loads((d / "colibri_model.json").read_text())
        t = _tensor(doc, name)
        p = d / "weights.bin"
        data = bytearray(p.read_bytes())
        begin, end = t["file_offset"], t["file_offset"] + t["file_size"]
        values = list(struct.unpack(f"<{t['file_size'] // 4}i", data[begin:end]))
        fn(values)
        data[begin:end] = struct.pack(f"<{len(values)}i", *values)
        t["checksum"] = "crc32:%08x" % zlib.crc32(bytes(data[begin:end]))
        p.write_bytes(bytes(data))
        (d / "colibri_model.json").write_text(json.dumps(doc))
    return make


def _swap_first_two(values):
    values[0], values[1] = values[1], values[0]


def _swap_offsets(offsets):
    offsets[10], offsets[11] = offsets[11], offsets[10]


def _stretch_last_offset(offsets):
    offsets[-1] += 1


def _overlap(doc):
    a, b = _tensor(doc, "layers.0.attn.wk"), _tensor(doc, "layers.0.attn.wv")
    b["file_offset"] = a["file_offset"]


def _misalign(doc):
    _tensor(doc, "norm")["file_offset"] += 4


def _remove_tensor(name):
    def fn(doc):
        doc["tensors"] = [t for t in doc["tensors"] if t["name"] != name]
    return fn


def _duplicate_tensor(doc):
    doc["tensors"].append(dict(_tensor(doc, "norm")))


def _rename_tensor(old, new):
    def fn(doc):
        _tensor(doc, old)["name"] = new
    return fn


def _swap_w2_shape(doc):
    t = _tensor(doc, "layers.0.experts.w2")
    t["shape"] = [t["shape"][0], t["shape"][2], t["shape"][1]]


def _tensor_field(name, field, value):
    def fn(doc):
        _tensor(doc, name)[field] = value(_tensor(doc, name)[field]) if callable(value) else value
    return fn


def _interleaved(fn):
    """The fixture's checkpoint converted with the interleaved layout, then `fn(doc, weights.bin's
    size)` edits its table."""
    def make(d):
        from colibri.convert import convert

        shutil.rmtree(d)
        convert(FIXTURES / "tiny-mixtral", d, layout="interleaved", progress=False)
        size = (d / "weights.bin").stat().st_size
        _edit_json(lambda doc: fn(doc, size))(d)
    return make


def _experts(doc, layer):
    return [t for t in doc["tensors"] if t["name"].startswith(f"layers.{layer}.experts.")]


def _extents_overlap(doc, size):
    """Layer 1's extents moved down to begin inside layer 0's last one."""
    first, second = _experts(doc, 0), _experts(doc, 1)
    E = first[0]["shape"][0]
    delta = min(t["file_offset"] for t in second) - (first[0]["file_offset"] + (E - 1) * first[0]["expert_stride"])
    for t in second:
        t["file_offset"] -= delta


def _stride_disagrees(doc, size):
    _tensor(doc, "layers.0.experts.w3")["expert_stride"] += 64


def _extent_past_end(doc, size):
    """Layer 0's stride stretched so its last part still lies in weights.bin and its last extent does not."""
    ts = _experts(doc, 0)
    E, base = ts[0]["shape"][0], min(t["file_offset"] for t in ts)
    end = max(t["file_offset"] - base + t["file_size"] // E for t in ts)
    stride = ((size - base - end) // (E - 1)) // 64 * 64
    assert base + E * stride > size
    for t in ts:
        t["expert_stride"] = stride


def _part_outside_extent(doc, size):
    w1, w2 = _tensor(doc, "layers.0.experts.w1"), _tensor(doc, "layers.0.experts.w2")
    w2["file_offset"] = w1["file_offset"] + w1["expert_stride"] - 64


CASES = [
    Case("missing_json", "COLIBRI_E_IO", "colibri_model.json", lambda d: (d / "colibri_model.json").unlink()),
    Case("missing_weights", "COLIBRI_E_IO", "weights.bin", lambda d: (d / "weights.bin").unlink()),
    Case("empty_json", "COLIBRI_E_JSON", "unexpected end", _write_json_text("")),
    Case("garbage_json", "COLIBRI_E_JSON", "line 1", _garbage_json),
    Case("truncated_json", "COLIBRI_E_JSON", "colibri_model.json line", _truncate_json),
    Case("trailing_text", "COLIBRI_E_JSON", "text after the JSON value",
         lambda d: (d / "colibri_model.json").write_text((d / "colibri_model.json").read_text() + " {}")),
    Case("deep_nesting", "COLIBRI_E_LIMIT", "nesting deeper than 32", _write_json_text("[" * 100000)),
    Case("huge_json", "COLIBRI_E_LIMIT", "limit 16 MiB", _write_json_text(b" " * (17 << 20))),
    Case("bad_escape", "COLIBRI_E_JSON", "bad escape", _bad_escape),
    Case("invalid_utf8", "COLIBRI_E_JSON", "invalid UTF-8", _invalid_utf8),
    Case("huge_shape_array", "COLIBRI_E_SHAPE", "shape has 200000 dimensions", _huge_shape),
    Case("duplicate_key", "COLIBRI_E_JSON", 'field "version" appears twice', _duplicate_key),
    Case("not_an_object", "COLIBRI_E_TYPE", "must hold a JSON object", _write_json_text("[1, 2, 3]")),
    Case("wrong_format", "COLIBRI_E_VERSION", "model.format", _edit_json(_set("format", "gguf"))),
    Case("future_version", "COLIBRI_E_VERSION", "model.version 99", _edit_json(_set("version", 99))),
    Case("empty_architecture", "COLIBRI_E_VALUE", "model.architecture must be 1 to 23 characters, not 0",
         _edit_json(_set("architecture", ""))),
    Case("long_architecture", "COLIBRI_E_VALUE", "model.architecture must be 1 to 23 characters, not 24",
         _edit_json(_set("architecture", "x" * 24))),
    Case("unprintable_architecture", "COLIBRI_E_VALUE", "model.architecture must be printable ASCII",
         _edit_json(_set("architecture", "mix\ttral"))),
    Case("missing_tensors", "COLIBRI_E_MISSING", "model.tensors is missing", _edit_json(_delete("tensors"))),
    Case("missing_hparam", "COLIBRI_E_MISSING", "hparams.hidden_size is missing",
         _edit_json(_delete("hparams.hidden_size"))),
    Case("string_for_int", "COLIBRI_E_TYPE", "hparams.hidden_size must be a number",
         _edit_json(_set("hparams.hidden_size", "64"))),
    Case("fraction_for_int", "COLIBRI_E_TYPE", "hparams.num_layers must be an integer",
         _edit_json(_set("hparams.num_layers", 2.5))),
    Case("huge_dimension", "COLIBRI_E_VALUE", "hparams.hidden_size = 1099511627776",
         _edit_json(_set("hparams.hidden_size", 2 ** 40))),
    Case("zero_layers", "COLIBRI_E_VALUE", "hparams.num_layers = 0", _edit_json(_set("hparams.num_layers", 0))),
    Case("eps_rounds_to_zero", "COLIBRI_E_VALUE", "hparams.rms_norm_eps = 1e-50",
         _edit_json(_set("hparams.rms_norm_eps", 1e-50))),
    Case("theta_rounds_to_zero", "COLIBRI_E_VALUE", "hparams.rope_theta = 1e-50",
         _edit_json(_set("hparams.rope_theta", 1e-50))),
    Case("theta_turns_angles_past_2_31", "COLIBRI_E_VALUE", "hparams.rope_theta = 1e-30 turns RoPE angles past 2^31",
         _edit_json(_set("hparams.rope_theta", 1e-30))),
    Case("yarn_factor_turns_angles_past_2_31", "COLIBRI_E_VALUE",
         "hparams.rope_scaling.factor = 1e-30 turns RoPE angles past 2^31",
         _edit_json(_set("hparams.rope_scaling", {"type": "yarn", "factor": 1e-30, "original_max_position_embeddings": 64}))),
    Case("negative_eps", "COLIBRI_E_VALUE", "hparams.rms_norm_eps", _edit_json(_set("hparams.rms_norm_eps", -1e-5))),
    Case("top_k_above_experts", "COLIBRI_E_VALUE", "routing.top_k = 9 exceeds experts.count = 4",
         _edit_json(_set("routing.top_k", 9))),
    Case("heads_not_grouped", "COLIBRI_E_VALUE", "not a multiple of num_kv_heads",
         _edit_json(_set("hparams.num_kv_heads", 3))),
    Case("unknown_field", "COLIBRI_E_VALUE", 'unknown field "rope_scale"',
         _edit_json(_set("hparams.rope_scale", 2.0))),
    Case("rope_scaling_not_object", "COLIBRI_E_TYPE", "hparams.rope_scaling must be an object",
         _edit_json(_set("hparams.rope_scaling", 2.0))),
    Case("mlp_layers_short", "COLIBRI_E_VALUE", "hparams.mlp_layers has 1 entries for 2 layers",
         _edit_json(_set("hparams.mlp_layers", ["moe"]))),
    Case("mlp_layers_unknown_kind", "COLIBRI_E_VALUE", 'hparams.mlp_layers[1] must be "moe" or "dense"',
         _edit_json(_set("hparams.mlp_layers", ["moe", "sparse"]))),
    Case("dense_layer_without_width", "COLIBRI_E_MISSING", "hparams.dense_intermediate_size is missing",
         _edit_json(_set("hparams.mlp_layers", ["moe", "dense"]))),
    Case("groups_do_not_divide", "COLIBRI_E_VALUE", "routing.groups = 3 does not divide experts.count = 4",
         _edit_json(_set("routing.groups", 3))),
    Case("latent_without_rope_dim", "COLIBRI_E_VALUE", "hparams.latent_attention needs rope_dim < head_dim",
         _edit_json(_set("hparams.latent_attention", {"q_lora_rank": 0, "kv_lora_rank": 8, "v_head_dim": 16,
                                                      "norm_eps": 1e-6}))),
    Case("unknown_quantization", "COLIBRI_E_VALUE", 'experts.quantization: unsupported value "q4"',
         _edit_json(_set("experts.quantization", "q4"))),
    Case("unknown_dtype", "COLIBRI_E_DTYPE", 'unknown dtype "f8"',
         _edit_json(_tensor_field("layers.1.attn.wq", "dtype", "f8"))),
    Case("shape_mismatch", "COLIBRI_E_SHAPE", "tensor `layers.0.experts.w2`: shape [4,96,64] != expected [4,64,96]",
         _edit_json(_swap_w2_shape)),
    Case("size_mismatch", "COLIBRI_E_SIZE", "tensor `norm`: file_size 260",
         _edit_json(_tensor_field("norm", "file_size", lambda v: v + 4))),
    Case("misaligned_offset", "COLIBRI_E_ALIGN", "tensor `norm`: file_offset", _edit_json(_misalign)),
    Case("negative_offset", "COLIBRI_E_TYPE", "file_offset must be a non-negative integer",
         _edit_json(_tensor_field("norm", "file_offset", -64))),
    Case("offset_past_end", "COLIBRI_E_BOUNDS", "tensor `lm_head`",
         _edit_json(_tensor_field("lm_head", "file_offset", 1 << 40))),
    Case("truncated_weights", "COLIBRI_E_BOUNDS", "past the end of weights.bin", _truncate_weights),
    Case("overlapping_tensors", "COLIBRI_E_OVERLAP", "overlaps", _edit_json(_overlap)),
    Case("missing_tensor", "COLIBRI_E_TENSOR", "tensor `layers.1.router` is missing",
         _edit_json(_remove_tensor("layers.1.router"))),
    Case("duplicate_tensor", "COLIBRI_E_TENSOR", "tensor `norm` is listed twice", _edit_json(_duplicate_tensor)),
    Case("unknown_tensor", "COLIBRI_E_TENSOR", "tensor `layers.7.router` is not part",
         _edit_json(_rename_tensor("layers.1.router", "layers.7.router"))),
    Case("bad_checksum_text", "COLIBRI_E_VALUE", "checksum must be",
         _edit_json(_tensor_field("norm", "checksum", "md5:00"))),
    Case("vocab_offsets_decrease", "COLIBRI_E_VALUE", "tensor `tokenizer.token_offsets`: entry 11", _edit_offsets(_swap_offsets)),
    Case("vocab_offsets_past_table", "COLIBRI_E_VALUE", "last entry", _edit_offsets(_stretch_last_offset)),
    Case("vocab_half_missing", "COLIBRI_E_TENSOR", "tensor `tokenizer.token_bytes` is missing",
         _edit_json(_remove_tensor("tokenizer.token_bytes"))),
    Case("vocab_wrong_dtype", "COLIBRI_E_DTYPE", "dtype f32, expected i32",
         _edit_json(_tensor_field("tokenizer.token_offsets", "dtype", "f32"))),
    Case("weight_as_integers", "COLIBRI_E_DTYPE", "expected f32, f16, bf16, q8_0, q4_0, w4g128, q4_k",
         _edit_json(_tensor_field("norm", "dtype", "i32"))),
    Case("w4g128_rows_not_whole_groups", "COLIBRI_E_SHAPE",
         "tensor `layers.0.router`: w4g128 rows must be whole blocks: the last dimension (64) is not a multiple of 128",
         _edit_json(_tensor_field("layers.0.router", "dtype", "w4g128"))),
    Case("interleaved_embedding", "COLIBRI_E_VALUE", "tensor `tok_embeddings`: dtype q4_0x8 interleaves rows",
         _edit_json(_tensor_field("tok_embeddings", "dtype", "q4_0x8"))),
    Case("interleaved_rows_not_groups_of_8", "COLIBRI_E_VALUE",
         "tensor `layers.0.router`: dtype q8_0x8 interleaves groups of 8 rows, but it has 4 rows",
         _edit_json(_tensor_field("layers.0.router", "dtype", "q8_0x8"))),
    Case("vocab_offsets_shape", "COLIBRI_E_SHAPE", "tensor `tokenizer.token_offsets`: shape [320] != expected [321]",
         _edit_json(_tensor_field("tokenizer.token_offsets", "shape", [320]))),
    Case("encoder_merge_id_range", "COLIBRI_E_VALUE", "tensor `tokenizer.merges`: entry 0 is 320, outside [0, vocab)",
         _edit_table("tokenizer.merges", lambda v: v.__setitem__(0, 320))),
    Case("encoder_merge_order", "COLIBRI_E_VALUE",
         "tensor `tokenizer.merge_order`: entries 0 and 1 are not in (left, right) order",
         _edit_table("tokenizer.merge_order", _swap_first_two)),
    Case("encoder_merged_bytes", "COLIBRI_E_VALUE", "tensor `tokenizer.merges`: rank 0: token",
         _edit_table("tokenizer.merges", lambda v: v.__setitem__(2, v[0]))),
    Case("encoder_byte_id_range", "COLIBRI_E_VALUE", "tensor `tokenizer.byte_ids`: entry 5 is -7, outside [-1, vocab)",
         _edit_table("tokenizer.byte_ids", lambda v: v.__setitem__(5, -7))),
    Case("encoder_bos_range", "COLIBRI_E_VALUE", "model.encoder.bos must be -1 or a token id below 320",
         _edit_json(_set("encoder.bos", 320))),
    Case("encoder_kind", "COLIBRI_E_VALUE", "model.encoder.kind must be \"byte_level_bpe\"",
         _edit_json(_set("encoder.kind", "unigram"))),
    Case("encoder_normalizer", "COLIBRI_E_VALUE", "model.encoder.normalizer must be \"nfc\" (byte_level_bpe only)",
         _edit_json(_set("encoder.normalizer", "nfd"))),
    Case("encoder_option_of_the_other_kind", "COLIBRI_E_VALUE", "model.encoder.prepend_scheme must be \"always\"",
         _edit_json(_set("encoder.prepend_scheme", "first"))),
    Case("encoder_added_flags", "COLIBRI_E_VALUE", "tensor `tokenizer.added`: row 0: flags 16, only lstrip 1",
         _edit_table("tokenizer.added", lambda v: v.__setitem__(2, v[2] | 16 << 24))),
    Case("encoder_without_merges", "COLIBRI_E_TENSOR", "model.encoder needs tensors",
         _edit_json(lambda doc: doc["tensors"].remove(_tensor(doc, "tokenizer.merges")))),
    Case("encoder_tables_without_encoder", "COLIBRI_E_TENSOR", "encoder tensors (tokenizer.merges, ...) but no \"encoder\"",
         _edit_json(_delete("encoder"))),
    Case("interleaved_extents_overlap", "COLIBRI_E_OVERLAP",
         "tensor `layers.0.experts.w1`'s expert extents [269440, 564352) overlaps tensor `layers.1.experts.w1`'s expert extents at 490624",
         _interleaved(_extents_overlap)),
    Case("interleaved_stride_disagrees", "COLIBRI_E_VALUE",
         "layer 0: tensor `layers.0.experts.w3` has expert_stride 73792, tensor `layers.0.experts.w1` 73728",
         _interleaved(_stride_disagrees)),
    Case("interleaved_extent_past_end", "COLIBRI_E_BOUNDS", "layer 0: expert 3's extent", _interleaved(_extent_past_end)),
    Case("interleaved_part_outside_extent", "COLIBRI_E_OVERLAP",
         "tensor `layers.0.experts.w2`: expert 0's part [343104, 367680) lies outside its extent [269440, 343168)",
         _interleaved(_part_outside_extent)),
    Case("interleaved_stride_missing", "COLIBRI_E_MISSING", "tensor `layers.1.experts.w2`.expert_stride is missing",
         _interleaved(lambda doc, size: _tensor(doc, "layers.1.experts.w2").pop("expert_stride"))),
    Case("extent_checksums_too_few", "COLIBRI_E_VALUE",
         "tensor `layers.0.experts.w1`: extent_checksums must list 4 checksums, one per expert",
         _interleaved(lambda doc, size: _tensor(doc, "layers.0.experts.w1")["extent_checksums"].pop())),
    Case("extent_checksum_malformed", "COLIBRI_E_VALUE",
         "tensor `layers.1.experts.w1`: extent_checksums[2] must be \"crc32:\" and 8 hex digits",
         _interleaved(lambda doc, size: _tensor(doc, "layers.1.experts.w1")["extent_checksums"].__setitem__(2, "crc32:xyz"))),
    Case("extent_checksums_twice", "COLIBRI_E_VALUE",
         "layer 0: tensor `layers.0.experts.w3` lists extent_checksums again",
         _interleaved(lambda doc, size: _tensor(doc, "layers.0.experts.w3").update(
             extent_checksums=_tensor(doc, "layers.0.experts.w1")["extent_checksums"]))),
    Case("extent_checksums_in_stacked_layout", "COLIBRI_E_VALUE",
         "tensor `layers.0.experts.w1`: extent_checksums belong only",
         _edit_json(lambda doc: _tensor(doc, "layers.0.experts.w1").update(extent_checksums=["crc32:00000000"] * 4))),
    Case("stride_in_stacked_layout", "COLIBRI_E_VALUE", "tensor `layers.0.experts.w1`: expert_stride belongs only",
         _edit_json(lambda doc: _tensor(doc, "layers.0.experts.w1").update(expert_stride=73728))),
    # the spec's descriptive fields (docs/FORMAT.md), checked against the tensors
    Case("top_k_zero", "COLIBRI_E_VALUE", "routing.top_k = 0 is outside [1, 64]", _edit_json(_set("routing.top_k", 0))),
    Case("routing_type_unknown", "COLIBRI_E_VALUE",
         'routing.type: unsupported value "expert_choice" (expected "topk_softmax", "topk" or "sparsemixer")',
         _edit_json(_set("routing.type", "expert_choice"))),
    Case("capacity_factor_negative", "COLIBRI_E_VALUE", "routing.capacity_factor = -1 is out of range",
         _edit_json(_set("routing.capacity_factor", -1))),
    Case("expert_count_disagrees_with_tensors", "COLIBRI_E_SHAPE", "tensor `layers.0.router`: shape [4,64] != expected [8,64]",
         _edit_json(_set("experts.count", 8))),
    Case("weight_layout_unknown", "COLIBRI_E_VALUE",
         'experts.weight_layout: unsupported value "striped" (expected "stacked", "interleaved" or "contiguous")',
         _edit_json(_set("experts.weight_layout", "striped"))),
    Case("quantization_disagrees_with_dtypes", "COLIBRI_E_VALUE",
         "experts.quantization says 4-bit groups of 128 (w4g128) but tensor `layers.0.experts.w1` is f32",
         _edit_json(_set("experts.quantization", {"enabled": True, "bits": 4, "group_size": 128}))),
    Case("quantization_no_such_format", "COLIBRI_E_VALUE",
         "experts.quantization: no block format has bits = 3 and group_size = 128",
         _edit_json(_set("experts.quantization", {"enabled": True, "bits": 3, "group_size": 128}))),
    Case("quantization_without_group_size", "COLIBRI_E_MISSING", "experts.quantization.group_size is missing",
         _edit_json(_set("experts.quantization", {"enabled": True, "bits": 4}))),
    Case("quantization_not_an_object", "COLIBRI_E_TYPE", 'experts.quantization must be "none" or an object',
         _edit_json(_set("experts.quantization", 4))),
    Case("checksum_mismatch", "COLIBRI_E_CHECKSUM", "crc32", _flip_weight_byte, verify=True),
    Case("nan_weight", "COLIBRI_E_VALUE", "tensor `layers.0.router`: element 0 is not finite", _nan_weight,
         verify=True),
]


def make_case(case, root):
    """Copies the fixture under `root` and breaks it; returns the model directory."""
    d = Path(root) / case.name
    shutil.copytree(FIXTURE, d)
    case.make(d)
    return d


def mutations(n, seed=1234):
    """Seeded random byte edits of the valid colibri_model.json: hostile-input fuzzing."""
    text = (FIXTURE / "colibri_model.json").read_bytes()
    rng = random.Random(seed)
    alphabet = b'{}[]",:0123456789-.eE+ \\truefalsnl\x00\xff'
    for _ in range(n):
        data = bytearray(text)
        for _ in range(rng.randint(1, 8)):
            op = rng.random()
            at = rng.randrange(len(data))
            if op < 0.4:
                data[at] = rng.choice(alphabet)
            elif op < 0.7:
                del data[at:at + rng.randint(1, 64)]
            else:
                data[at:at] = bytes(rng.choice(alphabet) for _ in range(rng.randint(1, 16)))
        yield bytes(data)

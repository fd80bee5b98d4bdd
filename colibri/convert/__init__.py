"""Convert a Hugging Face checkpoint directory (or a GGUF file) into a colibri model directory
(docs/FORMAT.md).

    from colibri.convert import convert
    convert("Mixtral-8x7B-v0.1", "mixtral.colibri")   # each weight in its checkpoint's dtype

Works without torch: tensors are read with safetensors' numpy reader, one at a time, and streamed
into weights.bin. Only layout happens here (renaming, stacking experts, splitting fused
projections, rounding to the output dtype); no model maths.
"""

import shutil
from pathlib import Path

import colibri
from colibri import chat

from .errors import ConvertError
from .families import FAMILIES
from .hf import Checkpoint
from .limits import check as check_limits
from .output import staged
from .vocab import byte_table, encoder, token_bytes
from .writer import DTYPES, LAYOUTS, check_dtype, check_layout, write_model

__all__ = ["convert", "ConvertError", "FAMILIES", "DTYPES", "LAYOUTS", "KEEP"]

KEEP = "keep"   # each weight in the dtype the checkpoint stores it in
KEPT = {"f32": "f32", "f16": "f16", "bf16": "bf16"}   # source dtype -> stored dtype (f64 and mixed sources: f32)


def convert(src_dir, out_dir, dtype=KEEP, progress=True, layout="stacked", repack=None):
    """Convert the HF model in `src_dir` to a colibri model in `out_dir`, weights stored as `dtype`
    (f32, f16, bf16, q8_0, q4_0 or w4g128; "keep", the default: each in its checkpoint's f32, f16 or
    bf16, f32 where it has f64 or its sources differ); or import a .gguf file, its weights as they
    are. The chat templates and the special tokens' text they read go with the model (colibri.chat). `layout`:
    the routed experts "stacked" (each tensor whole) or "interleaved" (each expert's tensors one
    extent, read at once; docs/FORMAT.md). `repack`: the block matrices of the core's matmuls stored
    row-interleaved (q4_0x8, q8_0x8, q4_kx8, ...: the same blocks, moved, for the fast kernels): None,
    the default, in the forms the kernels on this machine run faster than the plain ones; True in
    every interleaved form; False byte for byte. Returns out_dir as a Path. Raises ConvertError on
    anything it cannot convert.

    out_dir is replaced whole once the new model is written and the core has loaded it (CRCs and
    all): a conversion that fails, or is interrupted, leaves what was there (output.py). It must be
    new, empty, or a colibri model; files other than the model's own in it are kept."""
    if dtype != KEEP:
        check_dtype(dtype)
    check_layout(layout)
    src_dir, out_dir = Path(src_dir), Path(out_dir)
    if out_dir.resolve() == src_dir.resolve():
        raise ConvertError(f"{out_dir}: the output directory is the source {src_dir}: give another")
    if repack not in (None, True, False):
        raise ConvertError(f"repack={repack!r}: expected None (the forms this CPU's kernels run faster), True or False")
    repack_mode = "fast" if repack is None else bool(repack)
    with staged(out_dir, src_dir) as work:
        if src_dir.suffix == ".gguf" and src_dir.is_file():
            from .gguf_import import convert_gguf

            convert_gguf(src_dir, work, progress=progress, layout=layout, repack=repack_mode)
        else:
            _convert_checkpoint(src_dir, work, dtype, progress, layout, repack_mode)
        _check_loads(work)
    return out_dir


def _check_loads(model_dir):
    """The core's own validation of what was written, before it replaces anything."""
    try:
        colibri.Model(model_dir, verify=True)
    except colibri.Error as e:
        raise ConvertError(f"the converted model does not load (nothing was replaced): {e}") from None


def _convert_checkpoint(src_dir, out_dir, dtype, progress, layout, repack):
    with Checkpoint(src_dir) as ckpt:
        model_type = ckpt.config.get("model_type")
        if not isinstance(model_type, str) or model_type not in FAMILIES:
            raise ConvertError(f"{src_dir / 'config.json'}: model_type {model_type!r} is not supported "
                               f"(supported: {', '.join(sorted(FAMILIES))})")
        family = FAMILIES[model_type]
        try:
            desc = check_limits(family.describe(ckpt.config, model_type))   # before a plan is sized by it
        except ConvertError:
            raise
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError) as e:
            # a setting of a type or value the family's reading does not check for: named, not a traceback
            # (chained, so that the fuzz target still reports it as a finding)
            raise ConvertError(f"{src_dir / 'config.json'}: a setting {model_type} cannot take "
                               f"({type(e).__name__}: {e})") from e
        plan = family.plan(desc, ckpt)
        source_dtypes = set()
        for entry in plan:  # every missing tensor and wrong shape is reported before writing
            for name, shape in entry.sources:
                if name not in ckpt:
                    raise ConvertError(f"tensor `{name}` (for colibri `{entry.name}`) missing from {src_dir}")
                if ckpt.shape(name) != shape:
                    raise ConvertError(f"tensor `{name}` (for colibri `{entry.name}`): shape "
                                       f"{list(ckpt.shape(name))} != expected {list(shape)}")
                source_dtypes.add(ckpt.dtype(name))
        has_tokenizer = (src_dir / "tokenizer.json").is_file()
        doc = {"format": "colibri", "version": 1, **desc}
        if has_tokenizer:
            doc["tokenizer"] = "tokenizer.json"
        doc["metadata"] = {"source": src_dir.name, "converter": f"colibri {colibri.__version__}",
                           "source_dtype": ",".join(sorted(source_dtypes))}
        tensors = [(e.name, e.shape, lambda e=e: e.build([ckpt.get(n) for n, _ in e.sources]))
                   + ((_kept(ckpt, e),) if dtype == KEEP else ()) for e in plan]
        pieces = token_bytes(src_dir / "tokenizer.json", desc["hparams"]["vocab_size"]) if has_tokenizer else None
        if pieces is not None:  # the vocabulary as bytes, for text output without a tokenizer library
            table, offsets = byte_table(pieces)
            tensors += [("tokenizer.token_bytes", table.shape, lambda: table),
                        ("tokenizer.token_offsets", offsets.shape, lambda: offsets)]
            enc = encoder(src_dir / "tokenizer.json", desc["hparams"]["vocab_size"])
            if enc is not None:   # what colibri_tokenize needs to encode text in the core
                doc = {**{k: v for k, v in doc.items() if k != "metadata"}, "encoder": enc[0], "metadata": doc["metadata"]}
                tensors += [(name, x.shape, lambda x=x: x) for name, x in enc[1]]
        write_model(out_dir, doc, tensors, "f32" if dtype == KEEP else dtype, progress=progress, layout=layout,
                    repack=repack)
    if has_tokenizer:
        shutil.copyfile(src_dir / "tokenizer.json", out_dir / "tokenizer.json")
    try:
        chat.write(chat.from_hf(src_dir), out_dir)
    except (ValueError, UnicodeDecodeError) as e:   # json's errors are ValueErrors
        raise ConvertError(f"{src_dir}: the chat template or special tokens cannot be read: {e}") from None


def _kept(ckpt, entry):
    """The dtype a tensor of the plan keeps: its sources' one dtype, else f32."""
    dtypes = {ckpt.dtype(name) for name, _ in entry.sources}
    return KEPT.get(dtypes.pop(), "f32") if len(dtypes) == 1 else "f32"

"""Fuzz targets for the converter (colibri.convert), run by atheris (libFuzzer for Python):

  config       a Hugging Face checkpoint directory whose config.json is the input; its safetensors
               file is made to match what the family's plan asks of that config (when the plan is
               small), so that mutants reach the writer, not only the checks
  safetensors  the checkpoint's model.safetensors file is the input (its 8-byte header length, JSON
               header and data), with a fixed tiny Mixtral config.json
  gguf         a GGUF file (metadata, tensor table, tiny tensors) is the input

Each input is converted with colibri.convert.convert into a scratch directory. Success and
ConvertError are the only allowed outcomes; any other exception is a finding, as is an input that
runs past libFuzzer's -timeout or a memory blow-up (RLIMIT_AS is set, so it shows as MemoryError).

    python benchmarks/fuzz_convert.py config [libFuzzer flags] [corpus dirs]   # fuzz (needs atheris)
    python benchmarks/fuzz_convert.py --make-seeds                            # rewrite fuzz_corpus/

The target functions (TARGETS) import without atheris: tests/test_fuzz_regressions.py replays the
seed corpus and tests/fuzz_regressions/<target>/ through them. benchmarks/fuzz.py runs them all.
"""

import json
import resource
import shutil
import struct
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "benchmarks" / "fuzz_corpus"
REGRESSIONS = ROOT / "tests" / "fuzz_regressions"
MEMORY_LIMIT = 4 << 30   # RLIMIT_AS of a fuzzing process
MAX_ELEMENTS = 1 << 18   # a config's plan larger than this gets a placeholder tensor, not its weights
_SCRATCH = None


def _scratch():
    """A fresh, empty scratch directory (one per process, emptied for each input)."""
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = Path(tempfile.mkdtemp(prefix="colibri-fuzz-"))
    for child in _SCRATCH.iterdir():
        shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    return _SCRATCH


def _convert(src, out, data, refusal_ok):
    """colibri.convert.convert(src, out), dtype and layout picked from the input's checksum so that
    every dtype is reached (f32 where a refusal is not ok: the small seeds' rows are not whole blocks);
    a ConvertError is an answer (where refusal_ok), anything else propagates."""
    from colibri.convert import DTYPES, LAYOUTS, ConvertError, convert

    h = zlib.crc32(data)
    try:
        convert(src, out, dtype=DTYPES[h % len(DTYPES)] if refusal_ok else "f32", progress=False, layout=LAYOUTS[(h >> 8) % len(LAYOUTS)])
    except ConvertError as e:
        if not refusal_ok or (e.__cause__ is not None and not isinstance(e.__cause__, ConvertError)):
            raise   # a refusal only by convert()'s safety net is a finding too


class _Shapes:
    """A checkpoint with no tensors: what a family's plan asks of it, answered without one; its
    experts per-expert tensors (the hub's layout) or fused (transformers 5's)."""

    def __init__(self, config, fused):
        self.config, self.fused = config, fused

    def __contains__(self, name):
        return self.fused and name.endswith(".gate_up_proj")

    def __len__(self):
        return 0


def _planned_tensors(config, fused=False):
    """{source name: shape} of the tensors the family's plan reads for `config` (the experts fused
    where asked, or where there are many), or None when the config is refused before a plan or
    the plan holds more than MAX_ELEMENTS weights."""
    from colibri.convert import FAMILIES, ConvertError
    from colibri.convert.limits import check

    try:
        family = FAMILIES[config["model_type"]]
        desc = check(family.describe(config, config["model_type"]))
        many = desc["hparams"]["num_layers"] * desc["experts"]["count"] > 4096
        plan = family.plan(desc, _Shapes(config, fused or many))
    except ConvertError:
        return None
    sources = {name: tuple(shape) for entry in plan for name, shape in entry.sources}
    if sum(int(np.prod(s, dtype=np.int64)) for s in sources.values()) > MAX_ELEMENTS:
        return None
    return sources


def _tensors_file(path, sources, seed):
    """A safetensors file of float32 tensors of these shapes (norm weights around 1)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    save_file({name: (rng.standard_normal(shape) * 0.1 + ("norm" in name)).astype(np.float32)
               for name, shape in sources.items()}, str(path))


def target_config(data, refusal_ok=True):
    """config.json = data; model.safetensors what the plan of that config reads (a placeholder
    tensor when it cannot be planned, or is too large to write)."""
    src = _scratch() / "hf"
    src.mkdir()
    (src / "config.json").write_bytes(data)
    sources = None
    try:
        config = json.loads(data)
        if isinstance(config, dict) and isinstance(config.get("model_type"), str):
            sources = _planned_tensors(config, fused=bool(zlib.crc32(data) & 0x10000))
    except Exception:   # whatever json or the plan raises here, convert() meets again below
        pass
    _tensors_file(src / "model.safetensors", sources or {"placeholder": (1,)}, zlib.crc32(data))
    _convert(src, src.parent / "out", data, refusal_ok)


def target_safetensors(data, refusal_ok=True):
    """model.safetensors = data, config.json the fixed tiny Mixtral of SAFETENSORS_CONFIG."""
    src = _scratch() / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps(SAFETENSORS_CONFIG))
    (src / "model.safetensors").write_bytes(data)
    _convert(src, src.parent / "out", data, refusal_ok)


def target_gguf(data, refusal_ok=True):
    """model.gguf = data."""
    path = _scratch() / "model.gguf"
    path.write_bytes(data)
    _convert(path, path.parent / "out", data, refusal_ok)


TARGETS = {"config": target_config, "safetensors": target_safetensors, "gguf": target_gguf}

# the fixed config of the safetensors target: one layer, 2 experts, rows of 32 (so q8_0 applies)
SAFETENSORS_CONFIG = {"model_type": "mixtral", "vocab_size": 16, "hidden_size": 32, "intermediate_size": 32,
                      "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                      "num_local_experts": 2, "num_experts_per_tok": 1, "max_position_embeddings": 64,
                      "rms_norm_eps": 1e-5, "tie_word_embeddings": False}


# ---------------------------------------------------------------------------------- seed corpora

TINY = dict(vocab_size=32, hidden_size=16, max_position_embeddings=64)


def _config_seeds():
    """{name: config.json bytes}: each family's test config (tests/support.FAMILIES), shrunk where
    it still converts, as transformers' config class writes it."""
    sys.path.insert(0, str(ROOT / "tests"))
    import transformers
    from support import COMMON, FAMILIES

    seeds = {}
    for family, (_, _, class_name, kwargs) in FAMILIES.items():
        for shrink in (TINY, {}):
            config = getattr(transformers, class_name)(**{**COMMON, **kwargs, **shrink})
            text = json.dumps(config.to_diff_dict(), indent=1, sort_keys=True).encode()
            ok = _planned_tensors(json.loads(text)) is not None
            if ok:
                seeds[family] = text
                break
        assert ok, family
    return seeds


def _safetensors_seeds():
    """{name: model.safetensors bytes}: SAFETENSORS_CONFIG's tensors, hub-style per-expert and
    transformers 5's fused experts, f32 and bf16."""
    from safetensors.numpy import save

    import ml_dtypes

    hub = _planned_tensors(SAFETENSORS_CONFIG)
    E, F, D = 2, 32, 32
    fused = {k: v for k, v in hub.items() if ".block_sparse_moe." not in k}
    fused.update({"model.layers.0.mlp.gate.weight": (E, D), "model.layers.0.mlp.experts.gate_up_proj": (E, 2 * F, D),
                  "model.layers.0.mlp.experts.down_proj": (E, D, F)})
    rng = np.random.default_rng(0)
    seeds = {}
    for name, sources, dtype in (("hub-f32", hub, np.float32), ("hub-bf16", hub, ml_dtypes.bfloat16),
                                 ("fused-f16", fused, np.float16)):
        seeds[name] = save({k: (rng.standard_normal(s) * 0.1).astype(dtype) for k, s in sources.items()})
    return seeds


def _gguf_vocab(w, V, kind):
    if kind == "llama":
        tokens = ["<unk>", "<s>", "</s>"] + [f"\u2581w{i}" for i in range(V - 3)]
    else:   # GPT-2's byte alphabet
        tokens = ["<unk>", "<s>", "</s>", "\u0120", "ab", "abc"] + [chr(ord("a") + i) for i in range(V - 6)]
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3] + [1] * (V - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if kind == "llama":
        w.add_tokenizer_model("llama")
        w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(V - 3)])
        w.add_unk_token_id(0)
    else:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_merges(["a b", "ab c"])


# GGUF architecture -> (extra metadata, optional tensors present): D 16, 2 heads of 8 (1 kv head),
# 2 layers, 2 experts of 16, top-1, vocabulary of 32
_COMMON_META = {"context_length": 64, "embedding_length": 16, "block_count": 2, "attention.head_count": 2,
                "attention.head_count_kv": 1, "attention.layer_norm_rms_epsilon": 1e-5, "rope.freq_base": 1e4,
                "expert_count": 2, "expert_used_count": 1}
GGUF_SEEDS = {
    "llama": ({"feed_forward_length": 16, "rope.dimension_count": 8}, ()),
    "qwen3moe": ({"expert_feed_forward_length": 16, "attention.key_length": 8, "attention.value_length": 8}, ()),
    "qwen2moe": ({"feed_forward_length": 16, "expert_feed_forward_length": 16,
                  "expert_shared_feed_forward_length": 16}, ("attn_q.bias",)),
    "olmoe": ({"feed_forward_length": 16, "attention.clamp_kqv": 8.0}, ()),
    "granitemoe": ({"feed_forward_length": 16, "attention.scale": 0.3, "embedding_scale": 12.0,
                    "residual_scale": 0.2, "logit_scale": 4.0, "expert_shared_feed_forward_length": 16},
                   ("attn_q.bias",)),
    "phimoe": ({"feed_forward_length": 16, "attention.sliding_window": 8,
                "rope.scaling.original_context_length": 32, "rope.scaling.attn_factor": 1.2},
               ("attn_q.bias", "output.bias", "rope_factors_short.weight")),
    "deepseek2": ({"attention.head_count_kv": 1, "feed_forward_length": 16, "expert_feed_forward_length": 16,
                   "rope.dimension_count": 4, "attention.key_length_mla": 12, "attention.value_length_mla": 8,
                   "attention.kv_lora_rank": 8, "attention.q_lora_rank": 8, "attention.key_length": 12,
                   "attention.value_length": 8, "leading_dense_block_count": 1, "expert_shared_count": 1,
                   "expert_gating_func": 2, "expert_weights_norm": True, "expert_weights_scale": 2.5,
                   "expert_count": 4, "expert_group_count": 2, "expert_group_used_count": 1, "rope.scaling.type": "yarn",
                   "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 16,
                   "rope.scaling.yarn_log_multiplier": 0.1}, ("exp_probs_b.bias",)),
    "glm4moe": ({"feed_forward_length": 16, "expert_feed_forward_length": 16, "leading_dense_block_count": 1,
                 "expert_shared_count": 1, "rope.dimension_count": 4, "nextn_predict_layers": 0},
                ("attn_q.bias", "attn_q_norm.weight", "exp_probs_b.bias")),
    "dots1": ({"feed_forward_length": 16, "expert_feed_forward_length": 16, "expert_shared_count": 2,
               "expert_gating_func": 1}, ()),
    "ernie4_5-moe": ({"feed_forward_length": 16, "expert_feed_forward_length": 16, "expert_shared_count": 1,
                      "leading_dense_block_count": 1, "interleave_moe_layer_step": 1}, ()),
    "lfm2moe": ({"attention.head_count_kv": [0, 1], "feed_forward_length": 16, "expert_feed_forward_length": 16,
                 "shortconv.l_cache": 3, "leading_dense_block_count": 1, "expert_gating_func": 2},
                ("exp_probs_b.bias",)),
    "gpt-oss": ({"expert_feed_forward_length": 16, "attention.sliding_window": 8, "rope.scaling.type": "yarn",
                 "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 16}, ("attn_q.bias",)),
    "llama4": ({"expert_feed_forward_length": 16, "feed_forward_length": 16, "interleave_moe_layer_step": 2,
                "attention.key_length": 8, "attention.value_length": 8}, ("rope_freqs.weight",)),
}


def _add_meta(w, arch, key, value):
    name = f"{arch}.{key}"
    if isinstance(value, bool):
        w.add_bool(name, value)
    elif isinstance(value, int):
        w.add_uint32(name, value)
    elif isinstance(value, float):
        w.add_float32(name, value)
    elif isinstance(value, str):
        w.add_string(name, value)
    else:
        w.add_array(name, value)


def _gguf_names(arch):
    """colibri tensor name -> GGUF name, for the architecture's plan."""
    from colibri.convert import gguf_arch, gguf_import

    if arch in ("llama", "qwen3moe"):
        layer, glob = gguf_import.LAYER_TENSORS, gguf_import.GLOBAL_TENSORS
    else:
        layer = {k: v for k, v in gguf_arch.LAYER_TENSORS.items() if k != "post_attention_norm"}
        glob = {**gguf_arch.GLOBAL_TENSORS, **gguf_arch.EXTRA_GLOBAL.get(arch, {})}

    def gguf(name):
        key = lambda k: k if k.endswith(".bias") else k + ".weight"   # noqa: E731
        for k, v in glob.items():
            if v == name:
                return key(k)
        _, i, rest = name.split(".", 2)
        return f"blk.{i}." + key({v: k for k, v in layer.items()}[rest])
    return gguf


def _llama_shapes(arch, meta):
    D, H, KV, L, E = 16, meta["attention.head_count"], meta["attention.head_count_kv"], meta["block_count"], 2
    hd, F, V = 8, 16, 32
    shapes = {"tok_embeddings": (V, D)}
    for i in range(L):
        p = f"layers.{i}."
        shapes.update({p + "attn_norm": (D,), p + "attn.wq": (H * hd, D), p + "attn.wk": (KV * hd, D),
                       p + "attn.wv": (KV * hd, D), p + "attn.wo": (D, H * hd), p + "ffn_norm": (D,),
                       p + "router": (E, D), p + "experts.w1": (E, F, D), p + "experts.w3": (E, F, D),
                       p + "experts.w2": (E, D, F)})
        if arch == "qwen3moe":
            shapes.update({p + "attn.q_norm": (hd,), p + "attn.k_norm": (hd,)})
    shapes.update({"norm": (D,), "lm_head": (V, D)})
    return shapes


def _gguf_seeds(tmp):
    """{name: GGUF bytes}: each architecture's tiny model, its tensors the shapes colibri's plan
    for its metadata lists; matrices f32, f16, and q8_0 in one; llama (SentencePiece)
    vocabularies and one gpt2 (byte-level BPE) one."""
    from types import SimpleNamespace

    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    from colibri.convert import gguf_arch

    seeds = {}
    rng = np.random.default_rng(0)
    for arch, (extra, optional) in GGUF_SEEDS.items():
        meta = {**_COMMON_META, **extra}
        if arch in ("llama", "qwen3moe"):
            shapes = _llama_shapes(arch, meta)
        else:
            full = {f"{arch}.{k}": v for k, v in meta.items()}
            tensors = {name: SimpleNamespace(data=np.ones(4, np.float32))   # what describe looks at
                       for name in ["output.weight", *(o if o.startswith(("output", "rope")) else f"blk.0.{o}"
                                                       for o in optional)]}
            tensors["token_embd.weight"] = SimpleNamespace(data=np.zeros((32, 16), np.float32))
            _, shapes = gguf_arch.describe(full, arch, tensors)
        name_of = _gguf_names(arch)
        path = tmp / f"{arch}.gguf"
        w = GGUFWriter(str(path), arch)
        for k, v in meta.items():
            _add_meta(w, arch, k, v)
        _gguf_vocab(w, 32, "gpt2" if arch == "qwen2moe" else "llama")
        kind = "f32" if arch in ("llama", "qwen3moe", "deepseek2", "gpt-oss") else "f16"
        for name, shape in shapes.items():
            x = (rng.standard_normal(shape) * 0.1 + ("norm" in name or "factors" in name)).astype(np.float32)
            gname = "rope_freqs.weight" if (arch == "llama4" and name == "rope.factors") else \
                "rope_factors_short.weight" if name == "rope.factors" else name_of(name)
            if kind == "f16" and x.ndim >= 2:
                w.add_tensor(gname, x.astype(np.float16))
            else:
                w.add_tensor(gname, x)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        seeds[arch] = path.read_bytes()
    # llama with q8_0 matrices (rows of 32)
    path = tmp / "llama-q8_0.gguf"
    w = GGUFWriter(str(path), "llama")
    meta = {**_COMMON_META, "embedding_length": 32, "feed_forward_length": 32, "block_count": 1,
            "rope.dimension_count": 16}
    for k, v in meta.items():
        _add_meta(w, "llama", k, v)
    _gguf_vocab(w, 32, "llama")
    for name, shape in _llama_shapes("llama", {**meta, "block_count": 1}).items():
        shape = tuple({16: 32, 8: 16}.get(d, d) for d in shape)   # D 32, F 32, heads of 16 (the kv projection too)
        x = (rng.standard_normal(shape) * 0.1 + ("norm" in name)).astype(np.float32)
        if x.ndim >= 2 and x.shape[-1] % 32 == 0:
            w.add_tensor(_gguf_names("llama")(name), quantize(x, GGMLQuantizationType.Q8_0),
                         raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(_gguf_names("llama")(name), x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    seeds["llama-q8_0"] = path.read_bytes()
    seeds.update(_gguf_long_seeds(tmp))
    return seeds


def _gguf_long_seeds(tmp):
    """{name: GGUF bytes}: llama models with what a hostile file has too much of, at a size that still
    converts in milliseconds: many layers (many tensors), a long vocabulary (SentencePiece with
    scores, and byte-level with merges), a long token (of 4,096 characters, split by the merges)."""
    from gguf import GGUFWriter

    rng = np.random.default_rng(1)
    special, byte_tokens = ["<unk>", "<s>", "</s>"], [f"<0x{b:02X}>" for b in range(256)]
    sentencepiece = lambda words: (special + byte_tokens + words, [2, 3, 3] + [6] * 256 + [1] * len(words),   # noqa: E731
                                   [0.0] * 259 + [-float(i) for i in range(len(words))])
    alphabet = [chr(c) for c in range(ord("!"), ord("~") + 1)]
    pairs = [a + b for a in alphabet[:16] for b in alphabet[:16]]   # each the merge of its two characters
    byte_level = special[1:] + alphabet + pairs + [f"x{i}" for i in range(510 - len(alphabet) - len(pairs))]
    cases = {   # name -> (layers, (tokens, types, scores) or None, merges)
        "llama-layers-8": (8, None, None),
        "llama-vocab-512": (1, sentencepiece([f"\u2581w{i}" for i in range(253)]), None),
        "gpt2-vocab-512": (1, (byte_level, [3, 3] + [1] * 510, None), [f"{p[0]} {p[1]}" for p in pairs]),
        "llama-long-token": (1, sentencepiece(["a", "\u2581"] + ["a" * 2**i for i in range(1, 13)]),
                             None),
    }
    seeds = {}
    for name, (layers, vocab, merges) in cases.items():
        meta = {**_COMMON_META, **GGUF_SEEDS["llama"][0], "block_count": layers}
        path = tmp / f"{name}.gguf"
        w = GGUFWriter(str(path), "llama")
        for k, v in meta.items():
            _add_meta(w, "llama", k, v)
        if vocab is None:
            _gguf_vocab(w, 32, "llama")
        else:
            tokens, types, scores = vocab
            w.add_tokenizer_model("gpt2" if merges else "llama")
            w.add_token_list(tokens)
            w.add_token_types(types)
            w.add_bos_token_id(tokens.index("<s>"))
            w.add_eos_token_id(tokens.index("</s>"))
            if merges:
                w.add_tokenizer_pre("gpt-2")
                w.add_token_merges(merges)
            else:
                w.add_token_scores(scores)
        V = len(vocab[0]) if vocab else 32
        for cname, shape in _llama_shapes("llama", meta).items():
            shape = (V, *shape[1:]) if cname in ("tok_embeddings", "lm_head") else shape
            x = (rng.standard_normal(shape) * 0.1 + ("norm" in cname)).astype(np.float32)
            w.add_tensor(_gguf_names("llama")(cname), x.astype(np.float16) if x.ndim >= 2 else x)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        seeds[name] = path.read_bytes()
    return seeds


def make_seeds():
    """Rewrite benchmarks/fuzz_corpus/<target>/ and check that every seed converts."""
    from colibri.convert import ConvertError

    with tempfile.TemporaryDirectory() as tmp:
        corpora = {"config": _config_seeds(), "safetensors": _safetensors_seeds(), "gguf": _gguf_seeds(Path(tmp))}
    for target, seeds in corpora.items():
        folder = CORPUS / target
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        for name, data in seeds.items():
            (folder / name).write_bytes(data)
            try:   # each seed converts, not refused
                TARGETS[target](data, refusal_ok=False)
            except ConvertError as e:
                raise SystemExit(f"seed {target}/{name} is refused: {e}")
        print(f"{folder}: {len(seeds)} seeds, {sum(map(len, seeds.values()))} bytes")
    # libFuzzer dictionaries: the config keys and some values worth trying; the GGUF metadata keys
    keys = sorted({k for text in corpora["config"].values() for k in _keys(json.loads(text))})
    values = ["0", "-1", "1e309", "NaN", "-Infinity", "null", "true", "[]", "{}", "1000000000", "4294967296",
              "1e-45", "0.5", '""', '"yarn"', '"longrope"', '"llama3"', '"default"', '"dense"']
    _write_dict(CORPUS / "config.dict", [f'"{k}"' for k in keys] + values)
    from colibri.convert import gguf_arch
    gguf_keys = sorted(set(gguf_arch.KEYS) | {k for extra, _ in GGUF_SEEDS.values() for k in extra})
    _write_dict(CORPUS / "gguf.dict", gguf_keys + ["tokenizer.ggml.", "general.architecture"] + list(GGUF_SEEDS))


def _keys(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from _keys(v)
    elif isinstance(node, list):
        for v in node:
            yield from _keys(v)


def _write_dict(path, entries):
    """A libFuzzer dictionary: one quoted entry a line (quotes and backslashes escaped)."""
    quoted = ['"' + e.replace("\\", "\\\\").replace('"', '\\"') + '"' for e in entries]
    path.write_text("\n".join(quoted) + "\n")


# ------------------------------------------------------------------------------------ fuzz loop

# values a config.json mutant may take: limits, their neighbours, overflows, NaN, wrong types
INTERESTING = [0, 1, -1, 2, 3, 8, 16, 31, 32, 64, 127, 1024, 1025, 4096, 4097, 1 << 16, 1 << 20, 1 << 24,
               (1 << 24) + 1, 2**31 - 1, 2**31, 2**32, 2**63, 2**64, 10**7, 10**9, 10**30, 0.0, -0.0, 0.5, 1e-45,
               1e-38, 1e-30, 1e12, 1e13, 3.4e38, 1e39, float("inf"), float("-inf"), float("nan"), None, True, False,
               "", "x", "silu", "gelu", "yarn", "longrope", "llama3", "linear", "dense", "sparse", "sigmoid", "softmax",
               "noaux_tc", "group_limited_greedy", [], [0], [1, 2], ["full_attention"], ["conv"], {}, {"rope_type": "yarn"}]


def _slots(node, out):
    """Every (container, key) of a JSON document, depth first."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        out.append((node, k))
        _slots(v, out)
    return out


def _config_mutator(atheris, keys):
    """A custom mutator that edits config.json as JSON (a value replaced, scaled or removed; a
    key added), and otherwise mutates the bytes as libFuzzer does."""
    import copy
    import random

    def mutate(data, max_size, seed):
        try:
            return edit(data, max_size, seed)
        except (ValueError, RecursionError):   # a document json cannot write back
            return atheris.Mutate(data, max_size)

    def edit(data, max_size, seed):
        rng = random.Random(seed)
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            doc = None
        if not isinstance(doc, dict) or rng.random() < 0.15:
            return atheris.Mutate(data, max_size)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            slots = _slots(doc, [])
            op = rng.random()
            if op < 0.15 or not slots:
                parent = rng.choice([doc] + [c[k] for c, k in slots if isinstance(c[k], dict)])
                parent[rng.choice(keys)] = copy.deepcopy(rng.choice(INTERESTING))
                continue
            container, key = rng.choice(slots)
            value = container[key]
            if op < 0.3:
                del container[key]
            elif op < 0.55 and isinstance(value, (int, float)) and not isinstance(value, bool):
                container[key] = rng.choice((value + 1, value - 1, value * 2, -value, value * 1000, value // 2
                                             if isinstance(value, int) else value / 2))
            else:
                container[key] = copy.deepcopy(rng.choice(INTERESTING))
        return json.dumps(doc).encode()[:max_size]

    return mutate


def main(argv):
    if argv[1:2] == ["--make-seeds"]:
        return make_seeds()
    if len(argv) < 2 or argv[1] not in TARGETS:
        raise SystemExit(f"usage: {argv[0]} {{{','.join(TARGETS)}}} [libFuzzer flags] [corpus dirs] | --make-seeds")
    target = argv.pop(1)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT if hard == resource.RLIM_INFINITY else min(MEMORY_LIMIT, hard),
                                            hard))
    import atheris

    with atheris.instrument_imports(include=["colibri.convert", "gguf"] if target == "gguf" else ["colibri.convert"]):
        import colibri.convert   # noqa: F401
        import colibri.convert.gguf_import   # noqa: F401
        import colibri.convert.gguf_vocab   # noqa: F401
        if target == "gguf":
            import gguf   # noqa: F401
            import gguf.quants   # noqa: F401
    fn, extra = TARGETS[target], {}
    if target == "config":
        keys = sorted({k for path in (CORPUS / "config").iterdir() for k in _keys(json.loads(path.read_bytes()))})
        extra["custom_mutator"] = _config_mutator(atheris, keys)
    atheris.Setup(argv, fn, **extra)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)

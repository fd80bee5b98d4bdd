"""GGUF import of every MoE family llama.cpp writes: the family's tiny random checkpoint
(support.build, saved with save_pretrained) converted to GGUF by llama.cpp's own converter
(convert_hf_to_gguf.py from the llama-cpp-python source distribution, fetched once into
build/llama-cpp), imported with `colibri convert`, and run against transformers at every position.

The converter leaves out of the file what llama.cpp assumes for the architecture (gguf_arch.py's
docstring); each family's config here is the tiny test config with those settings as llama.cpp
fixes them (OVERRIDES), so that the GGUF and the checkpoint are one model.  The vocabulary is a
128-piece SentencePiece-style table written in place of the converter's tokenizer step (a tiny
random model has no real tokenizer; the converter's BPE path refuses unknown ones).  At Q4_K_M the
family is widened to rows of 256 and the f32 GGUF quantized by tests/kquant.py; the reference is
transformers on the dequantized weights."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import colibri
from colibri._core import interleaved_form
import kquant
from colibri.convert import ConvertError, convert
from support import COMMON, FAMILIES, TESTS, build, hf_logits, require_reference

torch, transformers = require_reference()

WORK = TESTS.parent / "build" / "llama-cpp"
N_TOKENS = 24
YARN_V3 = {**FAMILIES["deepseek_v3"][3]["rope_parameters"], "mscale": 0.8, "mscale_all_dim": 0.8}
# family -> (GGUF architecture, config overrides: what llama.cpp assumes and its converter does not write,
#            config.json additions the hub's configs carry and llama.cpp's converter reads)
CASES = {
    "qwen2_moe": ("qwen2moe", dict(decoder_sparse_step=1, use_sliding_window=False), {}),
    "olmoe": ("olmoe", dict(clip_qkv=None), {}),
    "granitemoe": ("granitemoe", {}, {}),
    "granitemoeshared": ("granitemoe", {}, {}),
    "phimoe": ("phimoe", dict(router_jitter_noise=0.01, rope_parameters={
        **FAMILIES["phimoe"][3]["rope_parameters"],
        "short_mscale": float(np.sqrt(1 + np.log(256 / 64) / np.log(64))),
        "long_mscale": float(np.sqrt(1 + np.log(256 / 64) / np.log(64)))}), {"architectures": ["PhiMoEForCausalLM"]}),
    "deepseek_v2": ("deepseek2", dict(n_group=1, topk_group=1), {}),
    "deepseek_v3": ("deepseek2", dict(rope_parameters=YARN_V3), {"scoring_func": "sigmoid"}),
    "glm4_moe": ("glm4moe", {}, {}),
    # the converter reads the dense layers from first_k_dense_replace only (GLM-4.7-Flash's hub config has both)
    "glm4_moe_lite": ("deepseek2", {}, {"scoring_func": "sigmoid", "first_k_dense_replace": 1}),
    "dots1": ("dots1", dict(sliding_window=None), {"scoring_func": "sigmoid"}),
    "ernie4_5_moe": ("ernie4_5-moe", {}, {}),
    "lfm2_moe": ("lfm2moe", dict(conv_bias=False, routed_scaling_factor=1.0), {}),
    "gpt_oss": ("gpt-oss", dict(swiglu_limit=7.0), {}),
    "llama4_text": ("llama4", dict(attention_chunk_size=8192, no_rope_layer_interval=4, floor_scale=8192,
                                   attn_scale=0.1), {}),
}
F32_IN_F16_GGUF = ("gate.weight", "router.weight", "router.layer.weight", "conv.conv.weight")

# llama.cpp's converter with the vocabulary written directly: <unk> <s> </s> and word pieces
CONVERTER = """
import sys
sys.path.insert(0, sys.argv.pop(1))
import convert_hf_to_gguf

def set_vocab(self):
    V, w = self.hparams["vocab_size"], self.gguf_writer
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(["<unk>", "<s>", "</s>"] + [f"\\u2581w{i}" for i in range(V - 3)])
    w.add_token_scores([0.0, 0.0, 0.0] + [-float(i) for i in range(V - 3)])
    w.add_token_types([2, 3, 3] + [1] * (V - 3))
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

_get = convert_hf_to_gguf.get_model_class
def get_model_class(*args, **kwargs):
    cls = _get(*args, **kwargs)
    cls.set_vocab = set_vocab
    return cls
convert_hf_to_gguf.get_model_class = get_model_class
convert_hf_to_gguf.main()
"""


def llama_cpp_tree():
    """llama.cpp's source tree, from the llama-cpp-python sdist the benchmark uses (cached)."""
    spec = importlib.util.spec_from_file_location("vs_llamacpp", TESTS.parent / "benchmarks" / "vs_llamacpp.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    WORK.mkdir(parents=True, exist_ok=True)
    sdist = WORK / f"llama_cpp_python-{bench.LLAMA_CPP_VERSION}.tar.gz"
    tree = WORK / f"llama_cpp_python-{bench.LLAMA_CPP_VERSION}" / "vendor" / "llama.cpp"
    if not (tree / "convert_hf_to_gguf.py").exists() and not sdist.exists():
        # only this package from source: with --no-binary :all: pip builds its build tools (cmake) too
        r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python",
                            f"llama-cpp-python=={bench.LLAMA_CPP_VERSION}", "-d", str(WORK)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            pytest.skip(f"llama.cpp's converter not available (pip download llama-cpp-python failed: {r.stderr[-500:]})")
    return bench.llama_cpp_source(WORK)


def wide(family):
    """Config overrides that make most matrices' rows 256 long, one K-quant block: hidden and (dense
    or expert) intermediate size 256, 16 heads of 16 where the head size follows from the hidden
    size (so that RoPE's tables keep their length)."""
    kwargs = FAMILIES[family][3]
    heads = {} if "head_dim" in kwargs or "kv_lora_rank" in kwargs else {"num_attention_heads": 16}
    return dict(hidden_size=256, intermediate_size=256, **heads)


def gguf_of(family, outtype, root, wider=False):
    """(GGUF path, transformers model): the family's checkpoint through llama.cpp's converter
    (wider: with wide(family)'s sizes)."""
    arch, overrides, extra = CASES[family]
    hf = build(family, **overrides, **(wide(family) if wider else {}))
    src = root / family / ("hf-wide" if wider else "hf")
    out = root / family / f"{outtype}{'-wide' if wider else ''}.gguf"
    if not out.exists():
        hf.save_pretrained(src)
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, **extra}, indent=1))
        env = {k: v for k, v in os.environ.items() if k != "NO_LOCAL_GGUF"}   # the tree's own gguf-py first
        r = subprocess.run([sys.executable, "-c", CONVERTER, str(llama_cpp_tree()), str(src), "--outtype", outtype,
                            "--outfile", str(out)], capture_output=True, text=True, env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-4000:]
    return out, hf


@pytest.fixture(scope="session")
def gguf_root(tmp_path_factory):
    return tmp_path_factory.mktemp("gguf-families")


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("family", list(CASES))
def test_llamacpp_gguf_runs_as_transformers(family, outtype, gguf_root):
    path, hf = gguf_of(family, outtype, gguf_root)
    from gguf import GGUFReader
    arch = bytes(GGUFReader(str(path)).fields["general.architecture"].parts[-1]).decode()
    assert arch == CASES[family][0]
    model = colibri.Model(convert(path, gguf_root / family / f"colibri-{outtype}", progress=False), verify=True)
    if outtype == "f16":   # transformers on the weights the file holds: llama.cpp keeps routers, convolution
        with torch.no_grad():   # kernels and biases in f32
            for name, p in hf.named_parameters():
                if p.ndim >= 2 and not name.endswith(F32_IN_F16_GGUF) and "bias" not in name:
                    p.copy_(p.half().float())
    tokens = np.random.default_rng(1).integers(0, COMMON["vocab_size"], N_TOKENS)
    ours = model.session(ctx=64, kernels="reference").forward(tokens)
    ref = hf_logits(hf, tokens)
    print(f"{family} ({arch}) gguf {outtype}: max |colibri - transformers| = {np.abs(ours - ref).max():.2e} "
          f"over {ours.size} logits")
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)


def test_colibri_convert_and_generate_on_a_llamacpp_gguf(gguf_root, tmp_path):
    """The command line on DeepSeek-V3's GGUF (latent attention, kv_b rejoined, YaRN, grouped sigmoid
    router): `colibri convert x.gguf`, then `colibri generate --tokens` gives transformers' greedy tokens."""
    path, hf = gguf_of("deepseek_v3", "f32", gguf_root)
    run = dict(capture_output=True, text=True, timeout=300, cwd="/")   # the installed colibri, not the source tree
    r = subprocess.run([sys.executable, "-m", "colibri", "convert", str(path), str(tmp_path / "m"), "--quiet"], **run)
    assert r.returncode == 0, r.stderr
    prompt = [5, 17, 99, 42, 3, 64]
    r = subprocess.run([sys.executable, "-m", "colibri", "generate", "--model", str(tmp_path / "m"), "--tokens",
                        ",".join(map(str, prompt)), "--max-tokens", "10", "--temperature", "0", "--ignore-eos"], **run)
    assert r.returncode == 0, r.stderr
    seq = list(prompt)
    for _ in range(10):
        seq.append(int(np.argmax(hf_logits(hf, seq)[-1])))
    assert [int(t) for t in r.stdout.strip().split(",")] == seq[len(prompt):]


def rewritten(src, dst, drop_keys=(), add_keys=(), drop_tensors=(), add_tensors=(), retype=None):
    """A copy of the f32 GGUF `src` with keys and tensors taken out or put in; retype(name, array)
    -> (array, GGML type or None for the array's own) rewrites tensors."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter
    r = GGUFReader(str(src))
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(str(dst), arch)
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        array = field.types[0] == GGUFValueType.ARRAY
        w.add_key_value(key, field.contents(), field.types[0], sub_type=field.types[1] if array else None)
    for key, value, kind in add_keys:
        w.add_key_value(key, value, kind)
    for t in r.tensors:
        if t.name not in drop_tensors:
            data, kind = (retype or (lambda _, x: (x, None)))(t.name, np.array(t.data))
            w.add_tensor(t.name, data, raw_dtype=kind)
    for name, x in add_tensors:
        w.add_tensor(name, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_what_colibri_cannot_express_is_refused_by_name(gguf_root, tmp_path):
    from gguf import GGUFValueType
    cases = [
        ("qwen2_moe", dict(add_keys=[("qwen2moe.attention.sliding_window", 4, GGUFValueType.UINT32)]),
         r"unsupported: qwen2moe.attention.sliding_window in gguf qwen2moe"),
        ("dots1", dict(drop_keys={"dots1.expert_gating_func"}), r"unsupported: dots1.expert_gating_func missing in gguf dots1"),
        ("olmoe", dict(add_tensors=[("blk.0.attn_sinks.weight", np.zeros(4, np.float32))]),
         r"unsupported: tensor `blk.0.attn_sinks.weight` in gguf olmoe"),
        ("granitemoe", dict(drop_tensors={"blk.1.attn_q.bias"}), r"gguf granitemoe: no tensor for colibri `layers.1.attn.bq`"),
        ("gpt_oss", dict(add_keys=[("gpt-oss.rope.dimension_count", 8, GGUFValueType.UINT32)]),
         r"unsupported: gpt-oss.rope.dimension_count 8 \(partial RoPE\) in gguf gpt-oss"),
    ]
    for i, (family, change, message) in enumerate(cases):
        bad = rewritten(gguf_of(family, "f32", gguf_root)[0], tmp_path / f"{i}.gguf", **change)
        with pytest.raises(ConvertError, match=message):
            convert(bad, tmp_path / f"out{i}", progress=False)


def test_a_vector_written_without_its_unit_dimension_imports_as_the_same_model(gguf_root, tmp_path):
    """llama.cpp's quantizer writes qwen2moe's shared-expert gate (1, hidden) as (hidden,): the same
    model, to the bit, as the converter's file."""
    src = gguf_of("qwen2_moe", "f32", gguf_root)[0]
    flat = rewritten(src, tmp_path / "flat.gguf",
                     retype=lambda name, x: (x.reshape(-1) if "ffn_gate_inp_shexp" in name else x, None))
    from gguf import GGUFReader
    assert all(len(t.shape) == 1 for t in GGUFReader(str(flat)).tensors if "ffn_gate_inp_shexp" in t.name)
    tokens = np.random.default_rng(1).integers(0, COMMON["vocab_size"], N_TOKENS)
    logits = [colibri.Model(convert(f, tmp_path / f.stem, progress=False)).session(ctx=64, kernels="reference").forward(tokens)
              for f in (src, flat)]
    assert np.array_equal(logits[0].view(np.uint32), logits[1].view(np.uint32))


# llama.cpp's Q4_K_M keeps these at 6 bits (roughly; the last is a whole name, attn_output is not one)
Q6_K_IN_Q4_K_M = ("attn_v.", "ffn_down", "output.weight")


def q4_k_m(src, dst):
    """(dst, {f32 row bytes: its dequantized row}): the f32 GGUF `src` rewritten Q4_K_M-style by
    tests/kquant.py: every matrix whose rows are whole 256-blocks in Q4_K, Q6_K_IN_Q4_K_M in Q6_K,
    routers, norms, biases and shorter rows as they were."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    rows = {}

    def retype(name, x):
        if x.ndim < 2 or x.shape[-1] % 256 or "ffn_gate_inp" in name or not name.endswith(".weight"):
            return x, None
        six = any(k in name for k in Q6_K_IN_Q4_K_M[:2]) or name == Q6_K_IN_Q4_K_M[2]
        kind = GGMLQuantizationType.Q6_K if six else GGMLQuantizationType.Q4_K
        q = kquant.quantize(x, kind)
        flat = x.reshape(-1, x.shape[-1])
        rows.update(zip((r.tobytes() for r in flat), dequantize(q, kind).reshape(flat.shape)))
        return q, kind
    return rewritten(src, dst, retype=retype), rows


def dequantized_into(hf, rows):
    """hf with each matrix the file holds quantized replaced by its dequantized values, found by
    their rows (the converter stacks, splits, permutes or transposes matrices, never changes a
    row): a parameter's rows, or its columns, all in `rows`."""
    used = set()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            for transposed in ((False, True) if p.ndim >= 2 else ()):
                w = (p.transpose(-1, -2) if transposed else p).contiguous().numpy()
                if w.shape[-1] % 256:
                    continue
                keys = [r.tobytes() for r in w.reshape(-1, w.shape[-1])]
                found = [k in rows for k in keys]
                if not any(found):
                    continue
                assert all(found), f"{name}: only some of its rows are in the file"
                new = torch.from_numpy(np.stack([rows[k] for k in keys]).reshape(w.shape))
                p.copy_(new.transpose(-1, -2) if transposed else new)
                used.update(keys)
                break
    assert len(used) == len(rows), f"{len(rows) - len(used)} quantized rows of the file not in the checkpoint"
    return hf


@pytest.mark.parametrize("kind, bound", [("Q4_K", 0.07), ("Q6_K", 0.02)])
def test_the_test_k_quantizer_writes_blocks_gguf_reads_back(kind, bound):
    """tests/kquant.py's blocks through gguf's own dequantizer: each weight within `bound` of the
    row's largest (half a step and the scales' rounding; a misplaced field is far off), zero rows
    and one-signed sub-blocks too."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize
    x = (np.random.default_rng(2).standard_normal((8, 512)) * 0.1).astype(np.float32)
    x[0], x[1, :256], x[2, 256:] = 0, np.abs(x[1, :256]), -np.abs(x[2, 256:])
    q = kquant.quantize(x, GGMLQuantizationType[kind])
    assert q.dtype == np.uint8 and q.shape == (8, 2 * kquant.QUANTIZERS[GGMLQuantizationType[kind]][1])
    err = np.abs(dequantize(q, GGMLQuantizationType[kind]) - x)
    assert err[0].max() == 0 and (err <= bound * np.abs(x).max(-1, keepdims=True)).all(), err.max()


@pytest.mark.parametrize("family", list(CASES))
def test_a_q4_k_m_gguf_converts_and_generates_as_transformers_on_its_dequantized_weights(family, gguf_root, tmp_path):
    """The family widened (wide()), its llama.cpp f32 GGUF quantized Q4_K_M-style; `colibri convert`,
    then its logits and `colibri generate --temperature 0`'s tokens, both on the reference kernels
    (float activations: the int8 path's rounding is not transformers'), against transformers on the
    dequantized weights."""
    src, hf = gguf_of(family, "f32", gguf_root, wider=True)
    path, rows = q4_k_m(src, tmp_path / "q4_k_m.gguf")
    hf = dequantized_into(hf, rows)
    run = dict(capture_output=True, text=True, timeout=300, cwd="/")   # the installed colibri, not the source tree
    r = subprocess.run([sys.executable, "-m", "colibri", "convert", str(path), str(tmp_path / "m"), "--quiet"], **run)
    assert r.returncode == 0, r.stderr
    model = colibri.Model(tmp_path / "m", verify=True)
    kinds = {t["name"]: t["dtype"] for t in model.tensors()}
    experts = {v for k, v in kinds.items() if k.endswith("experts.w1")}
    # the default conversion: each matmul in the layout the kernels here run fastest (q4_kx8 on x86)
    q4_k, q6_k = (interleaved_form(k, fast_here=True) or k for k in ("q4_k", "q6_k"))
    assert experts == {q4_k} and q6_k in kinds.values(), kinds
    tokens = np.random.default_rng(1).integers(0, COMMON["vocab_size"], N_TOKENS)
    ours = model.session(ctx=64, kernels="reference").forward(tokens)
    ref = hf_logits(hf, tokens)
    counts = {k: list(kinds.values()).count(k) for k in sorted(set(kinds.values()))}
    print(f"{family} gguf Q4_K_M (tensors by type {counts}): max |colibri - transformers| = "
          f"{np.abs(ours - ref).max():.2e} over {ours.size} logits")
    np.testing.assert_allclose(ours, ref, atol=1e-4, rtol=0)
    prompt = [5, 17, 99, 42, 3, 64]
    r = subprocess.run([sys.executable, "-m", "colibri", "generate", "--model", str(tmp_path / "m"), "--tokens",
                        ",".join(map(str, prompt)), "--max-tokens", "6", "--temperature", "0", "--ignore-eos"],
                       **run, env={**os.environ, "COLIBRI_KERNELS": "reference"})
    assert r.returncode == 0, r.stderr
    seq = list(prompt)
    for _ in range(6):
        seq.append(int(np.argmax(hf_logits(hf, seq)[-1])))
    assert [int(t) for t in r.stdout.strip().split(",")] == seq[len(prompt):]

"""GGUF import of every MoE family llama.cpp writes: the family's tiny random checkpoint
(support.build, saved with save_pretrained) converted to GGUF by llama.cpp's own converter
(convert_hf_to_gguf.py from the llama-cpp-python source distribution, fetched once into
build/llama-cpp), imported with `colibri convert`, and run against transformers at every position.

The converter leaves out of the file what llama.cpp assumes for the architecture (gguf_arch.py's
docstring); each family's config here is the tiny test config with those settings as llama.cpp
fixes them (OVERRIDES), so that the GGUF and the checkpoint are one model.  The vocabulary is a
128-piece SentencePiece-style table written in place of the converter's tokenizer step (a tiny
random model has no real tokenizer; the converter's BPE path refuses unknown ones)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import colibri
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
    try:
        return bench.llama_cpp_source(WORK)
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"llama.cpp's converter not available (pip download llama-cpp-python failed: {e})")


def gguf_of(family, outtype, root):
    """(GGUF path, transformers model): the family's checkpoint through llama.cpp's converter."""
    arch, overrides, extra = CASES[family]
    hf = build(family, **overrides)
    src = root / family / "hf"
    out = root / family / f"{outtype}.gguf"
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

"""GGUF's block formats (Q4_K, Q6_K, Q5_K, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS, MXFP4, Q3_K, Q2_K) in
the core: its reference dequantization is the gguf package's bit for bit, its matmul is an exact
dot of those weights to the stated rounding, every kernel set takes the reference for them, and a
GGUF model with its matrices in a format runs as the same model with the weights dequantized to
f32.  The matrices go through c_core/tests/quant_cli (the release and the ASan/UBSan builds); the
models through `colibri convert` and a Session."""
import struct
import subprocess
import sys

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

import colibri
from colibri._core import interleaved_form
from colibri.convert import ConvertError, convert
from colibri.targets import RUNNER, build, env_for, infer_binary, source_dir

# format -> (byte offset of the first f16 scale in a block, how many f16 scales follow it)
FORMATS = {"Q4_K": (0, 2), "Q6_K": (208, 1), "Q5_K": (0, 2), "Q4_1": (0, 2), "Q5_0": (0, 1), "Q5_1": (0, 2),
           "IQ4_NL": (0, 1), "IQ4_XS": (0, 1), "MXFP4": (0, 0), "Q3_K": (108, 1), "Q2_K": (80, 2)}
QUANTIZABLE = {"Q4_1", "Q5_0", "Q5_1", "MXFP4"}   # those gguf.quants.quantize writes
INT8 = {"Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL", "MXFP4", "Q4_1", "Q5_0", "Q5_1", "Q3_K", "Q2_K"}   # the int8 path's: activations rounded to int8 blocks of 32
# (one scale per 32, or per 256 for the formats of 256-weight blocks, as llama.cpp's Q8_K)
U = 2.0 ** -24   # float32's unit roundoff
U64 = 2.0 ** -53


def qtype(name):
    return GGMLQuantizationType[name]


def random_blocks(name, rows, cols, rng, target=None):
    """(rows, row bytes) uint8: random bytes, the scale fields finite f16 (mxfp4: exponents of moderate
    floats).  target: scale the blocks so max |weight| is about that (one factor on every scale field
    scales every weight of these formats by it); else scales of mixed sign and size, subnormal ones too."""
    block, block_bytes = GGML_QUANT_SIZES[qtype(name)]
    at, count = FORMATS[name]
    w = rng.integers(0, 256, (rows, cols // block, block_bytes), dtype=np.uint8)
    if name == "MXFP4":
        w[..., 0] = rng.integers(118, 123, w.shape[:2]) if target else rng.integers(90, 160, w.shape[:2])
        return w.reshape(rows, -1)
    if target is None:
        size = rng.choice(np.array([1e-6, 1e-3, 0.1, 1.0, 30.0], np.float32), (*w.shape[:2], count))
        scales = (rng.uniform(-1, 1, size.shape) * size).astype(np.float16)
    else:
        w[..., at:at + 2 * count] = np.ones((*w.shape[:2], count), np.float16).view(np.uint8)
        peak = float(np.abs(dequantize(w.reshape(rows, -1), qtype(name))).max())
        scales = (rng.uniform(0.5, 1.0, (*w.shape[:2], count)) * target / peak).astype(np.float16)
    w[..., at:at + 2 * count] = scales.view(np.uint8)
    return w.reshape(rows, -1)


@pytest.fixture(scope="module", params=["native", "sanitize", "aarch64", "riscv64", "riscv64-rvv"])
def quant_cli(request):
    """(matrix runner, the kernel sets to run it with) on the release, the ASan/UBSan, the aarch64
    (under QEMU: NEON's dispatch), the riscv64 build (the reference alone) or the riscv64 build
    with the vector kernels (under QEMU with V, VLEN 256)."""
    kind = request.param
    binary = [*RUNNER.get(kind, []), str(build(kind) / "c_core" / "tests" / "quant_cli")]
    # avx512-bf16 rounds the activations of bf16 weights to bf16 (test_kernels.c checks it so)
    runs = [k for k, ok in colibri.kernel_variants().items() if ok and k != "avx512-bf16"]
    runs = {"native": runs, "sanitize": ["reference", "reference-int8", runs[-1]],
            "aarch64": ["reference", "reference-int8", "neon", "neon-dotprod"],
            "riscv64-rvv": ["reference", "reference-int8", "rvv"]}.get(kind, ["reference", "reference-int8"])

    def run(name, kernels, w, x, tmp_path):
        """(dequantized W (rows, cols) f32, y = x @ W^T (n, rows) f32, y by the int8 path or None)
        from the core; None where this CPU does not run those kernels."""
        rows, cols = w.shape[0], w.shape[1] // GGML_QUANT_SIZES[qtype(name)][1] * GGML_QUANT_SIZES[qtype(name)][0]
        w.tofile(tmp_path / "w")
        np.ascontiguousarray(x, np.float32).tofile(tmp_path / "x")
        r = subprocess.run([*binary, name.lower(), kernels, str(rows), str(cols), str(tmp_path / "w"),
                            str(tmp_path / "x"), str(tmp_path / "out")], capture_output=True, text=True, env=env_for(kind))
        if r.returncode == 77 and kernels != "reference":
            return None
        assert r.returncode == 0, r.stdout + r.stderr
        out = np.fromfile(tmp_path / "out", np.float32)
        q8 = out[rows * cols + len(x) * rows:].reshape(len(x), rows) if out.size > rows * cols + len(x) * rows else None
        return out[:rows * cols].reshape(rows, cols), out[rows * cols:rows * cols + len(x) * rows].reshape(len(x), rows), q8
    return run, runs


def test_generated_tables_are_current():
    header = (source_dir() / "c_core" / "src" / "ops" / "quant_tables.h").read_text()
    script = source_dir() / "c_core" / "src" / "ops" / "gen_quant_tables.py"
    assert subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=True).stdout == header


@pytest.mark.parametrize("name", FORMATS)
def test_dequantization_is_gguf_bit_for_bit(quant_cli, name, tmp_path):
    run, _ = quant_cli
    rng = np.random.default_rng(sum(map(ord, name)))
    block = GGML_QUANT_SIZES[qtype(name)][0]
    cases = [random_blocks(name, 7, 4 * block, rng)]
    if name in QUANTIZABLE:   # blocks as a quantizer writes them
        cases.append(quantize(rng.standard_normal((5, 8 * block)).astype(np.float32) * 0.1, qtype(name)))
    for w in cases:
        ours, _, _ = run(name, "reference", w, np.ones((1, w.shape[1] // GGML_QUANT_SIZES[qtype(name)][1] * block)), tmp_path)
        theirs = dequantize(w, qtype(name))
        assert ours.shape == theirs.shape
        assert np.array_equal(ours.view(np.uint32), theirs.view(np.uint32)), \
            f"{name}: {np.count_nonzero(ours != theirs)} of {ours.size} weights differ"


@pytest.mark.parametrize("name", FORMATS)
def test_matmul_is_the_exact_dot_rounded(quant_cli, name, tmp_path):
    """y = x @ W^T: the reference sums exact products (float * float fits a double) in double, then
    rounds once to float, so |y - dot| <= U |dot| + n U64 sum|w_i x_i| (numpy's float64 dot adds at most as
    much again); every other kernel set takes the reference for these formats, bit for bit."""
    run, kernel_sets = quant_cli
    rng = np.random.default_rng(1 + sum(map(ord, name)))
    block = GGML_QUANT_SIZES[qtype(name)][0]
    cols = 3 * block
    w = random_blocks(name, 9, cols, rng, target=0.1)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    deq, y, _ = run(name, "reference", w, x, tmp_path)
    a, xx = deq.astype(np.float64), x.astype(np.float64)
    dot = xx @ a.T
    bound = U * np.abs(dot) + 2 * cols * U64 * (np.abs(xx) @ np.abs(a).T)
    assert (np.abs(y - dot) <= bound).all(), f"{name}: |y - dot| / bound up to {(np.abs(y - dot) / bound).max():.2f}"
    for kernels in kernel_sets:
        got = run(name, kernels, w, x, tmp_path)
        assert got is not None or kernels == "neon-dotprod", f"no {kernels} kernels"
        yk = y if got is None else got[1]
        assert np.array_equal(yk.view(np.uint32), y.view(np.uint32)), f"{name} with the {kernels} kernels"


def quantize_activations(x, group):
    """x (n, cols) as the core's int8 blocks of 32 (ops.h), in float32 as it computes them: d = max|x| / 127
    over each `group` (32, or 256 for the 256-weight formats), q = round-half-even(x * (1 / d)); returns
    d * q (n, cols) float64."""
    blocks = x.reshape(len(x), -1, group)
    d = np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)
    inv = np.where(d != 0, np.float32(1) / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    return (d.astype(np.float64) * np.rint(blocks * inv).astype(np.float64)).reshape(x.shape)


def weight_parts(name, w):
    """|scale part| + |min part| of each weight (rows, cols) float64: where a block's second f16 is a
    min (weight = d ... - dmin m), the int8 path sums the two parts apart, so its rounding is relative
    to both; |weight| elsewhere."""
    at, count = FORMATS[name]
    if count < 2:
        return np.abs(dequantize(w, qtype(name)).astype(np.float64))
    blocks = w.reshape(w.shape[0], -1, GGML_QUANT_SIZES[qtype(name)][1])
    parts = []
    for zeroed in (at + 2, at):
        b = blocks.copy()
        b[..., zeroed:zeroed + 2] = 0
        parts.append(np.abs(dequantize(b.reshape(w.shape), qtype(name)).astype(np.float64)))
    return parts[0] + parts[1]


@pytest.mark.parametrize("name", sorted(INT8))
def test_int8_path_is_the_dot_of_int8_activations(quant_cli, name, tmp_path):
    """Every kernel set's int8 path (reference-int8's scalar one too) against float64: with the
    activations as the core rounds them (x^ = d q), the exact dot to float rounding, (cols / 32 + 8)
    2^-22 of sum |x^| (|scale part| + |min part|) (per block a few roundings, then the block sums);
    with x itself, the format's budget: rounding moves each x by at most amax / 254 of its scale's
    group, so |y - x W^T| <= sum over groups amax / 254 sum |w|, plus that float rounding."""
    run, kernel_sets = quant_cli
    rng = np.random.default_rng(3 + sum(map(ord, name)))
    block = GGML_QUANT_SIZES[qtype(name)][0]
    group = 256 if block == 256 else 32
    cols = max(3 * block, 256)
    x = rng.standard_normal((3, cols)).astype(np.float32)
    x[1, :group] = 0   # a group of zeros: d = 0
    x[2, :16] *= 40    # a group whose scale its largest value sets
    for w in (random_blocks(name, 9, cols, rng, target=0.1), random_blocks(name, 5, cols, rng)):
        deq = dequantize(w, qtype(name)).astype(np.float64)
        xq, parts = quantize_activations(x, group), weight_parts(name, w)
        rounding = (cols / 32 + 8) * 2.0 ** -22 * (np.abs(xq) @ parts.T) + 1e-30
        amax = np.abs(x.reshape(3, -1, group)).max(axis=2).astype(np.float64)   # (n, groups)
        wsum = np.abs(deq).reshape(len(w), -1, group).sum(axis=2)               # (rows, groups)
        budget = amax / 254 * (1 + 1e-6) @ wsum.T + cols * 2.0 ** -22 * (np.abs(x.astype(np.float64)) @ parts.T)
        ran = []
        for kernels in kernel_sets:
            got = run(name, kernels, w, x, tmp_path)
            if got is None or got[2] is None:
                assert kernels in ("reference", "neon-dotprod"), f"no int8 path in {kernels}"
                continue
            ran.append(kernels)
            y = got[2].astype(np.float64)
            err = np.abs(y - xq @ deq.T)
            assert (err <= rounding).all(), f"{name} {kernels}: |y - x^ W^T| / bound up to {(err / rounding).max():.2f}"
            err = np.abs(y - x.astype(np.float64) @ deq.T)
            assert (err <= budget).all(), f"{name} {kernels}: |y - x W^T| / budget up to {(err / budget).max():.2f}"
        assert "reference-int8" in ran


# ------------------------------------------------------------------------------------ models

D, F, HEADS, KV_HEADS, LAYERS, EXPERTS, VOCAB = 256, 256, 4, 2, 2, 4, 256
TOKENS = np.random.default_rng(11).integers(0, VOCAB, 12).astype(np.int32)


def model_tensors(kinds, rng):
    """{GGUF name: (GGUF type name, data)} of a tiny Mixtral-style model: norms F32, each matrix in
    kinds(name) (quantized by gguf where it can, else random blocks of weights up to about 0.1)."""
    shapes = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,), "output.weight": (VOCAB, D)}
    for i in range(LAYERS):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (D,), p + "ffn_norm.weight": (D,),
                       p + "attn_q.weight": (HEADS * 64, D), p + "attn_k.weight": (KV_HEADS * 64, D),
                       p + "attn_v.weight": (KV_HEADS * 64, D), p + "attn_output.weight": (D, HEADS * 64),
                       p + "ffn_gate_inp.weight": (EXPERTS, D), p + "ffn_gate_exps.weight": (EXPERTS, F, D),
                       p + "ffn_up_exps.weight": (EXPERTS, F, D), p + "ffn_down_exps.weight": (EXPERTS, D, F)})
    out = {}
    for name, shape in shapes.items():
        kind = "F32" if len(shape) == 1 else kinds(name)
        if kind == "F32":
            x = 1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.05 * rng.standard_normal(shape)
            out[name] = (kind, x.astype(np.float32))
        elif kind in QUANTIZABLE:
            out[name] = (kind, quantize((0.05 * rng.standard_normal(shape)).astype(np.float32), qtype(kind)))
        else:
            rows = int(np.prod(shape[:-1]))
            out[name] = (kind, random_blocks(kind, rows, shape[-1], rng, target=0.1).reshape(*shape[:-1], -1))
    return out


def write_gguf(path, tensors):
    out = GGUFWriter(str(path), "llama")
    out.add_context_length(64)
    out.add_embedding_length(D)
    out.add_block_count(LAYERS)
    out.add_feed_forward_length(F)
    out.add_head_count(HEADS)
    out.add_head_count_kv(KV_HEADS)
    out.add_rope_freq_base(10000.0)
    out.add_layer_norm_rms_eps(1e-5)
    out.add_expert_count(EXPERTS)
    out.add_expert_used_count(2)
    out.add_rope_dimension_count(64)
    for name, (kind, data) in tensors.items():
        if kind == "F32":
            out.add_tensor(name, data)
        else:
            out.add_tensor(name, data, raw_dtype=qtype(kind))
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()
    return path


def dequantized(tensors):
    return {name: ("F32", data if kind == "F32" else dequantize(data, qtype(kind))) for name, (kind, data) in tensors.items()}


def stored_as(kind):
    """What a conversion stores a matmul's GGUF type (rows in groups of 8) as by default: its
    interleaved form where the kernels here run that faster (colibri_interleaved_form), else itself."""
    return interleaved_form(kind.lower(), fast_here=True) or kind.lower()


def check_runs_as_f32(tensors, tmp_path):
    """The model in its formats against the same weights in f32: under the reference kernels the same
    bits (each weight is gguf's float, each product and sum the same double operations in the same
    order); with this CPU's kernels (COLIBRI_KERNELS picks them) the f32 matmuls accumulate in float,
    n U per output at most (n <= 256 here), through two layers: within 64 n U of the logits' size (the
    int8 path's formats: of reference-int8's logits)."""
    ours = colibri.Model(convert(write_gguf(tmp_path / "q.gguf", tensors), tmp_path / "q", progress=False), verify=True)
    f32 = colibri.Model(convert(write_gguf(tmp_path / "f.gguf", dequantized(tensors)), tmp_path / "f", progress=False))
    kinds = {t["name"]: t["dtype"] for t in ours.tensors()}
    assert kinds["layers.0.experts.w1"] == stored_as(tensors["blk.0.ffn_gate_exps.weight"][0])
    assert ours.weight_bytes == sum(data.nbytes for _, data in tensors.values())
    session = ours.session(ctx=32)
    assert session.memory()["weights"] == ours.weight_bytes
    report = session.memdump()
    assert all(f"{t['file_size']:,} B" in report for t in ours.tensors())
    a = ours.session(ctx=32, kernels="reference").forward(TOKENS)
    b = f32.session(ctx=32, kernels="reference").forward(TOKENS)
    assert np.isfinite(a).all() and np.abs(a).max() > 0
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    fast_q, fast_f = session.forward(TOKENS), f32.session(ctx=32).forward(TOKENS)
    scale = np.abs(fast_f).max()
    if any(kind in INT8 for kind, _ in tensors.values()) and session.kernels != "reference":
        # the int8 path: the same integers as reference-int8's, float sums in another order.  It moved
        # the logits from the float ones (how far is no bound: a step of 1/127 can flip a router's choice)
        int8 = ours.session(ctx=32, kernels="reference-int8").forward(TOKENS)
        print(f"{session.kernels}: max |q - reference-int8| = {np.abs(fast_q - int8).max():.2e}, "
              f"|reference-int8 - f32| = {np.abs(int8 - a).max():.2e} of {scale:.2e}")
        assert np.abs(int8 - a).max() > 0
        # Float order can flip an activation's rounding (a step of d |w|) or a router's choice
        # downstream, and the KV cache carries the jump to the later tokens: no rounding bound holds
        # across it.  Without one the logits agree to 1e-6; a jump moves them by well under 5% (measured
        # 0.8%), a wrong kernel by about their size; one matmul: test_int8_path_is_the_dot_of_int8_activations.
        print(f"per token: {np.abs(fast_q - int8).max(axis=1)}")
        assert np.abs(fast_q - int8).max() <= 0.05 * scale
        return
    print(f"{session.kernels}: max |q - f32| = {np.abs(fast_q - fast_f).max():.2e} of {scale:.2e}")
    assert np.abs(fast_q - fast_f).max() <= 64 * 256 * U * scale


@pytest.mark.parametrize("name", FORMATS)
def test_a_model_in_the_format_runs_as_its_f32_weights(name, tmp_path):
    check_runs_as_f32(model_tensors(lambda _: name, np.random.default_rng(2 + sum(map(ord, name)))), tmp_path)


def test_a_q4_k_m_style_file_imports_and_runs(tmp_path):
    """Q4_K matrices, Q6_K for the embeddings, lm_head, attn_v and ffn_down (as llama.cpp's Q4_K_M
    mixes them), F32 norms and router."""
    def kind(name):
        if "ffn_gate_inp" in name:
            return "F32"
        return "Q6_K" if any(k in name for k in ("token_embd", "output.", "attn_v", "ffn_down")) else "Q4_K"
    tensors = model_tensors(kind, np.random.default_rng(3))
    check_runs_as_f32(tensors, tmp_path)
    kinds = {t["name"]: t["dtype"] for t in colibri.Model(tmp_path / "q").tensors()}
    assert kinds["tok_embeddings"] == "q6_k" and kinds["layers.1.attn.wq"] == stored_as("Q4_K")
    assert kinds["layers.1.router"] == "f32" and kinds["norm"] == "f32"
    stacked = colibri.Model(tmp_path / "q").session(ctx=32, kernels="reference").forward(TOKENS)
    interleaved = colibri.Model(convert(tmp_path / "q.gguf", tmp_path / "i", progress=False, layout="interleaved"), verify=True)
    assert np.array_equal(interleaved.session(ctx=32, kernels="reference").forward(TOKENS).view(np.uint32), stacked.view(np.uint32))
    for model in ("q", "i"):   # loaded, validated and run under ASan/UBSan, streaming the experts too
        for extra in ([], ["--expert_budget", "512K"]):
            r = subprocess.run([str(infer_binary("sanitize")), "--model", str(tmp_path / model), "--reference", "--ctx", "32",
                                "--tokens", ",".join(map(str, TOKENS)), "--max_tokens", "0", "--logits", str(tmp_path / "l.f32"),
                                *extra], capture_output=True, text=True, env=env_for("sanitize"))
            assert r.returncode == 0, r.stdout + r.stderr
            assert np.array_equal(np.fromfile(tmp_path / "l.f32", np.uint32), stacked.view(np.uint32).ravel())
        r = subprocess.run([str(infer_binary("sanitize")), "--model", str(tmp_path / model), "--validate-model"],
                           capture_output=True, text=True, env=env_for("sanitize"))
        assert r.returncode == 0, r.stdout + r.stderr


def test_unknown_types_and_wrong_sizes_are_refused(tmp_path):
    tensors = model_tensors(lambda _: "Q4_K", np.random.default_rng(4))
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType.IQ2_XXS][1]
    tensors["blk.1.attn_q.weight"] = ("IQ2_XXS", np.zeros((HEADS * 64, D // 256 * block_bytes), np.uint8))
    with pytest.raises(ConvertError, match=r"unsupported: tensor type IQ2_XXS \(`blk\.1\.attn_q\.weight`\)"):
        convert(write_gguf(tmp_path / "a.gguf", tensors), tmp_path / "a", progress=False)

    def patched(name, dim=None, raw_type=None):
        """The Q4_K file with one tensor's table entry changed: dimension `dim` = (index, value), or its type id."""
        data = bytearray(write_gguf(tmp_path / "good.gguf", model_tensors(lambda _: "Q4_K", np.random.default_rng(4))).read_bytes())
        key = struct.pack("<Q", len(name)) + name.encode()
        at = data.index(key) + len(key)
        n_dims = struct.unpack_from("<I", data, at)[0]
        if dim is not None:
            struct.pack_into("<Q", data, at + 4 + 8 * dim[0], dim[1])
        if raw_type is not None:
            struct.pack_into("<I", data, at + 4 + 8 * n_dims, raw_type)
        (tmp_path / "bad.gguf").write_bytes(bytes(data))
        return tmp_path / "bad.gguf"

    last = f"blk.{LAYERS - 1}.ffn_down_exps.weight"   # written last: more experts run past the end of the file
    with pytest.raises(ConvertError, match=rf"tensor `{last}` \(Q4_K\): its data \(shape \[{2 * EXPERTS}, {F}, {D}\]\) runs to byte \d+, past the end of the file"):
        convert(patched(last, dim=(2, 2 * EXPERTS)), tmp_path / "b", progress=False)
    with pytest.raises(ConvertError, match=r"tensor `blk\.0\.attn_q\.weight` \(Q4_K\): .*row size \(128\) is not a multiple"):
        convert(patched("blk.0.attn_q.weight", dim=(0, 128)), tmp_path / "c", progress=False)
    with pytest.raises(ConvertError, match=r"tensor `blk\.0\.attn_q\.weight` \(type 99\)"):
        convert(patched("blk.0.attn_q.weight", raw_type=99), tmp_path / "d", progress=False)

    from colibri.convert import gguf_import   # what the reader cannot check: its data against its type
    with pytest.raises(ConvertError, match=r"gguf tensor `blk\.0\.attn_k\.weight` \(Q6_K\): 210 bytes, but shape \[2, 256\] in Q6_K takes 420"):
        gguf_import._check_size("blk.0.attn_k.weight", "Q6_K", [2, 256], np.zeros(210, np.uint8))
    with pytest.raises(ConvertError, match=r"`x` \(Q4_K\): rows of 128 weights are not whole blocks of 256"):
        gguf_import._check_size("x", "Q4_K", [4, 128], np.zeros(4 * 72, np.uint8))


@pytest.mark.parametrize("name", FORMATS)
def test_verify_finds_a_scale_that_is_not_finite(name, tmp_path):
    tensors = model_tensors(lambda _: name, np.random.default_rng(5))
    kind, data = tensors["blk.0.attn_q.weight"]
    at, count = FORMATS[name]
    data = data.copy()
    block_bytes = GGML_QUANT_SIZES[qtype(name)][1]
    last = data.shape[1] - block_bytes   # row 1's last block: block 2 (row bytes / block bytes) - 1 of the tensor
    if name == "MXFP4":
        data[1, last] = 0xff                                                  # E8M0's nan
    else:
        start = last + at + 2 * (count - 1)
        data[1, start:start + 2] = np.array([np.inf], np.float16).view(np.uint8)
    tensors["blk.0.attn_q.weight"] = (kind, data)
    block = 2 * (data.shape[1] // block_bytes) - 1
    # the conversion loads what it wrote with verify=True (the core's check) before putting it in place
    with pytest.raises(ConvertError, match=rf"does not load .*`layers\.0\.attn\.wq`: the scale of block {block} is not finite"):
        convert(write_gguf(tmp_path / "m.gguf", tensors), tmp_path / "m", progress=False, repack=False)
    assert not (tmp_path / "m").exists()
    if interleaved_form(name.lower()):   # interleaved: row 1's last block lies in group 0's last block column
        group = data.shape[1] // block_bytes - 1
        with pytest.raises(ConvertError, match=rf"`layers\.0\.attn\.wq`: the scale of block group {group} is not finite"):
            convert(tmp_path / "m.gguf", tmp_path / "m", progress=False, repack=True)

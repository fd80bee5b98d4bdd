"""q4_0x8 and q8_0x8 (docs/FORMAT.md): q4_0 / q8_0 with each 8 rows interleaved.  A model whose
matrices are moved into them computes the plain model's logits: bit for bit in strict mode and on
the scalar int8 path (the same sums), to float rounding on the fast kernels."""
import json
import zlib

import numpy as np
import pytest

import colibri
from colibri.convert import convert
from support import FIXTURES

TOKENS = np.random.default_rng(19).integers(0, 320, 12).astype(np.int32)
MATRICES = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "experts.w1", "experts.w3", "experts.w2")


def interleave(plain, rows, cols, block_bytes):
    """The x8 bytes of (rows, cols) plain blocks, rows % 8 == 0: per block column the 8 rows'
    scales, then byte 16 + 64 c + 8 i + k = byte 8 c + k of row i's quants."""
    g, nb, chunks = rows // 8, cols // 32, (block_bytes - 2) // 8
    p = np.frombuffer(plain, dtype=np.uint8).reshape(g, 8, nb, block_bytes)
    d = p[..., :2].transpose(0, 2, 1, 3).reshape(g, nb, 16)
    q = p[..., 2:].reshape(g, 8, nb, chunks, 8).transpose(0, 2, 3, 1, 4).reshape(g, nb, 64 * chunks)
    return np.concatenate([d, q], axis=-1).tobytes()


def to_x8(d, plain):
    """Rewrites the model in d: every matrix above (and a separate lm_head) stored in `plain`
    becomes its x8 format, in place."""
    doc = json.loads((d / "colibri_model.json").read_text())
    blob = bytearray((d / "weights.bin").read_bytes())
    moved = 0
    for t in doc["tensors"]:
        if t["dtype"] != plain or not (t["name"] == "lm_head" or t["name"].endswith(MATRICES)):
            continue
        rows = int(np.prod(t["shape"][:-1]))   # an expert's rows stack: groups never straddle two
        at, size = t["file_offset"], t["file_size"]
        new = interleave(bytes(blob[at:at + size]), rows, t["shape"][-1], 34 if plain == "q8_0" else 18)
        blob[at:at + size] = new
        t.update(dtype=plain + "x8", checksum="crc32:%08x" % zlib.crc32(new))
        moved += 1
    (d / "weights.bin").write_bytes(bytes(blob))
    (d / "colibri_model.json").write_text(json.dumps(doc))
    return moved


@pytest.mark.parametrize("plain", ["q4_0", "q8_0"])
def test_interleaved_rows_compute_the_plain_formats_logits(plain, tmp_path):
    src = FIXTURES / "tiny-mixtral"
    convert(src, tmp_path / plain, dtype=plain, progress=False, repack=False)
    convert(src, tmp_path / "x8", dtype=plain, progress=False, repack=False)
    assert to_x8(tmp_path / "x8", plain) >= 2 * len(MATRICES)
    base, x8 = colibri.Model(tmp_path / plain), colibri.Model(tmp_path / "x8", verify=True)
    assert {t["dtype"] for t in x8.tensors() if t["name"].endswith("experts.w1")} == {plain + "x8"}
    for kernels in ("reference", "reference-int8"):
        want = base.session(ctx=32, kernels=kernels).forward(TOKENS)
        got = x8.session(ctx=32, kernels=kernels).forward(TOKENS)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), kernels
    int8_ref = x8.session(ctx=32, kernels="reference-int8").forward(TOKENS)
    fast = x8.session(ctx=32)
    prefill = fast.forward(TOKENS)
    decode = x8.session(ctx=32)   # one token at a time: the kernels' one-row-group path
    one_by_one = np.concatenate([decode.forward(TOKENS[i:i + 1]) for i in range(len(TOKENS))])
    for what, ours in (("prefill", prefill), ("decode", one_by_one)):
        print(f"{plain}x8 {fast.kernels} {what}: max |fast - reference-int8| = {np.abs(ours - int8_ref).max():.2e}")
        np.testing.assert_allclose(ours, int8_ref, atol=1e-4, rtol=0)

"""config.json's hyper-parameters are held to the ranges colibri's loader accepts before a plan is
built or anything written (colibri/convert/limits.py mirrors c_core/src/model/schema.c)."""
import re
import time

import pytest

from colibri.convert import ConvertError, convert
from support import FIXTURES, TESTS
from test_convert import copy_hf


@pytest.mark.parametrize("edit, match", [
    ({"num_local_experts": 1000000000}, r"`num_local_experts` = 1000000000 is outside \[1, 4096\]"),
    ({"num_hidden_layers": 10 ** 7}, r"`num_hidden_layers` = 10000000 is outside \[1, 1024\]"),
    ({"rope_theta": float("nan"), "rope_parameters": None}, r"`rope_theta` = nan is not a finite number"),
    ({"rope_theta": float("inf"), "rope_parameters": None}, r"`rope_theta` = inf is not a finite number"),
    ({"rms_norm_eps": 2.0}, r"`hparams\.rms_norm_eps` = 2\.0 is outside \(0, 1\]"),
    ({"head_dim": 2048}, r"`head_dim` = 2048 is outside \[2, 1024\]"),
    ({"rope_theta": 1e-6, "rope_parameters": None, "max_position_embeddings": 4096},
     r"`hparams\.rope_theta` = 1e-06 turns RoPE angles past 2\^31 within max_position_embeddings = 4096"),
], ids=["experts", "layers", "nan-theta", "inf-theta", "eps", "head-dim", "rope-angle"])
def test_out_of_range_hparams_refused_before_anything_is_written(tmp_path, edit, match):
    copy_hf(FIXTURES / "tiny-mixtral", tmp_path / "src", config=edit)
    start = time.monotonic()
    with pytest.raises(ConvertError, match=match):
        convert(tmp_path / "src", tmp_path / "out", progress=False)
    assert time.monotonic() - start < 10
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_limits_mirror_the_core():
    """Every constant range schema.c reads a field with is limits.py's, bound for bound."""
    from colibri.convert import limits

    src = (TESTS.parent / "c_core" / "src" / "model" / "schema.c").read_text()
    macros = {k: eval(v) for k, v in re.findall(r"#define (MAX_\w+)\s+(.+)", src)}
    ours = {**limits.INTEGERS, **limits.NUMBERS}
    found = re.findall(r'(?:get|opt)_(?:int|float)\(L, \w+, [^,]+, "(\w+)", ([^,]+), ([\w.]+)[,)]', src)
    checked = 0
    for key, lo, hi in found:
        if hi.startswith("hp") or hi.startswith("hp->"):
            continue   # a bound relative to another field
        want = (float(eval(lo, {}, macros)), float(eval(hi, {}, macros)))
        mine = {f: r for f, r in ours.items() if f.rsplit(".", 1)[1] == key}
        assert mine and all(tuple(map(float, r)) == want for r in mine.values()), (key, want, mine)
        checked += 1
    assert checked >= 40

"""The converter's fuzz inputs replayed without atheris: every seed of benchmarks/fuzz_corpus/<target>/
converts, and every input of tests/fuzz_regressions/<target>/ (what the fuzzer once crashed or hung
on) is converted or refused with a ConvertError, through the fuzz target itself
(benchmarks/fuzz_convert.py)."""
import importlib.util

import pytest

from support import TESTS

spec = importlib.util.spec_from_file_location("fuzz_convert", TESTS.parent / "benchmarks" / "fuzz_convert.py")
fuzz_convert = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fuzz_convert)


def _inputs(root):
    return [pytest.param(target, path, id=f"{target}/{path.name}")
            for target in fuzz_convert.TARGETS for path in sorted((root / target).glob("*")) if path.is_file()]


@pytest.mark.parametrize("target, path", _inputs(fuzz_convert.CORPUS))
def test_every_seed_converts(target, path):
    fuzz_convert.TARGETS[target](path.read_bytes(), refusal_ok=False)


@pytest.mark.parametrize("target, path", _inputs(fuzz_convert.REGRESSIONS))
def test_a_regression_input_converts_or_is_refused(target, path):
    fuzz_convert.TARGETS[target](path.read_bytes())   # anything but a ConvertError propagates

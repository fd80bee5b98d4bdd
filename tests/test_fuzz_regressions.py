"""The Python fuzz inputs replayed without atheris, through the fuzz targets themselves: every seed
of benchmarks/fuzz_corpus/<target>/ converts, and every input of tests/fuzz_regressions/<target>/
(what a fuzzer once crashed or hung on) is converted or refused with a ConvertError
(benchmarks/fuzz_convert.py); the remote surfaces' seeds and findings are answered or refused with
a gRPC status, and the HTTP/2 findings leave both servers answering (benchmarks/fuzz_remote.py)."""
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


# ---- the remote surfaces (benchmarks/fuzz_remote.py) -----------------------------------------------

remote_spec = importlib.util.spec_from_file_location("fuzz_remote", TESTS.parent / "benchmarks" / "fuzz_remote.py")
fuzz_remote = importlib.util.module_from_spec(remote_spec)
remote_spec.loader.exec_module(fuzz_remote)


def _remote_inputs(root, targets):
    return [pytest.param(target, path, id=f"{target}/{path.name}")
            for target in targets for path in sorted((root / target).glob("*")) if path.is_file()]


@pytest.mark.parametrize("target, path", _remote_inputs(fuzz_remote.CORPUS, fuzz_remote.TARGETS) +
                         _remote_inputs(fuzz_convert.REGRESSIONS, fuzz_remote.TARGETS))
def test_a_remote_request_is_answered_or_refused(target, path):
    """The seeds, and what the request fuzzers once found: a reply or a gRPC status, never an exception."""
    fuzz_remote.TARGETS[target](path.read_bytes())


@pytest.mark.parametrize("target, path", _remote_inputs(fuzz_convert.REGRESSIONS, ["http2"]))
def test_a_hostile_connection_leaves_both_servers_answering(target, path):
    """What the HTTP/2 grammar once stalled or killed the servers with, sent again and held open:
    serve-experts and orchestrate stay up, and a well-behaved Info and Heartbeat answer within 2 s."""
    import json
    assert fuzz_remote.replay_http2(json.loads(path.read_text())["connections"]) is None

"""Hostile arguments to the front ends: a Python session survives a bad argument, the `colibri`
command answers bad input with one line naming what is wrong (never a traceback), colibri-infer
says why it fails and never succeeds quietly, and a model's "tokenizer" stays in its directory."""
import json
import shutil
import subprocess
import sys

import pytest

import colibri
from colibri.demo import MODEL_DIR
from colibri.targets import infer_command
from colibri.tokenizer import load_tokenizer
from support import FIXTURES, infer

PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def model():
    return colibri.Model(MODEL_DIR)


def colibri_cli(*args, stdout=subprocess.PIPE):
    return subprocess.run([sys.executable, "-m", "colibri", *map(str, args)], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, cwd="/")


def refused(*args, status=1, naming=None, stdout=subprocess.PIPE):
    """stderr of a colibri command that must fail with `status` and one line (argparse's usage
    lines before it for status 2) naming `naming`, not a traceback."""
    r = colibri_cli(*args, stdout=stdout)
    err = r.stderr.strip()
    assert r.returncode == status and err and "Traceback" not in err and "Exception" not in err, (r.returncode, err)
    last = err.splitlines()[-1]
    assert status == 2 or len(err.splitlines()) == 1, err
    assert last.startswith("colibri"), err
    if naming is not None:
        assert naming in last, err
    return last


# ------------------------------------------------------------------------ a session's busy flag

def test_a_bad_seed_leaves_the_session_usable(model):
    s = model.session(ctx=64)
    with pytest.raises(TypeError, match="seed"):
        s.seed("x")
    with pytest.raises(TypeError, match="seed"):
        s.generate(model.tokenize(PROMPT), max_tokens=2, seed=float("nan"))
    s.reset()
    s.seed(3)
    assert len(s.generate(model.tokenize(PROMPT), max_tokens=2, temperature=0.0, stop_at_eos=False)) == 2


def test_every_flag_taking_method_releases_it_on_error(model):
    s = model.session(ctx=64)
    for call in (lambda: s.seed(2 ** 80 + 0.5), lambda: s.forward([10 ** 12]), lambda: s.forward([model.vocab_size]),
                 lambda: s.prefill([-1]), lambda: s.place(0, 0, "nowhere"), lambda: s.place(0, 0, 2 ** 40),
                 lambda: s.set_placement([[0]]), lambda: s.load_placement("{"), lambda: s.step(-5),
                 lambda: s.compute_experts(0, [0], [0], [[0.0]])):
        with pytest.raises(Exception):
            call()
        s.reset()
        assert s.forward([1]).shape == (1, model.vocab_size)

"""The sampler's logit bias, repetition, presence and frequency penalties and min-p against a numpy
reference of colibri.h's steps on the session's own logits; the stops (every end id of the model, a
full context) and a random seed, through Python and both CLIs."""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import colibri
from bad_models import FIXTURE
from support import infer
from test_sampling import chi_square_ok, reference_probs   # then temperature, top-k, top-p, min-p

PROMPT = [3, 141, 59, 26, 5, 141, 141, 59]   # repeats: the penalties count 141 three times, 59 twice


@pytest.fixture(scope="module")
def model():
    return colibri.Model(FIXTURE)


@pytest.fixture(scope="module")
def session(model):
    return model.session(ctx=64)


def adjusted(logits, window, repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, logit_bias=None):
    """colibri.h's first steps: the bias added, then each distinct token of the window penalised once
    (transformers' / llama.cpp's repetition penalty, then OpenAI's presence and frequency)."""
    z = np.array(logits, dtype=np.float64)
    for token, bias in (logit_bias or {}).items():
        z[token] += bias
    tokens, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
    for t, n in zip(tokens, counts):
        z[t] = z[t] / repeat_penalty if z[t] > 0 else z[t] * repeat_penalty
        z[t] -= presence_penalty + frequency_penalty * n
    return z


def first_draws(session, n, **options):
    """The first token of n generations with seeds 0..n-1: each a draw from the prompt's logits."""
    out = []
    for seed in range(n):
        session.reset()
        out.append(session.generate(PROMPT, 1, seed=seed, **options)[0])
    return np.array(out)


@pytest.fixture(scope="module")
def logits(session):
    session.reset()
    return session.forward(PROMPT)[-1].astype(np.float64)


TEMPERATURE = 0.5   # a sharper distribution than the fixture's own, so each option moves it visibly
OPTIONS = [
    dict(min_p=0.3),
    dict(repeat_penalty=3.0),
    dict(presence_penalty=1.5, frequency_penalty=0.75),
    dict(logit_bias={141: 3.0, 7: -np.inf, 200: 2.5}),
    dict(repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.5, repeat_last_n=3, top_k=40, top_p=0.9,
         min_p=0.05, logit_bias={59: 1.0}),
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o))
def test_draws_follow_the_reference(session, logits, options):
    options = dict(options)
    sampling = {k: options.pop(k) for k in ("top_k", "top_p", "min_p") if k in options}
    window = PROMPT[-options.get("repeat_last_n", 64):]
    z = adjusted(logits, window, **{k: v for k, v in options.items() if k != "repeat_last_n"})
    q = reference_probs(z, TEMPERATURE, **sampling)
    draws = first_draws(session, 3000, temperature=TEMPERATURE, **sampling, **options)
    assert set(draws) <= set(np.flatnonzero(q > 1e-6)), "a token the steps rule out was drawn"
    stat, crit = chi_square_ok(np.bincount(draws, minlength=len(q)), q)
    assert stat < crit, (stat, crit)
    plain = reference_probs(np.array(logits), TEMPERATURE, **{k: v for k, v in sampling.items() if k != "min_p"})
    assert np.abs(q - plain).sum() > 0.04, "the options change the distribution (else this test shows nothing)"


@pytest.mark.parametrize("options", OPTIONS[1:], ids=lambda o: ",".join(o))
def test_greedy_after_penalties_follows_the_reference(session, options):
    """Greedy over several tokens: each step's window holds the tokens generated so far (the
    reference recomputes every position's logits in one forward, teacher-forced)."""
    options = {k: v for k, v in options.items() if k not in ("top_k", "top_p", "min_p")}
    last_n = options.pop("repeat_last_n", 64)
    session.reset()
    got = session.generate(PROMPT, 12, temperature=0.0, stop_at_eos=False, repeat_last_n=last_n, **options)
    session.reset()
    rows = session.forward(PROMPT + got[:-1])[len(PROMPT) - 1:].astype(np.float64)
    seq = PROMPT + got
    for i, row in enumerate(rows):
        z = adjusted(row, seq[:len(PROMPT) + i][-last_n:], **options)
        top2 = np.sort(z)[-2:]
        if top2[1] - top2[0] < 1e-4:
            break   # a near tie: float32 sums may order it either way; the steps before were checked
        assert got[i] == int(np.argmax(z)), f"step {i}"


def test_penalties_see_the_prompt_and_repeat_last_n_bounds_them(session, logits):
    """With a heavy repetition penalty the greedy choice leaves the prompt's repeated tokens; a
    window of 0 turns the penalties off."""
    session.reset()
    assert session.generate(PROMPT, 1, repeat_penalty=5.0, repeat_last_n=0)[0] == int(np.argmax(logits))
    z = adjusted(logits, PROMPT, repeat_penalty=5.0)
    session.reset()
    assert session.generate(PROMPT, 1, repeat_penalty=5.0)[0] == int(np.argmax(z))


def test_bad_options_are_refused(session):
    vocab = session.model.vocab_size
    for options, match in [(dict(logit_bias={vocab: 1.0}), rf"logit_bias\[0\]: token {vocab} is outside"),
                           (dict(logit_bias=[(5, 1.0), (-3, 1.0)]), r"logit_bias\[1\]: token -3 is outside"),
                           (dict(logit_bias={5: float("nan")}), r"NaN or \+inf"),
                           (dict(min_p=1.5), "min_p"), (dict(repeat_penalty=-1.0), "repeat_penalty"),
                           (dict(repeat_last_n=-2), "penalty_last_n")]:
        session.reset()
        with pytest.raises(colibri.Error, match=match):
            session.generate(PROMPT, 2, **options)
    session.reset()
    with pytest.raises(colibri.Error, match="bans every token"):
        session.generate(PROMPT, 1, logit_bias={t: -np.inf for t in range(vocab)})


def test_stop_reason(session):
    session.reset()
    session.generate(PROMPT, 3, stop_at_eos=False)
    assert session.stop_reason == "max_tokens"
    session.reset()
    tokens = session.generate(PROMPT, 1000, stop_at_eos=False)
    assert session.stop_reason == "context_full" and len(PROMPT) + len(tokens) == session.n_ctx + 1


def with_end_ids(tmp_path, ids):
    """The fixture model with hparams.eos_token_ids = ids (its weights linked, not copied)."""
    out = tmp_path / "model"
    out.mkdir()
    for f in FIXTURE.iterdir():
        (out / f.name).symlink_to(f)
    doc = json.loads((FIXTURE / "colibri_model.json").read_text())
    doc["hparams"]["eos_token_ids"] = ids
    (out / "colibri_model.json").unlink()
    (out / "colibri_model.json").write_text(json.dumps(doc))
    return out


def test_every_end_id_stops(tmp_path, session):
    session.reset()
    free = session.generate(PROMPT, 8, stop_at_eos=False)
    eos = session.model.config["eos_token_id"]
    at = next(i for i, t in enumerate(free) if free.index(t) == i and i >= 2 and t != eos)
    unused = next(t for t in range(session.model.vocab_size) if t not in free)
    m = colibri.Model(with_end_ids(tmp_path, [unused, free[at]]))
    assert m.config["eos_token_ids"] == [unused, free[at]]
    s = m.session(ctx=64)
    assert s.generate(PROMPT, 8) == free[:at + 1] and s.stop_reason == "eos"
    s.reset()
    assert s.generate(PROMPT, 8, stop_at_eos=False) == free


@pytest.mark.parametrize("ids, match", [([1, 2, 3, 4, 5], "more than 4"), ([2, 320], r"eos_token_ids\[1\]"),
                                        ([2, "x"], r"eos_token_ids\[1\]")])
def test_bad_end_ids_are_refused(tmp_path, ids, match):
    with pytest.raises(colibri.Error, match=match):
        colibri.Model(with_end_ids(tmp_path, ids))


def test_seed_minus_one_is_random_and_kept(session):
    seeds = {session.seed(-1) for _ in range(4)}
    assert len(seeds) > 1 and all(0 <= s < 2 ** 31 for s in seeds)
    session.reset()
    a = session.generate(PROMPT, 12, temperature=1.5, seed=-1, stop_at_eos=False)
    drawn = session.last_seed
    session.reset()
    assert session.generate(PROMPT, 12, temperature=1.5, seed=drawn, stop_at_eos=False) == a


def run(command, *args):
    return subprocess.run([*command, *map(str, args)], capture_output=True, timeout=300, cwd="/")


PY = [sys.executable, "-m", "colibri", "generate"]


def flags(cli, **kw):
    """--name value in the spelling of each CLI (colibri-infer's underscores, generate's dashes)."""
    out = []
    for k, v in kw.items():
        out += [f"--{k if cli == 'infer' else k.replace('_', '-')}", v]
    return out


@pytest.mark.parametrize("cli", ["generate", "infer"])
def test_cli_seed_minus_one_is_printed_and_repeats(cli):
    go = (lambda *a: infer("native", *a, check=False)) if cli == "infer" else (lambda *a: run(PY, *a))
    base = ["--model", FIXTURE, "--tokens", "3,141,59", "--ignore" + ("_" if cli == "infer" else "-") + "eos",
            *flags(cli, max_tokens=24, temperature=1.5, top_k=0, top_p=1)]
    runs = [go(*base, "--seed", "-1", "--verbose") for _ in range(2)]
    seeds = [int(re.search(rb"seed: (\d+)", r.stderr).group(1)) for r in runs]
    assert all(r.returncode == 0 for r in runs) and seeds[0] != seeds[1]
    again = go(*base, "--seed", seeds[0])
    assert again.returncode == 0 and again.stdout == runs[0].stdout


@pytest.mark.parametrize("cli", ["generate", "infer"])
def test_cli_full_context_is_an_error(cli):
    go = (lambda *a: infer("native", *a, check=False)) if cli == "infer" else (lambda *a: run(PY, *a))
    base = ["--model", FIXTURE, "--tokens", "3,141,59", "--ignore" + ("_" if cli == "infer" else "-") + "eos",
            "--ctx", 16, *(["--ids"] if cli == "infer" else [])]
    full = go(*base, *flags(cli, max_tokens=40))
    assert full.returncode != 0 and b"context of 16 tokens is full after 14 of" in full.stderr
    assert full.stdout.count(b",") == 14 - 1   # the tokens still printed
    exact = go(*base, *flags(cli, max_tokens=14))
    assert exact.returncode == 0 and exact.stdout == full.stdout


def test_cli_sampling_flags_agree(session):
    """Both CLIs pass the new flags to the one generation loop: the same tokens, Python's too."""
    kw = dict(min_p=0.1, repeat_penalty=1.4, repeat_last_n=5, presence_penalty=0.3, frequency_penalty=0.2,
              temperature=1.2, top_k=0, top_p=1, max_tokens=20, seed=9)
    bias = "141=-inf,59=1.5"
    py = run(PY, "--model", FIXTURE, "--tokens", "3,141,59", "--ignore-eos", *flags("generate", **kw),
             "--logit-bias", bias)
    c = infer("native", "--model", FIXTURE, "--tokens", "3,141,59", "--ignore_eos", "--ids", *flags("infer", **kw),
              "--logit_bias", bias)
    assert py.returncode == 0 and py.stdout == c.stdout
    session.reset()
    want = session.generate([3, 141, 59], 20, 1.2, 0, 1.0, 9, False, min_p=0.1, repeat_penalty=1.4, repeat_last_n=5,
                            presence_penalty=0.3, frequency_penalty=0.2, logit_bias={141: -np.inf, 59: 1.5})
    assert c.stdout.strip() == ",".join(map(str, want)).encode() and 141 not in want
    bad = infer("native", "--model", FIXTURE, "--tokens", "3", "--logit_bias", "999=1", check=False)
    assert bad.returncode != 0 and b"token 999 is outside the vocabulary [0, 320)" in bad.stderr

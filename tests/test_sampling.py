"""The C sampler against a numpy reference: the distribution it draws from, the
candidate sets top-k and top-p allow, greedy, and seed reproducibility."""
import math

import numpy as np
import pytest

import colibri
from bad_models import FIXTURE


PROMPT = [3, 141, 59, 26, 5]


@pytest.fixture(scope="module")
def session():
    s = colibri.Model(FIXTURE).session(ctx=64)
    return s


@pytest.fixture(scope="module")
def logits(session):
    """The last position's logits the sampler draws from, as forward() returned them."""
    return session.forward(PROMPT)[-1].astype(np.float64)


def reference_probs(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """What the sampler should draw from, as transformers' TopK, TopP then MinP warpers define it:
    softmax(logits / T), cut to the top k, then to the nucleus of the renormalised top k, then to
    the tokens at least min_p times the most likely's probability."""
    p = np.exp((logits - logits.max()) / temperature)
    p /= p.sum()
    order = sorted(range(len(p)), key=lambda i: (-p[i], i))
    keep = order[:top_k] if top_k > 0 else order
    if top_p < 1.0:
        cum = np.cumsum(p[keep]) / p[keep].sum()
        keep = keep[: int(np.searchsorted(cum, top_p - 1e-6)) + 1]
    keep = [i for i in keep if p[i] >= min_p * p.max()]
    q = np.zeros_like(p)
    q[keep] = p[keep]
    return q / q.sum()


def chi_square_ok(counts, probs):
    """Pearson's test at p ~ 1e-5, bins with expected count < 5 merged (Wilson-Hilferty critical value)."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs) - 1
    crit = df * (1 - 2 / (9 * df) + 4.26 * math.sqrt(2 / (9 * df))) ** 3
    return stat, crit


def draw(s, n, **kw):
    return np.array([s.sample(**kw) for _ in range(n)])


def test_greedy_is_argmax(session, logits):
    assert session.sample(temperature=0.0) == int(np.argmax(logits))
    assert session.sample(temperature=0.7, top_k=1) == int(np.argmax(logits))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.0, 20, 1.0),
                                                     (0.8, 0, 0.6), (1.2, 50, 0.9)])
def test_draws_follow_the_reference_distribution(session, logits, temperature, top_k, top_p):
    probs = reference_probs(logits, temperature, top_k, top_p)
    session.seed(2024)
    samples = draw(session, 30000, temperature=temperature, top_k=top_k, top_p=top_p)
    assert set(np.unique(samples)) <= set(np.flatnonzero(probs)), "a token outside top-k / top-p was drawn"
    counts = np.bincount(samples, minlength=len(probs))
    stat, crit = chi_square_ok(counts, probs)
    assert stat < crit, f"chi2 {stat:.1f} >= {crit:.1f}"


def test_same_seed_same_tokens(session, logits):
    session.seed(11)
    a = draw(session, 200, temperature=0.9, top_k=40, top_p=0.95)
    session.seed(11)
    b = draw(session, 200, temperature=0.9, top_k=40, top_p=0.95)
    session.seed(12)
    c = draw(session, 200, temperature=0.9, top_k=40, top_p=0.95)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def uniforms(seed, n):
    """The sampler's uniforms: splitmix64 from the seed, the top 24 bits of each draw."""
    mask, state, out = (1 << 64) - 1, seed & ((1 << 64) - 1), []
    for _ in range(n):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append(((z ^ (z >> 31)) >> 40) / 16777216.0)
    return np.array(out)


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.6, 0, 1.0), (0.9, 40, 1.0), (0.8, 0, 0.6),
                                                     (0.9, 40, 0.95)])
def test_each_draw_is_the_references_on_the_same_uniform(session, logits, temperature, top_k, top_p):
    """The token a uniform u draws: the first whose cumulative probability passes u, walking the kept
    tokens in id order for temperature alone (nothing is sorted) and in candidate order (most likely
    first, lower id on ties) when top-k or top-p cut them; draws within rounding of a boundary are left out."""
    probs = reference_probs(logits, temperature, top_k, top_p)
    kept = np.flatnonzero(probs)
    if top_k or top_p < 1.0:
        kept = np.array(sorted(kept, key=lambda i: (-probs[i], i)))
    cum = np.cumsum(probs[kept])
    session.seed(99)
    ours = draw(session, 300, temperature=temperature, top_k=top_k, top_p=top_p)
    u = uniforms(99, 300) * cum[-1]
    theirs = kept[np.minimum(np.searchsorted(cum, u, side="right"), len(kept) - 1)]
    clear = np.min(np.abs(cum[None, :] - u[:, None]), axis=1) > 1e-5
    assert clear.sum() > 250
    assert np.array_equal(ours[clear], theirs[clear])


def test_bad_parameters_are_rejected(session, logits):
    for kw in ({"temperature": float("nan")}, {"temperature": 1.0, "top_p": -1000.0}, {"top_p": float("nan")}):
        with pytest.raises(colibri.Error) as e:
            session.sample(**kw)
        assert e.value.status == "COLIBRI_E_ARG"


def test_top_p_zero_is_greedy(session, logits):
    for temperature in (1.0, 1e30):
        assert session.sample(temperature=temperature, top_p=0.0) == int(np.argmax(logits))


def test_non_finite_logits_are_an_error_not_a_token(tmp_path):
    """NaN weights pass a plain load (only validation reads every byte); sampling must refuse."""
    from bad_models import CASES, make_case

    d = make_case(next(c for c in CASES if c.name == "nan_weight"), tmp_path)
    s = colibri.Model(d).session(ctx=8)
    s.forward([1, 2, 3])
    for kw in ({"temperature": 0.0}, {"temperature": 0.8, "top_k": 40, "top_p": 0.95}):
        with pytest.raises(colibri.Error) as e:
            s.sample(**kw)
        assert e.value.status == "COLIBRI_E_VALUE" and "not finite" in e.value.detail


def hand_stream(s, prompt, max_tokens, temperature, top_k, top_p, seed):
    """The loop Session.stream ran in Python before the core had one: prefill, sample, step."""
    s.seed(seed)
    s.prefill(prompt)
    eos, out = s.model.config["eos_token_id"], []
    if max_tokens <= 0:
        return out
    token = s.sample(temperature, top_k, top_p)
    for i in range(max_tokens):
        out.append(token)
        if token == eos or i + 1 == max_tokens or s.position >= s.n_ctx:
            break
        token = s.step(token, temperature, top_k, top_p)
    return out


@pytest.mark.parametrize("ctx, max_tokens", [(64, 20), (12, 20), (64, 1), (64, 0)])   # 12: the context fills
def test_stream_is_the_hand_run_loop_and_calls_between_tokens_before_each_step(ctx, max_tokens):
    model = colibri.Model(FIXTURE)
    hand, core = model.session(ctx=ctx), model.session(ctx=ctx)
    want = hand_stream(hand, PROMPT, max_tokens, 0.9, 20, 0.95, 5)
    got, hooks = [], []
    for token in core.stream(PROMPT, max_tokens, 0.9, 20, 0.95, seed=5,
                             between_tokens=lambda: hooks.append((len(got), core.position))):
        got.append(token)
    assert got == want and core.position == hand.position
    assert hooks == [(k, len(PROMPT) + k - 1) for k in range(1, len(got))]   # before each step, none after the last
    assert core.sample(1.0) == hand.sample(1.0)   # the generator's state goes on as the hand-run loop left it

"""Several sequences in one session (n_seq slots, Session.forward_batch): for every family, mixed
batches (one slot prefilling a chunk beside others decoding one token, slots joining and leaving,
calls crossing chunk boundaries) give each slot, at every step, the logits of the same sequence run
alone in a one-sequence session, bit for bit, with the reference kernels; so do a shared prefix
copied to other slots (seq_copy), a cut and refed slot (seq_truncate), streamed experts and a
device.  A refused call (a slot out of range or twice, a token out of range, no room) names what
was wrong and leaves every slot as it was; the memory plan is what the session reserves."""
import numpy as np
import pytest

import colibri
from colibri.convert import convert
from colibri.demo import MODEL_DIR
from support import FAMILIES, build

CTX, BATCH = 40, 6
LENGTHS = (23, 9, 17, 30)   # the four sequences' tokens


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_model(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    build(request.param, seed=3).save_pretrained(root / "hf")
    return colibri.Model(convert(root / "hf", root / "colibri", dtype="f32", progress=False, layout="interleaved"))


def sequences(model, seed=7):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, model.config["vocab_size"], n).astype(np.int32) for n in LENGTHS]


def alone(model, tokens, **options):
    """Every position's logits of `tokens` fed to a one-sequence session (the outside reference)."""
    return model.session(ctx=CTX, kernels="reference", **options).forward(tokens)


def schedule(lengths, seed=11):
    """Calls of forward_batch as [(seq, start, stop)]: slot 3 joins at the third call, slot 1 leaves
    when it is done while others go on; each call gives a slot one token (decode) or a chunk of up to
    2 * BATCH (a prefill that crosses chunk boundaries), the order of the entries shuffled."""
    rng = np.random.default_rng(seed)
    done = [0] * len(lengths)
    calls = []
    while any(d < n for d, n in zip(done, lengths)):
        entries = []
        for seq, n in enumerate(lengths):
            if done[seq] >= n or (seq == 3 and len(calls) < 2):
                continue
            take = 1 if rng.random() < 0.5 else int(rng.integers(2, 2 * BATCH + 1))
            take = min(take, n - done[seq])
            entries.append((seq, done[seq], done[seq] + take))
            done[seq] += take
        rng.shuffle(entries)
        calls.append(entries)
    return calls


def run_mixed(model, seqs, **options):
    """Feeds seqs by schedule() into one n_seq=4 session; checks each slot's logits after each call
    against its sequence run alone."""
    want = [alone(model, t) for t in seqs]
    s = model.session(ctx=CTX, batch=BATCH, kernels="reference", n_seq=4, **options)
    calls = schedule([len(t) for t in seqs])
    assert any(len(c) >= 3 for c in calls) and any(stop - start == 1 for c in calls for _, start, stop in c)
    for entries in calls:
        s.forward_batch([(seq, seqs[seq][start:stop], True) for seq, start, stop in entries])
        for seq, start, stop in entries:
            assert s.seq_position(seq) == stop
            got = s.seq_logits(seq)
            assert np.array_equal(got.view(np.uint32), want[seq][stop - 1].view(np.uint32)), \
                f"slot {seq} after position {stop}: {np.count_nonzero(got != want[seq][stop - 1])} logits differ"
    for seq, t in enumerate(seqs):
        assert s.seq_tokens(seq) == t.tolist()
    return s


def test_mixed_batches_give_each_slot_its_alone_logits(family_model):
    run_mixed(family_model, sequences(family_model))


def test_shared_prefix_copied_then_diverging(family_model):
    model = family_model
    rng = np.random.default_rng(2)
    V = model.config["vocab_size"]
    prefix = rng.integers(0, V, 13).astype(np.int32)
    tails = [rng.integers(0, V, n).astype(np.int32) for n in (1, 8, 3)]
    s = model.session(ctx=CTX, batch=BATCH, kernels="reference", n_seq=4)
    s.forward_batch([(0, prefix, True)])
    for dst in (1, 2, 3):
        s.seq_copy(0, dst)
        assert s.seq_tokens(dst) == prefix.tolist()
        assert np.array_equal(s.seq_logits(dst), s.seq_logits(0))
    s.forward_batch([(seq, tails[seq - 1], True) for seq in (3, 1, 2)])
    for seq in (1, 2, 3):
        want = alone(model, np.concatenate([prefix, tails[seq - 1]]))[-1]
        assert np.array_equal(s.seq_logits(seq).view(np.uint32), want.view(np.uint32))
    assert s.seq_position(0) == len(prefix)   # the source goes on as it was
    s.forward_batch([(0, tails[1], True)])
    assert np.array_equal(s.seq_logits(0), s.seq_logits(2))


def test_truncate_then_refeed(family_model):
    model = family_model
    seqs = sequences(model)
    s = model.session(ctx=CTX, batch=BATCH, kernels="reference", n_seq=3)
    s.forward_batch([(0, seqs[0], True), (1, seqs[1], True), (2, seqs[2], True)])
    s.seq_truncate(1, 4)
    s.seq_truncate(2, 0)
    assert s.seq_tokens(1) == seqs[1][:4].tolist() and s.seq_position(2) == 0 and s.seq_position(0) == len(seqs[0])
    fresh = seqs[3][:6]
    s.forward_batch([(1, fresh, True), (2, seqs[3][:2], True)])
    want = alone(model, np.concatenate([seqs[1][:4], fresh]))[-1]
    assert np.array_equal(s.seq_logits(1).view(np.uint32), want.view(np.uint32))
    assert np.array_equal(s.seq_logits(2).view(np.uint32), alone(model, seqs[3][:2])[-1].view(np.uint32))
    s.seq_reset(0)
    assert s.seq_position(0) == 0 and s.seq_tokens(0) == []


def test_pending_token_fed_first(family_model):
    """A generation on slot 0 leaves its last token pending; forward_batch feeds it before the slot's
    tokens, as forward does on a one-sequence session."""
    model = family_model
    seqs = sequences(model)
    one = model.session(ctx=CTX, kernels="reference")
    reply = one.generate(seqs[1], max_tokens=3, temperature=0.0, stop_at_eos=False)
    want = one.forward(seqs[2][:5])[-1]
    s = model.session(ctx=CTX, batch=BATCH, kernels="reference", n_seq=2)
    assert s.generate(seqs[1], max_tokens=3, temperature=0.0, stop_at_eos=False) == reply
    assert s.seq_pending(0) == reply[-1]
    s.forward_batch([(1, seqs[0][:7], False), (0, seqs[2][:5], True)])
    assert s.seq_pending(0) is None and s.seq_tokens(0) == one.tokens
    assert np.array_equal(s.seq_logits(0).view(np.uint32), want.view(np.uint32))


def test_streamed_experts_with_several_sequences(family_model):
    model = family_model
    if not model.config["num_experts"]:
        pytest.skip("no routed experts")
    slot, least = model.expert_slots()
    s = run_mixed(model, sequences(model), expert_budget=least + slot)
    assert s.expert_cache_stats()["misses"] > 0


class CpuBehind:
    """A device driver computing through another session's cpu driver (as tests/test_devices.py's)."""

    def __init__(self, model):
        self.cpu = model.session(ctx=4, kernels="reference")
        self.name = "other"
        self.calls = 0

    def compute(self, layer, experts, rows, gates, x):
        self.calls += 1
        self.job = (layer, experts.copy(), rows.copy(), x.copy())

    def sync(self, y):
        y[:] = self.cpu.compute_experts(*self.job)
        return 1e-4


def test_device_with_several_sequences(family_model):
    model = family_model
    if not model.config["num_experts"]:
        pytest.skip("no routed experts")
    L, E = model.config["num_layers"], model.config["num_experts"]
    driver = CpuBehind(model)
    placement = (np.arange(E) % 2 == 0)[None].repeat(L, 0).astype(np.uint8)
    s = run_mixed(model, sequences(model), devices=[driver], placement=placement)
    assert driver.calls > 0 and s.device_stats()[1]["experts"] > 0


def state(s):
    return [(s.seq_position(q), s.seq_tokens(q), s.seq_pending(q), s.seq_logits(q)) for q in range(s.n_seq)]


def same_state(a, b):
    return all(x[:3] == y[:3] and np.array_equal(x[3], y[3]) for x, y in zip(a, b))


def test_refused_calls_change_nothing():
    model = colibri.Model(MODEL_DIR)
    s = model.session(ctx=16, batch=4, kernels="reference", n_seq=3)
    s.forward_batch([(0, [1, 2, 3], True), (2, [4, 5], True)])
    before = state(s)
    V = model.config["vocab_size"]
    for entries, message in [
        ([(0, [6], True), (3, [1], True)], r"sequence 3 outside \[0, 3\)"),
        ([(-1, [6], True)], r"sequence -1 outside \[0, 3\)"),
        ([(1, [6], True), (1, [7], True)], r"sequence 1 appears twice"),
        ([(0, [6], True), (2, [1, V], True)], rf"sequence 2: token 1 is {V}, outside \[0, {V}\)"),
        ([(1, [6], True), (0, list(range(14)), True)], r"sequence 0: 14 tokens do not fit: 3 of 16 positions"),
        ([(1, [], True)], r"no tokens, and sequence 1 has no pending one"),
    ]:
        with pytest.raises(colibri.Error, match=message):
            s.forward_batch(entries)
        assert same_state(before, state(s))
    for call in (lambda: s.seq_position(3), lambda: s.seq_tokens(-1), lambda: s.seq_logits(5),
                 lambda: s.seq_truncate(3, 0), lambda: s.seq_reset(3), lambda: s.seq_copy(0, 3)):
        with pytest.raises(colibri.Error, match="outside"):
            call()
    with pytest.raises(colibri.Error, match="cannot keep 4 tokens, sequence 0 holds 3"):
        s.seq_truncate(0, 4)
    assert same_state(before, state(s))
    with pytest.raises(colibri.Error, match="n_seq = -1"):
        model.session(ctx=16, n_seq=-1)


@pytest.mark.parametrize("n_seq", [1, 2, 4])
def test_memory_plan_is_what_the_session_reserves(n_seq):
    model = colibri.Model(MODEL_DIR)
    plan = model.memory_plan(64, 8, n_seq=n_seq)
    s = model.session(ctx=64, batch=8, n_seq=n_seq)
    assert s.memory()["arena_used"] == plan
    assert s.n_seq == n_seq
    report = s.memdump()
    assert f"n_seq {n_seq}," in report
    listed = [line for line in report.splitlines() if line.lstrip().startswith("seq ")]
    assert [line.split(":")[0].strip() for line in listed] == [f"seq {q}" for q in range(n_seq)]
    if n_seq > 1:   # every slot's KV cache reserved: more than one slot's
        assert s.memory()["kv_cache"] > model.session(ctx=64, batch=8).memory()["kv_cache"]


@pytest.mark.parametrize("routing", ["noisy", "hash"])
def test_research_routers_see_each_rows_position_and_token(routing):
    """Noisy routing's draw is a function of each row's own position, hash routing's of its token."""
    model = colibri.Model(MODEL_DIR)
    seqs = sequences(model)
    want = [alone(model, t, routing=routing, noise=0.5) for t in seqs]
    s = model.session(ctx=CTX, batch=BATCH, kernels="reference", n_seq=4, routing=routing, noise=0.5)
    for entries in schedule([len(t) for t in seqs]):
        s.forward_batch([(seq, seqs[seq][start:stop], True) for seq, start, stop in entries])
        for seq, start, stop in entries:
            assert np.array_equal(s.seq_logits(seq).view(np.uint32), want[seq][stop - 1].view(np.uint32))


# ---- colibri.Batch: generations over several slots, stepped together ----

def drive(batch, joins):
    """Steps `batch` until no slot runs; joins {step number: [(seq, prompt, options)]} start slots as
    the steps come (a late one joins while others decode).  Returns {seq: (tokens, text, finish)}."""
    got, step = {}, 0
    while True:
        for seq, prompt, options in joins.get(step, ()):
            batch.start(seq, prompt, **options)
            got[seq] = ([], [], None)
        if not batch.active and step > max(joins, default=-1):
            return got
        for seq, token, text, finish in batch.step():
            tokens, texts, _ = got.setdefault(seq, ([], [], None))
            if token is not None:
                tokens.append(token)
            texts.append(text)
            got[seq] = (tokens, texts, finish)
        step += 1


def one_alone(model, prompt, stop=(), **options):
    """(tokens, text, finish) of Session.stream_text on a one-sequence session (the reference)."""
    s = model.session(ctx=CTX, kernels="reference")
    tokens = list(s.stream(prompt, **options))
    s = model.session(ctx=CTX, kernels="reference")
    text = "".join(s.stream_text(prompt, stop=stop, **options))
    return tokens, text, s.stop_reason


@pytest.fixture(scope="module")
def bundled():
    return colibri.Model(MODEL_DIR)


def test_batch_streams_are_the_one_sequence_streams(bundled):
    model = bundled
    prompts = [model.tokenize(t) for t in ("ROMEO:", "KING HENRY:\nWhat say you", "O", "First Citizen:\nWe are")]
    eos = model.config["eos_token_ids"][0]
    runs = [
        dict(max_tokens=12, temperature=0.0),
        dict(max_tokens=9, temperature=0.8, top_k=40, top_p=0.95, seed=5),
        dict(max_tokens=20, temperature=1.0, seed=11, stop=["e"], repeat_penalty=1.2),
        dict(max_tokens=7, temperature=0.7, seed=3, min_p=0.05, logit_bias={eos: 5.0}),
    ]
    s = model.session(ctx=CTX, batch=4, kernels="reference", n_seq=4)
    batch = colibri.Batch(s)
    joins = {0: [(0, prompts[0], runs[0]), (2, prompts[2], runs[2])], 1: [(1, prompts[1], runs[1])],
             4: [(3, prompts[3], runs[3])]}
    got = drive(batch, joins)
    for seq, prompt in enumerate(prompts):
        options = dict(runs[seq])
        stop = options.pop("stop", ())
        if stop:   # tokens stop with the text: compare the text, and the tokens up to its end
            want_tokens, want_text, want_finish = one_alone(model, prompt, stop=stop, **options)
        else:
            want_tokens, want_text, want_finish = one_alone(model, prompt, **options)
        tokens, texts, finish = got[seq]
        assert "".join(texts) == want_text and finish == want_finish, seq
        if not stop:
            assert tokens == want_tokens
        else:
            assert tokens == want_tokens[:len(tokens)]
        assert batch.seed_of(seq) == runs[seq].get("seed", batch.seed_of(seq))
    assert batch.active == () and batch.n_running_prefill == 0


def test_batch_prompt_longer_than_the_batch_prefills_beside_decoding(bundled):
    model = bundled
    long_prompt = model.tokenize("KING RICHARD III:\nNow is the winter of our discontent made glorious summer")
    short = model.tokenize("ROMEO:")
    s = model.session(ctx=CTX, batch=4, kernels="reference", n_seq=2)
    batch = colibri.Batch(s)
    batch.start(0, short, max_tokens=10)
    while batch.generated(0) == 0:
        batch.step()
    batch.start(1, long_prompt, max_tokens=3)
    assert batch.n_running_prefill == 1
    out = batch.step()   # slot 0 decodes one token, slot 1 gets the rest of the batch: 3 prompt tokens
    assert [seq for seq, *_ in out] == [0] and batch.prompt_done(1) == 3 and batch.generated(0) == 2
    assert len(long_prompt) > 3
    got = drive(batch, {})
    assert got[1][0] == one_alone(model, long_prompt, max_tokens=3)[0][:len(got[1][0])]


def test_batch_cancel_frees_the_slot_and_reuse_prefix(bundled):
    model = bundled
    prompt = model.tokenize("KING HENRY:\nWhat say you to this")
    s = model.session(ctx=CTX, batch=8, kernels="reference", n_seq=2)
    batch = colibri.Batch(s)
    assert batch.start(0, prompt, max_tokens=30) == 0
    for _ in range(3):
        batch.step()
    batch.cancel(0)
    assert batch.active == () and batch.step() == []
    reused = batch.start(0, prompt + model.tokenize(" now"), max_tokens=6)
    assert reused == len(prompt)   # the prompt's KV cache kept: only the new tokens computed
    got = drive(batch, {})
    want = one_alone(model, prompt + model.tokenize(" now"), max_tokens=6)
    assert got[0][0] == want[0] and "".join(got[0][1]) == want[1]
    batch.start(0, prompt, max_tokens=6, reuse_prefix=False)
    assert batch.prompt_done(0) == 0
    with pytest.raises(ValueError, match="seq 0 is running"):
        batch.start(0, prompt)
    with pytest.raises(colibri.Error, match=f"a prompt of {CTX + 1} tokens does not fit a context of {CTX} positions"):
        batch.start(1, [1] * (CTX + 1))
    with pytest.raises(colibri.Error, match=r"sequence 2 outside \[0, 2\)"):
        batch.start(2, prompt)

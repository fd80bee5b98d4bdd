"""A session as a conversation: a generation's last token left pending and fed first by what comes
next, so a session given the next turn computes what one forward over the whole conversation
computes (strict mode, bit for bit); truncation back to any prefix of it; the text of a generation
streamed once per token, never splitting a UTF-8 character, and cut before a stop string."""
import codecs

import numpy as np
import pytest

import colibri
from colibri.convert import convert
from colibri.demo import MODEL_DIR
from support import COMMON, build, infer, require_reference

# plain attention with a sliding window (mixtral: 5), latent attention, LFM2's short convolutions,
# gpt-oss's window of 4 with sinks, Llama 4's chunked attention
FAMILIES = ["mixtral", "deepseek_v2", "lfm2_moe", "gpt_oss", "llama4_text"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    """(name, colibri model, 24 random tokens)"""
    require_reference()
    name = request.param
    root = tmp_path_factory.mktemp(name)
    build(name).save_pretrained(root / "hf")
    tokens = np.random.default_rng(2).integers(0, COMMON["vocab_size"], 24).astype(np.int32).tolist()
    return name, colibri.Model(convert(root / "hf", root / "colibri", dtype="f32", progress=False)), tokens


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def strict(model):
    return model.session(ctx=64, batch=5, kernels="reference")


def test_the_next_turn_computes_the_whole_conversation(family):
    """Prompt, a generation, the next turn's tokens, a second generation: the same logits and tokens
    as one session fed the whole conversation at once (the first generation's last token included)."""
    name, model, tokens = family
    first, second = tokens[:6], tokens[6:10]
    s = strict(model)
    reply = s.generate(first, max_tokens=5, stop_at_eos=False)
    assert (s.position, s.pending, s.tokens) == (len(first) + 4, reply[-1], first + reply)
    turn = s.forward(second)
    conversation = first + reply + second
    whole = strict(model).forward(conversation)
    assert same_bits(turn, whole[-len(second):])
    assert s.tokens == conversation and s.pending is None

    again = s.generate([tokens[10]], max_tokens=6, stop_at_eos=False)
    fresh = strict(model)
    assert again == fresh.generate(conversation + [tokens[10]], max_tokens=6, stop_at_eos=False)
    assert s.tokens == fresh.tokens and same_bits(s.forward([3]), fresh.forward([3]))


def test_truncate_then_feed_is_a_session_fed_only_the_prefix(family):
    """Back from 24 positions (past every sliding window and attention chunk) to 12, 5, 0: what is fed
    next has the logits of a new session fed the kept tokens and then it, bit for bit."""
    name, model, tokens = family
    s = strict(model)
    s.forward(tokens)
    for keep in (12, 5, 0):
        s.truncate(keep)
        assert (s.position, s.tokens) == (keep, tokens[:keep])
        with pytest.raises(colibri.Error, match="no logits for the last position"):
            s.sample()   # the logits are a dropped position's
        got = s.forward(tokens[-4:])
        want = strict(model).forward(tokens[:keep] + tokens[-4:])[-4:]
        assert same_bits(got, want), f"{name}: truncated to {keep}"
        s.truncate(keep)


def test_truncate_keeps_or_drops_the_pending_token():
    model = colibri.Model(MODEL_DIR)
    prompt = model.tokenize("KING:")
    s = model.session(ctx=64, kernels="reference")
    reply = s.generate(prompt, max_tokens=4, temperature=0.0, stop_at_eos=False)
    held = len(prompt) + len(reply)
    with pytest.raises(colibri.Error, match=f"cannot keep {held + 1} tokens, the session holds {held}"):
        s.truncate(held + 1)
    with pytest.raises(colibri.Error):
        s.truncate(-1)
    s.truncate(held)   # all of it: the pending token stays, and the logits it was drawn from
    assert s.pending == reply[-1] and s.sample() == reply[-1]
    s.truncate(held - 1)   # the pending token dropped: the generation can be drawn again
    assert s.pending is None and s.tokens == prompt + reply[:-1] and s.sample() == reply[-1]
    s.reset()
    assert (s.tokens, s.pending, s.position) == ([], None, 0)


def test_what_is_fed_after_a_generation_follows_its_last_token():
    """prefill() and a second generation after a generation: the conversation a new session computes."""
    model = colibri.Model(MODEL_DIR)
    prompt = model.tokenize("ROMEO:")
    s = model.session(ctx=64, kernels="reference")
    reply = s.generate(prompt, max_tokens=3, temperature=0.0)
    s.prefill([10])
    more = s.generate([11], max_tokens=3, temperature=0.0)
    fresh = model.session(ctx=64, kernels="reference")
    assert more == fresh.generate(prompt + reply + [10, 11], max_tokens=3, temperature=0.0)


def test_tokenize_chooses_the_bos():
    """None: the tokenizer's template (what tokenize gave before); False: none; True: the model's BOS."""
    model = colibri.Model(MODEL_DIR)
    text = "KING:\nO, my \u00e9p\u00e9e"
    bos = model.config["bos_token_id"]
    default, none, added = (model.tokenize(text, add_bos=b) for b in (None, False, True))
    body = model.tokenizer.encode(text, add_special_tokens=False).ids
    assert none == body
    assert added == [bos] + body
    assert default == model.tokenizer.encode(text).ids


def ends_inside_a_character(data):
    d = codecs.getincrementaldecoder("utf-8")("replace")
    d.decode(data)
    return d.getstate()[0] != b""


def text_of(model, tokens):
    return b"".join(model.token_bytes(t) for t in tokens)


def first_stop_cut(text, stops):
    """The reference: the text before the first stop string to be completed, the longest of those
    the same byte completes; None when none occurs."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            return text[:end - max(map(len, done))]
    return None


@pytest.fixture(scope="module")
def sampled():
    """The bundled model, a prompt, and 200 tokens sampled hot enough that some tokens' bytes end
    inside a UTF-8 character (the byte-level vocabulary has such pieces)."""
    model = colibri.Model(MODEL_DIR)
    prompt = model.tokenize("KING:\nO, my \u00e9p\u00e9e")
    options = dict(max_tokens=200, temperature=1.6, top_k=0, top_p=1.0, seed=7, stop_at_eos=False)
    tokens = model.session(ctx=256).generate(prompt, **options)
    assert any(ends_inside_a_character(model.token_bytes(t)) for t in tokens), \
        "no generated token ends inside a character: the test would not test it"
    return model, prompt, options, tokens


def pieces_of(session, prompt, stop=(), **options):
    """The bytes each write of the core's text stream carried, per token."""
    out = colibri._core._TextOut(stop)
    per_token = []
    for _ in session.stream(prompt, _text=out, **options):
        per_token.append(out.pieces)
        out.pieces = []
    per_token[-1] = per_token[-1] + out.pieces
    return per_token


def test_streamed_text_is_each_tokens_bytes_once_in_whole_characters(sampled):
    model, prompt, options, tokens = sampled
    per_token = pieces_of(model.session(ctx=256), prompt, **options)
    writes = [p for token in per_token for p in token]
    assert b"".join(writes) == text_of(model, tokens)   # every byte once: linear in the tokens
    # at most two writes a token (the character an earlier token began, then the rest), and what waits
    # at the end: the work per token does not grow with the text
    assert len(per_token) == len(tokens) and max(map(len, per_token[:-1])) <= 2 and len(per_token[-1]) <= 3
    assert not any(ends_inside_a_character(w) for w in writes[:-1])
    s = model.session(ctx=256)
    assert "".join(s.stream_text(prompt, **options)) == model.detokenize(tokens)
    assert s.stop_reason == "max_tokens" and s.tokens == prompt + tokens


def stop_cases(text):
    """Stop strings cut from the text itself: inside one token and across tokens, one that shares a
    prefix with an earlier stretch, two completed by the same byte, one beginning with a multi-byte
    character, and one that never occurs (its prefix does)."""
    multi = next(i for i, b in enumerate(text) if b >= 0xc0)
    return [[text[40:43]], [text[90:101]], [text[120:126], text[60:70]], [text[30:36], text[33:36]],
            [text[multi:multi + 5]], [text[50:60] + b"zq"], [text[150:152], b"\xff"]]


def test_stop_strings_cut_the_text_as_the_reference_does(sampled):
    model, prompt, options, tokens = sampled
    text = text_of(model, tokens)
    for stops in stop_cases(text):
        want = first_stop_cut(text, stops)
        s = model.session(ctx=256)
        got = b"".join(p for token in pieces_of(s, prompt, stops, **options) for p in token)
        if want is None:
            assert got == text and len(s.tokens) == len(prompt) + len(tokens)
            continue
        assert got == want, stops
        # the generation ended with the token whose bytes completed the stop string
        n = next(k for k in range(1, len(tokens) + 1) if first_stop_cut(text_of(model, tokens[:k]), stops) is not None)
        assert s.tokens == prompt + tokens[:n]
        s = model.session(ctx=256)
        list(s.stream_text(prompt, stop=stops, **options))
        assert s.stop_reason == "stop"


def test_stop_strings_beyond_the_bounds_are_refused():
    model = colibri.Model(MODEL_DIR)
    s = model.session(ctx=64)
    for stop, match in ((["x" * 65], "stop string 0 is 65 bytes long: at most 64"), ([""], "stop string 0 is empty")):
        with pytest.raises(colibri.Error, match=match):
            list(s.stream_text([1], stop=stop))
    with pytest.raises(ValueError, match="17 stop strings: at most 16"):
        list(s.stream_text([1], stop=[str(i) for i in range(17)]))


def test_both_clis_stop_where_the_reference_cuts(sampled):
    """colibri-infer and `colibri generate`, greedy, with --stop: the prompt, then the text the
    reference cuts, byte for byte."""
    import subprocess
    import sys
    model = sampled[0]
    prompt = "KING:"
    ids = model.tokenize(prompt)
    tokens = model.session(ctx=256).generate(ids, max_tokens=40, temperature=0.0, stop_at_eos=False)
    text = text_of(model, tokens)
    stops = [text[25:29].decode(errors="ignore"), "zz"]
    want = prompt.encode() + first_stop_cut(text, [s.encode() for s in stops]) + b"\n"
    flags = [a for s in stops for a in ("--stop", s)]
    c = infer("native", "--model", MODEL_DIR, "--prompt", prompt, "--max_tokens", 40, "--temperature", 0,
              "--ignore_eos", *flags).stdout
    py = subprocess.run([sys.executable, "-m", "colibri", "generate", "--model", str(MODEL_DIR), "--prompt", prompt,
                         "--max-tokens", "40", "--temperature", "0", "--ignore-eos", *flags],
                        capture_output=True, timeout=300, cwd="/").stdout
    assert c == want and py == want


def test_generate_remote_streams_the_local_text():
    """`colibri generate --remote` with a text prompt and a stop string (the edge's stream_text, the
    placement kept between tokens): the text of the local run."""
    import subprocess
    import sys
    pytest.importorskip("grpc")
    from colibri.remote.server import start as start_server
    args = ["--model", str(MODEL_DIR), "--prompt", "KING:", "--max-tokens", "30", "--temperature", "0",
            "--ignore-eos", "--stop", "lord"]
    local = subprocess.run([sys.executable, "-m", "colibri", "generate", *args], capture_output=True, check=True)
    server, service, remote = start_server(MODEL_DIR, "127.0.0.1:0")
    try:
        out = subprocess.run([sys.executable, "-m", "colibri", "generate", *args, "--remote", remote,
                              "--device-threshold-ms", "2000", "--strict"], capture_output=True, timeout=120)
    finally:
        server.stop(0)
        service.close()
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert out.stdout == local.stdout and b"lord" not in out.stdout

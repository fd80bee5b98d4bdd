"""`colibri chat` in a real terminal (a pseudo-terminal: the program's controlling terminal, so
Ctrl-C is the line discipline's SIGINT, as a user's key press is): a three-turn conversation whose
replies and KV reuse are checked against a fresh session over the whole conversation, Ctrl-C in
the middle of a reply, /reset, /system, /save, and the policy when the context fills.  The model is
the bundled one with a chat template in its style (ROLE:, then the text) and room for 8192
positions, so that a reply can run long enough to be interrupted."""
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest

import colibri
from colibri.demo import MODEL_DIR

TEMPLATE = ("{%- for m in messages %}{{ m.role | upper }}:\n{{ m.content }}\n\n{% endfor %}"
            "{% if add_generation_prompt %}ASSISTANT:\n{% endif %}")
TURN = re.compile(rb"\[(\d+) tokens prefilled, (\d+) kept from earlier turns; (\d+) generated")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The bundled model with a chat template and 8192 positions (RoPE takes any)."""
    out = tmp_path_factory.mktemp("chat-model")
    doc = json.loads((MODEL_DIR / "colibri_model.json").read_text())
    doc["hparams"]["max_position_embeddings"] = 8192
    (out / "colibri_model.json").write_text(json.dumps(doc))
    for name in ("weights.bin", "tokenizer.json"):
        os.symlink(MODEL_DIR / name, out / name)
    (out / "chat_template.jinja").write_text(TEMPLATE)
    return out


class Terminal:
    """`colibri chat ARGS` on a pseudo-terminal: send() types, expect() reads until a pattern."""

    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:   # the child: the terminal is its controlling one, its process group the foreground
            # Ctrl-C as a shell leaves it to a program it starts: SIGINT not ignored, no signal blocked.
            # A fork inherits both from the forking test process, and a Python started with SIGINT
            # ignored never raises KeyboardInterrupt.
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.environ["TERM"] = "dumb"
            os.chdir("/")   # the installed colibri, not the source tree
            os.execv(sys.executable, [sys.executable, "-m", "colibri", "chat", *map(str, args)])
        self.seen = self.log = b""

    def send(self, text):
        os.write(self.fd, text.encode())

    def expect(self, pattern, timeout=60):
        """The match of `pattern` (bytes regex) in what the program wrote since the last match."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.seen)
            if m:
                self.seen = self.seen[m.end():]
                return m
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError(f"no {pattern!r} within {timeout} s ({self.signal_state()}); the terminal "
                                     f"shows {self.log[-2000:]!r}")
            try:
                data = os.read(self.fd, 65536)
                self.seen, self.log = self.seen + data, self.log + data
            except OSError:   # the program ended
                raise AssertionError(f"the program ended without {pattern!r}: {self.seen[-2000:]!r}") from None

    def signal_state(self):
        """The program's blocked, ignored and caught signals (/proc/PID/status), for a failure's message."""
        try:
            with open(f"/proc/{self.pid}/status") as f:
                return ", ".join(line.strip() for line in f if line.startswith(("SigBlk", "SigIgn", "SigCgt")))
        except OSError as e:
            return f"no /proc/{self.pid}/status: {e}"

    def close(self):
        """The exit status once the program has ended (killed after 30 s)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            try:   # drain what it writes, so that it never blocks on a full terminal
                self.seen += os.read(self.fd, 65536) if select.select([self.fd], [], [], 0.1)[0] else b""
            except OSError:   # its side closed: it is ending
                time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError("the program did not end")


def shared_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_three_turns_reuse_the_cache_and_reply_as_one_forward_would(chat_model, tmp_path):
    """Each turn's reply is, token for token, what a fresh session prefilled with the whole
    conversation generates; each turn prefills only what the session did not hold (measured: the
    program's own count equals the shared prefix of the conversation's ids with the previous
    conversation and its reply)."""
    term = Terminal("--model", chat_model, "--temperature", "0", "--max-tokens", "24", "--verbose")
    turns = []
    for user in ("ROMEO", "JULIET", "Wherefore art thou?"):
        term.expect(rb"> ")
        term.send(user + "\n")
        turns.append([int(x) for x in term.expect(TURN).groups()])
    term.expect(rb"> ")
    term.send(f"/save {tmp_path / 'talk.json'}\n")
    term.expect(rb"\[saved 6 messages")
    term.send("/quit\n")
    assert term.close() == 0

    model = colibri.Model(chat_model)
    messages = json.loads((tmp_path / "talk.json").read_text())
    held = []   # what the session held after the previous turn: its conversation, then its reply
    for i, (prefilled, kept, generated) in enumerate(turns):
        ids = model.tokenize(model.apply_chat_template(messages[:2 * i + 1]))
        session = model.session(ctx=8192)
        reply = session.generate(ids, max_tokens=24)
        assert model.detokenize(reply) == messages[2 * i + 1]["content"], f"turn {i + 1}"
        assert generated == len(reply) == 24
        assert kept == min(shared_prefix(held, ids), len(ids) - 1) and prefilled == len(ids) - kept
        if i:
            assert kept >= len(held) - len(reply), f"turn {i + 1} re-prefilled earlier turns: {turns}"
        held = ids + reply
    print("turns (prefilled, kept, generated):", turns)


def test_ctrl_c_stops_a_reply_and_keeps_the_conversation(chat_model, tmp_path):
    term = Terminal("--model", chat_model, "--ctx", "8192", "--temperature", "0", "--verbose")
    term.expect(rb"> ")
    term.send("ROMEO\n")
    term.expect(rb"ROMEO\r?\n")       # the line's echo, then the reply streams
    term.expect(rb"\S{4}")            # some of the reply: it runs until the 8192 positions fill
    term.send("\x03")                 # Ctrl-C
    term.expect(rb"\[stopped\]")
    first = [int(x) for x in term.expect(TURN).groups()]
    assert first[2] < 8192 - first[0], f"the reply ran to the end of the context: {first}"
    term.expect(rb"> ")               # the program goes on, the conversation too
    term.send("/system You speak in verse.\n")
    term.expect(rb"\[system prompt set\]")
    term.expect(rb"> ")
    # Ctrl-C at the prompt: a fresh line, nothing else.  Not at once: a SIGINT that lands between
    # readline's prompt and its wait is only seen at the next key (CPython checks signals when the
    # wait is interrupted), which no typist's timing reaches but a test's does
    time.sleep(0.5)
    term.send("\x03")
    term.expect(rb"> ")
    term.send("/save " + str(tmp_path / "talk.json") + "\n")
    term.expect(rb"\[saved 2 messages")
    term.send("/reset\n")
    term.expect(rb"\[conversation cleared\]")
    term.expect(rb"> ")
    term.send("/quit\n")
    assert term.close() == 0
    talk = json.loads((tmp_path / "talk.json").read_text())
    assert [m["role"] for m in talk] == ["system", "user", "assistant"] and talk[2]["content"]


@pytest.mark.parametrize("shift", [False, True])
def test_a_full_context_is_refused_or_shifted(chat_model, shift):
    """--ctx 96, replies of 24: the third turn no longer fits with room for a reply.  Without
    --context-shift the turn is refused with a message and the program goes on; with it the oldest
    turns go and the reply comes."""
    r = subprocess.run([sys.executable, "-m", "colibri", "chat", "--model", str(chat_model), "--ctx", "96",
                        "--max-tokens", "24", "--temperature", "0", "--verbose", *(["--context-shift"] if shift else [])],
                       input="ROMEO\nJULIET\nMERCUTIO\nTYBALT\n", capture_output=True, text=True, timeout=120, cwd="/")
    assert r.returncode == 0, r.stderr
    turns = re.findall(r"\[(\d+) tokens prefilled, (\d+) kept", r.stderr)
    if shift:
        assert len(turns) == 4 and "context holds" not in r.stderr, r.stderr
        assert any(int(k) == 0 or int(p) > 30 for p, k in turns[2:]), turns   # earlier turns dropped: re-prefilled
    else:
        assert len(turns) < 4 and "context holds 96" in r.stderr and "--context-shift" in r.stderr, r.stderr

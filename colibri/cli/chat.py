"""colibri chat: a conversation with a model in the terminal.

Each turn renders the whole conversation with the model's chat template (colibri.chat), tokenizes
it, and feeds only what the session does not hold yet: the longest prefix shared with the
session's tokens stays in the KV cache (a template that renders an earlier turn otherwise, e.g.
dropping its reasoning, costs the tokens from there on, not the conversation).  The reply streams
as it is generated and ends at any of the model's end-of-turn ids; Ctrl-C stops it and keeps what
was said.  Commands: /reset, /system TEXT, /save FILE, /quit.

When the conversation no longer fits the context: without --context-shift the turn is refused
with a message (/reset starts again); with it, the oldest turns after the system prompt are
dropped until the conversation and a reply of --max-tokens fit.
"""
import json
import signal
import sys
import threading
import time

from colibri.cli.options import (INT32_MAX, count_in, kv_type_argument, open_model, resolve_seed, sampling_arguments,
                                 sampling_options, stream_options, streaming_arguments)

COMMANDS = "/reset  /system TEXT  /save FILE  /quit"


class Conversation:
    """The messages, the model's session and what a turn costs (tokens prefilled, kept, generated)."""

    def __init__(self, model, session, args):
        from colibri import chat

        self.model, self.session, self.args = model, session, args
        self.templates = chat.read(model.directory)
        self.template_args = dict(args.template_arg or [])
        self.add_bos = not self.templates.writes_bos(args.template)   # the template writes BOS itself, or not
        self.system = args.system
        self.messages = []

    def reset(self):
        self.messages = []
        self.session.reset()

    def _ids(self, messages):
        text = self.model.apply_chat_template(messages, add_generation_prompt=True, template=self.args.template,
                                              **self.template_args)
        return self.model.tokenize(text, add_bos=self.add_bos)

    def _with_system(self, messages):
        return ([{"role": "system", "content": self.system}] if self.system else []) + messages

    def prompt(self, user):
        """The conversation's ids with `user`'s turn added, dropping the oldest turns when
        --context-shift allows and it would not fit; None (after saying why) when it cannot fit."""
        messages = self.messages + [{"role": "user", "content": user}]
        room = self.session.n_ctx - min(self.args.max_tokens or 1, self.session.n_ctx // 2)
        ids = self._ids(self._with_system(messages))
        while len(ids) > room and self.args.context_shift and len(messages) > 1:
            messages = messages[2:] if messages[0]["role"] == "user" and len(messages) > 2 else messages[1:]
            ids = self._ids(self._with_system(messages))
        if len(ids) > room:
            print(f"[the conversation takes {len(ids)} tokens; the context holds {self.session.n_ctx} with room for "
                  f"a reply: /reset, or run with --context-shift to drop the oldest turns]", file=sys.stderr)
            return None
        self.messages = messages
        return ids

    def feed_plan(self, ids):
        """How many of `ids` the session keeps (their longest shared prefix with its tokens; it is
        rolled back to them), so only the rest is prefilled."""
        held = self.session.tokens
        keep = 0
        for a, b in zip(held, ids):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)   # at least one token fed: the reply is drawn from its logits
        if keep < len(held):
            try:
                self.session.truncate(keep)
            except Exception:   # a state that cannot be rolled back (a convolution's, a wrapped window)
                self.session.reset()
                keep = 0
        return keep

    def reply(self, user, out):
        """Streams the reply to `user` into `out`; returns (kept, prefilled, generated, seconds)."""
        ids = self.prompt(user)
        if ids is None:
            return None
        keep = self.feed_plan(ids)
        args, pieces = self.args, []
        t0 = time.perf_counter()
        stream = self.session.stream_text(ids[keep:], max_tokens=args.max_tokens or INT32_MAX, temperature=args.temperature,
                                          top_k=args.top_k, top_p=args.top_p, seed=args.seed + len(self.messages),
                                          stop=args.stop or (), **sampling_options(args))
        # Ctrl-C stops the reply at its next piece; the program and the conversation go on.  A flag,
        # not KeyboardInterrupt: an exception raised where the interpreter happens to run the handler
        # (a finalizer the collector runs mid-token) would be printed and dropped, and the reply
        # would run on to the end of the context.
        interrupted = []
        main = threading.current_thread() is threading.main_thread()   # where signal handlers can be set
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.append(True)) if main else None
        try:
            for piece in stream:
                pieces.append(piece)
                out.write(piece)
                out.flush()
                if interrupted:
                    break
        except KeyboardInterrupt:
            interrupted.append(True)
        finally:
            if main:
                signal.signal(signal.SIGINT, previous)
        if interrupted:
            stream.close()
            out.write("\n[stopped]")
        out.write("\n")
        out.flush()
        self.messages.append({"role": "assistant", "content": "".join(pieces)})
        if self.session.stop_reason == "context_full":
            print("[the context is full: the reply was cut; /reset, or --context-shift]", file=sys.stderr)
        return keep, len(ids) - keep, len(self.session.tokens) - len(ids), time.perf_counter() - t0

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self._with_system(self.messages), f, ensure_ascii=False, indent=1)


def _template_arg(text):
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise ValueError(f"expects KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)   # true, 3, "x"
    except ValueError:
        return key, value


def cmd_chat(args):
    model = open_model(args.model, stream_experts=args.expert_budget is not None)
    resolve_seed(args)
    session = model.session(ctx=args.ctx, batch=args.batch, threads=args.threads, kv_type=args.kv_type,
                            **stream_options(model, args))
    try:
        talk = Conversation(model, session, args)
    except ValueError as e:
        raise SystemExit(f"colibri chat: {e}")
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        print(f"[colibri chat: {model.path}, {session.n_ctx} positions; {COMMANDS}]", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        except KeyboardInterrupt:   # Ctrl-C at the prompt: a fresh line, as shells do
            print(file=sys.stderr)
            continue
        if not line.strip():
            continue
        command, _, rest = line.strip().partition(" ")
        if command == "/quit":
            break
        if command == "/reset":
            talk.reset()
            print("[conversation cleared]", file=sys.stderr)
            continue
        if command == "/system":
            talk.system = rest or None
            print(f"[system prompt {'set' if rest else 'removed'}]", file=sys.stderr)
            continue
        if command == "/save":
            if not rest:
                print("[/save FILE]", file=sys.stderr)
                continue
            talk.save(rest)
            print(f"[saved {len(talk.messages)} messages to {rest}]", file=sys.stderr)
            continue
        if command.startswith("/") and command[1:].isalpha():
            print(f"[unknown command {command}: {COMMANDS}]", file=sys.stderr)
            continue
        turn = talk.reply(line, sys.stdout)
        if turn and args.verbose:
            kept, fed, count, seconds = turn
            print(f"[{fed} tokens prefilled, {kept} kept from earlier turns; {count} generated in {seconds:.2f} s; "
                  f"{session.position} of {session.n_ctx} positions]", file=sys.stderr)
    return 0


def add_chat(sub):
    c = sub.add_parser("chat", help="talk with a model in the terminal (its chat template, turn by turn)",
                       description=__doc__)
    c.add_argument("--model", help="colibri model directory or GGUF file (default: the bundled model)")
    c.add_argument("--system", help="the system prompt (/system changes it)")
    c.add_argument("--template", help="which of the model's chat templates (e.g. tool_use; default: its default)")
    c.add_argument("--template-arg", type=_template_arg, action="append", metavar="KEY=VALUE",
                   help="a variable for the template, VALUE as JSON where it parses (enable_thinking=false)")
    c.add_argument("--ctx", type=count_in(0, INT32_MAX), default=0,
                   help="KV cache positions (default: the model's, at most 4096)")
    c.add_argument("--batch", type=count_in(0, INT32_MAX), default=0, help="prefill tokens per forward (default 64)")
    c.add_argument("--threads", type=count_in(0, 4096), default=0)
    kv_type_argument(c)
    c.add_argument("--max-tokens", type=count_in(0, INT32_MAX), default=0,
                   help="the longest reply, 0 = until the model ends its turn or the context fills (default 0)")
    c.add_argument("--temperature", type=float, default=0.8, help="0 means greedy (default 0.8)")
    c.add_argument("--top-k", type=count_in(0, INT32_MAX), default=40, help="0 = no limit (default 40)")
    c.add_argument("--top-p", type=float, default=0.95, help="1 = off (default 0.95)")
    c.add_argument("--seed", type=count_in(-1, INT32_MAX), default=-1,
                   help="sampling seed, -1 = a random one (printed with --verbose) (default -1)")
    c.add_argument("--stop", action="append", metavar="TEXT", help="also end a reply at this text (repeatable)")
    c.add_argument("--context-shift", action="store_true",
                   help="when the conversation no longer fits, drop its oldest turns after the system prompt "
                        "(default: refuse the turn with a message)")
    c.add_argument("--verbose", action="store_true", help="per turn: tokens prefilled, kept, generated")
    sampling_arguments(c)
    streaming_arguments(c)
    c.set_defaults(func=cmd_chat)

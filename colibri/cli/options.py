"""What several commands share: the model they run (the bundled one unless given), integer and size
arguments, the prompt and sampling options, expert streaming's options, and the prompt's token ids."""
import argparse
import os
import re
import sys
from fractions import Fraction

import colibri
from colibri import experts
from colibri.demo import MODEL_DIR as BUNDLED_MODEL


def open_model(path, verify=False, experts_elsewhere=False, stream_experts=False, repack=True):
    """stream_experts: the sessions take an --expert-budget, so the routed experts stay unread at open;
    repack: False for --as-stored (colibri.Model's repack)."""
    if path is None:
        path = BUNDLED_MODEL
        if not (path / "colibri_model.json").exists():
            raise SystemExit(f"colibri: the bundled model is missing from {path}; give one with --model")
    return colibri.Model(path, verify=verify, experts_elsewhere=experts_elsewhere, stream_experts=stream_experts,
                         repack=repack)


INT32_MAX = 2 ** 31 - 1


def count_in(lo, hi):
    """An argparse type: an integer in [lo, hi]; argparse names the option when it is not one."""
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects an integer, got {text!r}") from None
        if not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"{n} is outside [{lo}, {hi}]")
        return n
    parse.__name__ = "integer"
    return parse


_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text, whole=None):
    """Bytes from a SIZE: plain bytes ("1048576"), binary units ("512K", "512M", "2G", "1.5G"; "MiB",
    "MB" read alike, 1024-based) or a percentage ("50%") of `whole` bytes (a callable is called only
    for a percentage).  ValueError names what is wrong."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgt])(?:i?b)?|(%)|b?)\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a size: give bytes, or K, M, G units (512M, 2G), or a percentage (50%)")
    number, unit, percent = Fraction(m.group(1)), (m.group(2) or "").lower(), m.group(3)
    if percent:
        total = whole() if callable(whole) else whole
        if total is None:
            raise ValueError(f"{text!r}: a percentage needs the whole it is of")
        return int(number * total / 100)
    if number.denominator != 1 and not unit:
        raise ValueError(f"{text!r}: bytes are whole")
    return int(number * _UNITS[unit])


def checkout_names(module, name):
    """targets.TARGETS or firmware.BOARDS, for argparse's choices; None without the C sources
    (any name then: the command says why it cannot build)."""
    from colibri.targets import TargetError

    try:
        return list(getattr(module, name))
    except TargetError:
        return None


def logit_bias(text):
    """An argparse type: {id: bias} from ID=BIAS,ID=BIAS (the ids' range is the core's to check)."""
    pairs = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        token, eq, bias = item.partition("=")
        try:
            pairs[int(token)] = float(bias)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects ID=BIAS pairs, comma-separated (5=-inf,17=2.5), got {text!r}")
        if not eq or pairs[int(token)] != pairs[int(token)]:
            raise argparse.ArgumentTypeError(f"expects ID=BIAS pairs, comma-separated (5=-inf,17=2.5), got {text!r}")
    return pairs


def sampling_options(args):
    """Session.stream's keyword-only sampling options from the flags generation_arguments adds."""
    return dict(min_p=args.min_p, repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                logit_bias=args.logit_bias)


def generation_arguments(p, tokens_help):
    """The prompt and sampling options `generate` and `firmware run` share."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt", default="", help="prompt text, encoded by the encoder the model carries; - reads standard input")
    src.add_argument("--tokens", help=tokens_help)
    p.add_argument("--max-tokens", type=count_in(0, INT32_MAX), default=64, help="tokens to generate (default 64)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 means greedy (default 0.8)")
    p.add_argument("--top-k", type=count_in(0, INT32_MAX), default=40, help="0 = no limit (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="1 = off (default 0.95)")
    p.add_argument("--seed", type=count_in(-1, INT32_MAX), default=0,
                   help="sampling seed, -1 = a random one (printed with --verbose) (default 0)")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")


def sampling_arguments(p):
    """The sampling steps `generate` adds (colibri.h's order: bias, penalties, temperature, top-k,
    top-p, min-p), as colibri-infer has them."""
    p.add_argument("--min-p", type=float, default=0.0,
                   help="keep tokens at least P times the most likely's probability, 0 = off (default 0)")
    p.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="a token among the last --repeat-last-n: its logit divided (multiplied when negative), "
                        "1 = off (default 1)")
    p.add_argument("--repeat-last-n", type=count_in(-1, INT32_MAX), default=64,
                   help="the tokens the penalties count, the prompt's included; 0 = off, -1 = the core's whole "
                        "window (default 64)")
    p.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtracted from the logit of a token among them (default 0)")
    p.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtracted from a token's logit, times its count among them (default 0)")
    p.add_argument("--logit-bias", type=logit_bias, metavar="ID=B,...",
                   help="add B to token ID's logit (-inf bans it), before the penalties")


def resolve_seed(args):
    """--seed -1: a random seed in [0, 2^31) (what --seed takes back), on stderr with --verbose."""
    if args.seed == -1:
        args.seed = int.from_bytes(os.urandom(4), "little") & INT32_MAX
        if args.verbose:
            print(f"[seed: {args.seed} (--seed {args.seed} repeats this run)]", file=sys.stderr)


def build_dir_argument(p):
    p.add_argument("--build-dir", metavar="DIR", help="where the builds go, one folder each (default: "
                   "$COLIBRI_BUILD_DIR, else build/ of a checkout, else ~/.cache/colibri/)")


def kv_type_name(text):
    """argparse's type of --kv-type: a name Session's kv_type takes (the core's table)."""
    try:
        from colibri._core import KV_TYPES
    except ImportError:   # no core built: the command says so, clearly, when it opens the model
        return text
    if text not in KV_TYPES:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(KV_TYPES)}")
    return text


def kv_type_argument(p):
    """--kv-type: what a session's KV cache stores (Session's kv_type)."""
    p.add_argument("--kv-type", metavar="{f32,f16,q8_0}", type=kv_type_name, default="f32",
                   help="what the KV cache stores: f32 (exact, the default), f16 (half the bytes) or q8_0 (8-bit "
                        "blocks of 32 along each head: 34 bytes a 32, head_dim a multiple of 32)")


def streaming_arguments(p):
    """Expert streaming, which `generate` and `memdump` share."""
    s = p.add_argument_group("expert streaming", "the routed experts read from storage into a cache in the "
                             "arena instead of being used where weights.bin is mapped; the output is the same")
    s.add_argument("--expert-budget", metavar="SIZE",
                   help="bytes of cache slots: plain bytes, K/M/G binary units (512M, 2G), or a percentage "
                        "of what every routed expert takes (50%%); at least one layer's top-k experts "
                        "(default: resident, no cache)")
    s.add_argument("--expert-cache", choices=["global", "per_layer"], default="global",
                   help="one pool for every layer (default) or the slots split evenly among the MoE layers")
    s.add_argument("--direct-io", action="store_true", help="read with O_DIRECT, past the page cache")
    s.add_argument("--no-prefetch", action="store_true",
                   help="read only the experts a token needs (no guess of the next layer's)")
    s.add_argument("--verify-experts", action="store_true",
                   help="check each expert's extent against its CRC-32 when first read (interleaved files)")
    s.add_argument("--pin", metavar="LOAD.json",
                   help="pin the most loaded experts of a load colibri stats --save-load wrote: read at the "
                        "start, never evicted (default: the hot ones, with at least twice an even share of "
                        "their layer's tokens, as many as fit: the slots less one layer's top-k)")
    pin = s.add_mutually_exclusive_group()
    pin.add_argument("--pin-count", type=count_in(0, INT32_MAX), metavar="N", help="pin the N most loaded experts")
    pin.add_argument("--pin-share", type=float, metavar="F",
                     help="pin a share F of the slots (0 to 1; at most the slots less one layer's top-k)")


def stream_options(model, args):
    """Model.session's expert streaming options from the --expert-budget, --expert-cache,
    --direct-io, --no-prefetch and --pin arguments ({} for a resident run)."""
    opts = dict(expert_cache=args.expert_cache, direct_io=args.direct_io, prefetch=not args.no_prefetch,
                verify=args.verify_experts)
    pin_choice = args.pin_count is not None or args.pin_share is not None
    if args.pin is None and pin_choice:
        raise SystemExit(f"colibri {args.command}: --pin-count and --pin-share choose from a --pin FILE; give it")
    if args.expert_budget is None:
        if args.pin is not None:
            raise SystemExit(f"colibri {args.command}: --pin needs --expert-budget (a resident run has no cache to pin in)")
        return {}
    if args.pin_share is not None and not 0 <= args.pin_share <= 1:
        raise SystemExit(f"colibri {args.command}: --pin-share is a share of the slots, in [0, 1], not {args.pin_share}")

    try:   # a percentage is of what slots for every routed expert take
        opts["expert_budget"] = budget = parse_size(args.expert_budget, lambda: experts.routed_bytes(model, **opts))
        if args.pin is not None:
            load = experts.read_load(args.pin, model)
            if budget == 0:
                raise ValueError("--pin needs an --expert-budget above 0 (a resident run has no cache to pin in)")
            if budget < model.expert_slots(**opts)[1]:
                return opts   # the session refuses it, naming the minimum
            opts["pins"] = experts.choose_pins(load, model.config["top_k"], model.expert_slot_count(**opts),
                                               experts.moe_layers(model), args.expert_cache == "per_layer",
                                               args.pin_count, args.pin_share)
    except ValueError as e:
        raise SystemExit(f"colibri {args.command}: {e}")
    return opts


def prompt_ids(model, args):
    if args.tokens is not None:
        try:
            ids = [int(t) for t in args.tokens.split(",") if t.strip()]
        except ValueError:
            raise SystemExit(f"colibri {args.command}: --tokens expects comma-separated integers, got {args.tokens!r}")
        if not ids:
            raise SystemExit(f"colibri {args.command}: --tokens {args.tokens!r} holds no token id")
        outside = [t for t in ids if not 0 <= t < model.vocab_size]
        if outside:
            raise SystemExit(f"colibri {args.command}: --tokens: id {outside[0]} is outside the vocabulary "
                             f"[0, {model.vocab_size})")
        return ids
    from colibri import Error

    if args.prompt == "-":   # standard input's bytes, as colibri-infer reads --prompt -
        args.prompt = os.fsdecode(sys.stdin.buffer.read())
    prompt = os.fsencode(args.prompt)   # argv's bytes as given, invalid UTF-8 included, as colibri-infer
    try:   # the core's encoder (colibri_tokenize), as the model's tokenizer encodes
        ids = model.tokenize(prompt)
    except Error:   # a model converted before models carried one
        if model.tokenizer is None:
            raise SystemExit(f"colibri: {model.path} has no tokenizer.json; give the prompt as ids with --tokens")
        try:
            ids = model.tokenizer.encode(prompt.decode("utf-8")).ids
        except UnicodeDecodeError as e:
            raise SystemExit(f"colibri: the prompt is not UTF-8 (byte {e.start}) and {model.path} has no byte "
                             f"table for the core's encoder: reconvert it with colibri convert")
    if not ids:
        bos = model.config["bos_token_id"]
        if bos < 0:
            raise SystemExit("colibri: the prompt is empty and the model has no BOS token")
        ids = [bos]
    return ids

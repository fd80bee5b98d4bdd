"""The `colibri` command: convert, validate, generate, memdump, firmware, profile, stats, serve-experts.

    colibri generate --prompt "ROMEO:"                     # the bundled Shakespeare model
    colibri convert path/to/hf-mixtral out/model [--dtype f16]
    colibri validate out/model
    colibri generate --model out/model --prompt "The capital of France is" --max-tokens 32
    colibri memdump --model out/model --ctx 2048
    colibri firmware run --board mps2-an386 --prompt "ROMEO:"   # the bundled model on a board, under QEMU
    colibri firmware export --board mps2-an386 --out fw         # sources, model and plan for a firmware of one's own
    colibri profile show profile.json                      # written by colibri-infer --profile
    colibri stats --model out/model --text some.txt        # per-expert load and loss on a text
    colibri serve-experts --model out/model --listen 127.0.0.1:50051   # experts for other machines (gRPC)

Expert streaming reads the routed experts from storage into a cache of SIZE bytes in the arena
(bytes, K/M/G binary units, or a percentage of what every routed expert takes); the text is the
same as the resident run's:

    colibri generate --model out/model --expert-budget 512M --verbose   # the cache's counters on stderr
    colibri memdump --model out/model --expert-budget 2G                # the slot pool in the report
    colibri stats --model out/model --text some.txt --save-load load.json
    colibri generate --model out/model --expert-budget 50% --pin load.json --pin-share 0.5

Experts on another machine (docs/DEVICES.md): a server computes the experts placed there; an
orchestrator places each edge's hottest experts local under its budget, by measured load:

    colibri serve-experts --model out/model --listen 127.0.0.1:50051
    colibri orchestrate --listen 127.0.0.1:50061 --state orchestrator.json
    colibri generate --model out/model --expert-budget 25% --remote 127.0.0.1:50051 \
        --orchestrator 127.0.0.1:50061 --edge-name kiosk-3 --verbose
"""
import argparse
import json
import os
import re
import signal
import sys
import time
from fractions import Fraction
from pathlib import Path

import colibri
from colibri import experts
from colibri.demo import MODEL_DIR as BUNDLED_MODEL
from colibri.tokenizer import read_regular_text


def _model(path, verify=False, experts_elsewhere=False):
    if path is None:
        path = BUNDLED_MODEL
        if not (path / "colibri_model.json").exists():
            raise SystemExit(f"colibri: the bundled model is missing from {path}; give one with --model")
    if experts_elsewhere:
        return colibri.Model(path, verify=verify, experts_elsewhere=True)
    return colibri.Model(path, verify=verify)


INT32_MAX = 2 ** 31 - 1


def _count(lo, hi):
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


# convert --quantize NAME: the weight dtype it means (the spec writes w4a16: 4-bit weights, 16-bit activations).
QUANTIZE = {"w4a16": "w4g128", "w4g128": "w4g128", "q8_0": "q8_0", "q4_0": "q4_0"}


def _one_spelling(what, *given):
    """The value of an option that has several spellings: (spelling, value) pairs, None where not given."""
    named = [(flag, value) for flag, value in given if value is not None]
    if len(named) > 1:
        raise SystemExit(f"colibri convert: {' and '.join(flag for flag, _ in named)} both give the {what}: use one")
    return named[0][1] if named else None


def cmd_convert(args):
    from colibri.convert import convert

    src = _one_spelling("source", ("SRC", args.src), ("--input-dir", args.input_dir))
    out = _one_spelling("output directory", ("OUT", args.out), ("--output-dir", args.output_dir))
    if src is None or out is None:
        raise SystemExit("colibri convert: give the source and the output directory (SRC OUT, or --input-dir and --output-dir)")
    dtype = _one_spelling("weight dtype", ("--quant", args.dtype),
                          ("--quantize", QUANTIZE.get(args.quantize) if args.quantize else None)) or "f32"
    # SIGTERM unwinds like Ctrl-C, so the unfinished model is removed (a kill -9 leaves it for the next run)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    out = convert(src, out, dtype=dtype, progress=not args.quiet, layout=args.layout, repack=args.repack)
    model = _model(out)   # convert() has loaded it with verify=True before putting it in place
    matrices = sorted({t["dtype"] for t in model.tensors() if len(t["shape"]) >= 2 and t["dtype"] not in ("u8", "i32")})
    print(f"wrote {out}: {model.architecture}, {len(model.tensors())} tensors, "
          f"{model.weight_bytes / 1e6:.1f} MB of weights, matrices in {', '.join(matrices)} (validated)")
    return 0


def cmd_validate(args):
    model = _model(args.model, verify=True)
    cfg = model.config
    print(f"{model.path}: valid {model.architecture} model")
    print(f"  {cfg['num_layers']} layers, hidden {cfg['hidden_size']}, {cfg['num_heads']} heads "
          f"({cfg['num_kv_heads']} kv) x {cfg['head_dim']}, vocab {cfg['vocab_size']}")
    print(f"  {cfg['num_experts']} experts of ffn {cfg['intermediate_size']}, top-{cfg['top_k']} routing")
    print(f"  {len(model.tensors())} tensors, {model.weight_bytes:,} bytes: shapes, offsets, "
          f"CRC-32 checksums and finiteness checked")
    enc = json.loads(read_regular_text(Path(model.path) / "colibri_model.json")).get("encoder")
    print(f"  encoder: {enc['kind']}, {enc['pre_tokenizer']} pre-tokenizer; its ids, merges and order checked" if enc
          else "  no encoder: runs on token ids (reconvert with colibri convert to encode text in the core)")
    return 0


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


def _stream_options(model, args):
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


def _cache_counters(stats):
    """One line of the expert cache's counters, for --verbose."""
    demanded = stats["hits"] + stats["misses"]
    return (f"[expert cache: {stats['slots']} slots of {stats['slot_bytes']:,} B, {stats['pinned']} pinned; "
            f"{stats['hits']} hits, {stats['misses']} misses ({stats['hits'] / max(demanded, 1):.1%} hit rate), "
            f"{stats['prefetches']} prefetches, {stats['prefetch_hits']} prefetch hits; "
            f"{stats['bytes_read'] / 1e6:.2f} MB read in {stats['reads']} reads, "
            f"{stats['io_wait_ns'] / 1e6:.1f} ms I/O wait]")


def _prompt_ids(model, args):
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


def generate_on_target(model, ids, args):
    """The same run through colibri-infer built for another target, under QEMU."""
    import subprocess

    from colibri import targets

    if not 0 <= args.seed <= INT32_MAX:   # what colibri-infer takes; the Python API takes any integer mod 2**64
        raise SystemExit(f"colibri generate: --seed {args.seed}: a --target run takes 0 to {INT32_MAX}")
    command = targets.infer_command(args.target) + [
        "--model", model.path, "--tokens", ",".join(map(str, ids)), "--max_tokens", str(args.max_tokens),
        "--temperature", str(args.temperature), "--top_k", str(args.top_k), "--top_p", str(args.top_p),
        "--seed", str(args.seed), "--ctx", str(args.ctx or min(model.config["max_position_embeddings"], 4096))]
    if args.batch:
        command += ["--batch", str(args.batch)]
    if args.ignore_eos:
        command.append("--ignore_eos")
    if args.tokens is not None:
        command.append("--ids")
    if args.verbose:
        command.append("--verbose")
    if args.threads:
        command += ["--threads", str(args.threads)]
    stream = _stream_options(model, args)
    if "pins" in stream:
        raise SystemExit("colibri generate: --pin runs natively only (colibri-infer takes no pins)")
    if stream:
        command += ["--expert_budget", str(stream["expert_budget"]), "--expert_cache", stream["expert_cache"]]
        command += ["--direct_io"] * stream["direct_io"] + ["--no_prefetch"] * (not stream["prefetch"])
        command += ["--verify_experts"] * stream["verify"]
    return subprocess.run(command, env=targets.env_for(args.target)).returncode


def cmd_generate(args):
    model = _model(args.model, experts_elsewhere=args.remote is not None and args.experts_elsewhere)
    ids = _prompt_ids(model, args)
    if args.target != "native":
        if args.remote is not None:
            raise SystemExit("colibri generate: --remote runs natively only")
        return generate_on_target(model, ids, args)
    if args.remote is not None:
        edge = _edge(model, args)
        session = edge.session
    else:
        edge = None
        session = model.session(ctx=args.ctx, batch=args.batch, threads=args.threads, **_stream_options(model, args))
    decode = None   # text out: the core's byte table, else the tokenizer library; ids for --tokens
    if args.tokens is None:
        decode = model.detokenize if model.token_bytes(0) is not None else model.tokenizer.decode
    out = sys.stdout
    if decode is not None:
        out.flush()
        out.buffer.write(os.fsencode(args.prompt))   # the prompt's own bytes back
    out.flush()

    generated, printed = [], ""
    start = time.perf_counter()
    for token in (edge or session).stream(ids, max_tokens=args.max_tokens, temperature=args.temperature,
                                          top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                                          stop_at_eos=not args.ignore_eos):
        generated.append(token)
        if decode is None:
            out.write(("," if len(generated) > 1 else "") + str(token))
        else:
            # decode the whole continuation, print what is new once it is whole UTF-8
            text = decode(generated)
            if not text.endswith("\ufffd"):
                out.write(text[len(printed):])
                printed = text
        out.flush()
    elapsed = time.perf_counter() - start
    out.write("\n")
    if args.verbose:
        print(f"[{len(ids)} prompt tokens, {len(generated)} generated in {elapsed * 1e3:.0f} ms, "
              f"{(len(ids) + len(generated)) / elapsed:.1f} tok/s overall]", file=sys.stderr)
        if session.expert_budget:
            print(_cache_counters(session.expert_cache_stats()), file=sys.stderr)
        for line in edge.counters() if edge else ():
            print(line, file=sys.stderr)
    if edge:
        edge.close()
    return 0


def _edge(model, args):
    """colibri.remote.Edge from generate's --remote arguments (the edge and cloud group)."""
    from colibri.remote.driver import RemoteError
    from colibri.remote.edge import Edge

    if args.placement_load is not None and args.placement != "auto":
        raise SystemExit("colibri generate: --placement-load chooses the first placement of --placement auto")
    stream = _stream_options(model, args)
    try:
        return Edge(model, args.remote, placement=args.placement, load=args.placement_load,
                    orchestrator=args.orchestrator, name=args.edge_name,
                    expert_budget=stream.pop("expert_budget", None),
                    experts_elsewhere=args.experts_elsewhere, fetch_mbit=args.fetch_mbit, token=args.token,
                    tls_ca=args.tls_ca, deadline_ms=args.device_deadline_ms,
                    device_threshold_ms=args.device_threshold_ms, strict=args.strict,
                    ctx=args.ctx, batch=args.batch, threads=args.threads, **stream)
    except (ValueError, OSError, RemoteError) as e:
        raise SystemExit(f"colibri generate: {e}")


def edge_arguments(p):
    """generate's edge and cloud options: experts computed on an expert server (docs/DEVICES.md)."""
    import os

    e = p.add_argument_group("edge and cloud", "experts computed by a `colibri serve-experts` server, placed by "
                             "measured load; the text is the local run's when both compute with the same kernels")
    e.add_argument("--remote", metavar="HOST:PORT", help="the expert server: experts placed there are computed there")
    e.add_argument("--placement", default="auto", metavar="FILE|auto",
                   help="a placement JSON file, or auto (default): the budget's hottest experts of --placement-load "
                        "local, else the first budget's share of each layer's experts")
    e.add_argument("--placement-load", metavar="LOAD.json",
                   help="the expert load (colibri stats --save-load) --placement auto starts from")
    e.add_argument("--orchestrator", metavar="HOST:PORT",
                   help="send heartbeats there and run the placements it pushes (colibri orchestrate)")
    e.add_argument("--edge-name", metavar="N", help="this edge's name at the orchestrator (default: the host name)")
    e.add_argument("--experts-elsewhere", action="store_true",
                   help="the model directory lacks the routed experts: local ones are fetched from the server "
                        "(needs --expert-budget)")
    e.add_argument("--fetch-mbit", type=float, metavar="M", help="at most M Mbit/s of expert fetches (default: no cap)")
    e.add_argument("--device-threshold-ms", type=float, default=5.0, metavar="T",
                   help="a device whose P90 latency passes T ms is bypassed: its experts run here (default 5)")
    e.add_argument("--device-deadline-ms", type=float, default=1000, metavar="D",
                   help="a remote call not answered in D ms fails (and falls back; default 1000)")
    e.add_argument("--strict", action="store_true", help="a failed or slow device call fails the run instead")
    e.add_argument("--token", default=os.environ.get("COLIBRI_TOKEN"),
                   help="the shared token of the server and the orchestrator (default: $COLIBRI_TOKEN)")
    e.add_argument("--tls-ca", metavar="PEM", help="the CA of their TLS certificates (needed off loopback)")


def cmd_strip_experts(args):
    from colibri.remote.edge import strip_experts

    try:
        kept, left = strip_experts(args.src, args.out)
    except (ValueError, OSError) as e:
        raise SystemExit(f"colibri strip-experts: {e}")
    print(f"wrote {args.out}: weights.bin keeps {kept:,} B, leaves out {left:,} B of routed experts; run it with "
          f"colibri generate --model {args.out} --experts-elsewhere --remote HOST:PORT --expert-budget SIZE")
    return 0


def cmd_orchestrate(args):
    from colibri.remote import orchestrator

    return orchestrator.run(args)


def orchestrate_parser(sub):
    from colibri.remote import orchestrator

    o = sub.add_parser("orchestrate", help="place experts across edges by their measured load (heartbeats)")
    orchestrator.add_arguments(o)
    o.set_defaults(func=cmd_orchestrate)


def _expert_table(load):
    """Per-layer shares of the routed tokens, as text; layers that routed nothing (dense ones) say so."""
    head = "layer  " + "".join(f"{f'e{e}':>7}" for e in range(load.shape[1])) + "     min     max"
    rows = []
    for layer, row in enumerate(load):
        if row.sum() == 0:
            rows.append(f"{layer:>5}  (no routed tokens: a dense layer)")
            continue
        share = row / row.sum()
        rows.append(f"{layer:>5}  " + "".join(f"{x:>6.1%} " for x in share) + f"{share.min():>7.1%} {share.max():>7.1%}")
    return "\n".join([head, *rows])


def cmd_stats(args):
    import numpy as np

    model = _model(args.model)
    cfg = model.config
    if args.save_load and not args.text:
        raise SystemExit("colibri stats: --save-load measures a text: give --text FILE")
    if not args.text:
        report = Path(model.path) / "training.json"
        if not report.exists():
            raise SystemExit("colibri stats: give --text FILE (this model has no training.json)")
        val = json.loads(report.read_text())["validation"]
        print(f"validation set of the training run ({report}):")
        print(f"  loss {val['loss']:.4f} nats/token (perplexity {val['perplexity']:.2f}); unigram baseline "
              f"{val['unigram_loss']:.4f} (perplexity {val['unigram_perplexity']:.2f})")
        print("  share of routed tokens per expert:")
        print(_expert_table(np.array(val["expert_share_per_layer"])))
        return 0
    if model.tokenizer is None:
        raise SystemExit(f"colibri stats: {model.path} has no tokenizer.json to read text with")
    ids = []
    for path in args.text:
        try:
            text = read_regular_text(path)
        except OSError as e:
            raise SystemExit(f"colibri stats: --text {path}: {e.strerror or e}")
        except UnicodeDecodeError as e:
            raise SystemExit(f"colibri stats: --text {path}: not UTF-8 text (byte {e.start})")
        ids += model.tokenizer.encode(text).ids
    ctx = args.ctx or min(cfg["max_position_embeddings"], 256)
    windows = [ids[i:i + ctx + 1] for i in range(0, len(ids) - 1, ctx)]
    windows = [w for w in windows if len(w) > 1]
    if not windows:
        raise SystemExit("colibri stats: the text is shorter than two tokens")
    session = model.session(ctx=ctx)
    nll, n = 0.0, 0
    for w in windows:  # each window from an empty cache, scored on its next tokens
        session.reset()
        logits = session.forward(w[:-1]).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll -= logp[np.arange(len(w) - 1), w[1:]].sum()
        n += len(w) - 1
    load = session.expert_load()
    print(f"{n:,} tokens in {len(windows)} windows of up to {ctx}: loss {nll / n:.4f} nats/token "
          f"(perplexity {np.exp(nll / n):.2f})")
    print(f"share of routed tokens per expert (top-{cfg['top_k']} of {cfg['num_experts']}):")
    print(_expert_table(load))
    dead = [(layer, e) for layer, row in enumerate(load) if row.sum() for e, x in enumerate(row) if x == 0]
    if dead:
        print(f"experts that received no token: {dead}")
    if args.save_load:
        doc = {"model": Path(model.path).name, "architecture": model.architecture, "n_layers": cfg["num_layers"],
               "n_experts": cfg["num_experts"], "top_k": cfg["top_k"], "tokens": n, "load": load.tolist()}
        Path(args.save_load).write_text(json.dumps(doc) + "\n")
        print(f"expert load written to {args.save_load} (for colibri generate --pin)")
    return 0


def _firmware_session(args):
    """(board, model directory, ctx, batch, stack, expert budget) of a firmware command."""
    model = _model(args.model)
    budget = 0
    if args.expert_budget is not None:
        try:   # a percentage is of what slots for every routed expert take
            budget = parse_size(args.expert_budget, lambda: experts.routed_bytes(model))
        except ValueError as e:
            raise SystemExit(f"colibri firmware: {e}")
    return args.board, model.path, args.ctx, args.batch, args.stack, budget


def cmd_firmware_plan(args):
    """Flash and RAM an image of this model and session needs on the board, before building."""
    from colibri.targets import firmware

    session = _firmware_session(args)
    p = firmware.plan(*session)
    if args.flash or args.ram:   # a chip of one's own: the board's code, this memory
        try:
            flash, ram = (parse_size(v) if v else d for v, d in ((args.flash, p.flash_size + p.model_flash_size),
                                                                 (args.ram, p.ram_size)))
        except ValueError as e:
            raise SystemExit(f"colibri firmware plan: {e}")
        p = firmware.for_memory(p, flash, ram)
        print(p.table())
        largest = firmware.largest_ctx(session[0], session[1], flash, ram, *session[3:5])
        print(f"largest n_ctx that fits: {largest}" if largest else "no n_ctx fits")
    else:
        print(p.table())
    return 1 if p.problems() else 0


def cmd_firmware_build(args):
    from colibri.targets import firmware

    board = args.board
    image = firmware.build_image(*_firmware_session(args))
    flash, ram = firmware.image_usage(board, image)
    mm = firmware.memory_map(board)
    print(image)
    print(firmware._run_tool(board, "size", "-A", "-d", image).split("\n.comment")[0].rstrip())
    print(f"flash used {flash:,} of {mm['flash_size'] + mm['model_flash_size']:,} B; RAM used {ram:,} of {mm['ram_size']:,} B "
          f"(stack reserved {firmware.stack_reserved(board, image):,} B)")
    return 0


def cmd_firmware_run(args):
    """The board's image under QEMU: the prompt text encoded on the board, then the text as
    `colibri generate` prints it (with the model's own byte table), then with --verbose the image's timing and memory on stderr."""
    from colibri.targets import firmware

    model = _model(args.model)
    prompt = args.prompt if args.tokens is None else _prompt_ids(model, args)   # text: encoded on the board
    session = _firmware_session(args)
    image = firmware.build_image(*session)
    experts = Path(model.path) / "weights.bin" if session[-1] else None
    result = firmware.run(args.board, image, firmware.arguments(
        prompt, args.max_tokens, args.temperature, args.top_k, args.top_p, args.seed, args.ignore_eos,
        experts=experts, kernels=args.kernels), timeout=args.timeout)
    sys.stdout.buffer.write(result.output)
    if args.verbose and result.report:
        r = result.report
        print(f"[{args.board}, emulated by QEMU: {r['prompt_tokens']} prompt tokens in "
              f"{r['prefill_ticks'] / r['ticks_per_second'] * 1e3:.0f} ms, {r['generated_tokens']} generated at "
              f"{result.tokens_per_second():.2f} tok/s; arena {r['arena_needed']:,} B, "
              f"stack {r['stack_used']:,} of {r['stack_reserved']:,} B]", file=sys.stderr)
        if "expert_slots" in r:
            print(f"[experts streamed: {r['expert_slots']} slots of {r['expert_slot_bytes']:,} B, "
                  f"{r['expert_hits']} hits, {r['expert_misses']} misses, {r['expert_bytes_read']:,} B read in "
                  f"{r['expert_reads']} reads]", file=sys.stderr)
    return result.status


def cmd_firmware_export(args):
    """A folder for a firmware project of one's own: sources, model data, plan, CMake and Meson."""
    from colibri.targets import export

    model = _model(args.model)
    try:
        sizes = export.export(args.out, model.path, args.ctx, args.batch, args.stack, board=args.board, cpu=args.cpu)
    except export.ExportError as e:
        raise SystemExit(f"colibri firmware export: {e}")
    print(f"{args.out}: {Path(model.path).name} for {args.board or args.cpu}, n_ctx {args.ctx}: RAM block "
          f"{sizes['meta'] + sizes['arena']:,} B (metadata {sizes['meta']:,}, arena {sizes['arena']:,}), stack "
          f"{args.stack:,} B; see {Path(args.out) / 'README.md'}")
    return 0


def cmd_profile_show(args):
    """The breakdown of a profile.json that colibri-infer --profile wrote: time per phase, per token."""
    try:
        doc = json.loads(read_regular_text(args.file))
        phases, tokens, wall = doc["phases_ns"], doc["prompt_tokens"] + doc["generated_tokens"], doc["wall_ns"]
        if not all(isinstance(x, (int, float)) and x >= 0 for x in (*phases.values(), tokens, wall)):
            raise ValueError("its counts and times must be numbers >= 0")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise SystemExit(f"colibri profile show: {args.file}: not a colibri profile ({e})")
    total = sum(phases.values()) or 1
    print(f"{doc.get('model', '?')} ({doc.get('kernels', '?')} kernels): {doc['prompt_tokens']} prompt + "
          f"{doc['generated_tokens']} generated tokens, {wall / 1e6:.1f} ms, "
          + (f"{total / wall:.0%} of it in the phases below" if wall else "no wall time measured"))
    def row(label, ns, note=""):
        print(f"  {label + ':':<17}{ns / max(tokens, 1) / 1e3:>9.1f} µs per token ({ns / total:5.1%}){note}")

    print("headline:")
    for label, names in PROFILE_HEADLINES:
        row(label, sum(phases.get(n, 0) for n in names), "  = " + " + ".join(names))
    print("every phase:")
    for name, ns in sorted(phases.items(), key=lambda item: -item[1]):
        row(name.replace("_", " ").capitalize().replace(" io ", " I/O "), ns)
    return 0


# The spec's four headline lines, each the sum of the phases colibri_phase_name lists: the router's
# scores and choice; gathering each expert's tokens, and waiting for a streamed expert's weights;
# the experts' (and the dense layers') FFN matmuls; the weighted sum back into the residual.
PROFILE_HEADLINES = (("Router", ("router",)), ("Expert Dispatch", ("dispatch", "expert_io_wait")),
                     ("Compute", ("experts", "dense_mlp")), ("Aggregation", ("aggregation",)))


def cmd_memdump(args):
    model = _model(args.model)
    session = model.session(ctx=args.ctx, batch=args.batch, **_stream_options(model, args))
    sys.stdout.write(session.memdump())
    return 0


def cmd_serve_experts(args):
    try:
        from colibri.remote import server
    except ImportError as e:
        raise SystemExit(f"colibri serve-experts needs grpcio and protobuf: pip install 'colibri-moe[remote]' ({e})")
    args.model = _model(args.model).path
    return server.main(args)


def _checkout_names(module, name):
    """targets.TARGETS or firmware.BOARDS, for argparse's choices; None without the C sources
    (any name then: the command says why it cannot build)."""
    from colibri.targets import TargetError

    try:
        return list(getattr(module, name))
    except TargetError:
        return None


def build_parser():
    p = argparse.ArgumentParser(prog="colibri", description="Run Mixture-of-Experts models with the colibri engine.")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    p.add_argument("--version", action="version", version=f"colibri {colibri.__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="Hugging Face directory (config.json + *.safetensors) or .gguf file -> colibri model")
    c.add_argument("src", nargs="?", help="Hugging Face model directory, or a .gguf file (its weights imported as they are)")
    c.add_argument("out", nargs="?", help="output colibri model directory")
    c.add_argument("--input-dir", help="the same as SRC")
    c.add_argument("--output-dir", help="the same as OUT")
    c.add_argument("--dtype", "--quant", choices=["f32", "f16", "bf16", "q8_0", "q4_0", "w4g128"],
                   help="weight storage: f32 (default), f16, bf16, llama.cpp's q8_0 / q4_0 blocks (int8 activations), "
                        "or w4g128 (4-bit groups of 128, float activations: w4a16) for the matrices")
    c.add_argument("--quantize", choices=sorted(QUANTIZE),
                   help="the quantization by name: w4a16 (= --quant w4g128), or a block format as --quant")
    c.add_argument("--layout", choices=["stacked", "interleaved"], default="stacked",
                   help="the routed experts in weights.bin: stacked (default: each tensor whole) or interleaved "
                        "(each expert's tensors one contiguous extent, one read per expert)")
    c.add_argument("--repack", action=argparse.BooleanOptionalAction, default=None,
                   help="store the q4_0 / q8_0 matrices of the matmuls with their rows interleaved in groups of 8 "
                        "(q4_0x8 / q8_0x8: the same blocks, moved, so the fast kernels read 8 rows at once; the same "
                        "numbers). Default: on for a checkpoint (--no-repack keeps every tensor plain q4_0 / q8_0), "
                        "off for a .gguf file (its bytes as they are; --repack moves its Q4_0 / Q8_0 matrices)")
    c.add_argument("--quiet", action="store_true", help="no progress bar")
    c.set_defaults(func=cmd_convert)

    v = sub.add_parser("validate", help="every load check plus checksums, no inference")
    v.add_argument("model", nargs="?", help="colibri model directory (default: the bundled model)")
    v.set_defaults(func=cmd_validate)

    def generation_arguments(p, tokens_help):
        """The prompt and sampling options `generate` and `firmware run` share."""
        src = p.add_mutually_exclusive_group()
        src.add_argument("--prompt", default="", help="prompt text, encoded by the encoder the model carries")
        src.add_argument("--tokens", help=tokens_help)
        p.add_argument("--max-tokens", type=_count(0, INT32_MAX), default=64, help="tokens to generate (default 64)")
        p.add_argument("--temperature", type=float, default=0.8, help="0 means greedy (default 0.8)")
        p.add_argument("--top-k", type=_count(0, INT32_MAX), default=40, help="0 = no limit (default 40)")
        p.add_argument("--top-p", type=float, default=0.95, help="1 = off (default 0.95)")
        p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
        p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-sequence token")

    def build_dir_argument(p):
        p.add_argument("--build-dir", metavar="DIR", help="where the builds go, one folder each (default: "
                       "$COLIBRI_BUILD_DIR, else build/ of a checkout, else ~/.cache/colibri/)")

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
        pin.add_argument("--pin-count", type=_count(0, INT32_MAX), metavar="N", help="pin the N most loaded experts")
        pin.add_argument("--pin-share", type=float, metavar="F",
                         help="pin a share F of the slots (0 to 1; at most the slots less one layer's top-k)")

    g = sub.add_parser("generate", help="generate text (or token ids) from a prompt")
    g.add_argument("--model", help="colibri model directory (default: the bundled Shakespeare model)")
    generation_arguments(g, "prompt as comma-separated token ids; prints ids")
    g.add_argument("--ctx", type=_count(0, INT32_MAX), default=0, help="context to reserve (default: model's, at most 4096)")
    g.add_argument("--batch", type=_count(0, 4096), default=0, help="prefill chunk (default 64)")
    g.add_argument("--threads", type=_count(0, 256), default=0, help="threads (default: $COLIBRI_THREADS, else the cores)")
    g.add_argument("--verbose", action="store_true", help="timings (and the expert cache's counters) on stderr")
    from colibri import targets

    g.add_argument("--target", default="native", choices=_checkout_names(targets, "TARGETS"),
                   help="run the core built for this target, under QEMU (needs meson, ninja and the target's "
                        "toolchain)")
    build_dir_argument(g)
    streaming_arguments(g)
    edge_arguments(g)
    g.set_defaults(func=cmd_generate)

    m = sub.add_parser("memdump", help="the memory a model and context need, before any token")
    m.add_argument("--model", help="colibri model directory (default: the bundled model)")
    m.add_argument("--ctx", type=_count(0, INT32_MAX), default=0, help="context length (default: the model's, at most 4096)")
    m.add_argument("--batch", type=_count(0, 4096), default=0, help="prefill chunk (default 64)")
    streaming_arguments(m)
    m.set_defaults(func=cmd_memdump)

    fw = sub.add_parser("firmware", help="bare-metal images: plan, build, run under QEMU (needs meson, ninja, the "
                        "board's toolchain and QEMU)")
    fw_sub = fw.add_subparsers(dest="firmware_command", required=True)

    def firmware_parser(name, help):
        from colibri.targets import firmware
        from colibri.targets.firmware import DEFAULT_BATCH, DEFAULT_CTX, DEFAULT_STACK

        f = fw_sub.add_parser(name, help=help)
        f.add_argument("--board", required=True, choices=_checkout_names(firmware, "BOARDS"))
        f.add_argument("--model", help="colibri model directory (default: the bundled model)")
        f.add_argument("--ctx", type=_count(1, INT32_MAX), default=DEFAULT_CTX, help=f"context the image reserves (default {DEFAULT_CTX})")
        f.add_argument("--batch", type=_count(1, 4096), default=DEFAULT_BATCH, help=f"prefill chunk (default {DEFAULT_BATCH})")
        f.add_argument("--stack", type=_count(1, INT32_MAX), default=DEFAULT_STACK, help=f"stack bytes (default {DEFAULT_STACK})")
        f.add_argument("--expert-budget", metavar="SIZE",
                       help="stream the routed experts of an interleaved model into SIZE bytes of cache slots (bytes, "
                            "512K, 2M, or a percentage of what every routed expert takes): flash holds the rest of "
                            "the model, the image reads the experts from the host's weights.bin (default: the whole "
                            "model in flash)")
        build_dir_argument(f)
        return f

    fp = firmware_parser("plan", "flash and RAM the image needs on the board, and whether it fits")
    fp.add_argument("--flash", metavar="SIZE", help="plan for a chip of this much flash (1M, 512K): the code as "
                    "on the board's CPU, the model beside it; also prints the largest n_ctx that fits")
    fp.add_argument("--ram", metavar="SIZE", help="plan for a chip of this much RAM (256K)")
    fp.set_defaults(func=cmd_firmware_plan)
    firmware_parser("build", "build the board's image of a model; print its size").set_defaults(
        func=cmd_firmware_build)
    fr = firmware_parser("run", "build the board's image and generate with it under QEMU")
    generation_arguments(fr, "prompt as comma-separated token ids (for a model without an encoder; --prompt "
                             "text is encoded on the board)")
    fr.add_argument("--kernels", metavar="NAME", help="a kernel variant of the image by name: reference (the strict "
                    "mode: the host's --reference bit for bit), mve on mps3-an547 (default: the best it has)")
    fr.add_argument("--timeout", type=float, default=600, help="seconds before a hung image is stopped (default 600)")
    fr.add_argument("--verbose", action="store_true", help="the image's timing and memory on stderr")
    fr.set_defaults(func=cmd_firmware_run)

    from colibri.targets import firmware as boards
    from colibri.targets.export import CPUS
    from colibri.targets.firmware import DEFAULT_BATCH, DEFAULT_CTX, DEFAULT_STACK

    fe = fw_sub.add_parser("export", help="a folder for a firmware of one's own: the core's sources, the model as "
                           "linker data, colibri_plan.h, CMakeLists.txt (colibri::colibri) and meson.build")
    where = fe.add_mutually_exclusive_group(required=True)
    where.add_argument("--board", choices=_checkout_names(boards, "BOARDS"),
                       help="a board colibri knows: its CPU, and an example image with its clock and toolchain file")
    where.add_argument("--cpu", choices=list(CPUS), help="a CPU alone: the library and the example, no board port")
    fe.add_argument("--model", help="colibri model directory (default: the bundled model)")
    fe.add_argument("--ctx", type=_count(1, INT32_MAX), default=DEFAULT_CTX,
                    help=f"context the plan reserves (default {DEFAULT_CTX})")
    fe.add_argument("--batch", type=_count(1, 4096), default=DEFAULT_BATCH, help=f"prefill chunk (default {DEFAULT_BATCH})")
    fe.add_argument("--stack", type=_count(1, INT32_MAX), default=DEFAULT_STACK,
                    help=f"stack bytes (default {DEFAULT_STACK})")
    fe.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new, or empty)")
    fe.set_defaults(func=cmd_firmware_export)

    pr = sub.add_parser("profile", help="read a profile written by colibri-infer --profile FILE")
    pr_sub = pr.add_subparsers(dest="profile_command", required=True)
    show = pr_sub.add_parser("show", help="time per phase of the forward pass, per token")
    show.add_argument("file", help="profile.json")
    show.set_defaults(func=cmd_profile_show)

    st = sub.add_parser("stats", help="per-expert load (and loss) on a text, or the training report's")
    st.add_argument("--model", help="colibri model directory (default: the bundled model)")
    st.add_argument("--text", nargs="*", help="UTF-8 text files to run (default: the training report's figures)")
    st.add_argument("--ctx", type=_count(0, INT32_MAX), default=0, help="window length (default: the model's, at most 256)")
    st.add_argument("--save-load", metavar="LOAD.json",
                    help="write the tokens routed to each expert on the text, as JSON (for generate --pin)")
    st.set_defaults(func=cmd_stats)

    se = sub.add_parser("serve-experts", help="compute a model's experts for other machines, over gRPC "
                        "(docs/DEVICES.md); needs the remote extra")
    se.add_argument("--model", help="colibri model directory (default: the bundled model)")
    se.add_argument("--listen", default="127.0.0.1:50051", metavar="HOST:PORT",
                    help="address to serve on (default 127.0.0.1:50051, loopback only; port 0: any free port); "
                         "another host needs --token and TLS, or --insecure")
    tok = se.add_mutually_exclusive_group()
    tok.add_argument("--token", help="shared secret the callers send as \"authorization: Bearer TOKEN\" "
                                     "(visible to other local users in the process list: prefer --token-file)")
    tok.add_argument("--token-file", metavar="FILE", help="read the token from FILE")
    se.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate chain")
    se.add_argument("--tls-key", metavar="PEM", help="the certificate's private key")
    se.add_argument("--insecure", action="store_true", help="allow a non-loopback address without a token and TLS")
    se.add_argument("--kernels", default="auto", help="kernel variant: auto (default), reference (strict: "
                    "the same bits as an edge computing with the reference kernels), or one of colibri's variants")
    se.add_argument("--threads", type=_count(0, 256), default=0, help="compute threads (default: $COLIBRI_THREADS, else the cores)")
    se.add_argument("--batch", type=_count(1, 4096), default=64, help="the largest prefill chunk of the edges served (default 64): "
                    "a call carries at most batch * top_k rows")
    se.add_argument("--max-message", type=float, metavar="MB",
                    help="bound on one message's MiB (default: what the largest call needs)")
    se.add_argument("--no-fetch", action="store_true", help="do not serve the experts' weights (FetchExpert)")
    se.set_defaults(func=cmd_serve_experts)
    orchestrate_parser(sub)
    sx = sub.add_parser("strip-experts", help="a copy of a model without its routed experts, for an edge that "
                        "fetches them from `colibri serve-experts` (--experts-elsewhere)")
    sx.add_argument("src", help="colibri model directory (interleaved layout: its experts written last)")
    sx.add_argument("out", help="output directory: colibri_model.json and weights.bin up to the first expert")
    sx.set_defaults(func=cmd_strip_experts)
    return p


# The packages of pyproject.toml's extras, by the name they are imported as: running a model needs
# numpy alone, so a command that needs more says which extra brings it.
EXTRAS = {"safetensors": "convert", "ml_dtypes": "convert", "tqdm": "convert", "gguf": "convert",
          "tokenizers": "convert", "grpc": "remote", "google": "remote"}


def main(argv=None):
    args = build_parser().parse_args(argv)
    if getattr(args, "build_dir", None):   # what colibri.targets.build_dir reads
        os.environ["COLIBRI_BUILD_DIR"] = str(Path(args.build_dir).resolve())
    from colibri.convert import ConvertError
    from colibri.targets import TargetError

    try:
        status = args.func(args)
        sys.stdout.flush()   # a full disk shows here, not in the interpreter's flush at exit
        return status
    except BrokenPipeError:
        _drop_stdout()
        return 0
    except Exception as e:
        if _stdout_fails():
            _drop_stdout()
            print(f"colibri {args.command}: cannot write standard output: {getattr(e, 'strerror', None) or e}",
                  file=sys.stderr)
            return 1
        if args.debug:
            raise
        extra = isinstance(e, ModuleNotFoundError) and EXTRAS.get((e.name or "").split(".")[0])
        if extra:   # a library of an optional part, named with what installs it
            print(f"colibri {args.command}: needs the {e.name.split('.')[0]} package: "
                  f"pip install 'colibri-moe[{extra}]'", file=sys.stderr)
            return 1
        core = sys.modules.get("colibri._core")   # not loaded: no colibri.Error could have been raised
        known = isinstance(e, (ConvertError, TargetError, OSError, ImportError)) or (core and isinstance(e, core.Error))
        print(f"colibri {args.command}: {e}" if known else f"colibri {args.command}: {type(e).__name__}: {e} "
              "(--debug shows the traceback)", file=sys.stderr)
        return 1


def _stdout_fails():
    """Whether standard output cannot take what it holds (an error writing it stays in its buffer)."""
    try:
        sys.stdout.flush()
        return False
    except OSError:
        return True


def _drop_stdout():
    """Points standard output at /dev/null, so the interpreter's flush at exit does not fail again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())

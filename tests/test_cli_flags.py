"""colibri-infer and `colibri generate` agree: a flag both have takes a value in both or in
neither, has the same default, and the same defaults generate the same tokens; the flags only one
of them has are listed here, each with why, so a new flag is either shared or explained."""
import argparse
import re
import subprocess
import sys

import pytest

from colibri.cli import build_parser
from colibri.demo import MODEL_DIR
from support import infer, infer_command

# colibri-infer's own: what the Python CLI does elsewhere, or what only a C-only run needs.
ONLY_INFER = {
    "validate_model": "`colibri validate` is a subcommand of its own",
    "memdump": "`colibri memdump` is a subcommand of its own",
    "version": "`colibri --version`, on the top-level parser",
    "ids": "`colibri generate` prints ids exactly when the prompt is --tokens",
    "logits": "the Python API returns logits (Session.forward); the C tool writes them for cross-target tests",
    "reference": "the Python API's kernels='reference'; the C tool's strict mode for cross-target tests",
    "kernels": "the Python API's kernels=NAME, or COLIBRI_KERNELS for both",
    "expert_load": "`colibri stats --save-load` writes the load, as JSON",
    "profile": "`colibri profile` runs and shows the profile",
    "routing": "research routing: the Python API's routing=, and `colibri stats`",
    "routing_noise": "research routing: the Python API's noise=",
    "routing_seed": "research routing: the Python API's noise_seed=",
    "capacity_factor": "research routing: the Python API's capacity_factor=",
    "reset_every": "a soak of the C tool alone (RSS and latency over a long run, benchmarks/)",
    "latency": "a soak of the C tool alone (each step's time, benchmarks/)",
    "device": "a built-in driver of the C build; `colibri generate --remote` computes on an expert server",
}
# `colibri generate`'s own: what needs Python (QEMU runs, pins read from JSON, gRPC edges).
ONLY_GENERATE = {
    "target": "runs colibri-infer built for a target, under QEMU",
    "build_dir": "where --target's builds go",
    "pin": "pins read from a colibri stats JSON file; colibri-infer takes no pins",
    "pin_count": "with --pin",
    "pin_share": "with --pin",
    "remote": "experts on an expert server, over gRPC (colibri.remote)",
    "placement_load": "with --remote",
    "orchestrator": "with --remote",
    "edge_name": "with --remote",
    "experts_elsewhere": "with --remote",
    "fetch_mbit": "with --remote",
    "device_threshold_ms": "with --remote",
    "device_deadline_ms": "with --remote",
    "strict": "with --remote",
    "token": "with --remote",
    "tls_ca": "with --remote",
    "fleet": "experts on every expert server announced in etcd (colibri.remote.fleet)",
    "etcd": "the control plane's etcd (colibri.remote.control), and with --fleet the expert servers'",
    "etcd_prefix": "with --etcd",
    "lease_ttl": "with --etcd",
}

# Both have these, with a difference that is meant.
SHARED_BUT_DIFFERENT = {
    "placement": "`colibri generate`'s places experts on --remote's devices (default auto: chosen from the load); "
                 "colibri-infer's binds them to its built-in drivers (default: none, every expert on the cpu)",
}


def infer_flags():
    """{name: (takes a value, default as typed or None)} from colibri-infer --help, which prints
    the flag table parse_args takes its defaults from."""
    text = infer("native", "--help").stdout.decode()
    flags, name = {}, None
    for line in text.splitlines():
        m = re.match(r"  --(\w+)(?: (\S+))?(?:\s|$)", line)
        if m:
            name = m.group(1)
            flags[name] = [m.group(2) is not None, None]
        d = re.search(r"\(default ([^)]*)\)$", line)
        if d and name:
            flags[name][1] = d.group(1)
    return {k: tuple(v) for k, v in flags.items()}


def generate_flags():
    """{name: (takes a value, default)} of `colibri generate`'s parser, '-' in names as '_'."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    flags = {}
    for action in sub.choices["generate"]._actions:
        for option in action.option_strings:
            if option.startswith("--"):
                flags[option[2:].replace("-", "_")] = (action.nargs != 0, action.default)
    return flags


def same_default(a, b):
    """Defaults as typed (colibri-infer) and as parsed (argparse): unset is None, False or ''."""
    a, b = (None if v is None or v is False or v == "" or v is argparse.SUPPRESS else v for v in (a, b))
    if a is None or b is None:
        return a is b
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return str(a) == str(b)


def test_shared_flags_agree_and_the_others_are_explained():
    c, py = infer_flags(), generate_flags()
    assert set(c) - set(py) == set(ONLY_INFER), "colibri-infer's flags that `colibri generate` lacks"
    assert set(py) - set(c) == set(ONLY_GENERATE), "`colibri generate`'s flags that colibri-infer lacks"
    shared = set(c) & set(py)
    assert {"max_tokens", "temperature", "top_k", "top_p", "seed", "prompt", "tokens", "ctx", "batch"} <= shared
    for name in sorted(shared):
        assert c[name][0] == py[name][0], f"--{name}: takes a value in one CLI only"
    differ = {name for name in shared if not same_default(c[name][1], py[name][1])}
    assert differ == set(SHARED_BUT_DIFFERENT), {name: (c[name][1], py[name][1]) for name in differ}


def colibri(*args, stdin=None):
    r = subprocess.run([sys.executable, "-m", "colibri", *map(str, args)], input=stdin, capture_output=True,
                       timeout=300, cwd="/")
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return r.stdout


def test_the_defaults_generate_the_same_tokens():
    """No sampling flag: both sample at their defaults (64 tokens, temperature, top-k, top-p, seed)."""
    want = colibri("generate", "--model", MODEL_DIR, "--tokens", "1,415", "--ignore-eos")
    got = infer("native", "--model", MODEL_DIR, "--tokens", "1,415", "--ids", "--ignore_eos").stdout
    assert got == want and got.count(b",") == 64 - 1


def test_infer_prompt_dash_reads_standard_input():
    text = "KING:\nO, my \u00e9p\u00e9e".encode()
    given = infer("native", "--model", MODEL_DIR, "--prompt", text.decode(), "--max_tokens", 12, "--temperature", 0).stdout
    r = subprocess.run([*infer_command("native"), "--model", str(MODEL_DIR), "--prompt", "-", "--max_tokens", "12",
                        "--temperature", "0"], input=text, capture_output=True, timeout=300)
    assert r.returncode == 0 and r.stdout == given and given.startswith(text)


def test_generate_prompt_dash_reads_standard_input():
    text = "KING:\nO, my \u00e9p\u00e9e".encode()
    given = colibri("generate", "--model", MODEL_DIR, "--prompt", text.decode(), "--max-tokens", 12, "--temperature", 0)
    piped = colibri("generate", "--model", MODEL_DIR, "--prompt", "-", "--max-tokens", 12, "--temperature", 0,
                    stdin=text)
    assert piped == given and given.startswith(text)

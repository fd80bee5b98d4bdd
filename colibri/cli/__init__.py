"""The `colibri` command: convert, validate, generate, chat, serve, memdump, firmware, profile, stats, serve-experts.

    colibri generate --prompt "ROMEO:"                     # the bundled Shakespeare model
    colibri convert path/to/hf-mixtral out/model [--dtype f16]
    colibri validate out/model
    colibri generate --model out/model --prompt "The capital of France is" --max-tokens 32
    colibri chat --model model.gguf                        # a conversation, with the model's chat template
    colibri serve --model model.gguf --parallel 4          # an OpenAI-compatible HTTP server on 127.0.0.1:8080
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

With the control plane on etcd, several orchestrators (one leads) and edges that find the leader:

    colibri orchestrate --listen 127.0.0.1:50061 --etcd 127.0.0.1:2379      # and more: one leads
    colibri orchestrate --listen 127.0.0.1:50062 --etcd 127.0.0.1:2379
    colibri generate --model out/model --expert-budget 25% --remote 127.0.0.1:50051 \
        --etcd 127.0.0.1:2379 --orchestrator 127.0.0.1:50061,127.0.0.1:50062 --edge-name kiosk-3
"""
import argparse
import os
import sys
from pathlib import Path

import colibri
from colibri.cli import chat, convert, firmware, measure, remote, run, serve


def build_parser():
    """The `colibri` parser: each subcommand's options are its group's module's (add_*), added in
    the order `colibri --help` lists them."""
    p = argparse.ArgumentParser(prog="colibri", description="Run Mixture-of-Experts models with the colibri engine.")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    p.add_argument("--version", action="version", version=f"colibri {colibri.__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (convert.add_convert, convert.add_validate, run.add_generate, chat.add_chat, serve.add_serve, run.add_memdump,
                firmware.add_firmware,
                measure.add_profile, measure.add_stats, remote.add_serve_experts, remote.add_orchestrate,
                remote.add_strip_experts):
        add(sub)
    return p


# The packages of pyproject.toml's extras, by the name they are imported as: running a model needs
# numpy alone, so a command that needs more says which extra brings it.
EXTRAS = {"safetensors": "convert", "ml_dtypes": "convert", "tqdm": "convert", "gguf": "convert",
          "tokenizers": "convert", "grpc": "remote", "google": "remote", "starlette": "serve", "uvicorn": "serve"}


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

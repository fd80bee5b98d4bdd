"""Experts computed and fetched by another machine, over gRPC (colibri_remote.proto; docs/DEVICES.md).

    colibri serve-experts --model out/model --listen 127.0.0.1:50051          # the machine with the experts

    from colibri.remote.driver import RemoteDriver                             # the edge
    drv = RemoteDriver("127.0.0.1:50051", model)
    s = model.session(devices=[drv], placement=table)   # table[layer, expert] = 1: computed there

    colibri serve-experts ... --etcd 10.0.0.1:2379 --hold 0-31                 # a fleet, announced in etcd
    from colibri.remote.fleet import FleetDriver
    drv = FleetDriver("10.0.0.1:2379", model)                                  # every server of the model

Needs the "remote" extra (grpcio, protobuf): pip install colibri-moe[remote].
"""
import hashlib
import os
import stat
from pathlib import Path

TOKEN_FILE_MAX = 4096   # bytes: a token is one line


def __getattr__(name):
    """colibri.remote.Edge, .FleetDriver, .Orchestrator, .RemoteDriver, imported when first used (they need grpc)."""
    modules = {"Edge": "edge", "FleetDriver": "fleet", "Orchestrator": "orchestrator", "RemoteDriver": "driver"}
    if name not in modules:
        raise AttributeError(f"module 'colibri.remote' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"colibri.remote.{modules[name]}"), name)


def model_hash(model_dir):
    """32 bytes: the SHA-256 of the model's colibri_model.json, the name every request carries."""
    return hashlib.sha256((Path(model_dir) / "colibri_model.json").read_bytes()).digest()


def read_token_file(path):
    """The token in `path` (--token-file), surrounding whitespace dropped.  ValueError for anything
    but a regular file of at most TOKEN_FILE_MAX bytes holding printable ASCII (what gRPC metadata
    carries): /dev/zero or a FIFO is refused before it is read, a large file after 4 KiB."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO would otherwise wait for a writer
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"--token-file {path} is not a regular file")
        data = f.read(TOKEN_FILE_MAX + 1)
    if len(data) > TOKEN_FILE_MAX:
        raise ValueError(f"--token-file {path} is over {TOKEN_FILE_MAX} bytes: a token is one line")
    token = data.strip()
    if not token:
        raise ValueError(f"--token-file {path} is empty")
    if not token.isascii() or not token.decode("ascii").isprintable():
        raise ValueError(f"--token-file {path}: a token is printable ASCII on one line")
    return token.decode("ascii")

"""Text in, text out: the model directory's tokenizer.json through the `tokenizers` package."""
import json
import os
import stat
from pathlib import Path


def read_regular_text(path, encoding="utf-8"):
    """The text of the file `path`.  OSError names it when it is not a regular file: opened without
    blocking, so a FIFO is refused instead of waited on for a writer."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return f.read().decode(encoding)


def load_tokenizer(model_dir):
    """The tokenizer named by colibri_model.json (or tokenizer.json beside it), or None."""
    model_dir = Path(model_dir)
    name = "tokenizer.json"
    meta = model_dir / "colibri_model.json"
    try:
        name = json.loads(read_regular_text(meta)).get("tokenizer", name)
    except (OSError, ValueError, AttributeError):
        pass
    parts = Path(name).parts if isinstance(name, str) else None
    if not parts or Path(name).is_absolute() or ".." in parts or "\\" in name:
        raise ValueError(f"{meta}: \"tokenizer\" must be a relative path in the model directory, not {name!r}")
    path = model_dir / name
    if not os.path.lexists(path):
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_str(read_regular_text(path))

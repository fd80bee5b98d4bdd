"""Text in, text out: the model directory's tokenizer.json through the `tokenizers` package."""
import json
from pathlib import Path


def load_tokenizer(model_dir):
    """The tokenizer named by colibri_model.json (or tokenizer.json beside it), or None."""
    model_dir = Path(model_dir)
    name = "tokenizer.json"
    meta = model_dir / "colibri_model.json"
    try:
        name = json.loads(meta.read_text()).get("tokenizer", name)
    except (OSError, ValueError, AttributeError):
        pass
    parts = Path(name).parts if isinstance(name, str) else None
    if not parts or Path(name).is_absolute() or ".." in parts or "\\" in name:
        raise ValueError(f"{meta}: \"tokenizer\" must be a relative path in the model directory, not {name!r}")
    path = model_dir / name
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))

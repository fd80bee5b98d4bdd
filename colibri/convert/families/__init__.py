"""One module per model family; each maps a Hugging Face config and checkpoint to colibri's format.

A family module has:
  describe(config) -> dict with "architecture", "hparams", "routing", "experts" (docs/FORMAT.md)
  plan(description, checkpoint) -> list of layout.Entry, in the file order FORMAT.md lists
"""

from . import mixtral

FAMILIES = {"mixtral": mixtral}  # HF config "model_type" -> family module

"""The Python face of a model: the compiled core's Model plus its tokenizer."""
from colibri import core
from colibri.tokenizer import load_tokenizer

_CoreModel = core().Model


class Model(_CoreModel):
    """A colibri model directory, validated and mapped; ``tokenizer`` is its
    ``tokenizers.Tokenizer`` when the directory has a tokenizer.json, else None."""

    @property
    def tokenizer(self):
        if not hasattr(self, "_tokenizer"):
            self._tokenizer = load_tokenizer(self.directory)
        return self._tokenizer

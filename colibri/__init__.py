"""colibri: a C99 inference engine for Mixture-of-Experts language models.

    m = colibri.Model("out/model")
    s = m.session(ctx=2048)
    logits = s.forward(tokens)          # float32 [len(tokens), vocab]
"""
from colibri._core import Error, Session
from colibri._core import Model as _CoreModel
from colibri.tokenizer import load_tokenizer

__version__ = "0.1.0"
__all__ = ["Model", "Session", "Error", "__version__"]


class Model(_CoreModel):
    """A colibri model directory, validated and mapped; ``tokenizer`` is its
    ``tokenizers.Tokenizer`` when the directory has a tokenizer.json, else None."""

    @property
    def tokenizer(self):
        if not hasattr(self, "_tokenizer"):
            self._tokenizer = load_tokenizer(self.path)
        return self._tokenizer

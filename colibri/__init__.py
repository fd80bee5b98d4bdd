"""colibri: a C99 inference engine for Mixture-of-Experts language models.

    m = colibri.Model("out/model")
    s = m.session(ctx=2048)
    logits = s.forward(tokens)          # float32 [len(tokens), vocab]

The compiled core loads on first use of Model, Session or Error, so the pure-Python tools
(colibri.convert, colibri.demo.train_shakespeare) also run from a source tree.
"""
__version__ = "0.1.0"
__all__ = ["Model", "Session", "Error", "kernel_variants", "__version__"]


def __getattr__(name):
    if name == "Model":
        from colibri.model import Model
        return Model
    if name in ("Session", "Error", "kernel_variants"):
        from colibri import _core
        return getattr(_core, name)
    raise AttributeError(f"module 'colibri' has no attribute {name!r}")

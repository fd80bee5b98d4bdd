"""colibri: a C99 inference engine for Mixture-of-Experts language models.

    m = colibri.Model("out/model")
    s = m.session(ctx=2048)
    logits = s.forward(tokens)          # float32 [len(tokens), vocab]

The compiled core loads on first use of Model, Session or Error, so the pure-Python tools
(colibri.convert, colibri.demo.train_shakespeare) also run from a source tree.

The C core's sources ship with the package, for C programs and for the firmware tooling:

    cc -I"$(python -c 'import colibri; print(colibri.get_include())')" app.c  # <colibri/colibri.h>
    colibri.c_sources()     # the core's .c files for an OS ("posix") or bare metal ("baremetal")
    colibri.source_root()   # meson.build, meson.options, c_core/, firmware/, toolchains/
"""
from pathlib import Path

try:
    from colibri._version import __version__   # written by the build from meson.build's project()
except ImportError:   # a source tree run in place (the pure-Python tools)
    __version__ = "0+unknown"
__all__ = ["Model", "Session", "Batch", "Error", "kernel_variants", "source_root", "get_include", "c_sources",
           "__version__"]

# The wheel's copy of the sources, laid out as in a checkout (colibri/meson.build installs it).
_SOURCE_COPY = Path(__file__).resolve().parent / "_source"


def source_root():
    """The sources this package was built from, as a pathlib.Path: the checkout it is imported
    from, else the copy the wheel carries.  Either holds meson.build, meson.options, c_core/,
    firmware/ and toolchains/; the copy is read-only (it lies in site-packages) and has no tests."""
    for root in (Path(__file__).resolve().parents[1], _SOURCE_COPY):
        if (root / "meson.build").is_file() and (root / "c_core" / "include" / "colibri").is_dir():
            return root
    raise FileNotFoundError(f"colibri's C sources are missing: neither a checkout nor {_SOURCE_COPY}")


def get_include():
    """The directory of the public headers (str), for -I: #include <colibri/colibri.h>."""
    return str(source_root() / "c_core" / "include")


def c_sources(platform="posix"):
    """The C core's translation units (absolute paths, str): the portable core with the reference
    kernels and `platform`'s layer, "posix" (threads, file I/O: link -lm -lpthread) or "baremetal"
    (no OS: link -lm).  C99; compile with -I get_include().  The SIMD kernels are left out: each
    needs its own flags and define (c_core/meson.build)."""
    core = source_root() / "c_core"
    layer = core / "platform" / platform
    if platform not in ("posix", "baremetal"):
        raise ValueError(f"platform {platform!r}: one of posix, baremetal")
    files = [*sorted((core / "src").rglob("*.c")), *sorted(layer.glob("*.c")), core / "arch" / "dispatch.c"]
    return [str(f) for f in files]


def core():
    """The C core's extension module, colibri._core; an ImportError that says where it was looked
    for when it is not built there (a source checkout run in place, without `pip install .`)."""
    try:
        from colibri import _core
    except ImportError as e:
        raise ImportError(f"colibri's C core (colibri._core) is not built in {Path(__file__).parent}: "
                          f"{e}. Install the package (pip install .) and run it from outside the source "
                          "tree, which Python would otherwise import first") from e
    return _core


def __getattr__(name):
    if name == "Model":
        from colibri.model import Model
        return Model
    if name in ("Session", "Batch", "Error", "kernel_variants"):
        return getattr(core(), name)
    raise AttributeError(f"module 'colibri' has no attribute {name!r}")

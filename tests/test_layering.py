"""The library does not import the command line: colibri.cli uses the library, never the reverse
(a library module that imports the CLI drags argparse and every command's imports along, and
makes an import cycle as soon as the CLI imports it back)."""
import ast

from support import TESTS

PACKAGE = TESTS.parent / "colibri"


def cli_imports(source, module):
    """The lines of `source` (the module `module`, dotted) that import colibri.cli or a name from it."""
    package = module.split(".")[:-1]   # a module's package; a package's __init__ is in its own
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:   # relative: from the module's package, `level` packages up
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        if any(n == "colibri.cli" or n.startswith("colibri.cli.") for n in names):
            lines.append(node.lineno)
    return lines


def library_modules():
    """(dotted name, path) of every module of the package but the CLI's own: colibri.cli and
    colibri.__main__ (`python -m colibri`, which runs it)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[:2] in (("colibri", "cli"), ("colibri", "__main__")):
            continue
        yield ".".join(parts), path


def test_the_check_finds_each_form_of_import():
    forms = ["import colibri.cli", "import colibri.cli.run as r", "from colibri.cli import main",
             "from colibri import cli", "from colibri.cli.run import x", "from .. import cli", "from ..cli import main"]
    for form in forms:
        assert cli_imports(f"x = 1\n{form}\n", "colibri.remote.edge") == [2], form
    for form in ["import colibri", "from colibri import experts", "from . import model_hash", "import client"]:
        assert cli_imports(form, "colibri.remote.edge") == [], form


def test_no_library_module_imports_the_cli():
    modules = dict(library_modules())
    assert "colibri.experts" in modules and "colibri.remote.edge" in modules
    found = {name: lines for name, path in modules.items() if (lines := cli_imports(path.read_text(), name))}
    assert not found, f"library modules importing colibri.cli (module: lines): {found}"

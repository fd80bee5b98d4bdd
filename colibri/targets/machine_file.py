"""Meson machine files (toolchains/*.ini), read as Meson reads them: the one place a target's
facts are written.

Each value is a string, integer, boolean or array, or a `+` of them and of names: the file's
[constants], and the entries above it in its own section.  @DIRNAME@ is the file's folder."""
import ast
import configparser
from pathlib import Path


def read(path):
    """{section: {name: value}} of one machine file, [constants] evaluated into the others."""
    path = Path(path)
    parser = configparser.ConfigParser(delimiters=["="], interpolation=None)
    parser.optionxform = str   # names are case-sensitive
    parser.read_string(path.read_text().replace("@DIRNAME@", str(path.parent)), str(path))
    constants = _section(parser, "constants", {}) if parser.has_section("constants") else {}
    return {s: _section(parser, s, constants) for s in parser.sections() if s != "constants"}


def _section(parser, name, constants):
    scope, out = {"true": True, "false": False, **constants}, {}
    for key, text in parser.items(name):
        try:
            out[key] = scope[key] = _value(ast.parse(text.strip(), mode="eval").body, scope)
        except (SyntaxError, ValueError, KeyError) as e:
            raise ValueError(f"[{name}] {key} = {text.strip()}: not a value Meson reads ({e})") from None
    return out


def _value(node, scope):
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, bool)):
        return node.value
    if isinstance(node, ast.List):
        return [_value(e, scope) for e in node.elts]
    if isinstance(node, ast.Name):
        return scope[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _value(node.left, scope) + _value(node.right, scope)
    raise ValueError(f"unsupported {type(node).__name__}")

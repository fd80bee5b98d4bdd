"""Meson machine files (toolchains/*.ini), read as Meson reads them: the one place a target's
facts are written.

Each value is a string, integer, boolean or array, or a `+` (concatenation) or `/` (path join) of
them and of names: the [constants], and the entries above it in its own section.  Several files are
read as Meson reads several --cross-file options: in order, later entries over earlier ones, the
constants of all of them shared.  @DIRNAME@ is each file's own folder."""
import ast
import configparser
import os
from pathlib import Path


def read(*paths, constants=None):
    """{section: {name: value}} of machine files read together, [constants] (theirs, after the
    `constants` given) evaluated into the others."""
    parser = configparser.ConfigParser(delimiters=["="], interpolation=None, strict=False)
    parser.optionxform = str   # names are case-sensitive
    for path in map(Path, paths):
        parser.read_string(path.read_text().replace("@DIRNAME@", str(path.parent)), str(path))
    constants = {**(constants or {}),
                 **(_section(parser, "constants", constants or {}) if parser.has_section("constants") else {})}
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
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Div)):
        left, right = _value(node.left, scope), _value(node.right, scope)
        if isinstance(node.op, ast.Div) and isinstance(left, str) and isinstance(right, str):
            return os.path.join(left, right)
        if isinstance(node.op, ast.Add) and type(left) is type(right) and isinstance(left, (str, list)):
            return left + right
        raise ValueError(f"unsupported {type(node.op).__name__} of {type(left).__name__} and {type(right).__name__}")
    raise ValueError(f"unsupported {type(node).__name__}")

"""config.json's hyper-parameters are held to the ranges colibri's loader accepts before a plan is
built or anything written (colibri/convert/limits.py asks the core's schema table,
c_core/src/model/schema.c, for them)."""
import json
import re
import time

import pytest

from colibri import _core
from colibri.convert import ConvertError, convert, limits
from bad_models import FIXTURE
from support import FIXTURES
from test_convert import copy_hf


@pytest.mark.parametrize("edit, match", [
    ({"num_local_experts": 1000000000}, r"`num_local_experts` = 1000000000 is outside \[1, 4096\]"),
    ({"num_hidden_layers": 10 ** 7}, r"`num_hidden_layers` = 10000000 is outside \[1, 1024\]"),
    ({"rope_theta": float("nan"), "rope_parameters": None}, r"`rope_theta` = nan is not a finite number"),
    ({"rope_theta": float("inf"), "rope_parameters": None}, r"`rope_theta` = inf is not a finite number"),
    ({"rms_norm_eps": 2.0}, r"`hparams\.rms_norm_eps` = 2\.0 is outside \(0, 1\]"),
    ({"head_dim": 2048}, r"`head_dim` = 2048 is outside \[2, 1024\]"),
    ({"rope_theta": 1e-6, "rope_parameters": None, "max_position_embeddings": 4096},
     r"`hparams\.rope_theta` = 1e-06 turns RoPE angles past 2\^31 within max_position_embeddings = 4096"),
], ids=["experts", "layers", "nan-theta", "inf-theta", "eps", "head-dim", "rope-angle"])
def test_out_of_range_hparams_refused_before_anything_is_written(tmp_path, edit, match):
    copy_hf(FIXTURES / "tiny-mixtral", tmp_path / "src", config=edit)
    start = time.monotonic()
    with pytest.raises(ConvertError, match=match):
        convert(tmp_path / "src", tmp_path / "out", progress=False)
    assert time.monotonic() - start < 10
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def _rows(*types):
    return [row for row in _core.schema() if row["type"] in types]


def _set(doc, path, value):
    *sections, key = path.split(".")
    for part in sections:
        doc = doc.setdefault(part, {})
    doc[key] = value


def _valid(row, rows):
    """A value of `row` within its range (the field it is bounded by read as the fixture has it)."""
    if row["type"] == "integer":
        return row["min"]
    return {"number": row["max"], "boolean": False, "choice": (row["choices"] or [None])[0]}[row["type"]]


def _fixture_with(path, value, rows, rope_type=None):
    """The fixture's hparams, routing and experts with `path` set to `value`; a section the fixture
    lacks is added with its required fields in range (rope_scaling as `rope_type`)."""
    doc = json.loads((FIXTURE / "colibri_model.json").read_text())
    sections = {key: doc[key] for key in ("hparams", "routing", "experts")}
    section = path.rsplit(".", 1)[0]
    node = sections
    for part in section.split("."):
        node = node.get(part, {}) if isinstance(node, dict) else {}
    if not node:
        for row in rows:
            if row["path"].rsplit(".", 1)[0] == section and row["required"] and row["type"] != "object":
                _set(sections, row["path"], _valid(row, rows))
    if rope_type is not None:
        _set(sections, "hparams.rope_scaling.type", rope_type)
    _set(sections, path, value)
    return json.dumps(sections)


def _past_range(row):
    """Values just outside the row's range: below min and above max (a number's min is excluded)."""
    if row["type"] == "integer":
        return [row["min"] - 1, row["max"] + 1]
    return [row["min"], row["max"] * 2]


def _refusal(text):
    try:
        _core.check_hparams(text)
    except _core.Error as e:
        return e.detail
    return None


RANGED = [pytest.param(row, id=row["path"]) for row in _rows("integer", "number") if row["max_of"] is None]


@pytest.mark.parametrize("row", RANGED)
def test_a_value_past_the_schema_range_is_refused_by_the_converter_and_the_loader(row):
    """For every field with a range in the core's schema table: a value just outside it is refused by
    limits.check (naming the field and the range) and by the core's loader (naming the field), and a
    value at its upper bound is not refused by the loader as out of range."""
    rows = _core.schema()
    path, lo, hi = row["path"], row["min"], row["max"]
    section = path.rsplit(".", 1)[0]
    rope_types = [None] if section != "hparams.rope_scaling" else \
        next(r["choices"] for r in rows if r["path"] == "hparams.rope_scaling.type")
    for value in _past_range(row):
        desc = json.loads(_fixture_with(path, value, rows))
        with pytest.raises(ConvertError) as raised:
            limits.check(desc)
        where = f"`{path}` = {value!r} is outside "
        assert str(raised.value).startswith(where + (f"[{lo}, {hi}]" if row["type"] == "integer" else f"({lo:g}, {hi:g}]"))
        # the loader: rope_scaling's fields are read for some of its types only
        messages = [_refusal(_fixture_with(path, value, rows, rope_type)) for rope_type in rope_types]
        want = f"{path} = {value} is outside [{lo}, {hi}]" if row["type"] == "integer" else f"{path} = {value!r} is out of range"
        assert want in messages, (want, messages)
    for rope_type in rope_types:
        message = _refusal(_fixture_with(path, hi, rows, rope_type)) or ""
        assert not re.match(rf"{re.escape(path)} = \S+ is out", message), message   # another rule may refuse it


def test_the_schema_is_ordered_as_the_loader_walks_it():
    """Each field's section, and a field its bound or default is taken from, come before it."""
    rows = _core.schema()
    seen = {}
    for row in rows:
        section = row["path"].rsplit(".", 1)[0] if "." in row["path"] else None
        assert section is None or seen.get(section) == "object", row
        assert row["max_of"] is None or seen.get(row["max_of"]) == "integer", row
        # an integer's default is another integer; a component's (experts.type), what a choice implies
        assert row["default_of"] is None or seen.get(row["default_of"]) == row["type"] == "integer" \
            or seen.get(row["default_of"]) == row["type"] == "choice", row
        assert (row["default"] is None) == (row["required"] or row["default_of"] is not None
                                            or row["type"] in ("object", "other")), row
        seen[row["path"]] = row["type"]
    assert {"hparams", "routing", "experts"} <= {p for p, t in seen.items() if t == "object"}


def test_a_cross_field_rule_is_the_loader_s():
    """What involves several fields (here top_k against the experts' count) is refused by the
    converter with the core loader's own message."""
    doc = json.loads((FIXTURE / "colibri_model.json").read_text())
    desc = {key: doc[key] for key in ("architecture", "hparams", "routing", "experts")}
    desc["routing"]["top_k"] = desc["experts"]["count"] + 1
    loader = _refusal(json.dumps(desc))
    assert loader == f"routing.top_k = {desc['routing']['top_k']} exceeds experts.count = {desc['experts']['count']}"
    with pytest.raises(ConvertError, match=re.escape("`routing.top_k`" + loader[len("routing.top_k"):])):
        limits.check(desc)

"""The ranges colibri's loader accepts for a model's hyper-parameters, checked on the description
before a plan is built or a byte written: what the core would refuse to load is refused here, by
name, instead of after weights.bin is written.  The ranges are the core's schema table
(c_core/src/model/schema.c, colibri._core.schema()) and what involves several fields is the
loader's own check (colibri._core.check_hparams): nothing here is a copy."""

import functools
import json
import re

import numpy as np

import colibri
from .errors import ConvertError

FLT_MIN = float(np.finfo(np.float32).tiny)


@functools.cache
def fields():
    """{path: row} of the core's schema table; asked on first use, so that importing the converter
    does not load the extension."""
    return {row["path"]: row for row in colibri.core().schema()}


def integer_range(field):
    """(lo, hi), lo <= value <= hi, of the integer field `field` (a path of the schema)."""
    row = fields()[field]
    return row["min"], row["max"]


def limit_error(field, value, source=None):
    """The ConvertError for `value` of colibri field `field` outside its range; `source` names
    where it came from (a config.json key) when that is not the field itself."""
    lo, hi = integer_range(field)
    where = f"config.json: `{source}`" if source else f"`{field}`"
    also = f" (colibri's {field})" if source else ""
    return ConvertError(f"{where} = {value} is outside [{lo}, {hi}], the range colibri's loader accepts{also}")


def _field(desc, field):
    node = desc
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def check(desc):
    """Raise a ConvertError naming the first field of the description (architecture, hparams,
    routing, experts) outside the range the core loads, or that is not a finite number, then
    anything else the core's loader refuses in them."""
    for field, row in fields().items():
        value = _field(desc, field)
        if value is None or row["max_of"] is not None:   # absent, or bounded by another field: the loader's
            continue
        if row["type"] == "integer":
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConvertError(f"`{field}` = {value!r} is not an integer")
            if not row["min"] <= value <= row["max"]:
                raise limit_error(field, value)
        elif row["type"] == "number":
            lo, hi = row["min"], row["max"]
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo < value <= hi \
                and float(np.float32(value)) >= FLT_MIN   # NaN and infinities fail lo < value <= hi
            if not ok:
                raise ConvertError(f"`{field}` = {value!r} is outside ({lo:g}, {hi:g}], the range colibri's loader "
                                   f"accepts (a finite number, at least {FLT_MIN:.6g})")
    sections = {key: desc[key] for key in ("hparams", "routing", "experts") if key in desc}
    try:
        colibri.core().check_hparams(json.dumps(sections))
    except colibri.core().Error as e:   # its message starts with the field's path, quoted here as above
        raise ConvertError(re.sub(r"^([\w.]+)", r"`\1`", e.detail) + " (colibri's loader)") from None
    return desc

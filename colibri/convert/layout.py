"""How a colibri tensor is made from source tensors: a plan of entries that families return.

An entry names its sources with the shapes they must have, so every missing tensor and every
wrong shape is found before weights.bin is written; `build` only rearranges (no model maths).
"""

from functools import partial
from typing import Callable, NamedTuple

import numpy as np


class Entry(NamedTuple):
    name: str          # colibri tensor name, e.g. "layers.0.experts.w1"
    shape: tuple       # its shape
    sources: tuple     # ((source name, source shape), ...)
    build: Callable    # list of source arrays (float32) -> the colibri array


def _first(arrays):
    return arrays[0]


def _slice_dim1(start, stop, arrays):
    return arrays[0][:, start:stop]


def direct(name, shape, source):
    """The source tensor as it is."""
    shape = tuple(shape)
    return Entry(name, shape, ((source, shape),), _first)


def reshaped(name, shape, source, source_shape):
    """The source's elements in a new shape (e.g. a [1, E] bias as [E])."""
    shape = tuple(shape)
    return Entry(name, shape, ((source, tuple(source_shape)),), lambda arrays: arrays[0].reshape(shape))


def stacked(name, shape, sources):
    """Per-expert source tensors stacked along a new first axis: [n, *each]."""
    shape = tuple(shape)
    return Entry(name, shape, tuple((s, shape[1:]) for s in sources), np.stack)


def _slice_dim0(start, stop, arrays):
    return arrays[0][start:stop]


def dim0_slice(name, shape, source, source_shape, start):
    """Rows start : start + shape[0] of a fused [rows, cols] source."""
    shape = tuple(shape)
    return Entry(name, shape, ((source, tuple(source_shape)),), partial(_slice_dim0, start, start + shape[0]))


def dim1_slice(name, shape, source, source_shape, start):
    """Rows start : start + shape[1] of dimension 1 of a fused [n, rows, cols] source."""
    shape = tuple(shape)
    return Entry(name, shape, ((source, tuple(source_shape)),), partial(_slice_dim1, start, start + shape[1]))

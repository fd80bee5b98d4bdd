"""Session-wide pytest fixtures: the committed tiny models' references and their conversions.
The helpers the tests share are in support.py."""
import numpy as np
import pytest

from support import DTYPES, FIXTURES, HF_MODELS


@pytest.fixture(scope="session")
def references():
    """{model: {array name: array}}: the transformers outputs (see fixtures/make_fixtures.py)."""
    out = {}
    for m in HF_MODELS:
        with np.load(FIXTURES / m / "reference.npz") as z:
            out[m] = {k: z[k] for k in z.files}
    return out


@pytest.fixture(scope="session")
def converted(tmp_path_factory):
    """{(model, dtype): colibri model dir}: every HF fixture converted to every dtype, once."""
    from colibri.convert import convert

    root = tmp_path_factory.mktemp("converted")
    return {(m, dt): convert(FIXTURES / m, root / f"{m}.{dt}", dtype=dt, progress=False)
            for m in HF_MODELS for dt in DTYPES}


@pytest.fixture(scope="session")
def bundled_quantized(tmp_path_factory):
    """{dtype: the bundled model converted from its checkpoint with that int8-path format}."""
    from colibri.convert import convert

    root = tmp_path_factory.mktemp("bundled-q")
    return {dt: convert(FIXTURES / "shakespeare-hf", root / dt, dtype=dt, progress=False) for dt in ("q8_0", "q4_0")}

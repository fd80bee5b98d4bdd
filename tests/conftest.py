"""Shared test fixtures: the committed tiny models, their references, and session-wide conversions."""

import importlib
import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures"
# colibri.targets builds the core for other targets from this checkout
os.environ.setdefault("COLIBRI_SOURCE", str(Path(__file__).resolve().parent.parent))
HF_MODELS = ("tiny-mixtral", "tiny-mixtral-b")  # HF checkpoints with reference.npz
DTYPES = ("f32", "f16", "bf16")


@pytest.fixture(scope="session")
def fixtures_dir():
    return FIXTURES


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


def require_reference():
    """torch and transformers, the reference the fixtures come from.  ./run-tests installs them;
    without them the committed fixtures still test everything else, so a developer's run skips
    only the tests that need them, while CI (CI set) fails: there a missing reference is a bug."""
    try:
        return importlib.import_module("torch"), importlib.import_module("transformers")
    except ImportError as e:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"needs torch and transformers: {e}", allow_module_level=True)


def load_make_fixtures():
    """The fixture generator module, fixtures/make_fixtures.py (needs torch and transformers)."""
    require_reference()
    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transformers_expert_load(name, tokens):
    """int [n_layers, n_experts]: tokens transformers routes to each expert of the HF fixture `name`."""
    torch, transformers = require_reference()
    hf = transformers.MixtralForCausalLM.from_pretrained(FIXTURES / name).eval()
    with torch.no_grad():
        out = hf(torch.from_numpy(np.asarray(tokens, dtype=np.int64))[None], output_router_logits=True)
    k, E = hf.config.num_experts_per_tok, hf.config.num_local_experts
    return np.stack([np.bincount(g.topk(k, dim=-1).indices.reshape(-1).numpy(), minlength=E) for g in out.router_logits])

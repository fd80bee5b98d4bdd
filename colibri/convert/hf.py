"""Read a Hugging Face checkpoint directory: ``config.json`` and its ``*.safetensors`` shards.

Tensors are read one at a time through ``safetensors.safe_open(framework="numpy")``, so torch is
not needed. numpy has no bfloat16 of its own; the ``ml_dtypes`` package registers one, and with it
imported the safetensors numpy reader returns BF16 tensors as they are. It is imported only when a
checkpoint holds BF16 tensors.
"""

import contextlib
import json
from pathlib import Path

import numpy as np

from .errors import ConvertError

# safetensors dtype name -> our short name; only float weights can be converted.
SOURCE_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16", "F64": "f64"}
SECTIONS = ("rope_parameters", "rope_scaling")   # config.json's nested objects


class Checkpoint:
    """An open HF checkpoint. Use as a context manager; it keeps the shard files open."""

    def __init__(self, src_dir):
        self.dir = Path(src_dir)
        config_path = self.dir / "config.json"
        if not config_path.is_file():
            raise ConvertError(f"{self.dir}: no config.json (is this a Hugging Face model directory?)")
        try:
            self.config = json.loads(config_path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ConvertError(f"{config_path}: not UTF-8 (byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise ConvertError(f"{config_path}: not valid JSON ({e})") from None
        except RecursionError:
            raise ConvertError(f"{config_path}: nested too deeply to be a model's config") from None
        if not isinstance(self.config, dict):
            raise ConvertError(f"{config_path}: a JSON object of the model's settings, not {type(self.config).__name__}")
        for key in SECTIONS:   # the families read these as objects
            if self.config.get(key) is not None and not isinstance(self.config[key], dict):
                raise ConvertError(f"{config_path}: `{key}` = {self.config[key]!r:.60} is not an object")
        self._end_ids(self.dir / "generation_config.json")
        self.shards = sorted(self.dir.glob("*.safetensors"))
        if not self.shards:
            raise ConvertError(f"{self.dir}: no *.safetensors files")
        from safetensors import SafetensorError, safe_open   # the "convert" extra: not needed to run a model

        self._stack = contextlib.ExitStack()
        self._where = {}  # tensor name -> open shard
        for path in self.shards:
            try:
                handle = self._stack.enter_context(safe_open(str(path), framework="numpy"))
            except SafetensorError as e:
                self._stack.close()
                raise ConvertError(f"{path}: not a readable safetensors file ({e})") from None
            for name in handle.keys():
                self._where[name] = handle

    def _end_ids(self, path):
        """generation_config.json's eos_token_id (an int or a list: what generate() stops on) joins
        config.json's, which stays first (the model's eos_token_id)."""
        if not path.is_file():
            return
        try:
            generation = json.loads(path.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise ConvertError(f"{path}: not a JSON object ({e})") from None
        more = generation.get("eos_token_id") if isinstance(generation, dict) else None
        if more is None:
            return
        ids = [self.config.get("eos_token_id")] + (more if isinstance(more, list) else [more])
        ids = [i for v in ids for i in (v if isinstance(v, list) else [v]) if i is not None]
        self.config["eos_token_id"] = list(dict.fromkeys(ids))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._stack.close()

    def __contains__(self, name):
        return name in self._where

    def __len__(self):
        return len(self._where)

    def _handle(self, name):
        if name not in self._where:
            raise ConvertError(f"tensor `{name}` missing from {self.dir}")
        return self._where[name]

    def shape(self, name):
        return tuple(self._handle(name).get_slice(name).get_shape())

    def dtype(self, name):
        """The short name of a source tensor's dtype (f32, f16, bf16, f64)."""
        st = self._handle(name).get_slice(name).get_dtype()
        if st not in SOURCE_DTYPES:
            raise ConvertError(f"tensor `{name}`: source dtype {st} is not a float type colibri converts")
        return SOURCE_DTYPES[st]

    def get(self, name):
        """One tensor as a float32 numpy array (exact for every accepted source dtype but f64)."""
        if self.dtype(name) == "bf16":
            try:
                import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16")
            except ImportError:
                raise ConvertError(f"tensor `{name}` is bfloat16: install the ml_dtypes package to read it") from None
        return self._handle(name).get_tensor(name).astype(np.float32, copy=False)

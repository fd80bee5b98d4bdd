# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin bindings to the C core: argument checks, memoryviews, nogil, status -> exception."""
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memcpy, memset

cimport colibri._colibri as c

import operator
import os
import time

import numpy as np

_DTYPES = {c.COLIBRI_DTYPE_F32: "f32", c.COLIBRI_DTYPE_F16: "f16", c.COLIBRI_DTYPE_BF16: "bf16",
           c.COLIBRI_DTYPE_U8: "u8", c.COLIBRI_DTYPE_I32: "i32", c.COLIBRI_DTYPE_Q8_0: "q8_0",
           c.COLIBRI_DTYPE_Q4_0: "q4_0", c.COLIBRI_DTYPE_W4G128: "w4g128",
           c.COLIBRI_DTYPE_Q4_K: "q4_k", c.COLIBRI_DTYPE_Q6_K: "q6_k", c.COLIBRI_DTYPE_Q5_K: "q5_k",
           c.COLIBRI_DTYPE_Q4_1: "q4_1", c.COLIBRI_DTYPE_Q5_0: "q5_0", c.COLIBRI_DTYPE_Q5_1: "q5_1",
           c.COLIBRI_DTYPE_IQ4_NL: "iq4_nl", c.COLIBRI_DTYPE_IQ4_XS: "iq4_xs", c.COLIBRI_DTYPE_MXFP4: "mxfp4",
           c.COLIBRI_DTYPE_Q3_K: "q3_k", c.COLIBRI_DTYPE_Q2_K: "q2_k",
           c.COLIBRI_DTYPE_Q4_0X8: "q4_0x8", c.COLIBRI_DTYPE_Q8_0X8: "q8_0x8", c.COLIBRI_DTYPE_Q4_KX8: "q4_kx8",
           c.COLIBRI_DTYPE_Q5_KX8: "q5_kx8", c.COLIBRI_DTYPE_Q6_KX8: "q6_kx8", c.COLIBRI_DTYPE_IQ4_XSX8: "iq4_xsx8",
           c.COLIBRI_DTYPE_MXFP4X8: "mxfp4x8"}
_DTYPE_CODES = {name: code for code, name in _DTYPES.items()}


class Error(Exception):
    """An error reported by the C core.

    ``status`` is the C enumerator's name (e.g. ``"COLIBRI_E_SHAPE"``), ``code`` its value;
    the message is the core's detail, naming the field, tensor or index at fault.
    """

    def __init__(self, status, code, message):
        super().__init__(f"{message} [{status}]")
        self.status = status
        self.code = code
        self.detail = message


def _token_ids(tokens):
    """A 1-D int32 array of token ids; refuses what a cast would silently change."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"token ids must be a non-empty 1-D sequence, got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"token ids must be integers, got {arr.dtype}")
    if arr.min() < -2**31 or arr.max() >= 2**31:
        raise ValueError("a token id does not fit in 32 bits")
    return np.ascontiguousarray(arr, dtype=np.int32)


def _seed_value(seed, what="seed"):
    """A generator seed as uint64 (an integer, taken modulo 2**64); refuses what int() would truncate."""
    try:
        return operator.index(seed) & 0xFFFFFFFFFFFFFFFF
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {seed!r}") from None


MAX_EOS_TOKENS = c.COLIBRI_MAX_EOS_TOKENS   # the most hparams.eos_token_ids a model carries
_LOGIT_BIAS = np.dtype([("token", np.int32), ("bias", np.float32)])   # colibri_logit_bias


def _logit_bias_pairs(logit_bias):
    """colibri_logit_bias pairs from {id: bias} or (id, bias) pairs (None: none); the ids' range is
    the core's to check."""
    if logit_bias is None:
        return np.zeros(0, _LOGIT_BIAS)
    items = list(logit_bias.items() if isinstance(logit_bias, dict) else logit_bias)
    pairs = np.zeros(len(items), _LOGIT_BIAS)
    for i, (token, bias) in enumerate(items):
        token = operator.index(token)
        if not -2**31 <= token < 2**31:
            raise ValueError(f"logit_bias: token {token} does not fit in 32 bits")
        pairs[i] = (token, float(bias))
    return pairs


def _threads_value(threads):
    """Threads sharing the big matmuls: 0 (COLIBRI_THREADS, else the cores) to 256, as the core takes."""
    try:
        n = operator.index(threads)
    except TypeError:
        raise TypeError(f"threads must be an integer, not {threads!r}") from None
    if not 0 <= n <= 256:
        raise ValueError(f"threads must lie in [0, 256] (0: $COLIBRI_THREADS, else the cores), not {n}")
    return n


def kernel_variants():
    """{name: whether this CPU runs it} for the kernel variants this build has, the reference first."""
    out = {}
    cdef int runs = 0
    cdef int32_t i = 0
    cdef const char *name = c.colibri_kernel_variant(0, &runs)
    while name is not NULL:
        out[name.decode()] = bool(runs)
        i += 1
        name = c.colibri_kernel_variant(i, &runs)
    return out


def _dtype_code(dtype):
    if dtype not in _DTYPE_CODES:
        raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(_DTYPE_CODES)}")
    return _DTYPE_CODES[dtype]


def interleaved_form(dtype, fast_here=False):
    """The row-interleaved form of a plain block dtype ("q4_k" -> "q4_kx8"), or None where it has none;
    fast_here: only one the kernels sessions pick here (COLIBRI_KERNELS, else this CPU's best) have
    kernels of their own for, so that they multiply it faster than the plain one."""
    cdef int code_int = _dtype_code(dtype)
    cdef c.colibri_dtype code = <c.colibri_dtype>code_int
    cdef c.colibri_dtype x8 = c.colibri_interleaved_form(code, 1 if fast_here else 0)
    return None if x8 == code else _DTYPES[x8]


def interleave_rows(blocks, dtype):
    """uint8 bytes (..., rows, row bytes) of a plain block dtype -> the same shape in its row-interleaved
    form (docs/FORMAT.md: each 8 rows' blocks moved into groups; rows % 8 == 0), by the core; of an
    interleaved dtype (q4_kx8) -> the plain form."""
    cdef c.colibri_error err
    cdef c.colibri_status st
    cdef int code_int = _dtype_code(dtype)
    cdef c.colibri_dtype code = <c.colibri_dtype>code_int
    a = np.ascontiguousarray(blocks).view(np.uint8)
    shape = tuple(a.shape)   # the module is built without wraparound: no negative indices
    if len(shape) < 2 or shape[len(shape) - 2] % 8:
        raise ValueError(f"interleave_rows takes (..., rows, row bytes) with rows in groups of 8, not shape {list(shape)}")
    if c.colibri_interleaved_form(code, 0) == code and not dtype.endswith("x8"):
        raise ValueError(f"{dtype} has no row-interleaved form")
    from .convert.writer import block_size
    weights, size = block_size(dtype)
    row_bytes = shape[len(shape) - 1]
    if row_bytes % size:
        raise ValueError(f"{dtype}: rows of {row_bytes} bytes are not whole {size}-byte blocks")
    out = np.empty_like(a)
    cdef const uint8_t[::1] src = a.reshape(-1)
    cdef uint8_t[::1] dst = out.reshape(-1)
    cdef int64_t rows = a.size // row_bytes if row_bytes else 0
    cdef int64_t cols = row_bytes // size * weights
    if a.size:
        with nogil:
            st = c.colibri_interleave_rows(&dst[0], &src[0], code, rows, cols, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)
    return out


cdef raise_error(c.colibri_error *err):
    raise Error(c.colibri_status_name(err.status).decode(), <int>err.status,
                err.message.decode("utf-8", "replace"))


_FIELD_TYPES = {c.COLIBRI_FIELD_INTEGER: "integer", c.COLIBRI_FIELD_NUMBER: "number", c.COLIBRI_FIELD_BOOLEAN: "boolean",
                c.COLIBRI_FIELD_CHOICE: "choice", c.COLIBRI_FIELD_OBJECT: "object", c.COLIBRI_FIELD_OTHER: "other"}


def schema():
    """The core's schema of colibri_model.json's hyper-parameters (model/schema.c), one dict per
    field in the loader's order: path, type (integer, number, boolean, choice, object, other),
    min and max (integer: min <= v <= max; number: min < v <= max; None for the other types),
    max_of (the path whose value the bound max is added to, else None), required, default
    (None where required; default_of: the path whose value it takes instead) and choices (a
    choice's default is its name)."""
    cdef c.colibri_field_info f
    cdef int32_t i
    rows = []
    for i in range(c.colibri_schema_count()):
        c.colibri_schema_field(i, &f)
        kind = _FIELD_TYPES[f.type]
        ranged = kind in ("integer", "number")
        as_value = int if kind in ("integer", "boolean", "choice") else float
        rows.append({
            "path": f.path.decode(), "type": kind,
            "min": as_value(f.min) if ranged else None, "max": as_value(f.max) if ranged else None,
            "max_of": f.max_of.decode() if f.max_of is not NULL else None,
            "required": bool(f.required),
            "default": None if f.required or f.fallback_of is not NULL or kind in ("object", "other")
                       else bool(f.fallback) if kind == "boolean"
                       else f.choices[<int32_t>f.fallback].decode() if kind == "choice" else as_value(f.fallback),
            "default_of": f.fallback_of.decode() if f.fallback_of is not NULL else None,
            "choices": [f.choices[k].decode() for k in range(f.n_choices)],
        })
    return rows


def check_hparams(json_text):
    """Raise Error with the loader's message where the hyper-parameters (hparams, routing,
    experts) of a colibri_model.json text, tensors aside, are not what colibri_model_load reads."""
    cdef bytes text = json_text.encode() if isinstance(json_text, str) else bytes(json_text)
    cdef c.colibri_error err
    cdef c.colibri_hparams hp
    cdef size_t meta_bytes = 0
    cdef c.colibri_status st = c.colibri_model_meta_bytes(text, len(text), &meta_bytes, &err)
    if st:
        raise_error(&err)
    cdef char *room = <char *>malloc(meta_bytes + 16)
    if room is NULL:
        raise MemoryError()
    try:   # meta starts at the first 16-byte boundary of room
        st = c.colibri_hparams_read(text, len(text), room + (-<size_t>room & 15), meta_bytes, &hp, &err)
        if st:
            raise_error(&err)
    finally:
        free(room)


_EXPERT_CACHES = {"global": c.COLIBRI_CACHE_GLOBAL, "per_layer": c.COLIBRI_CACHE_PER_LAYER}
KV_TYPES = {"f32": c.COLIBRI_DTYPE_F32, "f16": c.COLIBRI_DTYPE_F16, "q8_0": c.COLIBRI_DTYPE_Q8_0}


cdef c.colibri_dtype _kv_type(kv_type) except *:
    """The core's dtype of a KV cache type's name."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"kv_type must be one of {', '.join(KV_TYPES)}, not {kv_type!r}")
    return KV_TYPES[kv_type]

# A session's options, each declared here once with its default (Session's docstring says what each
# does).  Session takes them all, the first nine also by position after the model; Model.session
# passes them on (ctx, batch and kernels by position); Model.memory_plan takes ctx, batch, kv_type and the
# streaming ones, Model.expert_slots and .expert_slot_count the streaming ones.
SESSION_OPTIONS = {
    "ctx": 0, "batch": 0, "kernels": "auto", "routing": "model", "noise": 1.0, "noise_seed": 0,
    "capacity_factor": 1.0, "profile": False, "threads": None, "n_seq": 1, "kv_type": "f32",
    # expert streaming
    "expert_budget": 0, "expert_cache": "global", "direct_io": False, "prefetch": True, "pins": None,
    "verify": False, "expert_read": None,
    # devices
    "devices": (), "placement": None, "device_threshold_ms": 5.0, "device_probe_ms": 250.0, "strict": False,
}
_POSITIONAL = ("ctx", "batch", "kernels", "routing", "noise", "noise_seed", "capacity_factor", "profile", "threads")
STREAMING_OPTIONS = ("expert_budget", "expert_cache", "direct_io", "prefetch", "pins", "verify")


def _bind(what, args, kwargs, positional, names):
    """{name: value} of the options ``names``: ``args`` fill ``positional`` in order, ``kwargs``
    any of ``names``, SESSION_OPTIONS' defaults the rest.  TypeError, as Python's own binding
    raises it, for an argument too many or one not among ``names``."""
    if len(args) > len(positional):
        raise TypeError(f"{what}() takes at most {len(positional)} positional arguments ({len(args)} given)")
    given = dict(zip(positional, args))
    for name, value in kwargs.items():
        if name not in names:
            raise TypeError(f"{what}() got an unexpected keyword argument {name!r}")
        if name in given:
            raise TypeError(f"{what}() got multiple values for argument {name!r}")
        given[name] = value
    return {name: given.get(name, SESSION_OPTIONS[name]) for name in names}


def _expert_pins(pins):
    """(n, 2) int32 (layer, expert) pairs from a sequence of pairs or an integer array."""
    arr = np.asarray(pins)
    if arr.size == 0:
        return np.zeros((0, 2), dtype=np.int32)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"pins must be (layer, expert) pairs: a sequence of pairs or an (n, 2) array, "
                         f"got shape {arr.shape}")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"pins must be integers, got {arr.dtype}")
    if arr.min() < 0 or arr.max() >= 2**31:
        raise ValueError("a pinned layer or expert is negative or does not fit in 32 bits")
    return np.ascontiguousarray(arr, dtype=np.int32)


cdef object _expert_options(c.colibri_session_options *opts, expert_budget, str expert_cache, bint direct_io,
                            bint prefetch, pins, bint verify=False):
    """Fills the expert streaming fields of ``opts``; returns the pins array ``opts`` points into
    (None without pins), which the caller keeps alive as long as ``opts`` or its session."""
    cdef int32_t[:, ::1] pairs
    try:
        budget = operator.index(expert_budget)
    except TypeError:
        raise TypeError(f"expert_budget must be an integer number of bytes, not {expert_budget!r}") from None
    if budget < 0 or budget >= 2**64:
        raise ValueError(f"expert_budget must be >= 0 bytes (0: resident) and fit in 64 bits, not {budget}")
    if expert_cache not in _EXPERT_CACHES:
        raise ValueError(f"expert_cache must be one of {', '.join(_EXPERT_CACHES)}, not {expert_cache!r}")
    opts.expert_budget = <uint64_t>budget
    opts.expert_cache = _EXPERT_CACHES[expert_cache]
    opts.expert_io = ((c.COLIBRI_EXPERT_IO_DIRECT if direct_io else 0) |
                      (0 if prefetch else c.COLIBRI_EXPERT_IO_NO_PREFETCH) |
                      (c.COLIBRI_EXPERT_IO_VERIFY if verify else 0))
    if pins is None:
        return None
    arr = _expert_pins(pins)
    if arr.shape[0] == 0:
        return None
    if budget == 0:
        raise ValueError("pins need an expert_budget: a resident session (expert_budget=0) has no cache to pin in")
    if arr.shape[0] >= 2**31:
        raise ValueError(f"{arr.shape[0]} pins do not fit in 32 bits")
    pairs = arr
    opts.expert_pins = &pairs[0, 0]
    opts.n_expert_pins = <int32_t>arr.shape[0]
    return arr


cdef object _streaming_options(c.colibri_session_options *opts, dict o):
    """_expert_options from bound options (SESSION_OPTIONS' streaming ones)."""
    return _expert_options(opts, o["expert_budget"], o["expert_cache"], o["direct_io"], o["prefetch"], o["pins"],
                           o["verify"])


# ---- devices: Python drivers behind the core's driver table (colibri/device.h) ----

cdef void _set_error(c.colibri_error *err, exc) noexcept:
    """A Python exception as a driver's error message (the core adds which device and layer)."""
    if err is NULL:
        return
    cdef bytes text = f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")[:c.COLIBRI_ERROR_MESSAGE_SIZE - 1]
    memcpy(err.message, <const char *>text, len(text))
    err.message[len(text)] = 0
    err.status = c.COLIBRI_E_DEVICE


cdef class _Driver:
    """Holds a Python driver object and the C table that calls it."""
    cdef c.colibri_device_driver table
    cdef readonly object obj
    cdef bytes name
    cdef int32_t n_layers, n_experts

    def __cinit__(self, obj, int32_t n_layers, int32_t n_experts):
        for attr in ("name", "compute", "sync"):
            if not hasattr(obj, attr):
                raise TypeError(f"a device driver needs name, compute and sync: {obj!r} has no {attr}")
        name = obj.name
        if not isinstance(name, str) or not 1 <= len(name.encode()) <= 15 or name == "cpu" or "\0" in name:
            raise ValueError(f"a driver's name is 1 to 15 characters and not 'cpu', not {name!r}")
        threshold_ms = getattr(obj, "threshold_ms", None)
        if threshold_ms is not None and not 0 < threshold_ms < 1e9:
            raise ValueError(f"driver {name}: threshold_ms must be > 0, not {threshold_ms!r}")
        self.obj = obj
        self.name = name.encode()
        self.n_layers = n_layers
        self.n_experts = n_experts
        memset(&self.table, 0, sizeof(self.table))
        self.table.name = self.name
        self.table.context = <void *>self
        self.table.threshold_ns = 0 if threshold_ms is None else <uint64_t>(threshold_ms * 1e6)
        self.table.init = _driver_init
        self.table.compute = _driver_compute
        self.table.sync = _driver_sync


cdef c.colibri_status _driver_init(void *context, const c.colibri_model *model, uint8_t *holds,
                                   c.colibri_error *err) noexcept with gil:
    cdef _Driver d = <_Driver>context
    cdef uint8_t[:, ::1] table
    try:
        if not hasattr(d.obj, "holds"):
            return c.COLIBRI_OK
        held = d.obj.holds(d.n_layers, d.n_experts)
        if held is None:
            return c.COLIBRI_OK
        arr = np.ascontiguousarray(held, dtype=bool).astype(np.uint8)
        if arr.shape != (d.n_layers, d.n_experts):
            raise ValueError(f"holds() returned shape {arr.shape}, not ({d.n_layers}, {d.n_experts})")
        table = arr
        memcpy(holds, &table[0, 0], <size_t>(d.n_layers * d.n_experts))
        return c.COLIBRI_OK
    except BaseException as exc:
        _set_error(err, exc)
        return c.COLIBRI_E_DEVICE


cdef c.colibri_status _driver_compute(void *context, const c.colibri_device_task *t,
                                      c.colibri_error *err) noexcept with gil:
    cdef _Driver d = <_Driver>context
    try:
        experts = np.asarray(<int32_t[:t.n_experts]><int32_t *>t.experts)
        rows = np.asarray(<int32_t[:t.n_experts + 1]><int32_t *>t.rows)
        gates = np.asarray(<float[:t.n_rows]><float *>t.gates)
        x = np.asarray(<float[:t.n_rows, :t.hidden_size]><float *>t.x)
        for view in (experts, rows, gates, x):   # the core's buffers: read them, copy what outlives the call
            view.flags.writeable = False
        d.obj.compute(t.layer, experts, rows, gates, x)
        return c.COLIBRI_OK
    except BaseException as exc:
        _set_error(err, exc)
        return c.COLIBRI_E_DEVICE


cdef c.colibri_status _driver_sync(void *context, c.colibri_device_task *t, c.colibri_error *err) noexcept with gil:
    cdef _Driver d = <_Driver>context
    try:
        y = np.asarray(<float[:t.n_rows, :t.hidden_size]>t.y)
        latency = d.obj.sync(y)
        if latency is not None:
            if not 0 <= latency < 1e6:
                raise ValueError(f"sync() returned a latency of {latency!r} s")
            t.latency_ns = max(<uint64_t>(latency * 1e9), 1)
        return c.COLIBRI_OK
    except BaseException as exc:
        _set_error(err, exc)
        return c.COLIBRI_E_DEVICE


cdef class _Reader:
    """A Python callable read(offset, dst) -> bytes read, as the core's colibri_read_fn."""
    cdef readonly object read


cdef int64_t _reader_read(void *context, uint64_t offset, void *dst, size_t n) noexcept with gil:
    cdef _Reader r = <_Reader>context
    try:
        got = r.read(offset, memoryview(<uint8_t[:n]><uint8_t *>dst) if n else memoryview(b""))
        got = operator.index(got)
        return got if 0 <= got <= n else -5
    except BaseException:
        return -5   # EIO: the core names the expert and the bytes


def gguf_sidecar(path):
    """The directory that describes the GGUF file at ``path`` for running it in place (the core's
    colibri_gguf_sidecar: named by the file's name, size, modification time and first MiB)."""
    cdef c.colibri_error err
    cdef c.colibri_status st
    cdef char out[4096]
    cdef bytes bpath = _path_bytes(path)
    cdef const char *cpath = bpath
    with nogil:
        st = c.colibri_gguf_sidecar(cpath, out, sizeof(out), &err)
    if st != c.COLIBRI_OK:
        raise_error(&err)
    return os.fsdecode(out)


def _path_bytes(path):
    cdef bytes bpath = os.fsencode(os.fspath(path))
    if b"\0" in bpath:
        raise ValueError("model path contains a NUL byte")
    return bpath


cdef class Model:
    """A colibri model: a directory (colibri_model.json + weights.bin), or a GGUF file run in
    place, validated and mapped.  A GGUF's tensors are used where they lie in the file; the first
    open writes its description (colibri.convert.gguf_import.describe_in_place: the tensor table
    and the vocabulary's tables, no weights) into the directory gguf_sidecar names.

    ``verify=True`` also checks every tensor's CRC-32 and that all weights are finite.

    weights.bin is mapped privately and read-only (``MAP_PRIVATE``), not copied.  Each new Session
    checks that it is still the file opened (device, inode, size, modification time) and raises
    Error (``COLIBRI_E_IO``, naming weights.bin and what changed) if not.  Nothing more: writes by
    another process during a session may still show through on Linux and are not detected, and
    truncating the file under a live mapping may still end the process with SIGBUS, unless the
    model was opened with ``copy=True``.
    """
    cdef c.colibri_model *_model
    cdef readonly str path
    cdef readonly str directory     # what holds colibri_model.json: path, or a GGUF's sidecar
    cdef readonly int threads

    def __cinit__(self, path, *, bint verify=False, threads=0, bint experts_elsewhere=False, bint copy=False,
                  bint repack=True, bint stream_experts=False):
        """``threads``: how many threads its sessions share big matmuls with (0: $COLIBRI_THREADS,
        else the machine's cores); the results are the same for any count.  ``experts_elsewhere``:
        weights.bin holds only what precedes the routed experts (an interleaved file cut there);
        sessions then stream the experts through an ``expert_read`` callable.  ``copy``: read
        weights.bin into memory (read-only, not pageable to the file) instead of mapping it, so that
        the file truncated or rewritten later cannot reach the model's bytes (a server's choice).
        ``repack``: each matrix whose row-interleaved form this machine's kernels multiply faster
        (a GGUF's Q4_K, Q6_K, IQ4_XS, ... on x86) is rewritten in it at open, in the mapping's own
        private pages (the file is never written; ``tensors()``' run_dtype says what each runs as);
        False runs the file's layout as it is.  ``stream_experts``: sessions will take an
        ``expert_budget``, so the routed experts' pages are left unread at open (each expert is
        rewritten in its slot as it is read)."""
        cdef c.colibri_error err
        cdef c.colibri_status st
        cdef unsigned flags = (c.COLIBRI_LOAD_VERIFY if verify else 0) | \
            (c.COLIBRI_LOAD_EXPERTS_ELSEWHERE if experts_elsewhere else 0) | (c.COLIBRI_LOAD_COPY if copy else 0) | \
            (0 if repack else c.COLIBRI_LOAD_AS_STORED) | (c.COLIBRI_LOAD_STREAM_EXPERTS if stream_experts else 0)
        self.path = os.fspath(path)
        self.threads = _threads_value(threads)
        cdef bytes bpath = _path_bytes(self.path)
        cdef const char *cpath = bpath
        self.directory = self.path
        if os.path.isfile(self.path):   # a GGUF, described once
            from colibri.convert.gguf_import import describe_in_place
            self.directory = os.fspath(describe_in_place(self.path))
        with nogil:
            st = c.colibri_model_open(cpath, flags, &self._model, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def __dealloc__(self):
        if self._model is not NULL:
            c.colibri_model_close(self._model)

    @property
    def architecture(self):
        return c.colibri_model_architecture(self._model).decode()

    @property
    def config(self):
        """The validated hyper-parameters."""
        cdef const c.colibri_hparams *hp = c.colibri_model_hparams(self._model)
        return {
            "vocab_size": hp.vocab_size, "hidden_size": hp.hidden_size,
            "intermediate_size": hp.intermediate_size, "num_layers": hp.n_layers,
            "num_heads": hp.n_heads, "num_kv_heads": hp.n_kv_heads, "head_dim": hp.head_dim,
            "max_position_embeddings": hp.max_position_embeddings,
            "sliding_window": hp.sliding_window, "num_experts": hp.n_experts, "top_k": hp.top_k,
            "bos_token_id": hp.bos_token_id, "eos_token_id": hp.eos_token_id,
            "eos_token_ids": [hp.eos_token_ids[i] for i in range(hp.n_eos_token_ids)],
            "tie_word_embeddings": bool(hp.tie_word_embeddings),
            "normalize_topk": bool(hp.normalize_topk),
            "rope_theta": hp.rope_theta, "rms_norm_eps": hp.rms_norm_eps,
            "weight_layout": ("stacked", "interleaved")[hp.expert_layout],
        }

    @property
    def vocab_size(self):
        return c.colibri_model_hparams(self._model).vocab_size

    @property
    def weight_bytes(self):
        return c.colibri_model_weight_bytes(self._model)

    def tensors(self):
        """The tensor table: name, dtype, shape, offset, size and CRC-32 of each tensor as the file
        stores it, the dtype it runs as (run_dtype: dtype, or its row-interleaved form rewritten at
        open), and the routed experts' expert_stride with the interleaved layout."""
        cdef c.colibri_tensor_info info
        out = []
        for i in range(c.colibri_model_tensor_count(self._model)):
            c.colibri_model_tensor(self._model, i, &info)
            t = {"name": info.name.decode(), "dtype": _DTYPES[info.dtype],
                 "shape": tuple(info.shape[d] for d in range(info.n_dims)),
                 "file_offset": info.file_offset, "file_size": info.file_size, "crc32": info.crc32,
                 "run_dtype": _DTYPES[info.run_dtype]}
            if info.expert_stride:   # interleaved experts: expert e's part at file_offset + e * expert_stride
                t["expert_stride"] = info.expert_stride
            out.append(t)
        return out

    def token_bytes(self, int token):
        """The bytes of one token from the model's own vocabulary table (what the C CLI prints),
        or None when the model carries none."""
        cdef const uint8_t *data = NULL
        cdef size_t n = 0
        cdef c.colibri_status st = c.colibri_token_bytes(self._model, token, &data, &n)
        if st == c.COLIBRI_E_TENSOR:
            return None
        if st != c.COLIBRI_OK:
            raise IndexError(f"token {token} outside [0, {self.vocab_size})")
        return PyBytes_FromStringAndSize(<const char *>data, n)

    def check_file(self):
        """Raises Error (COLIBRI_E_IO, saying what changed) once weights.bin is no longer the file
        the model was opened from: replaced, resized or written to."""
        cdef c.colibri_error err
        cdef c.colibri_status st
        with nogil:
            st = c.colibri_model_check_file(self._model, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def tokenize(self, text, add_bos=None):
        """The token ids of `text` (str, or bytes taken as UTF-8) as the model's tokenizer encodes it,
        by the core's encoder (colibri_tokenize_bos).  add_bos: None puts the BOS where the tokenizer's
        template does, False none (a later turn of a conversation), True one.  Bytes pass through as
        they are, invalid UTF-8 included (byte fallback encodes them)."""
        cdef int32_t bos = c.COLIBRI_BOS_DEFAULT if add_bos is None else \
            c.COLIBRI_BOS_ADD if add_bos else c.COLIBRI_BOS_NONE
        cdef bytes data
        if isinstance(text, str):
            data = text.encode("utf-8")
        elif isinstance(text, (bytes, bytearray, memoryview)):
            data = bytes(text)
        else:   # bytes(3) would be three NUL bytes
            raise TypeError(f"tokenize takes str or bytes, not {type(text).__name__}")
        cdef const char *p = data
        cdef size_t length = len(data), n = 0, cap = length + 8   # byte-level BPE: a token a byte at most
        cdef int32_t[::1] ids = np.empty(cap, dtype=np.int32)
        cdef c.colibri_error err
        cdef c.colibri_status st
        with nogil:
            st = c.colibri_tokenize_bos(self._model, p, length, bos, &ids[0], cap, &n, &err)
        if st == c.COLIBRI_E_ARG and n > cap:   # byte fallback: a character may give a token per byte and more
            cap = n
            ids = np.empty(cap, dtype=np.int32)
            with nogil:
                st = c.colibri_tokenize_bos(self._model, p, length, bos, &ids[0], cap, &n, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)
        return np.asarray(ids[:n]).tolist()

    def detokenize(self, ids):
        """The text of token ids from the model's byte table (special tokens stand for no text);
        bytes that are not whole UTF-8 become U+FFFD, as the tokenizer's decoder does."""
        out = []
        for t in ids:
            b = self.token_bytes(int(t))
            if b is None:
                raise ValueError(f"{self.path} carries no vocabulary table: reconvert it with colibri convert")
            out.append(b)
        return b"".join(out).decode("utf-8", "replace")

    def memory_plan(self, *args, **options):
        """memory_plan(ctx, batch, n_seq=1, kv_type="f32", **streaming options): exact arena bytes a
        session with this context, batch, sequence slots and KV cache type needs (nothing is allocated); with an
        ``expert_budget``, its slot pool included (the options and their defaults: SESSION_OPTIONS, STREAMING_OPTIONS; see Session)."""
        o = _bind("memory_plan", args, options, ("ctx", "batch"), ("ctx", "batch", "n_seq", "kv_type") + STREAMING_OPTIONS)
        cdef c.colibri_session_options opts
        cdef c.colibri_error err
        cdef size_t need = 0
        memset(&opts, 0, sizeof(opts))
        opts.n_ctx = o["ctx"]
        opts.n_batch = o["batch"]
        opts.n_seq = o["n_seq"]
        opts.kv_type = _kv_type(o["kv_type"])
        kept = _streaming_options(&opts, o)
        if c.colibri_session_plan(self._model, &opts, &need, &err) != c.COLIBRI_OK:
            raise_error(&err)
        return need

    def expert_slots(self, **options):
        """expert_slots(**streaming options): (slot_bytes, min_budget) for expert streaming with
        these options (STREAMING_OPTIONS; see Session): the bytes of one cache slot, and the smallest
        expert_budget a session accepts (one layer's top_k slots; for every MoE layer with
        expert_cache="per_layer").  colibri.Error for a model without routed experts."""
        o = _bind("expert_slots", (), options, (), STREAMING_OPTIONS)
        cdef c.colibri_session_options opts
        cdef c.colibri_error err
        cdef uint64_t slot_bytes = 0, min_budget = 0
        memset(&opts, 0, sizeof(opts))
        kept = _streaming_options(&opts, o)
        if c.colibri_expert_slots(self._model, &opts, &slot_bytes, &min_budget, &err) != c.COLIBRI_OK:
            raise_error(&err)
        return slot_bytes, min_budget

    def expert_slot_count(self, **options):
        """expert_slot_count(**streaming options): the cache slots a session with these options
        (those of expert_slots) makes: what ``expert_budget`` buys, at most every routed
        expert, even shares of the MoE layers with expert_cache="per_layer"; 0 for a resident
        session.  colibri.Error for a budget under expert_slots()'s minimum."""
        o = _bind("expert_slot_count", (), options, (), STREAMING_OPTIONS)
        cdef c.colibri_session_options opts
        cdef c.colibri_error err
        cdef int32_t n_slots = 0
        memset(&opts, 0, sizeof(opts))
        kept = _streaming_options(&opts, o)
        if c.colibri_expert_slot_count(self._model, &opts, &n_slots, &err) != c.COLIBRI_OK:
            raise_error(&err)
        return n_slots

    def expert_location(self, int layer, int expert):
        """[(offset, size, stride)]: where expert ``expert`` of ``layer`` lies in weights.bin, in
        file order: its bytes are these parts joined.  Interleaved, one part, its extent (padding
        included); stacked, its slice of each of the layer's routed-expert tensors.  The next
        expert's part lies ``stride`` bytes further.  [] for a layer without routed experts;
        IndexError for a layer or expert out of range."""
        cdef uint64_t offset[c.COLIBRI_EXPERT_PARTS]
        cdef uint64_t size[c.COLIBRI_EXPERT_PARTS]
        cdef uint64_t stride[c.COLIBRI_EXPERT_PARTS]
        cdef int32_t n = 0
        if c.colibri_expert_location(self._model, layer, expert, offset, size, stride, &n) != c.COLIBRI_OK:
            hp = c.colibri_model_hparams(self._model)
            raise IndexError(f"no expert {expert} of layer {layer}: the model has {hp.n_layers} layers of "
                             f"{hp.n_experts} experts")
        return [(offset[i], size[i], stride[i]) for i in range(n)]

    @property
    def metadata_bytes(self):
        """Bytes of the model's tables (what colibri_model_load needs as ``meta``): the same
        on every target, as the arena plan is."""
        cdef c.colibri_error err
        cdef size_t need = 0
        with open(os.path.join(self.path, "colibri_model.json"), "rb") as f:
            text = f.read()
        if c.colibri_model_meta_bytes(text, len(text), &need, &err) != c.COLIBRI_OK:
            raise_error(&err)
        return need

    def apply_chat_template(self, messages, add_generation_prompt=True, tools=None, template=None, **kwargs):
        """The conversation ``messages`` ([{"role", "content"}, ...]) as the model's chat template
        writes it, to tokenize: the text transformers' ``apply_chat_template(..., tokenize=False)``
        gives.  ``template``: a name of the model's templates ("tool_use") or a template's text;
        other keyword arguments (``enable_thinking=False``, ``documents``) go to the template
        (colibri.chat, which also says whether the template writes the BOS token itself)."""
        from colibri import chat
        return chat.read(self.directory).render(messages, add_generation_prompt, tools=tools, template=template, **kwargs)

    def session(self, *args, **options):
        """session(ctx, batch, kernels, **options): a new session: a KV cache for ``ctx``
        positions (0: the model's maximum, at most 4096), prefill computed ``batch`` tokens at a
        time (0: 64), with the fastest kernels this CPU runs (``kernels="auto"``) or the plain C
        reference (``"reference"``).  The other options (SESSION_OPTIONS: expert streaming, devices,
        research routing, off by default): see Session."""
        return Session(self, **_bind("session", args, options, ("ctx", "batch", "kernels"), SESSION_OPTIONS))


_ROUTINGS = {"model": 0, "noisy": 1, "hash": 2, "capacity": 3}   # COLIBRI_ROUTING_*


# Session.stop_reason: an end id of the model, --max-tokens, a full context, a stop string
_STOP_REASONS = {c.COLIBRI_STOP_EOS: "eos", c.COLIBRI_STOP_MAX_TOKENS: "max_tokens",
                 c.COLIBRI_STOP_CONTEXT_FULL: "context_full", c.COLIBRI_STOP_STRING: "stop"}


cdef void _text_write(void *context, const char *data, size_t n) noexcept with gil:
    (<_TextOut>context).pieces.append(PyBytes_FromStringAndSize(data, n))


cdef class _TextOut:
    """A generation's text for Session.stream_text: the core's text stream (colibri_text_stream),
    its stop strings kept alive here, the pieces it wrote since the last take()."""
    cdef c.colibri_text_stream stream
    cdef const char *stop_ptrs[c.COLIBRI_MAX_STOPS]
    cdef tuple stop_bytes
    cdef public list pieces
    cdef public int stop

    def __cinit__(self, stop):
        cdef c.colibri_error err
        if isinstance(stop, (str, bytes)):
            stop = [stop]
        self.stop_bytes = tuple(s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in stop)
        if len(self.stop_bytes) > c.COLIBRI_MAX_STOPS:
            raise ValueError(f"{len(self.stop_bytes)} stop strings: at most {c.COLIBRI_MAX_STOPS}")
        for i, b in enumerate(self.stop_bytes):
            if b"\0" in b:
                raise ValueError(f"stop string {i} holds a NUL byte")
            self.stop_ptrs[i] = b
        self.pieces = []
        self.stop = c.COLIBRI_STOP_NONE
        if c.colibri_text_stream_init(&self.stream, self.stop_ptrs, len(self.stop_bytes), _text_write,
                                      <void *>self, &err) != c.COLIBRI_OK:
            raise_error(&err)

    def take(self):
        """The text written since the last take: whole UTF-8 characters (U+FFFD for invalid bytes)."""
        text = b"".join(self.pieces).decode("utf-8", "replace")
        self.pieces = []
        return text


cdef class Session:
    """One sequence's state: the arena with KV cache, activations and sampling buffers.

    Nothing is allocated by the core after creation.  A session is not shareable between
    threads; the GIL is released while it computes.
    """
    cdef c.colibri_session *_session
    cdef readonly Model model
    cdef uint64_t _rng
    cdef readonly object last_seed   # the seed seed() last set (the drawn one for -1); None: never seeded
    cdef readonly object stop_reason # why the last stream()/stream_text() ended: "eos", "max_tokens", "context_full",
                                     # "stop" (a stop string); None: running
    cdef bint _busy
    cdef int32_t _vocab
    cdef object _pins
    cdef object _drivers          # the _Driver tables the core calls, alive as long as the session
    cdef object _reader
    cdef const c.colibri_device_driver **_driver_table
    cdef readonly uint64_t expert_budget

    def __cinit__(self, Model model not None, *args, **options):
        """Session(model, ctx, batch, kernels, routing, noise, noise_seed, capacity_factor, profile,
        threads, **options): SESSION_OPTIONS lists every option with its default; ``ctx``,
        ``batch``, ``kernels``: see Model.session.

        ``routing``: "model" (the model's own router), or a research router that changes the
        model's output: "noisy" (Gaussian noise of std ``noise`` on the router logits, a function of
        ``noise_seed``, layer, position and expert), "hash" (a token id's experts are fixed, weights
        1/top_k), "capacity" (each expert takes at most ceil(capacity_factor * n * top_k / n_experts)
        of a chunk's n tokens; expert_dropped() counts the rest; 0: the model's routing.capacity_factor).  ``profile``: time each phase of
        the forward pass (profile()).  ``kv_type``: what the KV cache stores, "f32" (exact), "f16"
        (half the bytes) or "q8_0" (llama.cpp's 8-bit blocks of 32 along each head, 34 bytes a 32:
        head_dim a multiple of 32); keys and values are computed in f32 and stored converted.
        Latent attention's cache and the short convolution's inputs stay f32 (memdump() shows each).

        ``n_seq``: sequence slots, each with its own KV cache of ``ctx`` positions (forward_batch,
        the seq_* calls, colibri.Batch); the single-sequence calls are slot 0's.

        Expert streaming: with ``expert_budget`` bytes (0: every weight used where weights.bin is
        mapped) the routed experts are read from storage into a cache of slots in the arena, at
        least Model.expert_slots()'s minimum; the logits are the same.  ``expert_cache``: "global"
        (one pool) or "per_layer" (the slots split evenly among the MoE layers); ``direct_io``:
        read past the page cache (O_DIRECT); ``prefetch``: guess the next layer's experts and read
        them ahead; ``pins``: (layer, expert) pairs read at creation and never evicted (a sequence
        of pairs or an (n, 2) integer array), at most the slots less one layer's top_k; ``verify``:
        check each expert's extent against its CRC-32 when first read (interleaved files);
        ``expert_read``: where experts are read from, a callable ``read(offset, dst) -> bytes read``
        filling the writable memoryview ``dst`` from weights.bin's bytes at ``offset`` (called from
        the I/O thread; an exception is an I/O error), instead of the model's own weights.bin.

        Devices (docs/DEVICES.md): ``devices`` are driver objects (``name``, ``compute(layer,
        experts, rows, gates, x)``, ``sync(y) -> latency seconds or None``, optionally ``holds(
        n_layers, n_experts)`` and ``threshold_ms``), devices 1, 2, ... after the cpu;
        ``placement``: None (all on the cpu), a placement file's path or JSON text, or an
        (n_layers, n_experts) array of device indices.  A device whose P90 latency of its last 32
        calls passes ``device_threshold_ms`` (or its own ``threshold_ms``), or whose call fails, is
        bypassed: its experts run on the cpu (the same bits) and it is probed again after
        ``device_probe_ms``, doubling while it stays slow.  ``strict``: fail instead."""
        o = _bind("Session", args, options, _POSITIONAL, SESSION_OPTIONS)
        cdef int ctx = o["ctx"], batch = o["batch"]
        cdef str kernels = o["kernels"], routing = o["routing"]
        cdef float noise = o["noise"], capacity_factor = o["capacity_factor"]
        cdef bint profile = o["profile"], strict = o["strict"]
        threads, expert_read, devices, placement = o["threads"], o["expert_read"], o["devices"], o["placement"]
        device_threshold_ms, device_probe_ms = o["device_threshold_ms"], o["device_probe_ms"]
        cdef c.colibri_session_options opts
        cdef c.colibri_error err
        cdef c.colibri_status st
        variants = kernel_variants()
        if kernels != "auto" and kernels not in variants:
            raise ValueError(f"kernels must be 'auto' or one of {', '.join(variants)}, not {kernels!r}")
        if kernels != "auto" and not variants[kernels]:
            raise ValueError(f"this CPU cannot run the {kernels} kernels (it runs: "
                             f"{', '.join(k for k, runs in variants.items() if runs)})")
        cdef bytes kernel_name = kernels.encode()
        if routing not in _ROUTINGS:
            raise ValueError(f"routing must be one of {', '.join(_ROUTINGS)}, not {routing!r}")
        memset(&opts, 0, sizeof(opts))
        opts.routing = _ROUTINGS[routing]
        opts.routing_noise = noise
        opts.routing_seed = <uint64_t>_seed_value(o["noise_seed"], "noise_seed")
        opts.capacity_factor = capacity_factor
        opts.profile = profile
        opts.threads = model.threads if threads is None else _threads_value(threads)
        opts.kernels = c.COLIBRI_KERNELS_AUTO
        opts.kernel_variant = NULL if kernels == "auto" else <const char *>kernel_name
        opts.n_ctx = ctx
        opts.n_batch = batch
        opts.n_seq = o["n_seq"]
        opts.kv_type = _kv_type(o["kv_type"])
        self._pins = _streaming_options(&opts, o)
        self.expert_budget = opts.expert_budget
        self.model = model
        cdef const c.colibri_hparams *hp = c.colibri_model_hparams(model._model)
        self._vocab = hp.vocab_size
        cdef _Reader reader
        if expert_read is not None:
            if not callable(expert_read):
                raise TypeError(f"expert_read must be a callable read(offset, dst) -> int, not {expert_read!r}")
            reader = _Reader.__new__(_Reader)
            reader.read = expert_read
            self._reader = reader
            opts.expert_read = _reader_read
            opts.expert_read_context = <void *>reader
        self._drivers = [_Driver(d, hp.n_layers, hp.n_experts) for d in devices]
        if len(self._drivers) >= c.COLIBRI_MAX_DEVICES:
            raise ValueError(f"at most {c.COLIBRI_MAX_DEVICES - 1} devices beside the cpu, not {len(self._drivers)}")
        if not 0 < device_threshold_ms < 1e9 or not 0 < device_probe_ms < 1e12:
            raise ValueError("device_threshold_ms and device_probe_ms must be > 0")
        cdef _Driver drv
        if self._drivers:
            self._driver_table = <const c.colibri_device_driver **>malloc(len(self._drivers) * sizeof(void *))
            if self._driver_table is NULL:
                raise MemoryError()
            for i, drv in enumerate(self._drivers):
                self._driver_table[i] = &drv.table
            opts.devices = self._driver_table
            opts.n_devices = len(self._drivers)
        opts.device_threshold_ns = <uint64_t>(device_threshold_ms * 1e6)
        opts.device_probe_ns = <uint64_t>(device_probe_ms * 1e6)
        opts.device_strict = strict
        cdef uint8_t[:, ::1] table
        table_arr = None
        if placement is not None and not isinstance(placement, (str, os.PathLike)):
            table_arr = self._placement_array(placement, hp.n_layers, hp.n_experts)
            if not self._drivers:
                raise ValueError("a placement needs devices: pass the drivers it names")
            table = table_arr
            opts.placement = &table[0, 0]
        with nogil:   # a Python driver's init takes the GIL back
            st = c.colibri_session_create(model._model, &opts, &self._session, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)
        if placement is not None and table_arr is None:
            self.load_placement(placement)

    def __dealloc__(self):
        if self._session is not NULL:
            c.colibri_session_destroy(self._session)
        free(self._driver_table)

    @staticmethod
    def _placement_array(placement, int32_t n_layers, int32_t n_experts):
        arr = np.asarray(placement)
        if arr.shape != (n_layers, n_experts):
            raise ValueError(f"a placement is an (n_layers, n_experts) = ({n_layers}, {n_experts}) array of device "
                             f"indices, not shape {arr.shape}")
        if arr.dtype.kind not in "iu":
            raise TypeError(f"placement device indices must be integers, not {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() >= c.COLIBRI_MAX_DEVICES):
            raise ValueError(f"placement device indices must lie in [0, {c.COLIBRI_MAX_DEVICES})")
        return np.ascontiguousarray(arr, dtype=np.uint8)

    # ---- devices ----

    @property
    def devices(self):
        """Device names, in index order: "cpu" first, then the drivers."""
        return [c.colibri_device_name(self._session, i).decode()
                for i in range(c.colibri_device_count(self._session))]

    @property
    def placement(self):
        """(n_layers, n_experts) uint8: each routed expert's device index (a copy)."""
        cdef const c.colibri_hparams *hp = c.colibri_model_hparams(self.model._model)
        out = np.zeros((hp.n_layers, hp.n_experts), dtype=np.uint8)
        cdef uint8_t[:, ::1] view = out
        if out.size:
            c.colibri_placement_get(self._session, &view[0, 0])
        return out

    def set_placement(self, placement):
        """Binds every expert at once (an (n_layers, n_experts) array of device indices), from the
        next forward on: call it between tokens.  Nothing changes on error."""
        cdef const c.colibri_hparams *hp = c.colibri_model_hparams(self.model._model)
        arr = self._placement_array(placement, hp.n_layers, hp.n_experts)
        cdef uint8_t[:, ::1] view = arr
        cdef c.colibri_error err
        self._enter()
        try:
            st = c.colibri_placement_set(self._session, &view[0, 0], &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def place(self, int layer, int expert, device):
        """Binds expert (layer, expert) to ``device`` (a name or an index); -1: every layer or expert."""
        cdef c.colibri_error err
        cdef int32_t index
        if isinstance(device, str):
            name = device.encode()
            index = c.colibri_device_find(self._session, name)
            if index < 0:
                raise ValueError(f"no device {device!r} in this session (devices: {', '.join(self.devices)})")
        else:
            index = operator.index(device)
        self._enter()
        try:
            st = c.colibri_place(self._session, layer, expert, index, &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def load_placement(self, placement):
        """Applies a placement file (docs/DEVICES.md): a path, or the JSON text itself."""
        if isinstance(placement, os.PathLike) or (isinstance(placement, str) and not placement.lstrip().startswith("{")):
            with open(placement, "rb") as f:
                text = f.read()
        else:
            text = placement.encode() if isinstance(placement, str) else bytes(placement)
        cdef const char *json = text
        cdef size_t need = 0
        cdef c.colibri_error err
        st = c.colibri_placement_scratch_bytes(self._session, json, len(text), &need, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)
        scratch = np.empty(need // 4 + 1, dtype=np.uint32)
        cdef uint32_t[::1] buf = scratch
        self._enter()
        try:
            st = c.colibri_placement_parse(self._session, json, len(text), &buf[0], need, &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def device_stats(self):
        """Per device, in index order: calls, experts, rows, errors, slow, fallbacks, probes,
        bypassed (times it went bypassed), p90_ns, last_ns, threshold_ns, samples (latencies in its
        ring), bypassed_now.  The cpu's fallbacks are the expert computations it took in."""
        cdef c.colibri_device_stats st
        out = []
        for i, name in enumerate(self.devices):
            c.colibri_device_stats_get(self._session, i, &st)
            out.append({"name": name, "calls": st.calls, "experts": st.experts, "rows": st.rows,
                        "errors": st.errors, "slow": st.slow, "fallbacks": st.fallbacks, "probes": st.probes,
                        "bypassed": st.bypassed, "p90_ns": st.p90_ns, "last_ns": st.last_ns,
                        "threshold_ns": st.threshold_ns, "samples": st.samples, "bypassed_now": bool(st.bypassed_now)})
        return out

    def device_stats_clear(self):
        """Zeroes the counters (the latency rings and bypass states stay)."""
        c.colibri_device_stats_clear(self._session)

    def compute_experts(self, int layer, experts, rows, x):
        """The cpu driver: y (n_rows, hidden) float32 = each expert's FFN of its rows of ``x``
        (n_rows, hidden) float32, with this session's kernels: bit for bit what a forward pass
        computes.  ``experts``: ascending ids; ``rows``: n_experts + 1 offsets into x's rows.
        colibri.Error (COLIBRI_E_ARG) names what is out of range."""
        cdef int32_t[::1] ids = np.ascontiguousarray(experts, dtype=np.int32)
        cdef int32_t[::1] offsets = np.ascontiguousarray(rows, dtype=np.int32)
        xa = np.ascontiguousarray(x, dtype=np.float32)
        if xa.ndim != 2:
            raise ValueError(f"x must be (n_rows, hidden_size), not shape {xa.shape}")
        if ids.shape[0] < 1 or offsets.shape[0] != ids.shape[0] + 1:
            raise ValueError(f"{ids.shape[0]} experts need {ids.shape[0] + 1} row offsets, not {offsets.shape[0]}")
        if xa.shape[0] < 1:
            raise ValueError("x has no rows")
        out = np.empty_like(xa)
        cdef float[:, ::1] xv = xa
        cdef float[:, ::1] yv = out
        cdef c.colibri_device_task t
        cdef c.colibri_error err
        cdef c.colibri_status st
        memset(&t, 0, sizeof(t))
        t.layer = layer
        t.n_experts = ids.shape[0]
        t.experts = &ids[0]
        t.rows = &offsets[0]
        t.x = &xv[0, 0]
        t.y = &yv[0, 0]
        t.n_rows = xa.shape[0]
        t.hidden_size = xa.shape[1]
        self._enter()
        try:
            with nogil:
                st = c.colibri_experts_compute(self._session, &t, &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)
        return out

    def check_experts(self, int layer, experts, rows, int hidden_size):
        """compute_experts' checks of a task of ``rows[-1]`` rows of ``hidden_size``, without
        computing it: colibri.Error (COLIBRI_E_ARG) as compute_experts would raise.  It reads only
        the model, so it may run while another thread computes (the expert server checks each
        call on its event loop before merging it with others)."""
        cdef int32_t[::1] ids = np.ascontiguousarray(experts, dtype=np.int32)
        cdef int32_t[::1] offsets = np.ascontiguousarray(rows, dtype=np.int32)
        if ids.shape[0] < 1 or offsets.shape[0] != ids.shape[0] + 1:
            raise ValueError(f"{ids.shape[0]} experts need {ids.shape[0] + 1} row offsets, not {offsets.shape[0]}")
        cdef c.colibri_device_task t
        cdef c.colibri_error err
        memset(&t, 0, sizeof(t))
        t.layer = layer
        t.n_experts = ids.shape[0]
        t.experts = &ids[0]
        t.rows = &offsets[0]
        t.n_rows = offsets[offsets.shape[0] - 1]
        t.hidden_size = hidden_size
        if c.colibri_experts_check(self._session, &t, &err) != c.COLIBRI_OK:
            raise_error(&err)

    cdef _enter(self):
        # Callers convert and check every argument before taking the flag and release it in a
        # finally: an exception must never leave the session marked busy.
        if self._busy:
            raise RuntimeError("this session is already computing in another thread")
        self._busy = True

    @property
    def position(self):
        """Tokens in the KV cache: len(tokens), less the pending token if there is one."""
        return c.colibri_session_position(self._session)

    @property
    def tokens(self):
        """The conversation the session holds: the ids of the KV cache's positions, then the
        pending token if there is one (the last token a generation returned, which the next
        forward, prefill, step or generation feeds first)."""
        cdef int32_t n = 0
        cdef const int32_t *ids = c.colibri_session_tokens(self._session, &n)
        out = [ids[i] for i in range(n)]
        if c.colibri_session_pending(self._session) >= 0:
            out.append(c.colibri_session_pending(self._session))
        return out

    @property
    def pending(self):
        """The token sampled last and not yet fed (in tokens, not in position), else None."""
        cdef int32_t t = c.colibri_session_pending(self._session)
        return None if t < 0 else t

    def truncate(self, int n):
        """Keeps the first ``n`` tokens of the conversation (tokens[:n]): what is fed next computes
        exactly what a session fed only those computes.  Until then sample() has no logits unless
        n keeps every position."""
        cdef c.colibri_error err
        cdef c.colibri_status st
        self._enter()
        try:
            st = c.colibri_session_truncate(self._session, n, &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)

    @property
    def n_ctx(self):
        return c.colibri_session_n_ctx(self._session)

    # ---- several sequences ----

    @property
    def n_seq(self):
        """Sequence slots: each its own KV cache of n_ctx positions, position, pending token, logits."""
        return c.colibri_session_n_seq(self._session)

    cdef int32_t _seq(self, seq) except -1:
        """seq as a slot index; colibri.Error (as the core's calls say it) outside [0, n_seq)."""
        cdef int32_t n_seq = c.colibri_session_n_seq(self._session)
        index = operator.index(seq)
        if not 0 <= index < n_seq:
            raise Error("COLIBRI_E_ARG", <int>c.COLIBRI_E_ARG, f"sequence {index} outside [0, {n_seq})")
        return index

    def seq_position(self, seq):
        """Tokens in slot ``seq``'s KV cache."""
        return c.colibri_seq_position(self._session, self._seq(seq))

    def seq_tokens(self, seq):
        """The ids slot ``seq`` holds: its KV cache's positions, then its pending token if any."""
        cdef int32_t n = 0, index = self._seq(seq)
        cdef const int32_t *ids = c.colibri_seq_tokens(self._session, index, &n)
        out = [ids[i] for i in range(n)]
        if c.colibri_seq_pending(self._session, index) >= 0:
            out.append(c.colibri_seq_pending(self._session, index))
        return out

    def seq_pending(self, seq):
        """Slot ``seq``'s token sampled and not yet fed, else None."""
        cdef int32_t t = c.colibri_seq_pending(self._session, self._seq(seq))
        return None if t < 0 else t

    def seq_logits(self, seq):
        """float32 (vocab,): a copy of slot ``seq``'s last logits."""
        cdef const float *p = c.colibri_seq_logits(self._session, self._seq(seq))
        return np.asarray(<const float[:self._vocab]>p).copy()

    def seq_truncate(self, seq, int n):
        """Keeps slot ``seq``'s first ``n`` tokens (seq_tokens(seq)[:n]), as truncate() does slot 0's."""
        cdef c.colibri_error err
        cdef c.colibri_status st
        self._enter()
        try:
            st = c.colibri_seq_truncate(self._session, operator.index(seq), n, &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def seq_reset(self, seq):
        """Empties slot ``seq``: no positions, no pending token."""
        cdef c.colibri_error err
        cdef c.colibri_status st
        self._enter()
        try:
            st = c.colibri_seq_reset(self._session, operator.index(seq), &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def seq_copy(self, src, dst):
        """Slot ``dst`` holds what slot ``src`` holds (KV cache, tokens, pending token, logits): a
        shared prefix computed once."""
        cdef c.colibri_error err
        cdef c.colibri_status st
        self._enter()
        try:
            st = c.colibri_seq_copy(self._session, operator.index(src), operator.index(dst), &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def forward_batch(self, entries):
        """One forward over several slots: ``entries`` are (seq, token_ids, want_logits), each slot
        at most once; a slot's token_ids (may be empty when it has a pending token) are appended
        after its pending token.  With want_logits the slot's last position's logits go to
        seq_logits(seq).  Everything is checked before anything is computed (colibri.Error, every
        slot unchanged); the GIL is released while it computes."""
        entries = list(entries)
        cdef Py_ssize_t n = len(entries), i
        if n >= 2**31:
            raise ValueError(f"{n} entries do not fit in 32 bits")
        arrays = []
        for entry in entries:
            if len(entry) != 3:
                raise ValueError(f"a batch entry is (seq, token_ids, want_logits), not {entry!r}")
            seq, ids, want = entry
            arrays.append((operator.index(seq), _token_ids(ids) if len(ids) else None, bool(want)))
        cdef c.colibri_batch_entry *table = <c.colibri_batch_entry *>malloc(max(n, 1) * sizeof(c.colibri_batch_entry))
        cdef int32_t[::1] view
        cdef c.colibri_error err
        cdef c.colibri_status st
        if table is NULL:
            raise MemoryError()
        try:
            for i in range(n):
                seq, ids, want = arrays[i]
                if not -2**31 <= seq < 2**31:
                    raise ValueError(f"sequence {seq} does not fit in 32 bits")
                table[i].seq = seq
                table[i].logits = want
                table[i].n_tokens = 0
                table[i].tokens = NULL
                if ids is not None:
                    view = ids
                    table[i].tokens = &view[0]
                    table[i].n_tokens = <int32_t>ids.shape[0]
            self._enter()
            try:
                with nogil:
                    st = c.colibri_forward_batch(self._session, table, <int32_t>n, &err)
            finally:
                self._busy = False
        finally:
            free(table)
        if st != c.COLIBRI_OK:
            raise_error(&err)

    @property
    def kernels(self):
        """The kernels this session computes with: "avx2", "neon" or "reference"."""
        return c.colibri_session_kernels(self._session).decode()

    def reset(self):
        """Empties the KV cache and drops the pending token."""
        self._enter()
        try:
            c.colibri_session_reset(self._session)
        finally:
            self._busy = False

    cdef _expert_counts(self, bint dropped, bint clear):
        cdef const c.colibri_hparams *hp = c.colibri_model_hparams(self.model._model)
        out = np.zeros((hp.n_layers, hp.n_experts), dtype=np.uint64)
        cdef uint64_t[:, ::1] counts = out
        if dropped:
            c.colibri_expert_dropped(self._session, &counts[0, 0])
        else:
            c.colibri_expert_load(self._session, &counts[0, 0])
        if clear:
            c.colibri_expert_load_clear(self._session)
        return out.astype(np.int64)

    def expert_load(self, bint clear=False):
        """int64 [n_layers, n_experts]: tokens routed to each expert since creation or the last
        clear (reset() keeps the counts); with routing="capacity", the tokens each expert kept."""
        return self._expert_counts(False, clear)

    def expert_dropped(self, bint clear=False):
        """int64 [n_layers, n_experts]: tokens each expert dropped over capacity (routing="capacity"),
        counted and cleared with expert_load."""
        return self._expert_counts(True, clear)

    def expert_cache_stats(self):
        """The expert cache's counters since creation or the last clear: hits, misses, prefetches,
        prefetch_hits (in hits too), bytes_read, reads, io_wait_ns; and its slots, pinned and
        slot_bytes.  colibri.Error for a resident session (expert_budget=0)."""
        cdef c.colibri_expert_cache_stats s
        cdef c.colibri_status st = c.colibri_expert_cache_stats_get(self._session, &s)
        if st != c.COLIBRI_OK:
            raise Error(c.colibri_status_name(st).decode(), <int>st,
                        "the session is resident (expert_budget=0): it has no expert cache")
        return {"hits": s.hits, "misses": s.misses, "prefetches": s.prefetches, "prefetch_hits": s.prefetch_hits,
                "bytes_read": s.bytes_read, "reads": s.reads, "io_wait_ns": s.io_wait_ns, "slots": s.slots,
                "pinned": s.pinned, "slot_bytes": s.slot_bytes}

    def expert_cache_stats_clear(self):
        """Zeroes the expert cache's counters (the slots keep what they hold)."""
        self._enter()
        try:
            c.colibri_expert_cache_stats_clear(self._session)
        finally:
            self._busy = False

    def expert_cache_slots(self):
        """[(layer, expert, pinned)] for each slot of the expert cache: what it holds now, (-1, -1,
        False) when empty."""
        cdef int32_t layer = 0, expert = 0
        cdef int pinned = 0
        slots = self.expert_cache_stats()["slots"]
        out = []
        for i in range(slots):
            if c.colibri_expert_cache_slot(self._session, i, &layer, &expert, &pinned) != c.COLIBRI_OK:
                raise IndexError(f"expert cache slot {i} outside [0, {slots})")
            out.append((layer, expert, bool(pinned)))
        return out

    def profile(self):
        """{phase: nanoseconds} spent in each phase of the forward pass since the session was made
        (zeros unless it was made with profile=True)."""
        cdef uint64_t ns[32]
        c.colibri_profile(self._session, ns)
        return {c.colibri_phase_name(p).decode(): ns[p] for p in range(c.COLIBRI_PHASE_COUNT)}

    def seed(self, seed):
        """Seeds the sampler's generator: an integer, taken modulo 2**64; -1 draws a random seed in
        [0, 2**31) (what the CLIs' --seed takes back).  Returns the seed set, also in ``last_seed``."""
        if seed is not None and not isinstance(seed, bool) and seed == -1:
            seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        cdef uint64_t value = _seed_value(seed)   # converted before the flag: a bad seed leaves the session usable
        self._enter()
        try:
            self._rng = value
            self.last_seed = seed
        finally:
            self._busy = False
        return seed

    def forward(self, tokens):
        """Appends ``tokens`` to the KV cache (after the pending token, if any, whose logits are not
        returned); returns float32 logits [len(tokens), vocab]."""
        cdef int32_t[::1] ids = _token_ids(tokens)
        cdef size_t n = ids.shape[0]
        out = np.empty((n, self._vocab), dtype=np.float32)
        cdef float[:, ::1] logits = out
        cdef c.colibri_error err
        cdef c.colibri_status st
        self._enter()
        try:
            with nogil:
                st = c.colibri_forward(self._session, &ids[0], n, &logits[0, 0], &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)
        return out

    def prefill(self, tokens):
        """Appends ``tokens`` to the KV cache, computing only the last position's logits (for
        sample()): a prompt's lm_head costs one row, not one per token."""
        cdef int32_t[::1] ids = _token_ids(tokens)
        cdef size_t n = ids.shape[0]
        cdef c.colibri_error err
        cdef c.colibri_status st
        self._enter()
        try:
            with nogil:
                st = c.colibri_forward(self._session, &ids[0], n, NULL, &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def sample(self, float temperature=0.0, int top_k=0, float top_p=1.0):
        """Draws the next token from the last logits (greedy at temperature 0).  top_k keeps the k
        most likely tokens, then top_p the nucleus of those (renormalised, as transformers does)."""
        cdef c.colibri_sampling sp
        cdef c.colibri_error err
        cdef c.colibri_status st
        cdef int32_t token = 0
        memset(&sp, 0, sizeof(sp))
        sp.temperature = temperature
        sp.top_k = top_k
        sp.top_p = top_p
        self._enter()
        try:
            st = c.colibri_sample(self._session, &sp, &self._rng, &token, &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)
        return token

    def step(self, int token, float temperature=0.0, int top_k=0, float top_p=1.0):
        """Feeds one token (after the pending token, if any) and returns the next one sampled from
        its logits; that one is not left pending: step() it next."""
        cdef c.colibri_sampling sp
        cdef c.colibri_error err
        cdef c.colibri_status st
        cdef int32_t tok = token
        cdef int32_t nxt = 0
        memset(&sp, 0, sizeof(sp))
        sp.temperature = temperature
        sp.top_k = top_k
        sp.top_p = top_p
        self._enter()
        try:
            with nogil:
                st = c.colibri_forward(self._session, &tok, 1, NULL, &err)
                if st == c.COLIBRI_OK:
                    st = c.colibri_sample(self._session, &sp, &self._rng, &nxt, &err)
        finally:
            self._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)
        return nxt

    def stream(self, prompt, int max_tokens=16, float temperature=0.0, int top_k=0, float top_p=1.0,
               seed=None, bint stop_at_eos=True, between_tokens=None, *, float min_p=0.0,
               float repeat_penalty=1.0, int repeat_last_n=c.COLIBRI_PENALTY_LAST_N_DEFAULT,
               float presence_penalty=0.0, float frequency_penalty=0.0, logit_bias=None, _TextOut _text=None):
        """Prefills ``prompt`` and yields up to ``max_tokens`` generated token ids (the core's
        generation loop: colibri_generate_next).  seed: None goes on with the session's generator,
        -1 draws a random one (``last_seed``).  The sampling steps and their order are colibri.h's:
        logit_bias ({id: bias} or (id, bias) pairs; -inf bans a token), the repetition, presence and
        frequency penalties over the last ``repeat_last_n`` tokens (the prompt's included; 0: off,
        -1: the core's whole window), temperature, top_k, top_p, min_p.  When it ends,
        ``stop_reason`` says why: "eos" (an end id of the model: finish_reason "stop"), "max_tokens"
        or "context_full" (before max_tokens: finish_reason "length" for both).  between_tokens(),
        when given, is called before each step that computes a token after the first."""
        cdef c.colibri_generation g
        cdef c.colibri_generate_options o
        cdef c.colibri_error err
        cdef c.colibri_status st
        cdef int32_t token = -1
        cdef uint8_t[::1] bias_bytes
        if seed is not None:
            self.seed(seed)
        cdef int32_t[::1] ids = _token_ids(prompt)
        cdef size_t n = ids.shape[0]
        pairs = _logit_bias_pairs(logit_bias)   # kept alive by this frame: the core reads it every step
        memset(&o, 0, sizeof(o))
        o.max_tokens = max_tokens
        o.sampling.temperature = temperature
        o.sampling.top_k = top_k
        o.sampling.top_p = top_p
        o.sampling.min_p = min_p
        o.sampling.repeat_penalty = repeat_penalty
        o.sampling.presence_penalty = presence_penalty
        o.sampling.frequency_penalty = frequency_penalty
        o.sampling.penalty_last_n = repeat_last_n
        if len(pairs):
            bias_bytes = pairs.view(np.uint8)
            o.sampling.logit_bias = <const c.colibri_logit_bias *>&bias_bytes[0]
            o.sampling.n_logit_bias = len(pairs)
        o.stop_at_eos = stop_at_eos
        self.stop_reason = None
        self._enter()
        try:
            o.seed = self._rng
            with nogil:
                st = c.colibri_generate_start(&g, self._session, &o, &ids[0], n, &err)
        finally:
            self._busy = False
        if st == c.COLIBRI_OK and _text is not None:
            st = c.colibri_generate_text(&g, &_text.stream, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)
        while True:
            self._enter()
            try:
                g.rng = self._rng   # the session's generator: seed() between tokens takes effect
                with nogil:
                    st = c.colibri_generate_next(&g, &token, &err)
                self._rng = g.rng
            finally:
                self._busy = False
            if _text is not None:
                _text.stop = g.stop
            if st != c.COLIBRI_OK:
                raise_error(&err)
            if g.stop != c.COLIBRI_STOP_NONE:
                self.stop_reason = _STOP_REASONS.get(g.stop)
            if token < 0:
                return
            yield token
            if g.stop != c.COLIBRI_STOP_NONE:
                return
            if between_tokens is not None:
                between_tokens()

    def stream_text(self, prompt, stop=(), **options):
        """Like stream() (the same options), yielding the generated text instead of ids: each
        token's bytes as the core's text stream writes them (no piece splits a UTF-8 character), a
        str per token that wrote any.  ``stop``: strings that end the generation when the text
        completes one; the text stops before it, and no piece ever holds a part of one that then
        completes it.  stop_reason says afterwards why it ended."""
        out = _TextOut(stop)
        self.stop_reason = None
        for _ in self.stream(prompt, _text=out, **options):
            if out.pieces:
                yield out.take()
        if out.pieces:
            yield out.take()
        self.stop_reason = _STOP_REASONS.get(out.stop)

    def generate(self, prompt, int max_tokens=16, float temperature=0.0, int top_k=0, float top_p=1.0,
                 seed=None, bint stop_at_eos=True, **sampling):
        """Like stream(), as a list (``stop_reason`` says why it ended)."""
        return list(self.stream(prompt, max_tokens, temperature, top_k, top_p, seed, stop_at_eos, **sampling))

    def memdump(self):
        """The memory report: weights by tensor, the arena by group and buffer, totals."""
        cdef size_t n = 0
        c.colibri_memdump(self._session, NULL, 0, &n)
        cdef char *buf = <char *>malloc(n + 1)
        if buf is NULL:
            raise MemoryError()
        try:
            c.colibri_memdump(self._session, buf, n + 1, NULL)
            return PyBytes_FromStringAndSize(buf, n).decode("utf-8")
        finally:
            free(buf)

    def memory(self):
        """Byte totals: weights, metadata, arena_reserved, arena_used, kv_cache, activations,
        expert_cache (the slot pool and its tables, in arena_used)."""
        cdef c.colibri_memory_totals t
        c.colibri_memory(self._session, &t)
        return {"weights": t.weights, "metadata": t.metadata, "arena_reserved": t.arena_reserved,
                "arena_used": t.arena_used, "kv_cache": t.kv_cache, "activations": t.activations,
                "expert_cache": t.expert_cache}


cdef class Batch:
    """One generation per sequence slot of a session, stepped together: what a server's scheduler
    thread drives.  start() readies a slot, step() makes one batched forward (the running slots'
    next tokens first, then the prompts still prefilling in what is left of the session's batch)
    and returns what each slot produced.  The session must not be used otherwise while a slot runs."""
    cdef readonly Session session
    cdef c.colibri_generation *_gens      # (n_seq)
    cdef c.colibri_generation **_running  # (n_seq) the running ones, for colibri_generate_step
    cdef list _active                     # running seqs, in the order they started
    cdef dict _keep                       # seq -> (prompt ids, logit bias pairs, _TextOut): alive while it runs
    cdef dict _seeds

    def __cinit__(self, Session session not None):
        cdef int32_t n = c.colibri_session_n_seq(session._session)
        self.session = session
        self._gens = <c.colibri_generation *>malloc(n * sizeof(c.colibri_generation))
        self._running = <c.colibri_generation **>malloc(n * sizeof(void *))
        if self._gens is NULL or self._running is NULL:
            raise MemoryError()
        memset(self._gens, 0, n * sizeof(c.colibri_generation))
        self._active = []
        self._keep = {}
        self._seeds = {}

    def __dealloc__(self):
        free(self._gens)
        free(self._running)

    cdef int32_t _slot(self, seq) except -1:
        return self.session._seq(seq)

    def start(self, seq, prompt, *, int max_tokens=16, float temperature=0.0, int top_k=0, float top_p=1.0,
              float min_p=0.0, seed=None, stop=(), bint stop_at_eos=True, float repeat_penalty=1.0,
              int repeat_last_n=c.COLIBRI_PENALTY_LAST_N_DEFAULT, float presence_penalty=0.0,
              float frequency_penalty=0.0, logit_bias=None, bint reuse_prefix=True):
        """Readies slot ``seq`` to generate after ``prompt`` (token ids), the options Session.stream's
        (seed None: one drawn at random, seed_of(seq) tells it).  With reuse_prefix the slot keeps
        the longest prefix it shares with the prompt (not computed again), else it starts empty;
        returns the prompt tokens reused.  Nothing is computed until step()."""
        cdef int32_t index = self._slot(seq)
        cdef c.colibri_generate_options o
        cdef c.colibri_error err
        cdef c.colibri_status st
        cdef int32_t[::1] ids
        cdef uint8_t[::1] bias_bytes
        cdef c.colibri_generation *g = &self._gens[index]
        if index in self._active:
            raise ValueError(f"seq {index} is running: cancel() it first")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, not {max_tokens}")
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        cdef uint64_t seed_value = _seed_value(seed)
        arr = _token_ids(prompt)
        ids = arr
        pairs = _logit_bias_pairs(logit_bias)
        text = _TextOut(stop)
        memset(&o, 0, sizeof(o))
        o.max_tokens = max_tokens
        o.sampling.temperature = temperature
        o.sampling.top_k = top_k
        o.sampling.top_p = top_p
        o.sampling.min_p = min_p
        o.sampling.repeat_penalty = repeat_penalty
        o.sampling.presence_penalty = presence_penalty
        o.sampling.frequency_penalty = frequency_penalty
        o.sampling.penalty_last_n = repeat_last_n
        if len(pairs):
            bias_bytes = pairs.view(np.uint8)
            o.sampling.logit_bias = <const c.colibri_logit_bias *>&bias_bytes[0]
            o.sampling.n_logit_bias = len(pairs)
        o.stop_at_eos = stop_at_eos
        o.seed = seed_value
        if arr.shape[0] > self.session.n_ctx:   # before the slot is cut: the core's begin says it too
            raise Error("COLIBRI_E_CONTEXT", <int>c.COLIBRI_E_CONTEXT,
                        f"a prompt of {arr.shape[0]} tokens does not fit a context of {self.session.n_ctx} positions")
        reused = 0
        if reuse_prefix:   # the longest common prefix, less one token: the prompt's last logits come out of step()
            held = self.session.seq_tokens(index)
            limit = min(len(held), arr.shape[0] - 1, self.session.seq_position(index))
            while reused < limit and held[reused] == arr[reused]:
                reused += 1
            self.session.seq_truncate(index, reused)
        else:
            self.session.seq_reset(index)
        st = c.colibri_generate_begin(g, self.session._session, index, &o, &ids[0], arr.shape[0], &err)
        if st == c.COLIBRI_OK:
            st = c.colibri_generate_text(g, &text.stream, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)
        self._keep[index] = (arr, pairs, text)
        self._seeds[index] = seed
        self._active.append(index)
        return reused

    def cancel(self, seq):
        """Ends slot ``seq``'s generation at once; its KV cache stays for a later start to reuse."""
        cdef int32_t index = self._slot(seq)
        if index in self._active:
            self._active.remove(index)
            del self._keep[index]

    def step(self):
        """One colibri_generate_step over the running slots (the GIL released while it computes):
        [(seq, token, text, finish)] for each slot that produced a token; text is what its text stream
        wrote (whole UTF-8 characters; stop strings held back, then dropped), finish None or "eos",
        "max_tokens", "context_full", "stop".  A finished slot leaves ``active``.  colibri.Error on a
        core failure (the slots as they were)."""
        cdef int32_t n = len(self._active), i
        cdef c.colibri_error err
        cdef c.colibri_status st
        cdef c.colibri_generation *g
        for i in range(n):
            self._running[i] = &self._gens[<int32_t>self._active[i]]
        self.session._enter()
        try:
            with nogil:
                st = c.colibri_generate_step(self.session._session, self._running, n, &err)
        finally:
            self.session._busy = False
        if st != c.COLIBRI_OK:
            raise_error(&err)
        out = []
        for seq in list(self._active):
            g = &self._gens[<int32_t>seq]
            text = (<_TextOut>self._keep[seq][2])
            if not g.fresh and g.stop == c.COLIBRI_STOP_NONE:
                continue
            finish = None if g.stop == c.COLIBRI_STOP_NONE else _STOP_REASONS.get(g.stop)
            out.append((seq, g.last if g.fresh else None, text.take(), finish))
            if finish is not None:
                self._active.remove(seq)
                del self._keep[seq]
        return out

    @property
    def active(self):
        """The running slots, in the order they started."""
        return tuple(self._active)

    @property
    def n_running_prefill(self):
        """Running slots whose prompt is not all fed yet."""
        cdef int32_t seq, count = 0
        for seq in self._active:
            count += self._gens[seq].prompt_done < self._gens[seq].n_prompt
        return count

    def prompt_done(self, seq):
        """Prompt tokens of slot ``seq``'s generation fed so far (a reused prefix included)."""
        return self._gens[self._slot(seq)].prompt_done

    def generated(self, seq):
        """Tokens slot ``seq``'s generation produced so far."""
        return self._gens[self._slot(seq)].generated

    def seed_of(self, seq):
        """The seed slot ``seq``'s generation started from (drawn when start() was given None)."""
        return self._seeds.get(self._slot(seq))

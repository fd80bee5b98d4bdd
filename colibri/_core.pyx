# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin bindings to the C core: argument checks, memoryviews, nogil, status -> exception."""
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdint cimport int32_t, uint8_t, uint64_t
from libc.stdlib cimport malloc, free
from libc.string cimport memset

cimport colibri._colibri as c

import operator
import os

import numpy as np

_DTYPES = {c.COLIBRI_DTYPE_F32: "f32", c.COLIBRI_DTYPE_F16: "f16", c.COLIBRI_DTYPE_BF16: "bf16",
           c.COLIBRI_DTYPE_U8: "u8", c.COLIBRI_DTYPE_I32: "i32", c.COLIBRI_DTYPE_Q8_0: "q8_0",
           c.COLIBRI_DTYPE_Q4_0: "q4_0", c.COLIBRI_DTYPE_W4G128: "w4g128"}


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


cdef raise_error(c.colibri_error *err):
    raise Error(c.colibri_status_name(err.status).decode(), <int>err.status,
                err.message.decode("utf-8", "replace"))


_EXPERT_CACHES = {"global": c.COLIBRI_CACHE_GLOBAL, "per_layer": c.COLIBRI_CACHE_PER_LAYER}


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
                            bint prefetch, pins):
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
                      (0 if prefetch else c.COLIBRI_EXPERT_IO_NO_PREFETCH))
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


cdef class Model:
    """A colibri model directory (colibri_model.json + weights.bin), validated and mapped.

    ``verify=True`` also checks every tensor's CRC-32 and that all weights are finite.
    """
    cdef c.colibri_model *_model
    cdef readonly str path
    cdef readonly int threads

    def __cinit__(self, path, *, bint verify=False, int threads=0):
        """``threads``: how many threads its sessions share big matmuls with (0: $COLIBRI_THREADS,
        else the machine's cores); the results are the same for any count."""
        cdef c.colibri_error err
        cdef c.colibri_status st
        cdef unsigned flags = c.COLIBRI_LOAD_VERIFY if verify else 0
        self.path = os.fspath(path)
        if threads < 0:
            raise ValueError(f"threads must be >= 0, not {threads}")
        self.threads = threads
        cdef bytes bpath = os.fsencode(self.path)
        if b"\0" in bpath:
            raise ValueError("model path contains a NUL byte")
        cdef const char *cpath = bpath
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
        """The tensor table: name, dtype, shape, offset, size and CRC-32 of each tensor (and the
        routed experts' expert_stride with the interleaved layout)."""
        cdef c.colibri_tensor_info info
        out = []
        for i in range(c.colibri_model_tensor_count(self._model)):
            c.colibri_model_tensor(self._model, i, &info)
            t = {"name": info.name.decode(), "dtype": _DTYPES[info.dtype],
                 "shape": tuple(info.shape[d] for d in range(info.n_dims)),
                 "file_offset": info.file_offset, "file_size": info.file_size, "crc32": info.crc32}
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

    def memory_plan(self, int ctx=0, int batch=0, *, expert_budget=0, str expert_cache="global",
                    bint direct_io=False, bint prefetch=True, pins=None):
        """Exact arena bytes a session with this context and batch needs (nothing is allocated);
        with an ``expert_budget``, its slot pool included (the options: see Session)."""
        cdef c.colibri_session_options opts
        cdef c.colibri_error err
        cdef size_t need = 0
        memset(&opts, 0, sizeof(opts))
        opts.n_ctx = ctx
        opts.n_batch = batch
        kept = _expert_options(&opts, expert_budget, expert_cache, direct_io, prefetch, pins)
        if c.colibri_session_plan(self._model, &opts, &need, &err) != c.COLIBRI_OK:
            raise_error(&err)
        return need

    def expert_slots(self, *, expert_budget=0, str expert_cache="global", bint direct_io=False,
                     bint prefetch=True, pins=None):
        """(slot_bytes, min_budget) for expert streaming with these options (see Session): the
        bytes of one cache slot, and the smallest expert_budget a session accepts (one layer's
        top_k slots; for every MoE layer with expert_cache="per_layer").  colibri.Error for a model
        without routed experts."""
        cdef c.colibri_session_options opts
        cdef c.colibri_error err
        cdef uint64_t slot_bytes = 0, min_budget = 0
        memset(&opts, 0, sizeof(opts))
        kept = _expert_options(&opts, expert_budget, expert_cache, direct_io, prefetch, pins)
        if c.colibri_expert_slots(self._model, &opts, &slot_bytes, &min_budget, &err) != c.COLIBRI_OK:
            raise_error(&err)
        return slot_bytes, min_budget

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

    def session(self, int ctx=0, int batch=0, str kernels="auto", *, expert_budget=0, str expert_cache="global",
                bint direct_io=False, bint prefetch=True, pins=None, **routing):
        """A new session: a KV cache for ``ctx`` positions (0: the model's maximum, at most 4096),
        prefill computed ``batch`` tokens at a time (0: 64), with the fastest kernels this CPU runs
        (``kernels="auto"``) or the plain C reference (``"reference"``).  ``expert_budget`` (expert
        streaming) and ``routing`` (research routers, off by default): see Session."""
        return Session(self, ctx, batch, kernels, expert_budget=expert_budget, expert_cache=expert_cache,
                       direct_io=direct_io, prefetch=prefetch, pins=pins, **routing)


_ROUTINGS = {"model": 0, "noisy": 1, "hash": 2, "capacity": 3}   # COLIBRI_ROUTING_*


cdef class Session:
    """One sequence's state: the arena with KV cache, activations and sampling buffers.

    Nothing is allocated by the core after creation.  A session is not shareable between
    threads; the GIL is released while it computes.
    """
    cdef c.colibri_session *_session
    cdef readonly Model model
    cdef uint64_t _rng
    cdef bint _busy
    cdef int32_t _vocab
    cdef object _pins
    cdef readonly uint64_t expert_budget

    def __cinit__(self, Model model not None, int ctx=0, int batch=0, str kernels="auto", str routing="model",
                  float noise=1.0, noise_seed=0, float capacity_factor=1.0, bint profile=False, threads=None, *,
                  expert_budget=0, str expert_cache="global", bint direct_io=False, bint prefetch=True, pins=None):
        """``routing``: "model" (the model's own router), or a research router that changes the
        model's output: "noisy" (Gaussian noise of std ``noise`` on the router logits, a function of
        ``noise_seed``, layer, position and expert), "hash" (a token id's experts are fixed, weights
        1/top_k), "capacity" (each expert takes at most ceil(capacity_factor * n * top_k / n_experts)
        of a chunk's n tokens; expert_dropped() counts the rest).  ``profile``: time each phase of
        the forward pass (profile()).

        Expert streaming: with ``expert_budget`` bytes (0: every weight used where weights.bin is
        mapped) the routed experts are read from storage into a cache of slots in the arena, at
        least Model.expert_slots()'s minimum; the logits are the same.  ``expert_cache``: "global"
        (one pool) or "per_layer" (the slots split evenly among the MoE layers); ``direct_io``:
        read past the page cache (O_DIRECT); ``prefetch``: guess the next layer's experts and read
        them ahead; ``pins``: (layer, expert) pairs read at creation and never evicted (a sequence
        of pairs or an (n, 2) integer array), at most the slots less one layer's top_k."""
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
        opts.routing_seed = <uint64_t>(int(noise_seed) & 0xFFFFFFFFFFFFFFFF)
        opts.capacity_factor = capacity_factor
        opts.profile = profile
        opts.threads = model.threads if threads is None else threads
        opts.kernels = c.COLIBRI_KERNELS_AUTO
        opts.kernel_variant = NULL if kernels == "auto" else <const char *>kernel_name
        opts.n_ctx = ctx
        opts.n_batch = batch
        self._pins = _expert_options(&opts, expert_budget, expert_cache, direct_io, prefetch, pins)
        self.expert_budget = opts.expert_budget
        self.model = model
        self._vocab = c.colibri_model_hparams(model._model).vocab_size
        with nogil:
            st = c.colibri_session_create(model._model, &opts, &self._session, &err)
        if st != c.COLIBRI_OK:
            raise_error(&err)

    def __dealloc__(self):
        if self._session is not NULL:
            c.colibri_session_destroy(self._session)

    cdef _enter(self):
        if self._busy:
            raise RuntimeError("this session is already computing in another thread")
        self._busy = True

    @property
    def position(self):
        """Tokens in the KV cache."""
        return c.colibri_session_position(self._session)

    @property
    def n_ctx(self):
        return c.colibri_session_n_ctx(self._session)

    @property
    def kernels(self):
        """The kernels this session computes with: "avx2", "neon" or "reference"."""
        return c.colibri_session_kernels(self._session).decode()

    def reset(self):
        """Empties the KV cache."""
        self._enter()
        c.colibri_session_reset(self._session)
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
        c.colibri_expert_cache_stats_clear(self._session)
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
        """Seeds the sampler's generator."""
        self._enter()
        self._rng = <uint64_t>(int(seed) & 0xFFFFFFFFFFFFFFFF)
        self._busy = False

    def forward(self, tokens):
        """Appends ``tokens`` to the KV cache; returns float32 logits [len(tokens), vocab]."""
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
        """Feeds one token and returns the next one sampled from its logits."""
        cdef c.colibri_sampling sp
        cdef c.colibri_error err
        cdef c.colibri_status st
        cdef int32_t tok = token
        cdef int32_t nxt = 0
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
               seed=None, bint stop_at_eos=True):
        """Prefills ``prompt`` and yields up to ``max_tokens`` generated token ids."""
        if seed is not None:
            self.seed(seed)
        eos = c.colibri_model_hparams(self.model._model).eos_token_id
        self.prefill(prompt)
        if max_tokens <= 0:
            return
        token = self.sample(temperature, top_k, top_p)
        for i in range(max_tokens):
            yield token
            if (stop_at_eos and token == eos) or i + 1 == max_tokens:
                return
            if self.position >= self.n_ctx:
                return
            token = self.step(token, temperature, top_k, top_p)

    def generate(self, prompt, int max_tokens=16, float temperature=0.0, int top_k=0, float top_p=1.0,
                 seed=None, bint stop_at_eos=True):
        """Like stream(), as a list."""
        return list(self.stream(prompt, max_tokens, temperature, top_k, top_p, seed, stop_at_eos))

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

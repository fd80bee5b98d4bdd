# Declarations of the C API (c_core/include/colibri/colibri.h); nothing else.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t

cdef extern from "colibri/colibri.h" nogil:
    ctypedef enum colibri_status:
        COLIBRI_OK
        COLIBRI_E_ARG
        COLIBRI_E_CONTEXT
        COLIBRI_E_TENSOR
        COLIBRI_E_DEVICE

    enum: COLIBRI_ERROR_MESSAGE_SIZE

    ctypedef struct colibri_error:
        colibri_status status
        char message[256]

    const char *colibri_strerror(colibri_status status)
    const char *colibri_status_name(colibri_status status)

    ctypedef enum colibri_dtype:
        COLIBRI_DTYPE_F32
        COLIBRI_DTYPE_F16
        COLIBRI_DTYPE_BF16
        COLIBRI_DTYPE_U8
        COLIBRI_DTYPE_I32
        COLIBRI_DTYPE_Q8_0
        COLIBRI_DTYPE_Q4_0
        COLIBRI_DTYPE_W4G128
        COLIBRI_DTYPE_Q4_K
        COLIBRI_DTYPE_Q6_K
        COLIBRI_DTYPE_Q5_K
        COLIBRI_DTYPE_Q4_1
        COLIBRI_DTYPE_Q5_0
        COLIBRI_DTYPE_Q5_1
        COLIBRI_DTYPE_IQ4_NL
        COLIBRI_DTYPE_IQ4_XS
        COLIBRI_DTYPE_MXFP4
        COLIBRI_DTYPE_Q3_K
        COLIBRI_DTYPE_Q2_K
        COLIBRI_DTYPE_Q4_0X8
        COLIBRI_DTYPE_Q8_0X8
        COLIBRI_DTYPE_Q4_KX8
        COLIBRI_DTYPE_Q5_KX8
        COLIBRI_DTYPE_Q6_KX8
        COLIBRI_DTYPE_IQ4_XSX8
        COLIBRI_DTYPE_MXFP4X8
        COLIBRI_DTYPE_COUNT

    ctypedef struct colibri_model:
        pass
    ctypedef struct colibri_session:
        pass

    ctypedef struct colibri_hparams:
        int32_t vocab_size
        int32_t hidden_size
        int32_t intermediate_size
        int32_t n_layers
        int32_t n_heads
        int32_t n_kv_heads
        int32_t head_dim
        int32_t max_position_embeddings
        int32_t sliding_window
        int32_t n_experts
        int32_t top_k
        int32_t bos_token_id
        int32_t eos_token_id
        int32_t n_eos_token_ids
        int32_t eos_token_ids[4]     # COLIBRI_MAX_EOS_TOKENS
        int32_t tie_word_embeddings
        int32_t normalize_topk
        int32_t expert_layout
        float rope_theta
        float rms_norm_eps

    ctypedef struct colibri_tensor_info:
        const char *name
        colibri_dtype dtype
        int32_t n_dims
        int64_t shape[4]
        uint64_t file_offset
        uint64_t file_size
        uint32_t crc32
        const void *data
        uint64_t expert_stride
        colibri_dtype run_dtype

    ctypedef enum colibri_field_type:
        COLIBRI_FIELD_INTEGER
        COLIBRI_FIELD_NUMBER
        COLIBRI_FIELD_BOOLEAN
        COLIBRI_FIELD_CHOICE
        COLIBRI_FIELD_OBJECT
        COLIBRI_FIELD_OTHER

    ctypedef struct colibri_field_info:
        const char *path
        colibri_field_type type
        double min
        double max
        const char *max_of
        int32_t required
        double fallback
        const char *fallback_of
        const char *const *choices
        int32_t n_choices

    int32_t colibri_schema_count()
    colibri_status colibri_schema_field(int32_t index, colibri_field_info *info)
    colibri_status colibri_hparams_read(const char *json, size_t json_len, void *meta, size_t meta_bytes,
                                        colibri_hparams *hp, colibri_error *err)

    enum: COLIBRI_LOAD_VERIFY

    colibri_status colibri_model_meta_bytes(const char *json, size_t json_len, size_t *meta_bytes,
                                            colibri_error *err)
    colibri_status colibri_model_open(const char *dir, unsigned flags, colibri_model **model,
                                      colibri_error *err)
    colibri_status colibri_gguf_sidecar(const char *gguf_path, char *dir, size_t cap, colibri_error *err)
    colibri_status colibri_model_check_file(const colibri_model *model, colibri_error *err)
    void colibri_model_close(colibri_model *model)
    const colibri_hparams *colibri_model_hparams(const colibri_model *model)
    const char *colibri_model_architecture(const colibri_model *model)
    int32_t colibri_model_tensor_count(const colibri_model *model)
    colibri_status colibri_model_tensor(const colibri_model *model, int32_t index,
                                        colibri_tensor_info *info)
    uint64_t colibri_model_weight_bytes(const colibri_model *model)
    colibri_status colibri_token_bytes(const colibri_model *model, int32_t token, const uint8_t **bytes,
                                       size_t *len)
    colibri_status colibri_tokenize(const colibri_model *model, const char *text, size_t len, int32_t *ids,
                                    size_t cap, size_t *n, colibri_error *err) nogil
    enum: COLIBRI_BOS_DEFAULT
    enum: COLIBRI_BOS_NONE
    enum: COLIBRI_BOS_ADD
    colibri_status colibri_tokenize_bos(const colibri_model *model, const char *text, size_t len, int32_t bos,
                                        int32_t *ids, size_t cap, size_t *n, colibri_error *err) nogil

    enum: COLIBRI_KERNELS_AUTO
    enum: COLIBRI_KERNELS_REFERENCE

    ctypedef int64_t (*colibri_read_fn)(void *context, uint64_t offset, void *dst, size_t len)
    ctypedef struct colibri_device_task:
        int32_t layer
        int32_t n_experts
        const int32_t *experts
        const int32_t *rows
        const float *gates
        const float *x
        float *y
        int32_t n_rows
        int32_t hidden_size
        uint64_t latency_ns

    ctypedef struct colibri_device_driver:
        const char *name
        void *context
        uint32_t dtypes
        uint64_t threshold_ns
        colibri_status (*init)(void *context, const colibri_model *model, uint8_t *holds, colibri_error *err)
        colibri_status (*compute)(void *context, const colibri_device_task *task, colibri_error *err)
        colibri_status (*sync)(void *context, colibri_device_task *task, colibri_error *err)
        void (*release)(void *context)

    ctypedef struct colibri_session_options:
        int32_t kernels
        const char *kernel_variant
        int32_t n_ctx
        int32_t n_batch
        int32_t n_seq
        colibri_dtype kv_type
        int32_t routing
        float routing_noise
        uint64_t routing_seed
        float capacity_factor
        int32_t profile
        int32_t threads
        void *arena
        size_t arena_size
        uint64_t expert_budget
        int32_t expert_cache
        uint32_t expert_io
        const int32_t *expert_pins
        int32_t n_expert_pins
        colibri_read_fn expert_read
        void *expert_read_context
        const colibri_device_driver *const *devices
        int32_t n_devices
        const uint8_t *placement
        uint64_t device_threshold_ns
        uint64_t device_probe_ns
        int32_t device_strict

    enum: COLIBRI_LOAD_EXPERTS_ELSEWHERE
    enum: COLIBRI_LOAD_COPY
    enum: COLIBRI_LOAD_AS_STORED
    enum: COLIBRI_LOAD_STREAM_EXPERTS
    enum: COLIBRI_CACHE_GLOBAL
    enum: COLIBRI_CACHE_PER_LAYER
    enum: COLIBRI_EXPERT_IO_DIRECT
    enum: COLIBRI_EXPERT_IO_NO_PREFETCH
    enum: COLIBRI_EXPERT_IO_VERIFY

    colibri_status colibri_session_plan(const colibri_model *model, const colibri_session_options *options,
                                        size_t *arena_bytes, colibri_error *err)
    colibri_status colibri_session_create(const colibri_model *model, const colibri_session_options *options,
                                          colibri_session **session, colibri_error *err)
    void colibri_session_destroy(colibri_session *session)
    void colibri_session_reset(colibri_session *session)
    int32_t colibri_session_position(const colibri_session *session)
    const int32_t *colibri_session_tokens(const colibri_session *session, int32_t *n)
    int32_t colibri_session_pending(const colibri_session *session)
    colibri_status colibri_session_truncate(colibri_session *session, int32_t n, colibri_error *err)
    int32_t colibri_session_n_ctx(const colibri_session *session)
    const char *colibri_session_kernels(const colibri_session *session)
    const char *colibri_kernel_variant(int32_t i, int *runs_here)
    colibri_dtype colibri_interleaved_form(colibri_dtype dtype, int fast_here)
    colibri_status colibri_interleave_rows(void *dst, const void *src, colibri_dtype dtype, int64_t rows, int64_t cols,
                                           colibri_error *err) nogil
    colibri_status colibri_forward(colibri_session *session, const int32_t *tokens, size_t n,
                                   float *logits, colibri_error *err)
    const float *colibri_session_logits(const colibri_session *session)
    int32_t colibri_session_n_seq(const colibri_session *session)
    int32_t colibri_seq_position(const colibri_session *session, int32_t seq)
    const int32_t *colibri_seq_tokens(const colibri_session *session, int32_t seq, int32_t *n)
    int32_t colibri_seq_pending(const colibri_session *session, int32_t seq)
    colibri_status colibri_seq_truncate(colibri_session *session, int32_t seq, int32_t n, colibri_error *err)
    colibri_status colibri_seq_reset(colibri_session *session, int32_t seq, colibri_error *err)
    colibri_status colibri_seq_copy(colibri_session *session, int32_t src, int32_t dst, colibri_error *err)
    const float *colibri_seq_logits(const colibri_session *session, int32_t seq)
    ctypedef struct colibri_batch_entry:
        int32_t seq
        const int32_t *tokens
        int32_t n_tokens
        int32_t logits
    colibri_status colibri_forward_batch(colibri_session *session, const colibri_batch_entry *entries,
                                         int32_t n_entries, colibri_error *err)
    enum: COLIBRI_PHASE_COUNT
    const char *colibri_phase_name(int32_t phase)
    colibri_status colibri_profile(const colibri_session *session, uint64_t *ns)
    colibri_status colibri_expert_dropped(const colibri_session *session, uint64_t *counts)
    colibri_status colibri_expert_load(const colibri_session *session, uint64_t *counts)
    void colibri_expert_load_clear(colibri_session *session)

    colibri_status colibri_expert_slots(const colibri_model *model, const colibri_session_options *options,
                                        uint64_t *slot_bytes, uint64_t *min_budget, colibri_error *err)
    colibri_status colibri_expert_slot_count(const colibri_model *model, const colibri_session_options *options,
                                             int32_t *n_slots, colibri_error *err)
    enum: COLIBRI_EXPERT_PARTS
    colibri_status colibri_expert_location(const colibri_model *model, int32_t layer, int32_t expert,
                                           uint64_t *offset, uint64_t *bytes, uint64_t *stride, int32_t *n_parts)

    ctypedef struct colibri_expert_cache_stats:
        uint64_t hits
        uint64_t misses
        uint64_t prefetches
        uint64_t prefetch_hits
        uint64_t bytes_read
        uint64_t reads
        uint64_t io_wait_ns
        int32_t slots
        int32_t pinned
        uint64_t slot_bytes

    colibri_status colibri_expert_cache_stats_get(const colibri_session *session,
                                                  colibri_expert_cache_stats *stats)
    void colibri_expert_cache_stats_clear(colibri_session *session)
    colibri_status colibri_expert_cache_slot(const colibri_session *session, int32_t slot, int32_t *layer,
                                             int32_t *expert, int *pinned)

    ctypedef struct colibri_logit_bias:
        int32_t token
        float bias

    enum:
        COLIBRI_MAX_EOS_TOKENS
        COLIBRI_PENALTY_WINDOW
        COLIBRI_PENALTY_LAST_N_DEFAULT

    ctypedef struct colibri_sampling:
        float temperature
        int32_t top_k
        float top_p
        float min_p
        float repeat_penalty
        float presence_penalty
        float frequency_penalty
        int32_t penalty_last_n
        const colibri_logit_bias *logit_bias
        int32_t n_logit_bias

    colibri_status colibri_sample(colibri_session *session, const colibri_sampling *params,
                                  uint64_t *rng, int32_t *token, colibri_error *err)

    ctypedef enum colibri_stop:
        COLIBRI_STOP_NONE
        COLIBRI_STOP_EOS
        COLIBRI_STOP_MAX_TOKENS
        COLIBRI_STOP_CONTEXT_FULL
        COLIBRI_STOP_ERROR
        COLIBRI_STOP_STRING

    ctypedef struct colibri_generate_options:
        int32_t max_tokens
        colibri_sampling sampling
        uint64_t seed
        int stop_at_eos

    ctypedef struct colibri_generation:
        uint64_t rng
        int32_t generated
        colibri_stop stop
        int32_t seq
        int32_t n_prompt
        int32_t prompt_done
        int32_t fresh
        int32_t last

    colibri_status colibri_generate_start(colibri_generation *g, colibri_session *session,
                                          const colibri_generate_options *options, const int32_t *prompt,
                                          size_t n_prompt, colibri_error *err)
    colibri_status colibri_generate_next(colibri_generation *g, int32_t *token, colibri_error *err)
    colibri_status colibri_generate_begin(colibri_generation *g, colibri_session *session, int32_t seq,
                                          const colibri_generate_options *options, const int32_t *prompt,
                                          size_t n_prompt, colibri_error *err)
    colibri_status colibri_generate_step(colibri_session *session, colibri_generation *const *gens, int32_t n_gens,
                                         colibri_error *err)

    ctypedef void (*colibri_write_fn)(void *context, const char *bytes, size_t len) noexcept nogil
    enum: COLIBRI_MAX_STOPS
    enum: COLIBRI_STOP_MAX_BYTES
    ctypedef struct colibri_text_stream:
        int32_t matched
    colibri_status colibri_text_stream_init(colibri_text_stream *text, const char *const *stops, int32_t n_stops,
                                            colibri_write_fn write, void *context, colibri_error *err)
    colibri_status colibri_generate_text(colibri_generation *g, colibri_text_stream *text, colibri_error *err)

    colibri_status colibri_memdump(const colibri_session *session, char *buf, size_t cap, size_t *len)

    ctypedef struct colibri_memory_totals:
        size_t weights
        size_t metadata
        size_t arena_reserved
        size_t arena_used
        size_t kv_cache
        size_t activations
        size_t expert_cache

    colibri_status colibri_memory(const colibri_session *session, colibri_memory_totals *totals)


cdef extern from "colibri/device.h" nogil:
    enum: COLIBRI_MAX_DEVICES
    enum: COLIBRI_LATENCY_RING


    colibri_status colibri_experts_compute(colibri_session *session, colibri_device_task *task, colibri_error *err)
    colibri_status colibri_experts_check(const colibri_session *session, const colibri_device_task *task,
                                         colibri_error *err)
    int32_t colibri_device_count(const colibri_session *session)
    const char *colibri_device_name(const colibri_session *session, int32_t device)
    int32_t colibri_device_find(const colibri_session *session, const char *name)
    colibri_status colibri_place(colibri_session *session, int32_t layer, int32_t expert, int32_t device,
                                 colibri_error *err)
    colibri_status colibri_placement_set(colibri_session *session, const uint8_t *placement, colibri_error *err)
    void colibri_placement_get(const colibri_session *session, uint8_t *placement)
    colibri_status colibri_placement_scratch_bytes(const colibri_session *session, const char *json, size_t len,
                                                   size_t *scratch_bytes, colibri_error *err)
    colibri_status colibri_placement_parse(colibri_session *session, const char *json, size_t len, void *scratch,
                                           size_t scratch_bytes, colibri_error *err)

    ctypedef struct colibri_device_stats:
        uint64_t calls
        uint64_t experts
        uint64_t rows
        uint64_t errors
        uint64_t slow
        uint64_t fallbacks
        uint64_t probes
        uint64_t bypassed
        uint64_t p90_ns
        uint64_t last_ns
        uint64_t threshold_ns
        int32_t samples
        int32_t bypassed_now

    colibri_status colibri_device_stats_get(const colibri_session *session, int32_t device,
                                            colibri_device_stats *stats)
    void colibri_device_stats_clear(colibri_session *session)

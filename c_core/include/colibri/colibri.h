/* SPDX-License-Identifier: MIT */
/* colibri — a C99 inference engine for Mixture-of-Experts language models.
 *
 * Data flow:  model (mapped weights, validated at load)
 *               -> session (one arena: activations, KV cache, router and sampling buffers)
 *               -> forward (embed -> [norm -> attention -> norm -> router -> experts -> aggregate] x L -> norm -> lm_head)
 *               -> sample.
 *
 * Lifetimes:
 *   - A colibri_model owns its metadata block and (when opened from a directory) the
 *     mapping of weights.bin.  Weights are used in place and never copied.
 *   - A colibri_session borrows its model: close the model only after destroying every
 *     session made from it.  The session lives entirely inside its arena — either one
 *     the library maps (colibri_session_options.arena == NULL) or one the caller owns.
 *   - After colibri_session_create returns, no call on that session allocates memory.
 *   - weights.bin is mapped, not read: it must not be truncated or rewritten while a model
 *     made from it is open (the system would fault the process on the missing pages).
 *
 * Every fallible call returns a status and fills the optional colibri_error. */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#include "colibri/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COLIBRI_VERSION_STRING "0.1.0"
#define COLIBRI_FORMAT_VERSION 1
#define COLIBRI_ALIGNMENT 64            /* arena blocks; what the converter aligns tensors to */
#define COLIBRI_TENSOR_ALIGNMENT 32     /* tensor offsets and the weights' start: GGUF's default, so that a
                                           GGUF's tensors are used where they lie in the file */
#define COLIBRI_MAX_NAME 48             /* tensor names, including the NUL */

typedef enum colibri_dtype {
    COLIBRI_DTYPE_F32 = 0,
    COLIBRI_DTYPE_F16 = 1,
    COLIBRI_DTYPE_BF16 = 2,
    COLIBRI_DTYPE_U8 = 3,           /* the tokenizer's byte table */
    COLIBRI_DTYPE_I32 = 4,          /* the tokenizer's offsets */
    /* llama.cpp's block formats, along each row (the last dimension, a multiple of 32): blocks of
     * 32 weights, each an f16 scale d then the quants; weight = d * q */
    COLIBRI_DTYPE_Q8_0 = 5,         /* 34 bytes a block: d, 32 int8 */
    COLIBRI_DTYPE_Q4_0 = 6,         /* 18 bytes a block: d, 16 bytes; byte j holds q_j (low nibble) and
                                       q_{j+16} (high), each minus 8 */
    /* The 4-bit group-128 format ("w4a16": its dot products keep the activations in float): 66 bytes
     * a block of 128 weights, d then four q4_0 nibble groups of 32 sharing it */
    COLIBRI_DTYPE_W4G128 = 7,
    /* More of llama.cpp's block formats, byte for byte as GGUF stores them (docs/FORMAT.md has each
     * layout).  The K-quants: super-blocks of 256 weights in sub-blocks of 16 or 32, each with a
     * 4..8-bit scale (and min) under the f16 super-block scale(s). */
    COLIBRI_DTYPE_Q4_K = 8,         /* 144 bytes: d, dmin, 8 x 6-bit (scale, min), 4-bit quants */
    COLIBRI_DTYPE_Q6_K = 9,         /* 210 bytes: 4 + 2-bit quants, 16 int8 scales, d */
    COLIBRI_DTYPE_Q5_K = 10,        /* 176 bytes: q4_k plus a fifth bit a weight */
    /* blocks of 32: weight = d * q + m (q4_1, q5_1), d * (q - 16) (q5_0) */
    COLIBRI_DTYPE_Q4_1 = 11,        /* 20 bytes: d, m, q4_0's nibbles */
    COLIBRI_DTYPE_Q5_0 = 12,        /* 22 bytes: d, 32 fifth bits, nibbles */
    COLIBRI_DTYPE_Q5_1 = 13,        /* 24 bytes: d, m, 32 fifth bits, nibbles */
    /* 4-bit indices into a table of 16 levels (ops/quant_tables.h) */
    COLIBRI_DTYPE_IQ4_NL = 14,      /* 18 bytes a block of 32: d, nibbles */
    COLIBRI_DTYPE_IQ4_XS = 15,      /* 136 bytes a block of 256: d, 8 x 6-bit scales, nibbles */
    COLIBRI_DTYPE_MXFP4 = 16,       /* 17 bytes a block of 32: an E8M0 exponent, E2M1 nibbles */
    COLIBRI_DTYPE_Q3_K = 17,        /* 110 bytes: high bits, 2-bit quants, 16 x 6-bit scales, d */
    COLIBRI_DTYPE_Q2_K = 18,        /* 84 bytes: 16 x 4-bit (scale, min), 2-bit quants, d, dmin */
    /* q4_0 and q8_0 with each 8 consecutive rows interleaved (rows % 8 == 0): the same blocks and
     * sizes, per block column one group of the 8 rows' blocks, d[0..7] then 64-byte chunks whose
     * qword i is 8 quant bytes of row i (docs/FORMAT.md).  Only for matrices the forward pass
     * multiplies whole: a single row is not addressable on its own. */
    COLIBRI_DTYPE_Q4_0X8 = 19,      /* 144 bytes a group: 8 d, 2 chunks */
    COLIBRI_DTYPE_Q8_0X8 = 20,      /* 272 bytes a group: 8 d, 4 chunks */
    /* The same for the K-quants, iq4_xs and mxfp4: each field of the plain block in turn, the 8 rows'
     * copies side by side, a field of 8k bytes in 8-byte pieces (docs/FORMAT.md) */
    COLIBRI_DTYPE_Q4_KX8 = 21,      /* 1152 bytes a group */
    COLIBRI_DTYPE_Q5_KX8 = 22,      /* 1408 bytes */
    COLIBRI_DTYPE_Q6_KX8 = 23,      /* 1680 bytes */
    COLIBRI_DTYPE_IQ4_XSX8 = 24,    /* 1088 bytes */
    COLIBRI_DTYPE_MXFP4X8 = 25,     /* 136 bytes */
    COLIBRI_DTYPE_COUNT
} colibri_dtype;

typedef struct colibri_model colibri_model;
typedef struct colibri_session colibri_session;
typedef struct colibri_device_driver colibri_device_driver;   /* colibri/device.h */

/* The most end-of-sequence ids a model carries (eos, end of turn, end of message, ...). */
#define COLIBRI_MAX_EOS_TOKENS 4

/* The hyper-parameters of a loaded model, as validated. */
typedef struct colibri_hparams {
    int32_t vocab_size;
    int32_t hidden_size;
    int32_t intermediate_size;      /* per expert */
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t head_dim;
    int32_t max_position_embeddings;
    int32_t sliding_window;         /* 0: full causal attention */
    int32_t n_experts;
    int32_t top_k;
    int32_t bos_token_id;           /* -1: none */
    int32_t eos_token_id;           /* -1: none */
    int32_t n_eos_token_ids;        /* every token that ends a generation (hparams.eos_token_ids; */
    int32_t eos_token_ids[COLIBRI_MAX_EOS_TOKENS];   /* absent: eos_token_id alone, none for -1) */
    int32_t tie_word_embeddings;    /* lm_head is tok_embeddings */
    int32_t normalize_topk;         /* renormalise the top-k gate weights to sum 1 */
    float rope_theta;
    float rms_norm_eps;

    /* What other families add to the Mixtral block (docs/FORMAT.md); the defaults are Mixtral's. */
    int32_t dense_intermediate_size;    /* FFN of the dense layers; 0: every layer is MoE */
    int32_t shared_intermediate_size;   /* FFN of the shared expert beside the routed ones; 0: none */
    int32_t shared_gate;                /* the shared expert's output times sigmoid(gate . x) */
    int32_t attention_bias;             /* biases on q, k and v */
    int32_t attention_out_bias;         /* bias on the output projection */
    int32_t qk_norm;                    /* COLIBRI_QK_NORM_*: RMSNorm of q and k before RoPE */
    int32_t rope_dim;                   /* leading dimensions of each head that rotate: head_dim or fewer */
    int32_t rope_interleaved;           /* rotate pairs (2j, 2j+1) instead of (j, j + rope_dim/2) */
    int32_t rope_type;                  /* COLIBRI_ROPE_*: plain, or YaRN's blend of scaled frequencies */
    int32_t rope_original_max;          /* YaRN: the context the model was trained with */
    int32_t rope_truncate;              /* YaRN: round the correction range to whole dimensions */
    float rope_factor;                  /* YaRN: the context extension factor */
    float rope_beta_fast, rope_beta_slow;   /* YaRN: the correction range, in rotations */
    float rope_attention_factor;        /* cos and sin are multiplied by it (YaRN's mscale; 1 otherwise) */
    float rope_short_mscale, rope_long_mscale;   /* LongRoPE: the factor within / beyond rope_original_max */
    float rope_low_freq_factor, rope_high_freq_factor;   /* Llama 3: wavelengths between them blend */
    int32_t conv_kernel;                /* short-convolution layers: kernel length (their cache holds B*x per position) */
    int32_t conv_bias;                  /* biases on the convolution's projections and kernel */
    int32_t attention_chunk;            /* "chunked" layers see only their chunk: keys C*floor(q/C) .. q */
    float nope_temperature_floor;       /* layers without RoPE scale q by 1 + nope_temperature_scale *
                                           log(1 + floor((pos + 1) / floor)); 0: no scaling */
    float nope_temperature_scale;
    int32_t attention_sinks;            /* one learned logit per head joins each softmax (tensor attn.sinks) */
    /* Multi-head latent attention (DeepSeek-V2/V3) when kv_lora_rank > 0: head_dim is
     * nope_dim + rope_dim for queries and keys, values have v_head_dim, and the cache holds
     * per position one normed latent (kv_lora_rank) and one rotary key (rope_dim). */
    int32_t q_lora_rank;                /* 0: queries straight from wq */
    int32_t kv_lora_rank;
    int32_t nope_dim;                   /* the part of a query/key head that does not rotate (first) */
    int32_t v_head_dim;
    float latent_norm_eps;              /* of the q and kv latent RMSNorms */
    float clip_qkv;                     /* q, k, v clamped to [-clip_qkv, clip_qkv]; 0: no clamp */
    float attention_scale;              /* of q.k before the softmax: 1/sqrt(head_dim) unless set */
    float embedding_multiplier;         /* embeddings times this */
    float residual_multiplier;          /* each block's output times this before the residual add */
    float logits_divisor;               /* logits divided by this */
    int32_t norm_kind;                  /* COLIBRI_NORM_*: RMSNorm, or LayerNorm with biases (attn_norm_bias, ...) */
    int32_t lm_head_bias;               /* a bias on the logits (tensor lm_head_bias) */

    /* The router: score every expert, choose top_k (from the best groups), weigh the chosen. */
    int32_t router_kind;                /* routing.type's router: its index in the registry (colibri/moe.h) */
    float jitter_eps;                   /* sparsemixer: how far below the best an expert may score and stay */
    int32_t router_score;               /* COLIBRI_SCORE_*: softmax or sigmoid of the logits, or the logits */
    int32_t router_weights;             /* COLIBRI_WEIGHTS_*: the chosen experts' scores, or a softmax over their logits */
    int32_t router_logit_bias;          /* a bias added to the router logits (tensor router.bias) */
    int32_t router_selection_bias;      /* a bias added to the scores for choosing only (selection_bias) */
    int32_t n_groups;                   /* experts in n_groups equal groups; 1: no groups */
    int32_t topk_groups;                /* choose only among the experts of the best topk_groups groups */
    int32_t group_score;                /* COLIBRI_GROUP_*: how a group ranks */
    float normalize_eps;                /* added to the sum of the chosen weights when renormalising */
    float routed_scale;                 /* the chosen weights' final factor */
    int32_t gate_on_input;              /* the weight scales the expert's input, not its output (Llama 4) */
    float capacity_factor;              /* routing.capacity_factor: the default of COLIBRI_ROUTING_CAPACITY; 0: none */
    int32_t aggregator_kind;            /* routing.aggregator's: its index in the registry (colibri/moe.h) */

    /* The experts' FFN. */
    int32_t expert_kind;                /* experts.type's: its index in the registry (colibri/moe.h), COLIBRI_EXPERT_* for the core's */
    int32_t activation;                 /* COLIBRI_ACT_*: of the gate in every gated MLP (experts, shared, dense) */
    int32_t expert_bias;                /* biases on the experts' projections (experts.b1, b3, b2) */
    float swiglu_limit;                 /* clamped SwiGLU: gate <= limit, |up| <= limit */
    float swiglu_alpha;                 /* clamped SwiGLU: gate * sigmoid(alpha * gate) */
    int32_t expert_layout;              /* COLIBRI_LAYOUT_*: how weights.bin stores the routed experts */
} colibri_hparams;

/* The choices of colibri_model.json's string fields; *_COUNT sizes the loader's table of their
 * names (model/schema.c), which fails to compile when a value here has no name there. */
enum { COLIBRI_QK_NORM_NONE = 0, COLIBRI_QK_NORM_HEAD = 1, COLIBRI_QK_NORM_FULL = 2,
       COLIBRI_QK_NORM_HEAD_PLAIN = 3 /* per head, no weight, only on the layers that rotate (Llama 4) */,
       COLIBRI_QK_NORM_COUNT };
enum { COLIBRI_SCORE_SOFTMAX = 0, COLIBRI_SCORE_SIGMOID = 1, COLIBRI_SCORE_LOGITS = 2, COLIBRI_SCORE_COUNT };
enum { COLIBRI_WEIGHTS_SCORES = 0, COLIBRI_WEIGHTS_SOFTMAX_SELECTED = 1, COLIBRI_WEIGHTS_SIGMOID_SELECTED = 2,
       COLIBRI_WEIGHTS_COUNT };
enum { COLIBRI_GROUP_MAX = 0, COLIBRI_GROUP_TOP2_SUM = 1, COLIBRI_GROUP_COUNT };
enum { COLIBRI_ROPE_DEFAULT = 0, COLIBRI_ROPE_YARN = 1, COLIBRI_ROPE_LONGROPE = 2, COLIBRI_ROPE_LLAMA3 = 3,
       COLIBRI_ROPE_COUNT };
enum { COLIBRI_NORM_RMS = 0, COLIBRI_NORM_LAYER = 1, COLIBRI_NORM_COUNT };
/* experts.weight_layout: each routed-expert tensor whole, its experts one after another ("stacked"),
 * or each expert's parts of all of them side by side in one extent ("interleaved"), docs/FORMAT.md */
enum { COLIBRI_LAYOUT_STACKED = 0, COLIBRI_LAYOUT_INTERLEAVED = 1, COLIBRI_LAYOUT_COUNT };
enum { COLIBRI_EXPERT_SWIGLU = 0, COLIBRI_EXPERT_SWIGLU_CLAMPED = 1 };   /* SwiGLU, or gpt-oss's clamped SwiGLU */
enum { COLIBRI_ACT_SILU = 0, COLIBRI_ACT_GELU = 1, COLIBRI_ACT_GELU_TANH = 2, COLIBRI_ACT_RELU = 3 };

/* The schema of colibri_model.json's hyper-parameters (hparams, routing, experts): one row per
 * field, the table the loader reads and checks them by (model/schema.c).  A converter asks it
 * for the ranges instead of keeping a copy. */
typedef enum colibri_field_type {
    COLIBRI_FIELD_INTEGER,   /* min <= value <= max */
    COLIBRI_FIELD_NUMBER,    /* min < value <= max, and a normal float32 */
    COLIBRI_FIELD_BOOLEAN,
    COLIBRI_FIELD_CHOICE,    /* a string, one of choices */
    COLIBRI_FIELD_OBJECT,    /* a section: the rows below its path are its fields, and its only ones */
    COLIBRI_FIELD_OTHER      /* checked by the loader's code: per-layer lists, experts.quantization */
} colibri_field_type;

typedef struct colibri_field_info {
    const char *path;               /* "hparams.rope_scaling.factor" */
    colibri_field_type type;
    double min, max;                /* INTEGER, NUMBER */
    const char *max_of;             /* INTEGER: non-NULL, the bound is max plus this field's value */
    int32_t required;               /* where its section is present; hparams.rope_scaling's fields
                                       belong to some of its types only */
    double fallback;                /* absent and optional (a CHOICE: the index of its choice) */
    const char *fallback_of;        /* non-NULL: absent, it takes this field's value instead */
    const char *const *choices;     /* CHOICE: (n_choices) spellings */
    int32_t n_choices;
} colibri_field_info;

int32_t colibri_schema_count(void);
colibri_status colibri_schema_field(int32_t index, colibri_field_info *info);   /* COLIBRI_E_ARG past the end */
/* The hyper-parameters of a colibri_model.json text, read and checked as colibri_model_load reads
 * them, the header and tensors left unread: a converter's check of what it is about to write.
 * `meta`: colibri_model_meta_bytes long, 16-byte aligned, scratch. */
colibri_status colibri_hparams_read(const char *json, size_t json_len, void *meta, size_t meta_bytes,
                                    colibri_hparams *hp, colibri_error *err);

/* One tensor of the model, as described in colibri_model.json. */
typedef struct colibri_tensor_info {
    const char *name;
    colibri_dtype dtype;
    int32_t n_dims;
    int64_t shape[4];
    uint64_t file_offset;
    uint64_t file_size;
    uint32_t crc32;
    const void *data;               /* inside the mapped weights */
    uint64_t expert_stride;         /* interleaved routed experts: expert e's part at file_offset +
                                       e * expert_stride (data: expert 0's), file_size / n_experts
                                       bytes each; 0: the tensor's bytes are contiguous */
    colibri_dtype run_dtype;        /* what the forward pass multiplies: dtype, or its row-interleaved
                                       form rewritten at open (colibri_model_open); `data` holds it, or,
                                       for routed experts left to stream, their dtype as stored */
} colibri_tensor_info;

/* ---- model ------------------------------------------------------------ */

enum {
    COLIBRI_LOAD_VERIFY = 1u << 0,  /* also check every tensor's CRC-32 and that all values are finite */
    COLIBRI_LOAD_EXPERTS_ELSEWHERE = 1u << 1,  /* colibri_model_load: `weights` holds the tensors other than
                                   the routed experts (interleaved layout: weights.bin up to the first
                                   extent); sessions stream the experts through expert_read */
    COLIBRI_LOAD_COPY = 1u << 2,   /* colibri_model_open: read weights.bin into memory instead of mapping it,
                                   so that the file truncated under the model is no SIGBUS (a server's
                                   choice: it costs the file's size in memory that cannot be paged out) */
    COLIBRI_LOAD_AS_STORED = 1u << 3,  /* colibri_model_open: run every tensor in the layout the file stores
                                   (else each matrix whose row-interleaved form the kernels here multiply
                                   faster is rewritten so at open, in its own pages: see below) */
    COLIBRI_LOAD_STREAM_EXPERTS = 1u << 4  /* colibri_model_open: sessions will stream the routed experts
                                   (an expert_budget): leave their pages unread at open; each expert read
                                   into a slot is rewritten there */
};

/* Opens a model on a hosted platform: a directory (colibri_model.json + weights.bin), or a GGUF
 * file used in place, its tensors mapped (or streamed) from the file itself.  A GGUF is run from
 * its description, kept in its sidecar directory (colibri_gguf_sidecar): colibri_model.json and
 * extra.bin, the few tensors colibri makes for it (vocabulary tables, joined tensors), never a
 * copy of its weights.  Python writes the description (colibri.Model(path) on first open);
 * COLIBRI_E_IO, saying so, when there is none yet.
 *
 * Unless COLIBRI_LOAD_AS_STORED, every matrix the forward pass multiplies whole, stored in a plain
 * block dtype whose row-interleaved form the kernels here run faster (colibri_interleaved_form with
 * fast_here: a GGUF's Q4_K, Q6_K, IQ4_XS, ... on x86), is rewritten in that form at open, and one
 * stored interleaved where the kernels here have none for that form (a q4_kx8 file written on x86,
 * opened on NEON) back in the plain form, in the private mapping's own pages (copied on write: the
 * file is never written, and the memory stays the file's size); the routed experts too, unless
 * COLIBRI_LOAD_STREAM_EXPERTS or the weights exceed the machine's memory.
 * colibri_tensor_info.run_dtype says what each tensor runs as. */
colibri_status colibri_model_open(const char *path, unsigned flags,
                                  colibri_model **model, colibri_error *err);

/* The sidecar directory of the GGUF file at `gguf_path`: $COLIBRI_CACHE (else
 * $XDG_CACHE_HOME/colibri, else ~/.cache/colibri) /gguf/ NAME-SIZE-MTIME_NS-CRC, CRC the CRC-32
 * of the file's first MiB: a file rewritten, replaced or renamed gets another.  Nothing is
 * created.  COLIBRI_E_VERSION when the file is not a GGUF. */
colibri_status colibri_gguf_sidecar(const char *gguf_path, char *dir, size_t cap, colibri_error *err);

/* COLIBRI_OK while the model's weights.bin is still the file colibri_model_open read (device, inode,
 * size, modification time), else COLIBRI_E_IO saying what changed; every new session checks it.
 * COLIBRI_OK for a model loaded from memory. */
colibri_status colibri_model_check_file(const colibri_model *model, colibri_error *err);

/* Platform-free loading from memory, for bare metal: `json` and `weights` must outlive
 * the model; `weights` starts at a 64-byte boundary; `meta` (colibri_model_meta_bytes long,
 * 16-byte aligned) holds the model's tables. */
colibri_status colibri_model_meta_bytes(const char *json, size_t json_len,
                                        size_t *meta_bytes, colibri_error *err);
colibri_status colibri_model_load(const char *json, size_t json_len,
                                  const void *weights, size_t weights_len, unsigned flags,
                                  void *meta, size_t meta_bytes,
                                  colibri_model **model, colibri_error *err);

void colibri_model_close(colibri_model *model);

const colibri_hparams *colibri_model_hparams(const colibri_model *model);
const char *colibri_model_architecture(const colibri_model *model);
int32_t colibri_model_tensor_count(const colibri_model *model);
colibri_status colibri_model_tensor(const colibri_model *model, int32_t index,
                                    colibri_tensor_info *info);
uint64_t colibri_model_weight_bytes(const colibri_model *model);   /* sum of tensor sizes */

/* The bytes a token stands for, from the model's own vocabulary table (the tensors
 * tokenizer.token_bytes and tokenizer.token_offsets), so text can be produced with no
 * tokenizer library.  COLIBRI_E_TOKEN for an id outside [0, vocab); COLIBRI_E_TENSOR when
 * the model carries no vocabulary. */
colibri_status colibri_token_bytes(const colibri_model *model, int32_t token,
                                   const uint8_t **bytes, size_t *len);

/* Text to ids, exactly as the model's tokenizer encodes it with its special tokens (the BOS its
 * template puts first included), from the encoder the converter stored (colibri_model.json's
 * "encoder", docs/FORMAT.md).  No allocation (a few KiB of stack), deterministic, O(log) work per
 * byte.  Invalid UTF-8: each byte that starts no valid sequence is a character on its own, of no
 * letter, number or space class, encoded as that byte.  *n receives the full count; when it
 * exceeds `cap`, ids holds the first `cap` and the call returns COLIBRI_E_ARG naming the count
 * (ids NULL, cap 0: size the buffer; len + 1 always suffice for byte-level BPE, 3 len + 4 for
 * SentencePiece-style BPE, whose spaces may fall back on three byte tokens).  COLIBRI_E_TENSOR when the model carries no encoder
 * (converted before it had one: reconvert it).  Decode with colibri_token_bytes. */
colibri_status colibri_tokenize(const colibri_model *model, const char *text, size_t len, int32_t *ids,
                                size_t cap, size_t *n, colibri_error *err);
/* The same with the BOS chosen: the tokenizer's template (COLIBRI_BOS_DEFAULT, as colibri_tokenize),
 * none (a later turn of a conversation), or one (the model's bos_token_id where the template puts
 * none; COLIBRI_E_ARG when the model has no BOS token). */
enum { COLIBRI_BOS_DEFAULT = -1, COLIBRI_BOS_NONE = 0, COLIBRI_BOS_ADD = 1 };
colibri_status colibri_tokenize_bos(const colibri_model *model, const char *text, size_t len, int32_t bos,
                                    int32_t *ids, size_t cap, size_t *n, colibri_error *err);

/* For streaming decode: how many of `len` bytes end on a character boundary, i.e. all of them
 * unless the last bytes begin a UTF-8 character that more bytes may complete.  Print that many,
 * keep the rest (at most 3 bytes) for the next token's bytes, print what is left at the end. */
size_t colibri_utf8_whole(const uint8_t *bytes, size_t len);

/* ---- session ---------------------------------------------------------- */

/* A reader of weights.bin for expert streaming: bytes [offset, offset + len) into dst.  Returns the
 * bytes read (fewer than len: the file ends there), or a negative number for an I/O error (POSIX:
 * -errno).  Called from the session's I/O thread where the platform has threads, else from the
 * forward pass; never from two threads at once. */
typedef int64_t (*colibri_read_fn)(void *context, uint64_t offset, void *dst, size_t len);

enum {
    COLIBRI_KERNELS_AUTO = 0,       /* the fastest variant this CPU runs (AVX2, NEON, ...) */
    COLIBRI_KERNELS_REFERENCE = 1   /* the plain C reference kernels */
};

typedef struct colibri_session_options {
    int32_t kernels;        /* COLIBRI_KERNELS_*; AUTO yields to COLIBRI_KERNELS=<variant> in the environment */
    const char *kernel_variant; /* a variant by name ("reference", "avx2", "avx512", "neon", "neon-dotprod"):
                               overrides `kernels`; NULL: as `kernels` says */
    int32_t n_ctx;          /* positions the KV cache holds; 0: max_position_embeddings, at most 4096 */
    int32_t n_batch;        /* tokens computed together in one forward chunk; 0: 64 */
    int32_t n_seq;          /* sequence slots, each with a KV cache of n_ctx positions; 0: 1 */
    colibri_dtype kv_type;  /* what the KV cache stores: COLIBRI_DTYPE_F32 (0, exact), _F16 (half the bytes,
                               rounded to nearest even) or _Q8_0 (34 bytes a 32, llama.cpp's q8_0 along each
                               head: head_dim a multiple of 32).  Keys and values are computed in f32 and
                               stored converted.  Latent attention's cache and the short convolution's
                               inputs stay f32 whatever this says (the memory report shows each) */
    /* Research routing, off unless asked for: it changes what the model computes. */
    int32_t routing;        /* COLIBRI_ROUTING_*: the model's own router (0), or one of the research ones */
    float routing_noise;    /* NOISY: standard deviation of the Gaussian noise added to the router logits */
    uint64_t routing_seed;  /* NOISY: the noise is a function of (seed, layer, position, expert) alone */
    float capacity_factor;  /* CAPACITY: each expert takes at most ceil(factor * n * top_k / n_experts)
                               of a forward chunk's n tokens, the first ones; the rest are dropped.
                               0: the model's routing.capacity_factor (an error when it gives none) */
    int32_t profile;        /* nonzero: time each phase of the forward pass (colibri_profile) */
    int32_t threads;        /* threads sharing the big matmuls; 0: COLIBRI_THREADS, else the machine's cores */
    void *arena;            /* NULL: the library maps one; else a caller buffer, 16-byte aligned: of
                               colibri_session_plan bytes when 64-byte aligned, up to 48 more if not */
    size_t arena_size;
    /* Expert streaming: the routed experts are read from storage into a cache of slots in the arena
     * instead of being used where weights.bin is mapped.  Everything else stays mapped. */
    uint64_t expert_budget;     /* bytes of slots; 0: resident (no cache).  At least colibri_expert_slots'
                                   minimum, else COLIBRI_E_ARG names it */
    int32_t expert_cache;       /* COLIBRI_CACHE_GLOBAL (0) or _PER_LAYER: one pool for every layer, or
                                   the slots split evenly among the MoE layers */
    uint32_t expert_io;         /* COLIBRI_EXPERT_IO_* flags */
    colibri_read_fn expert_read;   /* where experts are read from; NULL: the platform reads the model's
                                      weights.bin (POSIX: pread), or copies from `weights` for a model
                                      loaded from memory with its experts in it */
    void *expert_read_context;
    const int32_t *expert_pins; /* (n_expert_pins, 2) (layer, expert) pairs read at session creation and
                                   never evicted; at most the slots less one layer's top_k */
    int32_t n_expert_pins;
    /* Devices (colibri/device.h): drivers beyond the built-in cpu (device 0), devices 1 .. n_devices */
    const colibri_device_driver *const *devices;
    int32_t n_devices;          /* at most COLIBRI_MAX_DEVICES - 1 */
    const uint8_t *placement;   /* (n_layers, n_experts) device of each expert; NULL: all on the cpu */
    uint64_t device_threshold_ns;   /* a device whose P90 passes it is bypassed; 0: 5 ms */
    uint64_t device_probe_ns;   /* the first back-off before a bypassed device is tried again; 0: 250 ms */
    int32_t device_strict;      /* nonzero: a failed or slow device call fails the forward, no fallback */
} colibri_session_options;

enum { COLIBRI_CACHE_GLOBAL = 0, COLIBRI_CACHE_PER_LAYER = 1 };
enum {
    COLIBRI_EXPERT_IO_DIRECT = 1u << 0,      /* POSIX: O_DIRECT, 4 KiB-aligned reads: the page cache is bypassed */
    COLIBRI_EXPERT_IO_NO_PREFETCH = 1u << 1, /* read only demanded experts (no guess of the next layer's) */
    COLIBRI_EXPERT_IO_VERIFY = 1u << 2       /* check each expert's extent against its CRC-32 when first read
                                                (extent_checksums: interleaved files colibri convert writes) */
};

enum {
    COLIBRI_ROUTING_MODEL = 0,      /* the router the model was trained with */
    COLIBRI_ROUTING_NOISY = 1,      /* noisy top-k: seeded Gaussian noise on the logits, then the model's router */
    COLIBRI_ROUTING_HASH = 2,       /* hash routing: a token id's experts are fixed, weights 1/top_k */
    COLIBRI_ROUTING_CAPACITY = 3    /* the model's router, then experts over capacity drop tokens */
};

/* Exactly how many arena bytes a session with these options needs (no allocation). */
colibri_status colibri_session_plan(const colibri_model *model,
                                    const colibri_session_options *options,
                                    size_t *arena_bytes, colibri_error *err);

colibri_status colibri_session_create(const colibri_model *model,
                                      const colibri_session_options *options,
                                      colibri_session **session, colibri_error *err);
void colibri_session_destroy(colibri_session *session);

void colibri_session_reset(colibri_session *session);          /* empties the KV cache, drops the pending token */
int32_t colibri_session_position(const colibri_session *session);   /* positions in the KV cache */
/* The conversation a session holds: the ids of the *n positions in its KV cache, in order (valid
 * until the next call on the session), then maybe one pending token: the last one
 * colibri_generate_next returned, sampled but not yet fed.  The next colibri_forward feeds the
 * pending token before its own (its logits are not returned), so a session that generates and is
 * then given the next turn computes what one forward over the whole conversation computes. */
const int32_t *colibri_session_tokens(const colibri_session *session, int32_t *n);
int32_t colibri_session_pending(const colibri_session *session);    /* -1: none */
/* Keeps the first n tokens of the conversation (positions, then the pending token), for a turn
 * rendered again differently, a reused prompt prefix, rejected drafts: n <= position moves the
 * position back to n and drops the pending token; position + 1 keeps it.  Every position's state
 * is kept until reset (the KV cache, the latent cache, the convolution's inputs; a sliding window
 * masks older positions but never overwrites them), so what is fed next computes exactly what a
 * session fed only the kept tokens computes.  After a cut the logits are a dropped position's:
 * colibri_sample refuses them until a forward.  COLIBRI_E_ARG for n outside [0, tokens held]. */
colibri_status colibri_session_truncate(colibri_session *session, int32_t n, colibri_error *err);
int32_t colibri_session_n_ctx(const colibri_session *session);
const char *colibri_session_kernels(const colibri_session *session);   /* "avx2", "neon", "reference", ... */
/* The kernel variants this build has, in order of preference after the reference: name of the
 * i-th (NULL past the end), and whether this CPU runs it. */
const char *colibri_kernel_variant(int32_t i, int *runs_here);
/* The row-interleaved form of a plain block dtype (q4_k: q4_kx8), or the dtype itself where it has
 * none; with fast_here, only a form that the kernels sessions pick here (COLIBRI_KERNELS, else this
 * CPU's best) have kernels of their own for, so that they multiply it faster than the plain one:
 * what the converter writes by default. */
colibri_dtype colibri_interleaved_form(colibri_dtype dtype, int fast_here);
/* dst = src (rows, cols) of a plain block dtype (q4_0, q8_0, q4_k, q5_k, q6_k, iq4_xs, mxfp4) in its
 * row-interleaved form (docs/FORMAT.md): the same bytes, moved; src of an interleaved dtype (q4_kx8)
 * goes back to the plain form.  rows % 8 == 0; dst and src of rows * colibri_row_bytes; they must
 * not overlap.  COLIBRI_E_DTYPE for a dtype with no such form, COLIBRI_E_SHAPE for rows or cols
 * that do not fit it. */
colibri_status colibri_interleave_rows(void *dst, const void *src, colibri_dtype dtype, int64_t rows, int64_t cols,
                                       colibri_error *err);

/* Appends `n` tokens to the KV cache (after the pending token, if any) and computes their logits.
 * logits (n, vocab): every position's logits, or NULL to keep only the last one,
 * which colibri_session_logits returns either way.  n = 0 feeds the pending token alone. */
colibri_status colibri_forward(colibri_session *session, const int32_t *tokens, size_t n,
                               float *logits, colibri_error *err);
const float *colibri_session_logits(const colibri_session *session);   /* (vocab) */

/* ---- several sequences ------------------------------------------------ */

/* A session holds n_seq sequence slots (colibri_session_options.n_seq), each with its own KV cache
 * of n_ctx positions, token ids, position, pending token and last logits; the calls above are slot
 * 0's.  The calls below name a slot; COLIBRI_E_ARG (or -1, NULL) for one outside [0, n_seq). */
int32_t colibri_session_n_seq(const colibri_session *session);
int32_t colibri_seq_position(const colibri_session *session, int32_t seq);
const int32_t *colibri_seq_tokens(const colibri_session *session, int32_t seq, int32_t *n);
int32_t colibri_seq_pending(const colibri_session *session, int32_t seq);
colibri_status colibri_seq_truncate(colibri_session *session, int32_t seq, int32_t n, colibri_error *err);
colibri_status colibri_seq_reset(colibri_session *session, int32_t seq, colibri_error *err);
/* dst holds what src holds (its KV cache rows, token ids, pending token, logits): a shared prefix
 * such as a system prompt computed once, then each slot continued its own way. */
colibri_status colibri_seq_copy(colibri_session *session, int32_t src, int32_t dst, colibri_error *err);
const float *colibri_seq_logits(const colibri_session *session, int32_t seq);   /* (vocab) its last logits */

/* One slot's part of colibri_forward_batch. */
typedef struct colibri_batch_entry {
    int32_t seq;                /* the slot; at most once per call */
    const int32_t *tokens;      /* appended after the slot's pending token (fed first, as colibri_forward does) */
    int32_t n_tokens;           /* may be 0 when the slot has a pending token */
    int32_t logits;             /* nonzero: the slot's last position's logits into colibri_seq_logits */
} colibri_batch_entry;

/* One forward over the tokens of several slots (continuous batching: a new sequence's prompt beside
 * the running ones' next tokens).  Every entry is checked before anything is computed (slot range
 * and uniqueness, token ids, room in each slot); the rows (each entry's pending token, then its
 * tokens, entry after entry) go in chunks of at most n_batch, each row attending over its own slot
 * at its own position, the MoE block computing each expert once over every row routed to it.  A
 * failed read (streamed expert, device) leaves every slot's position and pending token as they were.
 * With the reference kernels each slot's logits are bit-identical to the same sequence run alone. */
colibri_status colibri_forward_batch(colibri_session *session, const colibri_batch_entry *entries, int32_t n_entries,
                                     colibri_error *err);

/* Router statistics: how many tokens each expert of each layer received, counted over every
 * forward since the session was created or the counts cleared (colibri_session_reset keeps
 * them, so a long text can be measured window by window).  counts: (n_layers, n_experts). */
colibri_status colibri_expert_load(const colibri_session *session, uint64_t *counts);
void colibri_expert_load_clear(colibri_session *session);
/* The profiler (colibri_session_options.profile): nanoseconds spent in each phase since the
 * session was created, summed over layers and tokens.  Off, the forward pass reads no clock. */
enum {
    COLIBRI_PHASE_NORMS, COLIBRI_PHASE_ATTENTION, COLIBRI_PHASE_ROUTER, COLIBRI_PHASE_DISPATCH,
    COLIBRI_PHASE_EXPERTS, COLIBRI_PHASE_AGGREGATION, COLIBRI_PHASE_DENSE, COLIBRI_PHASE_LM_HEAD,
    COLIBRI_PHASE_SAMPLING, COLIBRI_PHASE_EXPERT_IO, COLIBRI_PHASE_COUNT
};
const char *colibri_phase_name(int32_t phase);
colibri_status colibri_profile(const colibri_session *session, uint64_t ns[COLIBRI_PHASE_COUNT]);

/* Capacity routing: the tokens each expert dropped, counted and cleared with expert_load. */
colibri_status colibri_expert_dropped(const colibri_session *session, uint64_t *counts);

/* Expert streaming.  The size of one cache slot (the largest routed expert, with its alignment) and
 * the smallest expert_budget these options allow: one layer's top_k slots (global cache) or that
 * for every MoE layer (per-layer cache).  COLIBRI_E_ARG for a model without routed experts. */
colibri_status colibri_expert_slots(const colibri_model *model, const colibri_session_options *options,
                                    uint64_t *slot_bytes, uint64_t *min_budget, colibri_error *err);
/* The slots options->expert_budget buys: the pool a session makes with these options (never more than
 * the routed experts; with a per-layer cache, even shares of the MoE layers).  COLIBRI_E_ARG, naming the
 * minimum, for a budget below colibri_expert_slots' (0: resident, no slots). */
colibri_status colibri_expert_slot_count(const colibri_model *model, const colibri_session_options *options,
                                         int32_t *n_slots, colibri_error *err);

/* Where expert `expert` of layer `layer` lies in weights.bin, in file order: *n_parts parts (at most
 * COLIBRI_EXPERT_PARTS), part i at offset[i] of bytes[i], the next expert's part stride[i] further.
 * Interleaved: one part, the expert's extent (padding included); stacked: its slice of each of the
 * layer's routed-expert tensors.  *n_parts = 0 for a layer without routed experts; COLIBRI_E_ARG for a
 * layer or an expert out of range. */
#define COLIBRI_EXPERT_PARTS 6
colibri_status colibri_expert_location(const colibri_model *model, int32_t layer, int32_t expert,
                                       uint64_t offset[COLIBRI_EXPERT_PARTS], uint64_t bytes[COLIBRI_EXPERT_PARTS],
                                       uint64_t stride[COLIBRI_EXPERT_PARTS], int32_t *n_parts);

typedef struct colibri_expert_cache_stats {
    uint64_t hits;              /* demanded experts found in a slot */
    uint64_t misses;            /* demanded experts read (or waited for, when a guess was still reading) */
    uint64_t prefetches;        /* speculative reads started for the next layer's guessed experts */
    uint64_t prefetch_hits;     /* demanded experts a speculative read brought: in hits when it had finished,
                                   in misses when the forward pass still waited for it */
    uint64_t bytes_read;        /* from storage, demanded and speculative */
    uint64_t reads;             /* read calls */
    uint64_t io_wait_ns;        /* the forward pass waiting for reads (0 where the platform has no clock) */
    int32_t slots;              /* the pool */
    int32_t pinned;
    uint64_t slot_bytes;
} colibri_expert_cache_stats;

/* COLIBRI_E_ARG for a resident session (expert_budget 0). */
colibri_status colibri_expert_cache_stats_get(const colibri_session *session, colibri_expert_cache_stats *stats);
void colibri_expert_cache_stats_clear(colibri_session *session);
/* What slot `slot` holds: layer and expert (-1, -1 when empty), pinned or not. */
colibri_status colibri_expert_cache_slot(const colibri_session *session, int32_t slot, int32_t *layer,
                                         int32_t *expert, int *pinned);

/* ---- sampling --------------------------------------------------------- */

/* The steps, in this order (transformers' order of its logits processors and warpers, which
 * vLLM's sampler follows too): logit bias, repetition penalty, presence and frequency penalties,
 * temperature, top-k, top-p, min-p, then a draw.  Greedy (temperature <= 0, top_k 1 or top_p 0)
 * takes the argmax after the bias and the penalties.  Each new step is off at zero, so a struct
 * zeroed past top_p samples as before.  The penalties count the `recent` tokens the sampler is
 * given (colibri_sample_after; a generation passes the last tokens of its sequence, the prompt
 * included, as llama.cpp does). */
typedef struct colibri_logit_bias {
    int32_t token;          /* in [0, vocab_size): COLIBRI_E_ARG otherwise */
    float bias;             /* added to the token's logit; -INFINITY bans it; NaN, +inf: COLIBRI_E_ARG */
} colibri_logit_bias;

#define COLIBRI_PENALTY_WINDOW 256          /* the most recent tokens a generation keeps for the penalties */
#define COLIBRI_PENALTY_LAST_N_DEFAULT 64   /* llama.cpp's --repeat-last-n, the CLIs' and Python's default */

typedef struct colibri_sampling {
    float temperature;      /* <= 0: greedy (argmax, lowest id on ties) */
    int32_t top_k;          /* keep the k most likely tokens; <= 0: no limit */
    float top_p;            /* then the nucleus of those, renormalised (as transformers does);
                               >= 1: no limit; 0: greedy; negative: COLIBRI_E_ARG */
    float min_p;            /* then keep the tokens with p >= min_p * p(most likely); 0: off; in [0, 1] */
    float repeat_penalty;   /* a token among the last penalty_last_n: a positive logit divided by it, a
                               negative one multiplied (transformers', llama.cpp's); 0 or 1: off; >= 0 */
    float presence_penalty; /* logit -= presence_penalty * (count > 0) + frequency_penalty * count, count */
    float frequency_penalty;/* its occurrences among the last penalty_last_n (OpenAI's); 0: off */
    int32_t penalty_last_n; /* the window the penalties count: 0: none (penalties off, as llama.cpp);
                               -1: all the recent tokens given; else at most that many, the latest */
    const colibri_logit_bias *logit_bias;   /* caller-owned, n_logit_bias pairs; NULL: none */
    int32_t n_logit_bias;
} colibri_sampling;

/* Draws the next token from the session's last logits (those of the last position in the KV
 * cache: with a pending token, the logits it was drawn from).  `rng` is the caller's
 * state (seed it with any value); the same state and logits give the same token.
 * COLIBRI_E_VALUE when a logit is not finite (NaN weights loaded without verification), or when
 * the logit bias bans every token.  colibri_sample gives the penalties no tokens to count. */
colibri_status colibri_sample(colibri_session *session, const colibri_sampling *params,
                              uint64_t *rng, int32_t *token, colibri_error *err);
/* The same after the sequence's recent tokens (n_recent, oldest first), which the penalties count. */
colibri_status colibri_sample_after(colibri_session *session, const colibri_sampling *params,
                                    const int32_t *recent, int32_t n_recent, uint64_t *rng, int32_t *token,
                                    colibri_error *err);

/* ---- generation ------------------------------------------------------- */

/* One sequence's generation, driven by the caller one token at a time: colibri_generate_start
 * prefills the prompt, each colibri_generate_next feeds the last token back (none the first
 * time), samples the next one and says whether it is the last.  The caller owns the struct, so
 * any number of generations run side by side, each on its own session; nothing is allocated.
 * A generation ends after a token that is one of the model's end ids (with stop_at_eos), the
 * max_tokens-th, or one the context has no room to feed back: COLIBRI_STOP_CONTEXT_FULL means
 * max_tokens were not reached (a caller reports it: OpenAI's finish_reason "length", as for
 * COLIBRI_STOP_MAX_TOKENS; "stop" for COLIBRI_STOP_EOS). */
typedef enum colibri_stop {
    COLIBRI_STOP_NONE = 0,          /* more tokens may come */
    COLIBRI_STOP_EOS,               /* the last token is one of the model's eos_token_ids */
    COLIBRI_STOP_MAX_TOKENS,        /* max_tokens were generated (at once for max_tokens <= 0) */
    COLIBRI_STOP_CONTEXT_FULL,      /* the KV cache holds n_ctx positions */
    COLIBRI_STOP_ERROR,             /* a call failed: start again (after colibri_session_reset) */
    COLIBRI_STOP_STRING             /* the text completed a stop string (colibri_generate_text) */
} colibri_stop;

typedef struct colibri_generate_options {
    int32_t max_tokens;             /* tokens to generate; <= 0: none (the prompt is still prefilled) */
    colibri_sampling sampling;
    uint64_t seed;                  /* the sampler's state to start from (a generation's rng goes on) */
    int stop_at_eos;
} colibri_generate_options;

typedef struct colibri_generation { /* caller-owned; read between calls, never written */
    colibri_session *session;
    int32_t seq;                    /* its sequence slot (colibri_generate_start: 0) */
    const int32_t *prompt;          /* borrowed until fed: n_prompt tokens, prompt_done of them fed */
    int32_t n_prompt, prompt_done;
    int32_t fresh;                  /* colibri_generate_step: 1 when `last` is a new token this step */
    colibri_generate_options options;
    uint64_t rng;                   /* the sampler's state now */
    int32_t n_eos_token_ids;        /* the ids that stop it: the model's at the start */
    int32_t eos_token_ids[COLIBRI_MAX_EOS_TOKENS];
    int32_t n_recent;               /* the sequence's last tokens, oldest first, for the penalties: */
    int32_t recent[COLIBRI_PENALTY_WINDOW];   /* the prompt's, then each one sampled */
    int32_t generated;              /* tokens returned so far */
    int32_t last;                   /* the last token returned, fed back by the next call */
    colibri_stop stop;              /* known with the last token: the next call returns none */
    struct colibri_text_stream *text;   /* where the generated text goes (colibri_generate_text), else NULL */
} colibri_generation;

/* Appends the prompt (n_prompt tokens; 0: the session already holds it, e.g. fed position by
 * position for every position's logits) to the session's KV cache and readies `g`.  A pending
 * token (the last one of an earlier generation) is fed first.  The generation's last token is left
 * pending: the session's next forward or generation feeds it. */
colibri_status colibri_generate_start(colibri_generation *g, colibri_session *session,
                                      const colibri_generate_options *options, const int32_t *prompt,
                                      size_t n_prompt, colibri_error *err);
/* *token: the next token, or -1 once g->stop is set (then nothing is computed).  After a token,
 * colibri_session_logits holds the logits it was drawn from. */
colibri_status colibri_generate_next(colibri_generation *g, int32_t *token, colibri_error *err);

/* Generations over several slots, stepped together (a server's scheduler):
 * colibri_generate_begin readies g on slot `seq` without computing: the slot holds nothing or the
 * prompt's first tokens (a prefix kept with colibri_seq_truncate is not computed again: prompt_done
 * counts it), and no pending token; the prompt is borrowed until it is fed; COLIBRI_E_CONTEXT when
 * it is longer than n_ctx.  colibri_generate_step makes one
 * colibri_forward_batch: each decoding generation feeds its pending token, then the generations
 * still prefilling feed their next prompt chunk in what is left of n_batch (at least one token), so
 * running streams never wait behind a long prompt; each generation whose logits came out samples
 * its next token exactly as colibri_generate_next does (the same sampler, penalties window, stop
 * conditions, text stream) and gets g->fresh = 1.  Generations already stopped are skipped; each
 * slot at most once.  A failed forward leaves every slot and generation as they were. */
colibri_status colibri_generate_begin(colibri_generation *g, colibri_session *session, int32_t seq,
                                      const colibri_generate_options *options, const int32_t *prompt,
                                      size_t n_prompt, colibri_error *err);
colibri_status colibri_generate_step(colibri_session *session, colibri_generation *const *gens, int32_t n_gens,
                                     colibri_error *err);

/* Streamed text: each token's bytes (colibri_token_bytes) go to `write` as they come, but an
 * unfinished UTF-8 character (at most 3 bytes) waits for the bytes that complete it, so no write
 * splits a character.  colibri_text_flush writes what still waits, at the end. */
typedef void (*colibri_write_fn)(void *context, const char *bytes, size_t len);
typedef struct colibri_text_sink {  /* caller-owned */
    colibri_write_fn write;
    void *context;
    uint8_t held[4];
    size_t n_held;
} colibri_text_sink;

void colibri_text_sink_init(colibri_text_sink *sink, colibri_write_fn write, void *context);
void colibri_text_put(colibri_text_sink *sink, const uint8_t *bytes, size_t len);
/* A token's bytes; COLIBRI_E_TENSOR (nothing written) when the model has no vocabulary. */
colibri_status colibri_text_put_token(colibri_text_sink *sink, const colibri_model *model, int32_t token);
void colibri_text_flush(colibri_text_sink *sink);

/* A generation's text, with stop strings: the bytes of each generated token go to the sink, except
 * that bytes which may begin a stop string wait until they cannot; when a stop string is complete
 * the generation ends (COLIBRI_STOP_STRING) and the text is what came before it: no write ever holds
 * a stop string or bytes of one.  The first stop string completed ends it (the longest of those the
 * same byte completes).  Caller-owned, no allocation; the stop strings are borrowed. */
#define COLIBRI_MAX_STOPS 16
#define COLIBRI_STOP_MAX_BYTES 64       /* the longest stop string */
typedef struct colibri_text_stream {
    colibri_text_sink sink;
    const char *const *stops;       /* (n_stops) NUL-terminated, 1 .. COLIBRI_STOP_MAX_BYTES bytes */
    int32_t n_stops;
    size_t stop_len[COLIBRI_MAX_STOPS];
    uint8_t held[COLIBRI_STOP_MAX_BYTES];   /* the longest tail that begins a stop string */
    size_t n_held;
    int32_t matched;                /* the stop string found, -1: none yet */
} colibri_text_stream;

/* COLIBRI_E_ARG for more than COLIBRI_MAX_STOPS stop strings, an empty one or a longer one. */
colibri_status colibri_text_stream_init(colibri_text_stream *text, const char *const *stops, int32_t n_stops,
                                        colibri_write_fn write, void *context, colibri_error *err);
/* Takes bytes of the text; 1 once a stop string is complete (from then on, nothing is taken). */
int colibri_text_stream_put(colibri_text_stream *text, const uint8_t *bytes, size_t len);
/* The end of the text: what waits is written (unless a stop string was found), then flushed. */
void colibri_text_stream_finish(colibri_text_stream *text);
/* Sends the text of each token `g` generates from now on (after colibri_generate_start) to `text`,
 * finished when the generation stops.  COLIBRI_E_TENSOR when the model has no vocabulary. */
colibri_status colibri_generate_text(colibri_generation *g, colibri_text_stream *text, colibri_error *err);

/* ---- memory report ---------------------------------------------------- */

/* Writes the memory tree (weights by tensor, arena by group and buffer, metadata) as
 * text into `buf` (truncated to `cap`, always NUL-terminated when cap > 0); `len`
 * receives the full length.  Call with cap 0 to size the buffer. */
colibri_status colibri_memdump(const colibri_session *session, char *buf, size_t cap,
                               size_t *len);

typedef struct colibri_memory_totals {
    size_t weights;         /* tensor bytes in weights.bin, mapped */
    size_t metadata;        /* the model's tables */
    size_t arena_reserved;  /* bytes the arena holds */
    size_t arena_used;      /* bytes handed out: the high-water mark */
    size_t kv_cache;
    size_t activations;
    size_t expert_cache;    /* expert streaming: the slot pool and its tables (in arena_used) */
} colibri_memory_totals;

colibri_status colibri_memory(const colibri_session *session, colibri_memory_totals *totals);

#ifdef __cplusplus
}
#endif
#endif

/* SPDX-License-Identifier: MIT */
/* Attention, the token mixer of most layers (forward.h): grouped-query heads over a KV cache, and
 * DeepSeek's multi-head latent attention over a cache of latents.  In both the threads share a
 * layer's heads, each head with its own scratch rows, so the result does not depend on the split. */
#include <math.h>
#include <string.h>

#include "forward.h"
#include "../platform.h"

/* x (n) <- x clamped to [-limit, limit] */
static void clamp(float *x, size_t n, float limit)
{
    size_t i;
    for (i = 0; i < n; i++) x[i] = x[i] > limit ? limit : x[i] < -limit ? -limit : x[i];
}

/* rows (n_rows, width) <- each row times 1/sqrt(mean(row^2) + eps): RMSNorm with no weight */
static void rms_plain(float *rows, size_t n_rows, int32_t width, float eps)
{
    size_t r;
    int32_t i;
    for (r = 0; r < n_rows; r++) {
        float *x = rows + r * width, scale;
        double ss = 0.0;
        for (i = 0; i < width; i++) ss += (double)x[i] * x[i];
        scale = 1.0f / sqrtf((float)(ss / width) + eps);
        for (i = 0; i < width; i++) x[i] *= scale;
    }
}

/* QK-norm of rows (n, n_heads * head_dim) in place: RMSNorm per head or over the whole row. */
static void qk_norm(const colibri_session *s, float *rows, colibri_weight w, int32_t n, int32_t n_heads)
{
    const colibri_hparams *hp = &s->model->hp;
    int32_t hd = hp->head_dim, width = hp->qk_norm == COLIBRI_QK_NORM_HEAD ? hd : n_heads * hd;
    size_t r, n_rows = (size_t)n * n_heads * hd / width;
    for (r = 0; r < n_rows; r++)
        s->compute.kernels->rmsnorm(rows + r * width, rows + r * width, w.data, w.dtype, width, hp->rms_norm_eps);
}

/* x (n) <- the first n of softmax(x, sink): the sink takes its share of the probability and is dropped */
static void softmax_with_sink(float *x, int32_t n, float sink)
{
    float max = sink, sum;
    int32_t i;
    for (i = 0; i < n; i++) if (x[i] > max) max = x[i];
    sum = colibri_expf(sink - max);
    for (i = 0; i < n; i++) { x[i] = colibri_expf(x[i] - max); sum += x[i]; }
    for (i = 0; i < n; i++) x[i] /= sum;
}

/* Element `col` of row `row` of a layer's KV cache (rows of `width` in the session's kv_type; col a
 * multiple of its block). */
static uint8_t *kv_at(const colibri_session *s, float *cache, size_t row, int32_t width, size_t col)
{
    return (uint8_t *)cache + colibri_row_bytes(s->kv_type, row * (size_t)width + col);
}

/* softmax(q k^T * scale) v for heads [part * H / parts, (part + 1) * H / parts) of n queries, each at
 * its own position over its own slot's cached keys and values: the threads share a layer's heads,
 * each head with its own scores row, so the result does not depend on the split. */
typedef struct heads_job { colibri_session *s; int32_t layer, n; const int32_t *pos, *row; } heads_job;

static void attend_heads(void *context, int32_t part, int32_t parts)
{
    const heads_job *job = context;
    colibri_session *s = job->s;
    const colibri_hparams *hp = &s->model->hp;
    const colibri_layer_weights *lw = &s->model->layers[job->layer];
    const colibri_kernels *kernels = s->compute.kernels;
    int32_t hd = hp->head_dim, H = hp->n_heads, q_dim = H * hd, kv_dim = hp->n_kv_heads * hd, group = H / hp->n_kv_heads;
    int32_t t, h;
    for (h = H * part / parts; h < H * (part + 1) / parts; h++) {
        float *scores = s->scores + (size_t)h * s->n_ctx;
        size_t kv_off = (size_t)(h / group) * hd;
        for (t = 0; t < job->n; t++) {
            int32_t pos = job->pos[t], first = 0, span;
            size_t slot = (size_t)(job->row[t] - pos);   /* the slot's first cache row */
            const float *qh = s->q + (size_t)t * q_dim + (size_t)h * hd;
            float *out = s->attn + (size_t)t * q_dim + (size_t)h * hd;
            if (lw->window > 0 && pos - lw->window + 1 > 0) first = pos - lw->window + 1;
            if (lw->chunk) first = pos / lw->chunk * lw->chunk;
            span = pos - first + 1;
            kernels->attention_scores(scores, qh, kv_at(s, s->k_cache[job->layer], slot + (size_t)first, kv_dim, kv_off),
                                      s->kv_type, (size_t)kv_dim, span, hd, hp->attention_scale);
            if (hp->attention_sinks) softmax_with_sink(scores, span, colibri_load_f32(lw->w[L_SINKS].data, lw->w[L_SINKS].dtype, (size_t)h));
            else kernels->softmax(scores, span);
            kernels->attention_values(out, scores, kv_at(s, s->v_cache[job->layer], slot + (size_t)first, kv_dim, kv_off),
                                      s->kv_type, (size_t)kv_dim, span, hd);
        }
    }
}

/* The largest position + 1 of n rows: how far the longest of them attends. */
static int32_t reach(const int32_t *pos, int32_t n)
{
    int32_t t, far = 0;
    for (t = 0; t < n; t++) if (pos[t] + 1 > far) far = pos[t] + 1;
    return far;
}

/* Whether the n rows lie in one run of cache rows, row[0] onwards. */
static int one_run(const int32_t *row, int32_t n)
{
    int32_t t;
    for (t = 1; t < n; t++) if (row[t] != row[0] + t) return 0;
    return 1;
}

/* block_out (n, dim) = wo @ attention(x_normed) for n rows at positions pos (n), cache rows row (n). */
void colibri_attention(colibri_session *s, int32_t layer, const int32_t *pos, const int32_t *row, int32_t n)
{
    const colibri_hparams *hp = &s->model->hp;
    const colibri_layer_weights *lw = &s->model->layers[layer];
    const colibri_weight *w = lw->w;
    const colibri_compute *k = &s->compute;
    int32_t d = hp->hidden_size, hd = hp->head_dim, H = hp->n_heads, half = hp->rope_dim / 2;
    int32_t q_dim = H * hd, kv_dim = hp->n_kv_heads * hd;
    /* one slot's rows in a run of an f32 cache: projected straight into it; else into k_rows, v_rows, then
     * each row to its slot's cache row, converted for an f16 or q8_0 cache */
    int run = s->kv_type == COLIBRI_DTYPE_F32 && (s->n_seq == 1 || one_run(row, n));
    float *k_rows = run ? s->k_cache[layer] + (size_t)row[0] * kv_dim : s->k_rows;     /* (n, kv_dim) */
    float *v_rows = run ? s->v_cache[layer] + (size_t)row[0] * kv_dim : s->v_rows;
    int32_t t, i;

    colibri_matmul(k, s->q, s->xn, w[L_WQ].data, w[L_WQ].dtype, n, d, q_dim);
    colibri_matmul(k, k_rows, s->xn, w[L_WK].data, w[L_WK].dtype, n, d, kv_dim);
    colibri_matmul(k, v_rows, s->xn, w[L_WV].data, w[L_WV].dtype, n, d, kv_dim);
    if (hp->attention_bias) {
        colibri_add_bias(s->q, w[L_BQ], n, q_dim);
        colibri_add_bias(k_rows, w[L_BK], n, kv_dim);
        colibri_add_bias(v_rows, w[L_BV], n, kv_dim);
    }
    if (hp->qk_norm != COLIBRI_QK_NORM_NONE && hp->qk_norm != COLIBRI_QK_NORM_HEAD_PLAIN) {
        qk_norm(s, s->q, w[L_Q_NORM], n, H);
        qk_norm(s, k_rows, w[L_K_NORM], n, hp->n_kv_heads);
    }
    if (hp->qk_norm == COLIBRI_QK_NORM_HEAD_PLAIN && lw->rope) {   /* rotation keeps a head's norm: order is free */
        rms_plain(s->q, (size_t)n * H, hd, hp->rms_norm_eps);
        rms_plain(k_rows, (size_t)n * hp->n_kv_heads, hd, hp->rms_norm_eps);
    }
    if (hp->clip_qkv > 0.0f) {
        clamp(s->q, (size_t)n * q_dim, hp->clip_qkv);
        clamp(k_rows, (size_t)n * kv_dim, hp->clip_qkv);
        clamp(v_rows, (size_t)n * kv_dim, hp->clip_qkv);
    }
    for (t = 0; t < n && lw->rope; t++) {
        const float *c = s->rope_cos + (size_t)pos[t] * half, *sn = s->rope_sin + (size_t)pos[t] * half;
        colibri_rope(s->q + (size_t)t * q_dim, H, hd, hp->rope_dim, hp->rope_interleaved, c, sn);
        colibri_rope(k_rows + (size_t)t * kv_dim, hp->n_kv_heads, hd, hp->rope_dim, hp->rope_interleaved, c, sn);
    }
    if (!lw->rope && hp->nope_temperature_floor > 0.0f) {   /* Llama 4: sharper attention far into the context */
        for (t = 0; t < n; t++) {
            float steps = (float)floor((double)((float)pos[t] + 1.0f) / hp->nope_temperature_floor);
            float scale = (float)colibri_log(1.0 + steps) * hp->nope_temperature_scale + 1.0f;
            for (i = 0; i < q_dim; i++) s->q[(size_t)t * q_dim + i] *= scale;
        }
    }

    for (t = 0; t < n && !run; t++) {   /* each row's key and value into its own slot's cache row */
        colibri_kv_store(kv_at(s, s->k_cache[layer], (size_t)row[t], kv_dim, 0), s->kv_type, k_rows + (size_t)t * kv_dim, kv_dim);
        colibri_kv_store(kv_at(s, s->v_cache[layer], (size_t)row[t], kv_dim, 0), s->kv_type, v_rows + (size_t)t * kv_dim, kv_dim);
    }
    {
        heads_job job;
        job.s = s; job.layer = layer; job.pos = pos; job.row = row; job.n = n;
        if (k->pool && (uint64_t)n * (uint64_t)reach(pos, n) * (uint64_t)q_dim >= (1u << 16))
            colibri_platform_pool_run(k->pool, attend_heads, &job, hp->n_heads);
        else
            attend_heads(&job, 0, 1);
    }
    colibri_matmul(k, s->block_out, s->attn, w[L_WO].data, w[L_WO].dtype, n, q_dim, d);
    if (hp->attention_out_bias) colibri_add_bias(s->block_out, w[L_BO], n, d);
}

/* DeepSeek's multi-head latent attention.  The cache holds per position the normed latent c
 * (kv_lora) and the rotary key k_pe (rope_dim) every head shares; each head's key and value
 * up-projections (wkv_b) are folded into its query and its output instead of expanding the cache:
 *   q_nope . (Wk c) = (Wk^T q_nope) . c   and   sum_j p_j Wv c_j = Wv sum_j p_j c_j.
 * Heads [part * H / parts, (part + 1) * H / parts) of n queries, each at its own position over its
 * own slot, each head with its own rows of q_latent, ctx_latent, scores and latent_xq. */
typedef struct latent_job { colibri_session *s; int32_t layer, n; const int32_t *pos, *row; } latent_job;

static void attend_latent_heads(void *context, int32_t part, int32_t parts)
{
    const latent_job *job = context;
    colibri_session *s = job->s;
    const colibri_hparams *hp = &s->model->hp;
    const colibri_weight wkv_b = s->model->layers[job->layer].w[L_WKV_B];   /* (H * (dn + dv), R) */
    const colibri_kernels *kernels = s->compute.kernels;
    int32_t H = hp->n_heads, dn = hp->nope_dim, dr = hp->rope_dim, dv = hp->v_head_dim, R = hp->kv_lora_rank;
    int32_t qd = hp->head_dim, t, h;
    const float *latent = s->k_cache[job->layer], *k_rope = s->v_cache[job->layer];   /* (n_seq * n_ctx, R), (.., dr) */
    size_t wkv_row = colibri_row_bytes(wkv_b.dtype, (size_t)R);   /* bytes of one wkv_b row */
    for (h = H * part / parts; h < H * (part + 1) / parts; h++) {
        const uint8_t *wk = (const uint8_t *)wkv_b.data + (size_t)h * (dn + dv) * wkv_row;   /* (dn, R), then Wv (dv, R) */
        float *q_latent = s->q_latent + (size_t)h * R, *ctx_latent = s->ctx_latent + (size_t)h * R;
        float *scores = s->scores + (size_t)h * s->n_ctx;
        colibri_compute alone;   /* this thread, with the head's own quantized-input rows */
        alone.kernels = kernels;
        alone.pool = NULL;
        alone.xq = s->latent_xq ? s->latent_xq + (size_t)h * (R / COLIBRI_BLOCK) : NULL;
        alone.xq_row_blocks = R / COLIBRI_BLOCK;
        for (t = 0; t < job->n; t++) {
            const float *qh = s->q + ((size_t)t * H + h) * qd;   /* [nope (dn) | rope (dr)] */
            int32_t span = job->pos[t] + 1;
            size_t slot = (size_t)(job->row[t] - job->pos[t]);   /* the slot's first cache row */
            kernels->latent_query(q_latent, qh, wk, wkv_b.dtype, dn, R);
            kernels->latent_scores(scores, q_latent, qh + dn, latent + slot * R, k_rope + slot * dr, span, R, dr,
                                   hp->attention_scale);
            kernels->softmax(scores, span);
            kernels->attention_values(ctx_latent, scores, latent + slot * R, COLIBRI_DTYPE_F32, (size_t)R, span, R);
            colibri_matmul(&alone, s->attn + ((size_t)t * H + h) * dv, ctx_latent, wk + (size_t)dn * wkv_row, wkv_b.dtype,
                           1, R, dv);
        }
    }
}

/* block_out (n, dim) = wo @ latent attention(x_normed) for n rows at positions pos (n), cache rows row (n). */
void colibri_attention_latent(colibri_session *s, int32_t layer, const int32_t *pos, const int32_t *row, int32_t n)
{
    const colibri_hparams *hp = &s->model->hp;
    const colibri_weight *w = s->model->layers[layer].w;
    const colibri_compute *k = &s->compute;
    int32_t d = hp->hidden_size, H = hp->n_heads, dn = hp->nope_dim, dr = hp->rope_dim, dv = hp->v_head_dim;
    int32_t R = hp->kv_lora_rank, qd = hp->head_dim, QL = hp->q_lora_rank, half = dr / 2, t;
    float *latent = s->k_cache[layer], *k_rope = s->v_cache[layer];   /* (n_seq * n_ctx, R), (n_seq * n_ctx, dr) */

    /* queries (n, H * qd): [nope | rope] per head */
    if (QL) {
        colibri_matmul(k, s->latent_in, s->xn, w[L_WQ_A].data, w[L_WQ_A].dtype, n, d, QL);
        if (hp->attention_bias) colibri_add_bias(s->latent_in, w[L_BQ_A], n, QL);
        for (t = 0; t < n; t++)
            k->kernels->rmsnorm(s->latent_in + (size_t)t * QL, s->latent_in + (size_t)t * QL, w[L_Q_A_NORM].data,
                                w[L_Q_A_NORM].dtype, QL, hp->latent_norm_eps);
        colibri_matmul(k, s->q, s->latent_in, w[L_WQ_B].data, w[L_WQ_B].dtype, n, QL, H * qd);
    } else {
        colibri_matmul(k, s->q, s->xn, w[L_WQ].data, w[L_WQ].dtype, n, d, H * qd);
    }
    /* the new positions' latent and rotary key, into the cache */
    colibri_matmul(k, s->latent_in, s->xn, w[L_WKV_A].data, w[L_WKV_A].dtype, n, d, R + dr);   /* (n, R + dr) */
    if (hp->attention_bias) colibri_add_bias(s->latent_in, w[L_BKV_A], n, R + dr);
    for (t = 0; t < n; t++) {
        const float *in = s->latent_in + (size_t)t * (R + dr);
        const float *c = s->rope_cos + (size_t)pos[t] * half, *sn = s->rope_sin + (size_t)pos[t] * half;
        k->kernels->rmsnorm(latent + (size_t)row[t] * R, in, w[L_KV_A_NORM].data, w[L_KV_A_NORM].dtype, R, hp->latent_norm_eps);
        memcpy(k_rope + (size_t)row[t] * dr, in + R, (size_t)dr * sizeof(float));
        colibri_rope(k_rope + (size_t)row[t] * dr, 1, dr, dr, hp->rope_interleaved, c, sn);
        colibri_rope(s->q + (size_t)t * H * qd + dn, H, qd, dr, hp->rope_interleaved, c, sn);
    }

    {   /* threads when worth waking: per head and token, the fold (dn x R), scores and sum (2 x span x R), Wv (dv x R) */
        latent_job job;
        job.s = s; job.layer = layer; job.pos = pos; job.row = row; job.n = n;
        if (k->pool && (uint64_t)n * (uint64_t)H * (uint64_t)R * (uint64_t)(dn + dv + 2 * reach(pos, n)) >= (1u << 16))
            colibri_platform_pool_run(k->pool, attend_latent_heads, &job, H);
        else
            attend_latent_heads(&job, 0, 1);
    }
    colibri_matmul(k, s->block_out, s->attn, w[L_WO].data, w[L_WO].dtype, n, H * dv, d);
    if (hp->attention_out_bias) colibri_add_bias(s->block_out, w[L_BO], n, d);
}

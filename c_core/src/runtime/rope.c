/* SPDX-License-Identifier: MIT */
/* RoPE's angle tables, filled once when the session is made: every position's cos and sin,
 * so the forward pass only looks them up. */
#include <math.h>

#include "forward.h"

/* YaRN's correction range: the dimension at which a frequency makes `rotations` turns over the
 * original context (transformers' find_correction_dim, in double as it computes it). */
static double yarn_dim(double rotations, const colibri_hparams *hp)
{
    const double two_pi = 6.283185307179586;
    return hp->rope_dim * colibri_log(hp->rope_original_max / (rotations * two_pi)) / (2.0 * colibri_log((double)hp->rope_theta));
}

/* Angles as transformers computes them in float32: inv_freq = 1 / theta^(2j/d) (YaRN blends it
 * with inv_freq / factor across its correction range), angle = pos * inv_freq; cos and sin of our
 * own (ops/math.c), so every platform fills the same table, times the attention factor. */
void colibri_rope_tables_fill(colibri_session *s)
{
    const colibri_hparams *hp = &s->model->hp;
    int32_t half = hp->rope_dim / 2, p, j;
    double low = 0.0, high = 0.0;
    if (hp->rope_type == COLIBRI_ROPE_YARN) {
        low = yarn_dim(hp->rope_beta_fast, hp);
        high = yarn_dim(hp->rope_beta_slow, hp);
        if (hp->rope_truncate) { low = floor(low); high = ceil(high); }
        if (low < 0.0) low = 0.0;
        if (high > hp->rope_dim - 1) high = hp->rope_dim - 1;
        if (low == high) high += 0.001;
    }
    for (j = 0; j < half; j++) {
        float exponent = (float)(2 * j) / (float)hp->rope_dim;
        float pos_freq = (float)colibri_exp((double)exponent * colibri_log((double)hp->rope_theta));
        float inv_freq = 1.0f / pos_freq;
        if (hp->rope_type == COLIBRI_ROPE_LONGROPE)   /* transformers divides by the short factors at every length */
            inv_freq = 1.0f / (colibri_load_f32(s->model->rope_factors.data, s->model->rope_factors.dtype, (size_t)j) * pos_freq);
        if (hp->rope_type == COLIBRI_ROPE_LLAMA3) {   /* long wavelengths slowed by factor, a blend between */
            float wavelen = 6.2831855f / inv_freq, orig = (float)hp->rope_original_max;
            float low_wavelen = (float)((double)hp->rope_original_max / hp->rope_low_freq_factor);
            float high_wavelen = (float)((double)hp->rope_original_max / hp->rope_high_freq_factor);
            float slowed = wavelen > low_wavelen ? inv_freq / hp->rope_factor : inv_freq;
            float smooth = (orig / wavelen - hp->rope_low_freq_factor) /
                           (float)((double)hp->rope_high_freq_factor - hp->rope_low_freq_factor);
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen))
                slowed = (1.0f - smooth) * slowed / hp->rope_factor + smooth * slowed;
            inv_freq = slowed;
        }
        if (hp->rope_type == COLIBRI_ROPE_YARN) {
            float ramp = ((float)j - (float)low) / (float)(high - low);
            float extrapolation = 1.0f - (ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp);
            inv_freq = 1.0f / (hp->rope_factor * pos_freq) * (1.0f - extrapolation) + inv_freq * extrapolation;
        }
        for (p = 0; p < s->n_ctx; p++) {
            float angle = (float)p * inv_freq, factor = hp->rope_attention_factor;
            if (hp->rope_type == COLIBRI_ROPE_LONGROPE)   /* past the trained context, the long factor */
                factor = p + 1 > hp->rope_original_max ? hp->rope_long_mscale : hp->rope_short_mscale;
            s->rope_cos[(size_t)p * half + j] = (float)colibri_cos((double)angle) * factor;
            s->rope_sin[(size_t)p * half + j] = (float)colibri_sin((double)angle) * factor;
        }
    }
}

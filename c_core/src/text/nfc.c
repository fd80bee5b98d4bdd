/* SPDX-License-Identifier: MIT */
/* The NFC normalizer: canonical decomposition, canonical ordering and composition (UAX #15), with
 * unicode.c's tables.  The text splits into chunks at safe starts: a character whose decomposition
 * begins with a starter (class 0) that composes with nothing before it; a chunk's NFC is
 * independent of the rest.  A chunk is normalized with no buffer, straight from the input: its
 * decomposition is walked in place, a run of non-starters given out class by class (lowest first,
 * each class in text order: the stable sort), and each starter's final composite found by a look
 * ahead over the same walk before it is written.  A chunk longer than the space left is written
 * in parts, its state kept between them (nfc_chunk, text.h). */
#include <string.h>

#include "text.h"

/* Whether a chunk may start at cp: nothing before it reorders or composes with it. */
static int safe_start(uint32_t cp)
{
    uint32_t d[4];
    if (cp < 0x300 || cp > 0x10ffff) return 1;
    colibri_decompose(cp, d);
    if (colibri_ccc(d[0]) || d[0] - HANGUL_V < 21 || d[0] - HANGUL_T - 1 < 27) return 0;
    return !colibri_second_starter(d[0]);
}

static void pos_load(const uint8_t *s, size_t e, nfc_pos *p)
{
    p->t = 0;
    if (p->k < e) p->n = colibri_decompose(utf8_at(s, p->k, e, &p->len), p->d);
}

static void pos_next(const uint8_t *s, size_t e, nfc_pos *p)
{
    if (++p->t < p->n) return;
    p->k += p->len;
    pos_load(s, e, p);
}

static int pos_equal(const nfc_pos *a, const nfc_pos *b) { return a->k == b->k && a->t == b->t; }

static int walk_next(nfc_walk *w, uint32_t *out)
{
    nfc_pos p;
    for (;;) {
        if (!w->cls) {
            int lowest = 256, c;
            if (w->at.k >= w->e) return 0;
            if (!colibri_ccc(w->at.d[w->at.t])) {
                *out = w->at.d[w->at.t];
                pos_next(w->s, w->e, &w->at);
                return 1;
            }
            for (p = w->at; p.k < w->e && (c = colibri_ccc(p.d[p.t])) != 0; pos_next(w->s, w->e, &p))
                if (c < lowest) lowest = c;
            w->end = p;
            w->scan = w->at;
            w->cls = lowest;
        }
        while (!pos_equal(&w->scan, &w->end)) {
            uint32_t cp = w->scan.d[w->scan.t];
            pos_next(w->s, w->e, &w->scan);
            if (colibri_ccc(cp) == w->cls) { *out = cp; return 1; }
        }
        {   /* the next class up, or the run is done */
            int next = 256, c;
            for (p = w->at; !pos_equal(&p, &w->end); pos_next(w->s, w->e, &p))
                if ((c = colibri_ccc(p.d[p.t])) > w->cls && c < next) next = c;
            if (next == 256) { w->at = w->end; w->cls = 0; }
            else { w->cls = next; w->scan = w->at; }
        }
    }
}

/* Whether c, after the starter s with `last` the class of the last character kept since it (-1:
 * none), composes with it; *s becomes the composite. */
static int composes(uint32_t *s, int last, uint32_t c, int cls)
{
    uint32_t x;
    if (!(last < 0 || (last > 0 && last < cls)) || !(x = colibri_compose(*s, c))) return 0;
    *s = x;
    return 1;
}

static int put_utf8(uint8_t *out, size_t *n, size_t cap, uint32_t cp)
{
    if (cap - *n < 4) return 0;
    if (cp >= 0x110000) out[(*n)++] = (uint8_t)(cp - 0x110000);   /* an invalid byte: itself */
    else if (cp < 0x80) out[(*n)++] = (uint8_t)cp;
    else if (cp < 0x800) { out[(*n)++] = (uint8_t)(0xc0 | cp >> 6); out[(*n)++] = (uint8_t)(0x80 | (cp & 0x3f)); }
    else {
        if (cp < 0x10000) out[(*n)++] = (uint8_t)(0xe0 | cp >> 12);
        else { out[(*n)++] = (uint8_t)(0xf0 | cp >> 18); out[(*n)++] = (uint8_t)(0x80 | (cp >> 12 & 0x3f)); }
        out[(*n)++] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
        out[(*n)++] = (uint8_t)(0x80 | (cp & 0x3f));
    }
    return 1;
}

/* Chunk s[0, e)'s NFC onto out[*n, cap), from where it stopped (c->active) or its start; returns
 * whether it is all written. */
static int nfc_chunk_write(nfc_chunk *c, const uint8_t *s, size_t e, uint8_t *out, size_t *n, size_t cap)
{
    uint32_t cp;
    int cls;
    if (!c->active) {
        memset(&c->w, 0, sizeof c->w);
        c->w.s = s; c->w.e = e;
        pos_load(s, e, &c->w.at);
        c->have_starter = c->has_pending = 0;
        c->last = -1;
        c->active = 1;
    }
    if (c->has_pending) {
        if (!put_utf8(out, n, cap, c->pending)) return 0;
        c->has_pending = 0;
    }
    while (walk_next(&c->w, &cp)) {
        cls = colibri_ccc(cp);
        if (c->have_starter && composes(&c->starter, c->last, cp, cls)) continue;
        if (cls == 0) {   /* a new starter: written as what it composes into */
            nfc_walk ahead = c->w;
            uint32_t final = cp, d;
            int l = -1, dc;
            while (walk_next(&ahead, &d)) {
                dc = colibri_ccc(d);
                if (composes(&final, l, d, dc)) continue;
                if (!dc) break;
                l = dc;
            }
            c->starter = cp; c->have_starter = 1; c->last = -1;
            cp = final;
        } else {
            c->last = cls;
        }
        if (!put_utf8(out, n, cap, cp)) { c->pending = cp; c->has_pending = 1; return 0; }
    }
    c->active = 0;
    return 1;
}

int colibri_nfc_fill(const uint8_t *s, size_t e, size_t *i, nfc_chunk *c, uint8_t *out, size_t *n, size_t cap)
{
    while (*i < e) {
        size_t len;
        if (cap - *n < 4) return 1;
        if (!c->active && s[*i] < 0x80 && (*i + 1 == e || s[*i + 1] < 0x80)) {   /* ASCII: as is */
            out[(*n)++] = s[(*i)++];
            continue;
        }
        if (!c->active) {
            utf8_at(s, *i, e, &len);
            for (c->end = *i + len; c->end < e && !safe_start(utf8_at(s, c->end, e, &len)); c->end += len) {}
        }
        if (!nfc_chunk_write(c, s + *i, c->end - *i, out, n, cap)) return 1;
        *i = c->end;
    }
    return 0;
}

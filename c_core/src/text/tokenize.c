/* SPDX-License-Identifier: MIT */
/* Text to token ids, as the model's own tokenizer encodes it: added tokens matched first (exact
 * bytes, leftmost, longest first; those `tokenizers` matches after normalizing, in a second pass),
 * the rest normalized (NFC, or nothing: nfc.c) and split into words by the pre-tokenizer's regular
 * expressions (pretokenize.c's hand-written scanners: GPT-2's, Llama 3's, Qwen2's, DeepSeek V3's),
 * each word's bytes merged by BPE rank.  Normalized text (or text given a prefix space) passes through a window
 * on the stack, the unfinished word at its end carried into the next.
 *
 * Byte-level BPE (GPT-2): a word starts as one token per byte (byte_ids) and the pair of
 * neighbours with the lowest merge rank merges, leftmost first, until no pair has a rank.  A
 * binary heap of (rank, position) makes that O(w log w) for a word of w bytes, and a word is at
 * most COLIBRI_WORD_BYTES bytes: a longer one is encoded in pieces of at most that many bytes,
 * cut at a UTF-8 character boundary.  That, and the stack, are the bounds: no allocation, O(log)
 * work per byte beyond the added-token scan (n_added first-byte tests per byte, then memcmp).
 *
 * Text is UTF-8; a byte that does not start a valid sequence (truncated, overlong, a surrogate,
 * past U+10FFFF) is one character of class "other" on its own and is encoded as its byte. */
#include <string.h>

#include "colibri/colibri.h"   /* colibri_utf8_whole */
#include "tokenize.h"
#include "text.h"
#include "../util.h"

#define COLIBRI_WORD_BYTES 256      /* positions fit the heap key's low 8 bits */
#define COLIBRI_WINDOW 512          /* normalized text pre-tokenized at a time: a word of COLIBRI_WORD_BYTES and more */
#define COLIBRI_LOOKAHEAD 16        /* bytes past a word's end its scanner may have looked at, and then some */

/* What an encoding reads: the encoder's tables and the vocabulary's bytes (token_of looks words up by them). */
typedef struct tables {
    const colibri_encoder *enc;
    const colibri_vocabulary *vocab;
} tables;

/* ---- BPE ---- */

/* The token whose bytes are s[0, n), or -1: a binary search of vocab_order. */
static int32_t token_of(const tables *tb, const uint8_t *s, size_t n)
{
    const colibri_encoder *enc = tb->enc;
    int32_t lo = 0, hi = enc->n_vocab_order;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2, t = enc->vocab_order[mid];
        size_t tn = (size_t)(tb->vocab->offsets[t + 1] - tb->vocab->offsets[t]);
        int c = memcmp(tb->vocab->bytes + tb->vocab->offsets[t], s, tn < n ? tn : n);
        if (c == 0) c = tn < n ? -1 : tn > n;
        if (c == 0) return t;
        if (c < 0) lo = mid + 1; else hi = mid;
    }
    return -1;
}

/* The rank of merging (left, right), or -1: a binary search of merge_order. */
static int32_t merge_rank(const colibri_encoder *enc, int32_t left, int32_t right)
{
    int32_t lo = 0, hi = enc->n_merges;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2, r = enc->merge_order[mid];
        const int32_t *m = enc->merges + 3 * (size_t)r;
        if (m[0] == left && m[1] == right) return r;
        if (m[0] < left || (m[0] == left && m[1] < right)) lo = mid + 1; else hi = mid;
    }
    return -1;
}

typedef struct bpe_word {
    int32_t id[COLIBRI_WORD_BYTES];
    int32_t rank[COLIBRI_WORD_BYTES];   /* of the pair (i, next[i]); -1: none */
    int16_t prev[COLIBRI_WORD_BYTES], next[COLIBRI_WORD_BYTES];   /* -1: none; prev -2: merged away */
    uint32_t heap[2 * COLIBRI_WORD_BYTES];   /* rank << 8 | position: the first pairs, then each merge pops 1, pushes at most 2 */
    int32_t n_heap;
} bpe_word;

static void heap_push(bpe_word *w, uint32_t key)
{
    int32_t i = w->n_heap++;
    while (i > 0 && w->heap[(i - 1) / 2] > key) { w->heap[i] = w->heap[(i - 1) / 2]; i = (i - 1) / 2; }
    w->heap[i] = key;
}

static uint32_t heap_pop(bpe_word *w)
{
    uint32_t top = w->heap[0], key = w->heap[--w->n_heap];
    int32_t i = 0, n = w->n_heap;
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && w->heap[c + 1] < w->heap[c]) c++;
        if (w->heap[c] >= key) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    w->heap[i] = key;
    return top;
}

static void set_pair(const colibri_encoder *enc, bpe_word *w, int32_t i)
{
    w->rank[i] = w->next[i] >= 0 ? merge_rank(enc, w->id[i], w->id[w->next[i]]) : -1;
    if (w->rank[i] >= 0) heap_push(w, (uint32_t)w->rank[i] << 8 | (uint32_t)i);
}

typedef struct sink {
    int32_t *ids;
    size_t cap, n;
} sink;

static void emit(sink *out, int32_t id)
{
    if (out->n < out->cap) out->ids[out->n] = id;
    out->n++;
}

/* The tokens of the word's first `count` symbols, w->id[0, count), merged. */
static void bpe_merge(const colibri_encoder *enc, bpe_word *w, int32_t count, sink *out)
{
    int32_t i;
    for (i = 0; i < count; i++) {
        w->prev[i] = (int16_t)(i - 1);
        w->next[i] = (int16_t)(i + 1 < count ? i + 1 : -1);
    }
    w->n_heap = 0;
    for (i = 0; i < count; i++) set_pair(enc, w, i);
    while (w->n_heap) {
        uint32_t key = heap_pop(w);
        int32_t r = (int32_t)(key >> 8), j;
        i = (int32_t)(key & 0xff);
        if (w->prev[i] == -2 || w->rank[i] != r) continue;   /* stale: that pair changed since */
        j = w->next[i];
        w->id[i] = enc->merges[3 * (size_t)r + 2];
        w->next[i] = w->next[j];
        if (w->next[j] >= 0) w->prev[w->next[j]] = (int16_t)i;
        w->prev[j] = -2;
        set_pair(enc, w, i);
        if (w->prev[i] >= 0) set_pair(enc, w, w->prev[i]);
    }
    for (i = count ? 0 : -1; i >= 0; i = w->next[i]) emit(out, w->id[i]);
}

/* The tokens of bytes s[0, n), n <= COLIBRI_WORD_BYTES. */
static void bpe(const colibri_encoder *enc, const uint8_t *s, size_t n, bpe_word *w, sink *out)
{
    int32_t count = 0;
    size_t k;
    for (k = 0; k < n; k++) {
        int32_t id = enc->byte_ids[s[k]];
        if (id >= 0) w->id[count++] = id;   /* else not in the vocabulary, no unknown token: dropped, as `tokenizers` does */
    }
    bpe_merge(enc, w, count, out);
}

/* SentencePiece-style BPE (Llama 2, Mixtral): spaces are U+2581, one before the text; a symbol per
 * character, its own token or (byte fallback) its bytes' tokens; a word starts at each U+2581 that
 * follows another character (the converter checked no token holds U+2581 after another character,
 * so no merge crosses there), and a longer one is merged in pieces of COLIBRI_WORD_BYTES symbols. */
static const uint8_t metaspace[3] = { 0xe2, 0x96, 0x81 };   /* U+2581, which the vocabulary stores as " " */

/* One character of bytes [0, n) (a space: U+2581) onto the word; the word merged first when the
 * character starts a new one or would overfill it. */
static void spm_char(const tables *tb, bpe_word *w, int32_t *count, int *after_char, const uint8_t *bytes,
                     size_t n, int space, sink *out)
{
    const colibri_encoder *enc = tb->enc;
    int32_t id = space ? token_of(tb, (const uint8_t *)" ", 1) : token_of(tb, bytes, n);
    size_t k;
    if (space) { bytes = metaspace; n = 3; }
    if ((space && (*after_char || enc->split_spaces) && *count) || *count + (id >= 0 ? 1 : (int32_t)n) > COLIBRI_WORD_BYTES) {
        bpe_merge(enc, w, *count, out);
        *count = 0;
    }
    if (id >= 0) w->id[(*count)++] = id;
    else for (k = 0; k < n; k++) w->id[(*count)++] = enc->byte_ids[bytes[k]];   /* all 256 exist (load) */
    *after_char = !space;
}

/* The U+2581 before a stretch: always (the Prepend normalizer's form), or Metaspace's schemes: when
 * the stretch does not start with a space, "first" only for the text's first stretch. */
static void encode_spm(const tables *tb, const uint8_t *s, size_t e, int first, bpe_word *w, sink *out)
{
    const colibri_encoder *enc = tb->enc;
    int32_t count = 0;
    int after_char = 0, starts_with_space = e >= 1 && (s[0] == ' ' || (e >= 3 && memcmp(s, metaspace, 3) == 0));
    size_t i, len;
    if (e == 0) return;
    if (enc->prepend == COLIBRI_PREPEND_NORMALIZER ||
        (!starts_with_space && (enc->prepend == COLIBRI_PREPEND_ALWAYS || (enc->prepend == COLIBRI_PREPEND_FIRST && first))))
        spm_char(tb, w, &count, &after_char, metaspace, 3, 1, out);
    for (i = 0; i < e; i += len) {
        uint32_t cp = utf8_at(s, i, e, &len);
        spm_char(tb, w, &count, &after_char, s + i, len, cp == ' ' || cp == 0x2581, out);
    }
    bpe_merge(tb->enc, w, count, out);
}

/* The word s[i, end): its token (ignore_merges) or its BPE, in pieces of at most COLIBRI_WORD_BYTES. */
static void encode_word(const tables *tb, const uint8_t *s, size_t i, size_t end, bpe_word *w, sink *out)
{
    int32_t whole = tb->enc->ignore_merges ? token_of(tb, s + i, end - i) : -1;   /* Llama 3: a word that is a token */
    if (whole >= 0) { emit(out, whole); return; }
    while (i < end) {
        size_t cut = end - i <= COLIBRI_WORD_BYTES ? end : i + COLIBRI_WORD_BYTES;
        while (cut < end && cut > i + 1 && (s[cut] & 0xc0) == 0x80) cut--;   /* not inside a character */
        bpe(tb->enc, s + i, cut - i, w, out);
        i = cut;
    }
}

/* Text the pre-tokenizer sees through a window (NFC, or a prefix space): the window holds a part
 * of the normalized text, and a word that ends, or whose whitespace run reaches, within
 * COLIBRI_LOOKAHEAD bytes of its end waits for the next part (the scanners look at most a
 * character or three bytes past a word, but a whitespace run decides as a whole).  A window with
 * no finished word (a word that long is encoded in pieces anyway) gives its first pieces. */
static void encode_windowed(const tables *tb, const uint8_t *s, size_t e, bpe_word *w, sink *out)
{
    const colibri_encoder *enc = tb->enc;
    uint8_t win[COLIBRI_WINDOW];
    nfc_chunk chunk;
    size_t i = 0, n = 0, at, len;
    int more = 1;
    chunk.active = 0;
    if (enc->prefix_space && e && s[0] != ' ') win[n++] = ' ';
    while (more) {
        size_t piece = 0;
        if (enc->normalizer == COLIBRI_NORM_NFC) {
            more = colibri_nfc_fill(s, e, &i, &chunk, win, &n, sizeof win);
        } else {
            size_t k = e - i < sizeof win - n ? e - i : sizeof win - n;
            if (k < e - i) k = colibri_utf8_whole(s + i, k);   /* whole characters, but for the text's last bytes */
            memcpy(win + n, s + i, k);
            n += k; i += k;
            more = i < e;
        }
        for (at = 0; at < n;) {
            size_t end = colibri_word_end(enc->pre_tokenizer, win, at, n, &piece), j;
            if (more) {
                for (j = at; j < n && class_at(win, j, n, &len) == C_SPACE; j += len) {}
                if (end + COLIBRI_LOOKAHEAD > n || (j > at && j + COLIBRI_LOOKAHEAD > n)) break;
            }
            encode_word(tb, win, at, end, w, out);
            at = end;
        }
        if (more && at == 0) {   /* one unfinished word fills the window: its first pieces */
            at = COLIBRI_WORD_BYTES;   /* as encode_word cuts it */
            while (at > 1 && (win[at] & 0xc0) == 0x80) at--;
            encode_word(tb, win, 0, at, w, out);
        }
        memmove(win, win + at, n - at);
        n -= at;
    }
}

/* A stretch of text between added tokens (`first`: it starts the text): words, each in pieces of
 * at most COLIBRI_WORD_BYTES. */
static void encode_text(const tables *tb, const uint8_t *s, size_t e, int first, bpe_word *w, sink *out)
{
    const colibri_encoder *enc = tb->enc;
    size_t i = 0, piece = 0;
    if (enc->kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE) {
        encode_spm(tb, s, e, first, w, out);
        return;
    }
    if (enc->normalizer != COLIBRI_NORM_NONE || enc->prefix_space) {
        encode_windowed(tb, s, e, w, out);
        return;
    }
    while (i < e) {
        size_t end = colibri_word_end(enc->pre_tokenizer, s, i, e, &piece);
        encode_word(tb, s, i, end, w, out);
        i = end;
    }
}

#define ADDED_LENGTH(row) ((size_t)((row)[2] & ((1 << COLIBRI_ADDED_LENGTH_BITS) - 1)))
#define ADDED_FLAGS(row) ((row)[2] >> COLIBRI_ADDED_LENGTH_BITS)

/* The added token of the pass (`normalized`: the second) starting at s[i], longest first, or -1. */
static int32_t added_at(const colibri_encoder *enc, const uint8_t *first, const uint8_t *s, size_t i, size_t e,
                        int normalized)
{
    int32_t k;
    if (!(first[s[i] >> 3] & (1u << (s[i] & 7)))) return -1;
    for (k = 0; k < enc->n_added; k++) {
        const int32_t *a = enc->added + 3 * (size_t)k;
        size_t len = ADDED_LENGTH(a);
        if (!(ADDED_FLAGS(a) & COLIBRI_ADDED_NORMALIZED) == !normalized && len <= e - i &&
            memcmp(s + i, enc->added_bytes + a[1], len) == 0)
            return k;
    }
    return -1;
}

typedef struct added_pass {
    uint8_t first[2][32];   /* each pass's tokens' first bytes, a bit each */
    int two;                /* some tokens are matched in the second pass */
} added_pass;

/* Whether a word character (\w) ends s[start, i) or starts s[i, e). */
static int word_before(const uint8_t *s, size_t start, size_t i)
{
    size_t p = i - 1, len;
    if (i == start) return 0;
    while (p > start && i - p < 4 && (s[p] & 0xc0) == 0x80) p--;   /* back to the last character's lead byte */
    return colibri_is_word_char(utf8_at(s, p, i, &len)) && p + len == i;
}

static int word_after(const uint8_t *s, size_t i, size_t e)
{
    size_t len;
    return i < e && colibri_is_word_char(utf8_at(s, i, e, &len));
}

/* s[start, e) with the added tokens of a pass (`normalized`: the second) split out, as `tokenizers`
 * extracts them: leftmost, longest first, and grown over the whitespace before (lstrip) or after
 * (rstrip) them; the text between them goes on to the second pass, or is encoded. */
static void split_added(const tables *tb, const added_pass *ap, const uint8_t *s, size_t start, size_t e,
                        int normalized, bpe_word *w, sink *out)
{
    const colibri_encoder *enc = tb->enc;
    size_t i = start, from = start;
    for (;;) {
        int32_t k = i < e && enc->n_added ? added_at(enc, ap->first[normalized], s, i, e, normalized) : -1;
        const int32_t *row;
        size_t a, b, len;
        if (k < 0 && i < e) { i++; continue; }
        a = b = i;
        if (k >= 0) {
            row = enc->added + 3 * (size_t)k;
            b = i + ADDED_LENGTH(row);
            if ((ADDED_FLAGS(row) & COLIBRI_ADDED_SINGLE_WORD) && (word_before(s, start, i) || word_after(s, b, e))) {
                i = b;   /* not a word of its own: passed over, the search goes on after it */
                continue;
            }
            if (ADDED_FLAGS(row) & COLIBRI_ADDED_LSTRIP)
                while (a > from) {   /* back over whole whitespace characters, not past the last token */
                    size_t p = a - 1;
                    while (p > from && a - p < 4 && (s[p] & 0xc0) == 0x80) p--;
                    if (class_at(s, p, a, &len) != C_SPACE || p + len != a) break;
                    a = p;
                }
            if (ADDED_FLAGS(row) & COLIBRI_ADDED_RSTRIP)
                while (b < e && class_at(s, b, e, &len) == C_SPACE) b += len;
        }
        if (!normalized && ap->two) split_added(tb, ap, s, from, a, 1, w, out);
        else encode_text(tb, s + from, a - from, from == 0, w, out);
        if (k < 0) return;
        emit(out, enc->added[3 * (size_t)k]);
        i = from = b;
    }
}

size_t colibri_encode(const colibri_encoder *enc, const colibri_vocabulary *vocab, const uint8_t *text, size_t len,
                      int32_t *ids, size_t cap)
{
    tables tb;
    added_pass ap;
    bpe_word w;
    sink out;
    int32_t k;
    tb.enc = enc; tb.vocab = vocab;
    out.ids = ids; out.cap = cap; out.n = 0;
    if (enc->bos >= 0) emit(&out, enc->bos);
    memset(&ap, 0, sizeof ap);
    for (k = 0; k < enc->n_added; k++) {
        const int32_t *row = enc->added + 3 * (size_t)k;
        int pass = (ADDED_FLAGS(row) & COLIBRI_ADDED_NORMALIZED) != 0;
        uint8_t b = enc->added_bytes[row[1]];
        ap.first[pass][b >> 3] = (uint8_t)(ap.first[pass][b >> 3] | 1u << (b & 7));
        ap.two |= pass;
    }
    split_added(&tb, &ap, text, 0, len, 0, &w, &out);
    return out.n;
}

size_t colibri_utf8_whole(const uint8_t *s, size_t len)
{
    size_t j = len, need;
    while (j > 0 && len - j < 3 && (s[j - 1] & 0xc0) == 0x80) j--;   /* back over continuation bytes */
    if (j == 0 || s[j - 1] < 0xc2 || s[j - 1] > 0xf4) return len;   /* no lead byte there: nothing to wait for */
    need = s[j - 1] >= 0xf0 ? 4 : s[j - 1] >= 0xe0 ? 3 : 2;
    return len - (j - 1) < need ? j - 1 : len;
}

/* ---- the checks that let encoding trust every index ---- */

static colibri_status table_fail(colibri_error *err, const char *name, const char *fmt, int64_t a, int64_t b)
{
    char what[160];
    colibri_format(what, sizeof what, fmt, (long long)a, (long long)b);
    return colibri_fail(err, COLIBRI_E_VALUE, "tensor `tokenizer.%s`: %s", name, what);
}

static size_t token_len(const colibri_vocabulary *vocab, int32_t t)
{
    return (size_t)(vocab->offsets[t + 1] - vocab->offsets[t]);
}

colibri_status colibri_encoder_check(const colibri_encoder *enc, const colibri_vocabulary *vocab, size_t added_bytes,
                                     colibri_error *err)
{
    const uint8_t *bytes = vocab->bytes;
    const int32_t *offsets = vocab->offsets;
    int32_t V = vocab->size, i;
    if (enc->n_merges >= (1 << 23))
        return table_fail(err, "merges", "%lld merges, at most %lld", enc->n_merges, (1 << 23) - 1);
    for (i = 0; i < 256; i++)
        if (enc->byte_ids[i] < -1 || enc->byte_ids[i] >= V)
            return table_fail(err, "byte_ids", "entry %lld is %lld, outside [-1, vocab)", i, enc->byte_ids[i]);
    for (i = 0; i < 3 * enc->n_merges; i++)
        if (enc->merges[i] < 0 || enc->merges[i] >= V)
            return table_fail(err, "merges", "entry %lld is %lld, outside [0, vocab)", i, enc->merges[i]);
    for (i = 0; i < enc->n_merges; i++) {   /* a merged token's bytes are its parts' */
        const int32_t *r = enc->merges + 3 * (size_t)i;
        size_t a = token_len(vocab, r[0]), b = token_len(vocab, r[1]);
        const uint8_t *t = bytes + offsets[r[2]];
        if (token_len(vocab, r[2]) != a + b || memcmp(t, bytes + offsets[r[0]], a) != 0 ||
            memcmp(t + a, bytes + offsets[r[1]], b) != 0)
            return table_fail(err, "merges", "rank %lld: token %lld is not its two parts' bytes", i, r[2]);
    }
    /* strictly increasing keys: distinct ranks, so a permutation, and no pair twice */
    for (i = 0; i < enc->n_merges; i++) {
        int32_t r = enc->merge_order[i];
        if (r < 0 || r >= enc->n_merges)
            return table_fail(err, "merge_order", "entry %lld is %lld, not a rank", i, r);
        if (i) {
            const int32_t *p = enc->merges + 3 * (size_t)enc->merge_order[i - 1], *q = enc->merges + 3 * (size_t)r;
            if (p[0] > q[0] || (p[0] == q[0] && p[1] >= q[1]))
                return table_fail(err, "merge_order", "entries %lld and %lld are not in (left, right) order", i - 1, i);
        }
    }
    for (i = 0; i < enc->n_vocab_order; i++) {   /* sorted by bytes: memcmp, a prefix first */
        int32_t t = enc->vocab_order[i], p;
        size_t n, pn;
        int cmp;
        if (t < 0 || t >= V) return table_fail(err, "vocab_order", "entry %lld is %lld, outside [0, vocab)", i, t);
        if (!i) continue;
        p = enc->vocab_order[i - 1];
        n = token_len(vocab, t); pn = token_len(vocab, p);
        cmp = memcmp(bytes + offsets[p], bytes + offsets[t], pn < n ? pn : n);
        if (cmp > 0 || (cmp == 0 && pn > n))
            return table_fail(err, "vocab_order", "entries %lld and %lld are not in byte order", i - 1, i);
    }
    for (i = 0; i < enc->n_added; i++) {
        const int32_t *a = enc->added + 3 * (size_t)i;
        if (a[0] < 0 || a[0] >= V) return table_fail(err, "added", "row %lld: id %lld outside [0, vocab)", i, a[0]);
        if (a[2] < 0 || ADDED_FLAGS(a) & ~(COLIBRI_ADDED_LSTRIP | COLIBRI_ADDED_RSTRIP | COLIBRI_ADDED_NORMALIZED |
                                         COLIBRI_ADDED_SINGLE_WORD))
            return table_fail(err, "added", "row %lld: flags %lld, only lstrip 1, rstrip 2, normalized 4 and single_word 8 exist", i,
                              a[2] >> COLIBRI_ADDED_LENGTH_BITS);
        if (ADDED_LENGTH(a) < 1 || a[1] < 0 || (size_t)a[1] > added_bytes || ADDED_LENGTH(a) > added_bytes - (size_t)a[1])
            return table_fail(err, "added", "row %lld: bytes outside tokenizer.added_bytes (%lld)", i, (int64_t)added_bytes);
        if (i && ADDED_LENGTH(a) > ADDED_LENGTH(a - 3))
            return table_fail(err, "added", "row %lld is longer than row %lld (longest first)", i, i - 1);
    }
    for (i = 0; i < 256 && enc->kind == COLIBRI_ENCODER_SENTENCEPIECE_BPE; i++)
        if (enc->byte_ids[i] < 0)   /* byte fallback needs every byte's token */
            return colibri_fail(err, COLIBRI_E_VALUE, "tensor `tokenizer.byte_ids`: byte %d has no token (sentencepiece_bpe "
                                "falls back on bytes)", (int)i);
    return COLIBRI_OK;
}

/* SPDX-License-Identifier: MIT */
/* The POSIX platform: model directories read and mapped from files, session arenas
 * mapped anonymously (huge pages first, normal pages when the system has none). */
#define _POSIX_C_SOURCE 200809L
#define _DEFAULT_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__) && (defined(__aarch64__) || defined(__riscv))
#include <sys/auxv.h>
#endif
#if defined(__linux__) && defined(__aarch64__)
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

#include "../../src/model/json.h"
#include "../../src/model/loader.h"
#include "../../src/model/model.h"
#include "../../src/platform.h"
#include "../../src/util.h"

#define HUGE_PAGE (2u << 20)

colibri_status colibri_platform_map_arena(size_t size, void **base, size_t *mapped, int *hugepages,
                                          colibri_error *err)
{
    void *p = MAP_FAILED;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
#ifdef MAP_HUGETLB
    if (size >= HUGE_PAGE) {
        size_t huge = colibri_align_up(size, HUGE_PAGE);
        p = mmap(NULL, huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB, -1, 0);
        if (p != MAP_FAILED) { *base = p; *mapped = huge; *hugepages = 1; return COLIBRI_OK; }
    }
#endif
    size = colibri_align_up(size, page);
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return colibri_fail(err, COLIBRI_E_NOMEM, "cannot map a %zu-byte arena: %s", size, strerror(errno));
    *base = p; *mapped = size; *hugepages = 0;
    return COLIBRI_OK;
}

void colibri_platform_unmap_arena(void *base, size_t mapped)
{
    munmap(base, mapped);
}

const char *colibri_platform_kernels_request(void)
{
    const char *v = getenv("COLIBRI_KERNELS");
    return v && *v && strcmp(v, "auto") != 0 ? v : NULL;
}

/* What a model opened from a directory owns besides its metadata block. */
static void release_posix_model(colibri_model *m);

typedef struct posix_model {
    char *json;
    void *mapping;              /* what release unmaps: weights.bin, or a GGUF's data and the extra tensors */
    size_t mapping_len;
    size_t readable[2][2];      /* the mapping's readable spans (offset, bytes): the main file's, extra.bin's */
    char *weights_path;         /* the file the weights lie in: for expert streaming's reads (expert_io.c) */
    uint64_t weights_at;        /* where the weights start in it (a GGUF's data offset; 0 for weights.bin) */
    struct stat weights_stat;   /* that file as mapped: colibri_platform_model_check compares */
} posix_model;

const char *colibri_posix_weights_path(const colibri_model *m, uint64_t *at)
{
    if (m->release != release_posix_model) return NULL;
    *at = ((const posix_model *)m->platform)->weights_at;
    return ((const posix_model *)m->platform)->weights_path;
}

static void release_posix_model(colibri_model *m)
{
    posix_model *pm = (posix_model *)m->platform;
    if (pm->mapping) munmap(pm->mapping, pm->mapping_len);
    free(pm->json);
    free(pm->weights_path);
    free(pm);
    free(m);
}

static colibri_status path_join(char *out, size_t cap, const char *dir, const char *file, colibri_error *err)
{
    if (colibri_format(out, cap, "%s/%s", dir, file) >= cap)
        return colibri_fail(err, COLIBRI_E_ARG, "model path too long: %s", dir);
    return COLIBRI_OK;
}

/* Opens `path` for reading if it is a regular file.  O_NONBLOCK: opening a FIFO for reading would
 * otherwise wait for a writer, before fstat could refuse it (on a regular file the flag changes nothing). */
static colibri_status open_regular(const char *path, int *fd, struct stat *st, colibri_error *err)
{
    *fd = open(path, O_RDONLY | O_NONBLOCK);
    if (*fd < 0) return colibri_fail(err, COLIBRI_E_IO, "cannot open %s: %s", path, strerror(errno));
    if (fstat(*fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(*fd);
        *fd = -1;
        return colibri_fail(err, COLIBRI_E_IO, "%s is not a regular file", path);
    }
    return COLIBRI_OK;
}

/* Reads colibri_model.json whole (bounded by the JSON size limit). */
static colibri_status read_json(const char *path, char **text, size_t *len, colibri_error *err)
{
    struct stat st;
    int fd;
    size_t got = 0;
    colibri_status s = open_regular(path, &fd, &st, err);
    if (s) return s;
    if ((unsigned long long)st.st_size > (16ull << 20)) {
        close(fd);
        return colibri_fail(err, COLIBRI_E_LIMIT, "%s is %lld bytes (limit 16 MiB)", path, (long long)st.st_size);
    }
    *text = malloc((size_t)st.st_size + 1);
    if (!*text) { close(fd); return colibri_fail(err, COLIBRI_E_NOMEM, "cannot allocate %lld bytes", (long long)st.st_size); }
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, *text + got, (size_t)st.st_size - got);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    if (got != (size_t)st.st_size) {
        free(*text); *text = NULL;
        return colibri_fail(err, COLIBRI_E_IO, "short read on %s", path);
    }
    (*text)[got] = '\0';
    *len = got;
    return COLIBRI_OK;
}

/* Where a model's weights lie: weights.bin beside colibri_model.json, or, when the JSON has a
 * "weights" object, a GGUF file used in place: its data [data_offset, + data_bytes) are the
 * weights, and the few tensors colibri made for it (its vocabulary tables, tensors it joined) lie
 * in extra.bin beside the JSON, placed at extra_at in the same address range, so that every
 * tensor keeps one base pointer.  The GGUF's size and modification time are those it was
 * described from. */
typedef struct weights_source {
    int in_place;
    char name[256];             /* the GGUF's file name, for messages */
    int64_t data_offset, data_bytes, file_bytes, mtime_ns, extra_at;
} weights_source;

static colibri_status read_source(const char *json, size_t len, weights_source *src, colibri_error *err)
{
    static const char *const numbers[] = { "data_offset", "data_bytes", "file_bytes", "mtime_ns", "extra_at" };
    int64_t *values[5];
    json_token *tok;
    uint32_t n = 0, k;
    int32_t obj, i;
    colibri_status st = colibri_json_parse(json, len, NULL, 0, &n, err);
    memset(src, 0, sizeof *src);
    if (st) return st;
    tok = malloc((size_t)n * sizeof *tok);
    if (!tok) return colibri_fail(err, COLIBRI_E_NOMEM, "cannot allocate %u JSON tokens", n);
    st = colibri_json_parse(json, len, tok, n, &n, err);
    obj = st || tok[0].type != JSON_OBJECT ? -1 : colibri_json_object_get(json, tok, 0, "weights");
    values[0] = &src->data_offset; values[1] = &src->data_bytes; values[2] = &src->file_bytes;
    values[3] = &src->mtime_ns; values[4] = &src->extra_at;
    if (!st && obj >= 0) {
        src->in_place = 1;
        i = colibri_json_object_get(json, tok, obj, "format");
        if (tok[obj].type != JSON_OBJECT || i < 0 || !colibri_json_string_equals(json, &tok[i], "gguf"))
            st = colibri_fail(err, COLIBRI_E_VALUE, "model.weights must be an object with \"format\": \"gguf\"");
        i = st ? -1 : colibri_json_object_get(json, tok, obj, "name");
        if (!st && (i < 0 || tok[i].type != JSON_STRING))
            st = colibri_fail(err, COLIBRI_E_VALUE, "model.weights.name must be the GGUF's file name");
        if (!st) colibri_copy_token_text(src->name, sizeof src->name, json, &tok[i]);
        for (k = 0; !st && k < 5; k++) {
            i = colibri_json_object_get(json, tok, obj, numbers[k]);
            if (i < 0 || !colibri_json_as_int64(json, &tok[i], values[k]) || *values[k] < 0)
                st = colibri_fail(err, COLIBRI_E_VALUE, "model.weights.%s must be a non-negative integer", numbers[k]);
        }
        if (!st && (src->data_bytes > src->file_bytes || src->data_offset > src->file_bytes - src->data_bytes ||
                    src->extra_at < src->data_bytes))
            st = colibri_fail(err, COLIBRI_E_BOUNDS, "model.weights: the data [%lld, +%lld) lie past the GGUF's %lld bytes, "
                              "or extra_at %lld inside them", (long long)src->data_offset, (long long)src->data_bytes,
                              (long long)src->file_bytes, (long long)src->extra_at);
    }
    free(tok);
    return st;
}

/* pread `len` bytes at `at` of `fd` into `dst`. */
static colibri_status read_all(int fd, const char *path, uint64_t at, void *dst, size_t len, colibri_error *err)
{
    size_t got = 0;
    while (got < len) {
        size_t want = len - got < (1u << 30) ? len - got : (1u << 30);   /* Linux reads < 2 GiB per call */
        ssize_t n = pread(fd, (char *)dst + got, want, (off_t)(at + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0)
            return colibri_fail(err, COLIBRI_E_IO, "%s: %s at byte %llu", path,
                                n ? strerror(errno) : "the file ended (changed while read)", (unsigned long long)(at + got));
        got += (size_t)n;
    }
    return COLIBRI_OK;
}

/* The weights' bytes: [at, at + len) of `main_path` (all of weights.bin, or a GGUF's data), and
 * extra.bin's at extra_at past their start, mapped privately (copy-on-write, so no write of ours
 * could reach the files) into one reserved range; or, with `copy` (COLIBRI_LOAD_COPY), read into
 * anonymous memory made read-only, so a file truncated later cannot fault (SIGBUS) a read past
 * its new end.  pm->weights_stat: the main file as read. */
static colibri_status map_weights(const char *main_path, const weights_source *src, const char *extra_path, int copy,
                                  posix_model *pm, uint8_t **weights, size_t *weights_len, colibri_error *err)
{
    int fd, extra_fd = -1;
    struct stat extra_stat;
    uint64_t at = 0, len, extra_at = 0, extra_len = 0, head, page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint8_t *p = NULL;
    colibri_status s = open_regular(main_path, &fd, &pm->weights_stat, err);
    if (s) return s;
    len = (uint64_t)pm->weights_stat.st_size;
    *weights = NULL;
    *weights_len = 0;
    if (src->in_place) {
        int64_t mtime = (int64_t)pm->weights_stat.st_mtim.tv_sec * 1000000000 + pm->weights_stat.st_mtim.tv_nsec;
        if ((int64_t)len != src->file_bytes || mtime != src->mtime_ns)
            s = colibri_fail(err, COLIBRI_E_IO, "%s changed since it was described (%lld bytes then, %llu now, or "
                             "written to): open it again to describe it anew", main_path,
                             (long long)src->file_bytes, (unsigned long long)len);
        at = (uint64_t)src->data_offset;
        len = (uint64_t)src->data_bytes;
        extra_at = (uint64_t)src->extra_at;
        if (!s) s = open_regular(extra_path, &extra_fd, &extra_stat, err);
        if (!s) extra_len = (uint64_t)extra_stat.st_size;
        if (!s && extra_len && (at + extra_at) % page)
            s = colibri_fail(err, COLIBRI_E_ALIGN, "%s: extra_at %llu does not place extra.bin on a page of %llu bytes",
                             extra_path, (unsigned long long)extra_at, (unsigned long long)page);
    }
    head = at % page;   /* a mapping starts on a page: the weights start `head` bytes into it */
    pm->mapping_len = (size_t)colibri_align_up((size_t)(head + (extra_len ? extra_at + extra_len : len)), (size_t)page);
    if (!s && len + extra_len) {
        p = mmap(NULL, pm->mapping_len, copy ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            p = NULL;
            s = colibri_fail(err, COLIBRI_E_NOMEM, "cannot reserve %zu bytes for %s: %s", pm->mapping_len, main_path,
                             strerror(errno));
        }
    }
    if (p && copy) {
        s = read_all(fd, main_path, at, p + head, (size_t)len, err);
        if (!s && extra_len) s = read_all(extra_fd, extra_path, 0, p + head + extra_at, (size_t)extra_len, err);
        if (!s && mprotect(p, pm->mapping_len, PROT_READ) != 0)
            s = colibri_fail(err, COLIBRI_E_IO, "cannot make the copy of %s read-only: %s", main_path, strerror(errno));
    } else if (p) {
        if (len && mmap(p, (size_t)(head + len), PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, (off_t)(at - head)) == MAP_FAILED)
            s = colibri_fail(err, COLIBRI_E_IO, "cannot map %s (%llu bytes): %s", main_path,
                             (unsigned long long)len, strerror(errno));
        if (!s && extra_len &&
            mmap(p + head + extra_at, (size_t)extra_len, PROT_READ, MAP_PRIVATE | MAP_FIXED, extra_fd, 0) == MAP_FAILED)
            s = colibri_fail(err, COLIBRI_E_IO, "cannot map %s: %s", extra_path, strerror(errno));
    }
    close(fd);
    if (extra_fd >= 0) close(extra_fd);
    if (s) {
        if (p) munmap(p, pm->mapping_len);
        return s;
    }
    pm->mapping = p;
    pm->weights_at = at;
    pm->readable[0][1] = copy ? pm->mapping_len : (size_t)(head + len);
    pm->readable[1][0] = (size_t)(head + extra_at);
    pm->readable[1][1] = copy ? 0 : (size_t)extra_len;
    *weights = p ? p + head : NULL;
    *weights_len = (size_t)(extra_len ? extra_at + extra_len : len);
    return COLIBRI_OK;
}

/* CRC-32 of the first MiB: with the size and modification time it names a GGUF's description. */
#define SIDECAR_HASHED (1u << 20)

colibri_status colibri_gguf_sidecar(const char *gguf_path, char *dir, size_t cap, colibri_error *err)
{
    const char *root = getenv("COLIBRI_CACHE"), *base, *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char magic[4], root_buf[4096];
    uint8_t *chunk;
    uint32_t crc = 0;
    uint64_t done = 0, hashed;
    struct stat st;
    int fd, n;
    colibri_status s;
    if (!gguf_path || !dir || !cap) return colibri_fail(err, COLIBRI_E_ARG, "colibri_gguf_sidecar: NULL argument");
    s = open_regular(gguf_path, &fd, &st, err);
    if (s) return s;
    s = read_all(fd, gguf_path, 0, magic, sizeof magic, err);
    if (!s && memcmp(magic, "GGUF", 4) != 0)
        s = colibri_fail(err, COLIBRI_E_VERSION, "%s is a file but not a GGUF file: a model is a directory "
                         "(colibri_model.json, weights.bin) or a GGUF file", gguf_path);
    hashed = (uint64_t)st.st_size < SIDECAR_HASHED ? (uint64_t)st.st_size : SIDECAR_HASHED;
    chunk = s ? NULL : malloc(1u << 16);
    if (!s && !chunk) s = colibri_fail(err, COLIBRI_E_NOMEM, "out of memory");
    while (!s && done < hashed) {
        size_t n = hashed - done < (1u << 16) ? (size_t)(hashed - done) : (1u << 16);
        s = read_all(fd, gguf_path, done, chunk, n, err);
        crc = s ? crc : colibri_crc32(crc, chunk, n);
        done += n;
    }
    free(chunk);
    close(fd);
    if (s) return s;
    if (!(root && *root)) {
        if ((xdg && *xdg ? colibri_format(root_buf, sizeof root_buf, "%s/colibri", xdg)
                         : home && *home ? colibri_format(root_buf, sizeof root_buf, "%s/.cache/colibri", home)
                                         : sizeof root_buf) >= sizeof root_buf)
            return colibri_fail(err, COLIBRI_E_ARG, "no cache directory for %s's description: set COLIBRI_CACHE "
                                "(or XDG_CACHE_HOME or HOME)", gguf_path);
        root = root_buf;
    }
    base = strrchr(gguf_path, '/');
    base = base ? base + 1 : gguf_path;
    n = snprintf(dir, cap, "%s/gguf/%.120s-%lld-%lld-%08x", root, base, (long long)st.st_size,   /* NAME_MAX */
                 (long long)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec, (unsigned)crc);
    if (n < 0 || (size_t)n >= cap)
        return colibri_fail(err, COLIBRI_E_ARG, "the cache directory's path is too long: %s", root);
    return COLIBRI_OK;
}

/* The fast forms (colibri_model_repack) written into the mapping's own pages, made writable for the
 * while: the mapping is private, so each page written becomes the process's copy in place of the
 * file's, the file is never written, and the memory stays the file's size.  The routed experts wait
 * for their slots when sessions will stream them, or when the weights exceed the machine's memory
 * (rewriting them all would page).  Where the pages cannot be made writable (a strict overcommit
 * policy), the mapped tensors run as stored. */
static colibri_status repack_at_open(colibri_model *m, posix_model *pm, unsigned flags, colibri_error *err)
{
    long phys = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    int what = COLIBRI_REPACK_DENSE |
               (flags & COLIBRI_LOAD_STREAM_EXPERTS || (phys > 0 && m->weights_len / (size_t)page > (size_t)phys)
                ? 0 : COLIBRI_REPACK_EXPERTS);
    size_t need, k;
    uint8_t *scratch, *base = (uint8_t *)pm->mapping;
    colibri_status s;
    m->fast_forms = &colibri_fast_forms_here;
    need = colibri_repack_scratch(m, what);
    if (!need) return COLIBRI_OK;
    scratch = malloc(need);
    if (!scratch) return colibri_fail(err, COLIBRI_E_NOMEM, "cannot allocate %zu bytes to repack the weights", need);
    if (mprotect(base, pm->mapping_len, PROT_READ | PROT_WRITE) != 0) {
        free(scratch);
        return COLIBRI_OK;
    }
    s = colibri_model_repack(m, base + (m->weights - base), what, scratch, need, err);
    free(scratch);
    if (mprotect(base, pm->mapping_len, PROT_NONE) != 0 && !s)
        s = colibri_fail(err, COLIBRI_E_IO, "cannot make the weights read-only again: %s", strerror(errno));
    for (k = 0; k < 2; k++)
        if (pm->readable[k][1] && mprotect(base + pm->readable[k][0], pm->readable[k][1], PROT_READ) != 0 && !s)
            s = colibri_fail(err, COLIBRI_E_IO, "cannot make the weights read-only again: %s", strerror(errno));
    return s;
}

colibri_status colibri_model_open(const char *path, unsigned flags, colibri_model **out, colibri_error *err)
{
    char dir[4096], json_path[4096], main_path[4096], extra_path[4096];
    struct stat what;
    int gguf;
    weights_source src;
    posix_model *pm;
    size_t json_len = 0, meta_bytes, weights_len = 0;
    uint8_t *weights = NULL;
    void *meta = NULL;
    colibri_status st;

    if (!path || !out) return colibri_fail(err, COLIBRI_E_ARG, "colibri_model_open: NULL argument");
    *out = NULL;
    /* a file is a GGUF used in place, described in its sidecar directory; else a model directory */
    gguf = stat(path, &what) == 0 && S_ISREG(what.st_mode);
    st = gguf ? colibri_gguf_sidecar(path, dir, sizeof dir, err) : path_join(dir, sizeof dir, path, ".", err);
    if (st) return st;
    if (!st) st = path_join(json_path, sizeof json_path, dir, "colibri_model.json", err);
    if (!st && gguf && access(json_path, F_OK) != 0)
        return colibri_fail(err, COLIBRI_E_IO, "%s: no description of this GGUF yet: open it once from Python "
                            "(colibri generate --model FILE, or colibri.Model(FILE)) to make it (no weights copied)", path);
    pm = calloc(1, sizeof *pm);
    if (!pm) return colibri_fail(err, COLIBRI_E_NOMEM, "out of memory");
    if (!st) st = read_json(json_path, &pm->json, &json_len, err);
    if (!st) st = colibri_model_meta_bytes(pm->json, json_len, &meta_bytes, err);
    if (!st) st = read_source(pm->json, json_len, &src, err);
    if (!st && src.in_place && !gguf)
        st = colibri_fail(err, COLIBRI_E_ARG, "%s describes the GGUF file %s, used in place: open that file", path, src.name);
    if (!st && !src.in_place && gguf)
        st = colibri_fail(err, COLIBRI_E_VERSION, "%s: not a description of a GGUF file (no \"weights\"): remove it "
                          "and open %s again from Python", dir, path);
    if (!st) st = gguf ? path_join(main_path, sizeof main_path, path, "", err) : path_join(main_path, sizeof main_path, dir, "weights.bin", err);
    if (!st && gguf) main_path[strlen(main_path) - 1] = '\0';   /* the file itself, not "path/" */
    if (!st) st = path_join(extra_path, sizeof extra_path, dir, "extra.bin", err);
    if (!st) st = map_weights(main_path, &src, extra_path, (flags & COLIBRI_LOAD_COPY) != 0, pm, &weights, &weights_len, err);
    if (!st) {   /* absolute: later checks and expert reads must not depend on the working directory */
        pm->weights_path = realpath(main_path, NULL);
        if (!pm->weights_path) st = colibri_fail(err, COLIBRI_E_IO, "cannot resolve %s: %s", main_path, strerror(errno));
    }
    if (!st) {
        meta = malloc(meta_bytes);   /* malloc aligns to 16 on every POSIX ABI we target */
        if (!meta) st = colibri_fail(err, COLIBRI_E_NOMEM, "cannot allocate %zu bytes of model metadata", meta_bytes);
    }
    if (!st) st = colibri_model_load(pm->json, json_len, weights, weights_len, flags, meta, meta_bytes, out, err);
    if (!st && !(flags & COLIBRI_LOAD_AS_STORED)) st = repack_at_open(*out, pm, flags, err);
    if (st) {
        *out = NULL;
        if (pm->mapping) munmap(pm->mapping, pm->mapping_len);
        free(pm->json);
        free(pm->weights_path);
        free(pm);
        free(meta);
        return st;
    }
    (*out)->platform = pm;
    (*out)->release = release_posix_model;
    return COLIBRI_OK;
}

colibri_status colibri_platform_model_check(const colibri_model *model, colibri_error *err)
{
    const posix_model *pm;
    struct stat now;
    if (!model || model->release != release_posix_model) return COLIBRI_OK;
    pm = (const posix_model *)model->platform;
    if (stat(pm->weights_path, &now) != 0)
        return colibri_fail(err, COLIBRI_E_IO, "%s changed since the model was opened (%s): reopen the model",
                            pm->weights_path, strerror(errno));
    if (now.st_dev != pm->weights_stat.st_dev || now.st_ino != pm->weights_stat.st_ino)
        return colibri_fail(err, COLIBRI_E_IO, "%s changed since the model was opened (replaced by another file): "
                            "reopen the model", pm->weights_path);
    if (now.st_size != pm->weights_stat.st_size)
        return colibri_fail(err, COLIBRI_E_IO, "%s changed since the model was opened (%lld bytes, then %lld): "
                            "reopen the model", pm->weights_path, (long long)pm->weights_stat.st_size, (long long)now.st_size);
    if (now.st_mtim.tv_sec != pm->weights_stat.st_mtim.tv_sec || now.st_mtim.tv_nsec != pm->weights_stat.st_mtim.tv_nsec)
        return colibri_fail(err, COLIBRI_E_IO, "%s changed since the model was opened (written to: its modification time moved): reopen the model",
                            pm->weights_path);
    return COLIBRI_OK;
}

colibri_status colibri_model_check_file(const colibri_model *model, colibri_error *err)
{
    return colibri_platform_model_check(model, err);
}

uint64_t colibri_platform_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void colibri_platform_once(int32_t *done, void (*fn)(void))
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    if (__atomic_load_n(done, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&lock);
    if (!*done) {
        fn();
        __atomic_store_n(done, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&lock);
}

int colibri_platform_arm_dotprod(void)
{
#if defined(__linux__) && defined(__aarch64__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
    return 0;
#endif
}

int colibri_platform_riscv_vector(void)
{
#if defined(__linux__) && defined(__riscv) && __riscv_xlen == 64
    return (getauxval(AT_HWCAP) & (1ul << ('V' - 'A'))) != 0;
#else
    return 0;
#endif
}

/* ---- the thread pool ---- */

/* A job is `parts` independent parts that threads claim one at a time, the caller too, so a
 * thread that a busy neighbour slows takes fewer parts instead of holding the others up.  The
 * claim word packs (generation, parts, next part): a worker claims by compare-and-swap only
 * within the generation it saw, so a late worker never touches a finished job, and the caller
 * waits only for parts in flight, never for a worker to show up.  Idle workers spin on the word
 * for a short while (the next job of a decode step comes within microseconds), then sleep on a
 * condition variable.  A sleeper announces itself before its last check and the other side
 * looks after its own store (both sequentially consistent), so no wake-up is lost. */
#define SPIN_ROUNDS 20000   /* ~50-100 us of pause instructions before sleeping */

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct worker_start { struct colibri_pool *pool; int32_t part; } worker_start;

struct colibri_pool {
    int32_t threads;                /* the caller included */
    pthread_t *workers;             /* (threads), [0] unused: the caller is part 0 */
    worker_start *starts;           /* (threads) each worker's pool and part, read as it starts */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    uint64_t claim;                 /* generation << 32 | parts << 16 | next part (atomic) */
    int32_t finished;               /* parts of the current job done (atomic) */
    int32_t sleeping_workers;       /* workers waiting on `wake` (atomic) */
    int32_t caller_sleeping;        /* the caller waits on `done` (atomic) */
    int32_t stopping;
    void (*fn)(void *context, int32_t part, int32_t parts);
    void *context;
};

#define CLAIM_GENERATION(c) ((uint32_t)((c) >> 32))
#define CLAIM_PARTS(c) ((int32_t)(((c) >> 16) & 0xffffu))
#define CLAIM_NEXT(c) ((int32_t)((c) & 0xffffu))

static uint64_t load_claim(colibri_pool *pool) { return __atomic_load_n(&pool->claim, __ATOMIC_SEQ_CST); }

/* Claims and runs parts of job `generation` until none is left. */
static void run_parts(colibri_pool *pool, uint32_t generation)
{
    uint64_t c = load_claim(pool);
    while (CLAIM_GENERATION(c) == generation && CLAIM_NEXT(c) < CLAIM_PARTS(c)) {
        if (__atomic_compare_exchange_n(&pool->claim, &c, c + 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            pool->fn(pool->context, CLAIM_NEXT(c), CLAIM_PARTS(c));   /* published before the claim word */
            if (__atomic_add_fetch(&pool->finished, 1, __ATOMIC_SEQ_CST) == CLAIM_PARTS(c)
                && __atomic_load_n(&pool->caller_sleeping, __ATOMIC_SEQ_CST)) {
                pthread_mutex_lock(&pool->lock);
                pthread_cond_signal(&pool->done);
                pthread_mutex_unlock(&pool->lock);
            }
            c = load_claim(pool);
        }   /* else c holds the word's new value: try again */
    }
}

static void *worker(void *arg)
{
    colibri_pool *pool = ((worker_start *)arg)->pool;
    uint32_t seen = 0;
    for (;;) {
        int32_t spin;
        for (spin = 0; spin < SPIN_ROUNDS && CLAIM_GENERATION(load_claim(pool)) == seen; spin++) cpu_relax();
        if (CLAIM_GENERATION(load_claim(pool)) == seen) {
            pthread_mutex_lock(&pool->lock);
            __atomic_add_fetch(&pool->sleeping_workers, 1, __ATOMIC_SEQ_CST);
            while (CLAIM_GENERATION(load_claim(pool)) == seen && !__atomic_load_n(&pool->stopping, __ATOMIC_SEQ_CST))
                pthread_cond_wait(&pool->wake, &pool->lock);
            __atomic_sub_fetch(&pool->sleeping_workers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&pool->lock);
        }
        if (__atomic_load_n(&pool->stopping, __ATOMIC_SEQ_CST)) break;
        seen = CLAIM_GENERATION(load_claim(pool));
        run_parts(pool, seen);
    }
    return NULL;
}

int32_t colibri_platform_default_threads(void)
{
    const char *env = getenv("COLIBRI_THREADS");
    long n = env ? strtol(env, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int32_t)n;
}

colibri_status colibri_platform_pool_create(int32_t threads, colibri_pool **out, colibri_error *err)
{
    colibri_pool *pool;
    worker_start *starts;
    int32_t i, started = 0;
    *out = NULL;
    if (threads < 2 || threads > 256)
        return colibri_fail(err, COLIBRI_E_ARG, "threads = %d: a pool has 2 to 256", threads);
    pool = calloc(1, sizeof *pool);
    starts = calloc((size_t)threads, sizeof *starts);
    if (pool) pool->workers = calloc((size_t)threads, sizeof *pool->workers);
    if (!pool || !starts || !pool->workers) {
        if (pool) free(pool->workers);
        free(pool);
        free(starts);
        return colibri_fail(err, COLIBRI_E_NOMEM, "no memory for a pool of %d threads", threads);
    }
    pool->threads = threads;
    pool->starts = starts;
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->wake, NULL);
    pthread_cond_init(&pool->done, NULL);
    for (i = 1; i < threads; i++) {
        starts[i].pool = pool;
        starts[i].part = i;
        if (pthread_create(&pool->workers[i], NULL, worker, &starts[i]) != 0) break;
        started++;
    }
    if (started != threads - 1) {
        pool->threads = started + 1;
        colibri_platform_pool_destroy(pool);
        return colibri_fail(err, COLIBRI_E_NOMEM, "could start %d of %d threads", started + 1, threads);
    }
    *out = pool;
    return COLIBRI_OK;
}

void colibri_platform_pool_run(colibri_pool *pool, void (*fn)(void *context, int32_t part, int32_t parts), void *context,
                               int32_t parts)
{
    uint32_t generation = CLAIM_GENERATION(load_claim(pool)) + 1;
    int32_t spin;
    if (parts < 1) return;
    if (parts > 0xffff) parts = 0xffff;   /* each part then covers more */
    pool->fn = fn;
    pool->context = context;
    __atomic_store_n(&pool->finished, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&pool->claim, (uint64_t)generation << 32 | (uint64_t)parts << 16, __ATOMIC_SEQ_CST);   /* publishes */
    if (__atomic_load_n(&pool->sleeping_workers, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&pool->lock);
        pthread_cond_broadcast(&pool->wake);
        pthread_mutex_unlock(&pool->lock);
    }
    run_parts(pool, generation);
    for (spin = 0; spin < SPIN_ROUNDS && __atomic_load_n(&pool->finished, __ATOMIC_SEQ_CST) < parts; spin++) cpu_relax();
    if (__atomic_load_n(&pool->finished, __ATOMIC_SEQ_CST) < parts) {
        pthread_mutex_lock(&pool->lock);
        __atomic_store_n(&pool->caller_sleeping, 1, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&pool->finished, __ATOMIC_SEQ_CST) < parts) pthread_cond_wait(&pool->done, &pool->lock);
        __atomic_store_n(&pool->caller_sleeping, 0, __ATOMIC_SEQ_CST);
        pthread_mutex_unlock(&pool->lock);
    }
}

void colibri_platform_pool_destroy(colibri_pool *pool)
{
    int32_t i;
    pthread_mutex_lock(&pool->lock);
    __atomic_store_n(&pool->stopping, 1, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (i = 1; i < pool->threads; i++) pthread_join(pool->workers[i], NULL);
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    free(pool->workers);
    free(pool->starts);
    free(pool);
}

/* SPDX-License-Identifier: MIT */
#include "util.h"

#include <string.h>

#include "platform.h"

typedef struct out_buf { char *buf; size_t cap; size_t len; } out_buf;

static void put_char(out_buf *o, char c)
{
    if (o->len + 1 < o->cap) o->buf[o->len] = c;
    o->len++;
}

static void put_str(out_buf *o, const char *s)
{
    if (!s) s = "(null)";
    while (*s) put_char(o, *s++);
}

static void put_unsigned(out_buf *o, unsigned long long v, unsigned base)
{
    char digits[24];
    int n = 0;
    do {
        unsigned d = (unsigned)(v % base);
        digits[n++] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
        v /= base;
    } while (v);
    while (n) put_char(o, digits[--n]);
}

static void put_signed(out_buf *o, long long v)
{
    if (v < 0) { put_char(o, '-'); put_unsigned(o, 0ull - (unsigned long long)v, 10); }
    else put_unsigned(o, (unsigned long long)v, 10);
}

size_t colibri_vformat(char *buf, size_t cap, const char *fmt, va_list ap)
{
    out_buf o;
    o.buf = buf; o.cap = cap; o.len = 0;
    for (; *fmt; fmt++) {
        if (*fmt != '%') { put_char(&o, *fmt); continue; }
        fmt++;
        switch (*fmt) {
        case 's': put_str(&o, va_arg(ap, const char *)); break;
        case 'c': put_char(&o, (char)va_arg(ap, int)); break;
        case 'd': put_signed(&o, va_arg(ap, int)); break;
        case 'u': put_unsigned(&o, va_arg(ap, unsigned), 10); break;
        case 'x': put_unsigned(&o, va_arg(ap, unsigned), 16); break;
        case 'p': put_str(&o, "0x"); put_unsigned(&o, (unsigned long long)(uintptr_t)va_arg(ap, void *), 16); break;
        case 'z': fmt++; put_unsigned(&o, va_arg(ap, size_t), 10); break;   /* %zu */
        case 'l':
            if (fmt[1] == 'l') {
                fmt += 2;
                if (*fmt == 'd') put_signed(&o, va_arg(ap, long long));
                else put_unsigned(&o, va_arg(ap, unsigned long long), 10);
            } else {
                fmt++;
                if (*fmt == 'd') put_signed(&o, va_arg(ap, long));
                else put_unsigned(&o, va_arg(ap, unsigned long), 10);
            }
            break;
        case '%': put_char(&o, '%'); break;
        case '\0': fmt--; break;
        default: put_char(&o, '%'); put_char(&o, *fmt); break;
        }
    }
    if (cap) buf[o.len < cap ? o.len : cap - 1] = '\0';
    return o.len;
}

size_t colibri_format(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    size_t n;
    va_start(ap, fmt);
    n = colibri_vformat(buf, cap, fmt, ap);
    va_end(ap);
    return n;
}

colibri_status colibri_fail(colibri_error *err, colibri_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->status = status;
        va_start(ap, fmt);
        colibri_vformat(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* Each status's enumerator name and fixed description, keyed by the status. */
#define STATUS(code, text) [code] = { #code, text }
static const struct { const char *name, *text; } statuses[] = {
    STATUS(COLIBRI_OK, "success"),
    STATUS(COLIBRI_E_ARG, "invalid argument"),
    STATUS(COLIBRI_E_IO, "file cannot be read"),
    STATUS(COLIBRI_E_JSON, "invalid JSON"),
    STATUS(COLIBRI_E_LIMIT, "JSON exceeds a limit"),
    STATUS(COLIBRI_E_VERSION, "unsupported format version"),
    STATUS(COLIBRI_E_MISSING, "required field missing"),
    STATUS(COLIBRI_E_TYPE, "field has the wrong type"),
    STATUS(COLIBRI_E_VALUE, "field value out of range"),
    STATUS(COLIBRI_E_DTYPE, "unknown tensor dtype"),
    STATUS(COLIBRI_E_TENSOR, "tensor missing, duplicated or unknown"),
    STATUS(COLIBRI_E_SHAPE, "tensor shape mismatch"),
    STATUS(COLIBRI_E_SIZE, "tensor size mismatch"),
    STATUS(COLIBRI_E_ALIGN, "tensor offset misaligned"),
    STATUS(COLIBRI_E_BOUNDS, "tensor past the end of weights.bin"),
    STATUS(COLIBRI_E_OVERLAP, "tensors overlap"),
    STATUS(COLIBRI_E_CHECKSUM, "tensor checksum mismatch"),
    STATUS(COLIBRI_E_NOMEM, "out of memory"),
    STATUS(COLIBRI_E_CONTEXT, "context full"),
    STATUS(COLIBRI_E_TOKEN, "token id out of range"),
    STATUS(COLIBRI_E_DEVICE, "a device failed to compute"),
};
#undef STATUS
COLIBRI_TABLE_CHECK(statuses, COLIBRI_STATUS_COUNT);

const char *colibri_status_name(colibri_status status)
{
    return (unsigned)status < COLIBRI_STATUS_COUNT ? statuses[status].name : "COLIBRI_E_UNKNOWN";
}

const char *colibri_strerror(colibri_status status)
{
    return (unsigned)status < COLIBRI_STATUS_COUNT ? statuses[status].text : "unknown status";
}

uint64_t colibri_profile_start(const uint64_t *profile) { return profile ? colibri_platform_now_ns() : 0; }

void colibri_profile_add(uint64_t *profile, int32_t phase, uint64_t *since)
{
    uint64_t now;
    if (!profile) return;
    now = colibri_platform_now_ns();
    profile[phase] += now - *since;
    *since = now;
}

#include "util.h"

#include <string.h>

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

static const char *const status_names[COLIBRI_STATUS_COUNT] = {
    "COLIBRI_OK", "COLIBRI_E_ARG", "COLIBRI_E_IO", "COLIBRI_E_JSON", "COLIBRI_E_LIMIT",
    "COLIBRI_E_VERSION", "COLIBRI_E_MISSING", "COLIBRI_E_TYPE", "COLIBRI_E_VALUE",
    "COLIBRI_E_DTYPE", "COLIBRI_E_TENSOR", "COLIBRI_E_SHAPE", "COLIBRI_E_SIZE",
    "COLIBRI_E_ALIGN", "COLIBRI_E_BOUNDS", "COLIBRI_E_OVERLAP", "COLIBRI_E_CHECKSUM",
    "COLIBRI_E_NOMEM", "COLIBRI_E_CONTEXT", "COLIBRI_E_TOKEN",
};

static const char *const status_texts[COLIBRI_STATUS_COUNT] = {
    "success", "invalid argument", "file cannot be read", "invalid JSON",
    "JSON exceeds a limit", "unsupported format version", "required field missing",
    "field has the wrong type", "field value out of range", "unknown tensor dtype",
    "tensor missing, duplicated or unknown", "tensor shape mismatch", "tensor size mismatch",
    "tensor offset misaligned", "tensor past the end of weights.bin", "tensors overlap",
    "tensor checksum mismatch", "out of memory", "context full", "token id out of range",
};

const char *colibri_status_name(colibri_status status)
{
    return (unsigned)status < COLIBRI_STATUS_COUNT ? status_names[status] : "COLIBRI_E_UNKNOWN";
}

const char *colibri_strerror(colibri_status status)
{
    return (unsigned)status < COLIBRI_STATUS_COUNT ? status_texts[status] : "unknown status";
}

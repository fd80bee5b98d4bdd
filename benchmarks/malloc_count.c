/* Counts the allocator calls of a whole process, for benchmarks/soak.py: LD_PRELOAD this
 * library and name a file in MALLOC_COUNT_FILE; at exit it writes there
 * "malloc N calloc N realloc N memalign N free N" (free(NULL) not counted).
 *
 *   cc -O2 -shared -fPIC benchmarks/malloc_count.c -o build/soak/malloc_count.so
 *
 * glibc only: the counters forward to glibc's __libc_* entry points, as c_core/tests/test_no_alloc.c. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void *__libc_memalign(size_t align, size_t size);
extern void __libc_free(void *p);

static long n_malloc, n_calloc, n_realloc, n_memalign, n_free;   /* atomically added: threads allocate too */
static volatile int done;

#define COUNT(c) do { if (!done) __atomic_fetch_add(&(c), 1, __ATOMIC_RELAXED); } while (0)

void *malloc(size_t size) { COUNT(n_malloc); return __libc_malloc(size); }
void *calloc(size_t n, size_t size) { COUNT(n_calloc); return __libc_calloc(n, size); }
void *realloc(void *p, size_t size) { COUNT(n_realloc); return __libc_realloc(p, size); }
void free(void *p) { if (p) COUNT(n_free); __libc_free(p); }
void *memalign(size_t align, size_t size) { COUNT(n_memalign); return __libc_memalign(align, size); }
void *aligned_alloc(size_t align, size_t size) { COUNT(n_memalign); return __libc_memalign(align, size); }

int posix_memalign(void **out, size_t align, size_t size)
{
    void *p;
    COUNT(n_memalign);
    p = __libc_memalign(align, size);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

__attribute__((destructor)) static void report(void)
{
    const char *path = getenv("MALLOC_COUNT_FILE");
    char line[160];
    int fd, len;
    done = 1;
    if (!path) return;
    len = snprintf(line, sizeof line, "malloc %ld calloc %ld realloc %ld memalign %ld free %ld\n",
                   n_malloc, n_calloc, n_realloc, n_memalign, n_free);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    if (len > 0 && write(fd, line, (size_t)len) != len) len = -1;
    close(fd);
}

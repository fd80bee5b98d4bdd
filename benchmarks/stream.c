/* A STREAM-style triad, a[i] = b[i] + s * c[i], on T threads over arrays far larger than the
 * caches: the memory bandwidth decode can hope for.  Prints the best of R rounds in GB/s
 * (STREAM's count: 3 arrays x 8 bytes per element).
 *
 *   cc -O2 -pthread stream.c -o stream && ./stream THREADS [MIB_PER_ARRAY] [ROUNDS] */
#define _POSIX_C_SOURCE 199309L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct part { double *a, *b, *c; size_t n; } part;

static void *triad(void *arg)
{
    part *p = arg;
    size_t i;
    for (i = 0; i < p->n; i++) p->a[i] = p->b[i] + 3.0 * p->c[i];
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 1, rounds = argc > 3 ? atoi(argv[3]) : 10, r, t;
    size_t n = (size_t)(argc > 2 ? atoi(argv[2]) : 512) * 1024 * 1024 / sizeof(double), i;
    double *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b), *c = malloc(n * sizeof *c), best = 0.0;
    pthread_t tid[64];
    part parts[64];
    if (!a || !b || !c || threads < 1 || threads > 64) return 1;
    for (i = 0; i < n; i++) { a[i] = 0.0; b[i] = 1.0; c[i] = 2.0; }
    for (r = 0; r < rounds; r++) {
        double start = now(), seconds;
        for (t = 0; t < threads; t++) {
            size_t lo = n * t / threads, hi = n * (t + 1) / threads;
            parts[t].a = a + lo; parts[t].b = b + lo; parts[t].c = c + lo; parts[t].n = hi - lo;
            pthread_create(&tid[t], NULL, triad, &parts[t]);
        }
        for (t = 0; t < threads; t++) pthread_join(tid[t], NULL);
        seconds = now() - start;
        if (3.0 * 8.0 * (double)n / seconds / 1e9 > best) best = 3.0 * 8.0 * (double)n / seconds / 1e9;
    }
    printf("%.2f\n", best + 0.0 * a[n / 2]);
    return 0;
}

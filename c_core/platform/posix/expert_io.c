/* SPDX-License-Identifier: MIT */
/* Expert streaming's reader on POSIX: one I/O thread made with the session performs the reads the
 * forward pass queues (platform.h), urgent ones first, from the caller's read function or from
 * weights.bin with pread (O_DIRECT on request, so the page cache is bypassed).  The queues are
 * lists threaded through the read table (colibri_io_read.next), one per urgency. */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../src/model/model.h"
#include "../../src/platform.h"
#include "../../src/util.h"

const char *colibri_posix_weights_path(const colibri_model *m, uint64_t *at);   /* posix.c */

struct colibri_io {
    colibri_read_fn read;
    void *context;
    int fd;                     /* the weights' file when the platform reads it, else -1 */
    uint64_t at;                /* where the weights start in it (a GGUF's data offset) */
    colibri_io_read *reads;     /* in the session arena */
    int32_t head[2], tail[2];   /* the queues: [0] speculative reads, [1] urgent ones; -1 empty */
    int stopping;
    pthread_mutex_t lock;
    pthread_cond_t work;        /* a read was queued, or stop */
    pthread_cond_t done;        /* a read finished */
    pthread_t thread;
};

/* pread until `len` bytes or the end of the file; -errno on an error. */
static int64_t read_file(void *context, uint64_t offset, void *dst, size_t len)
{
    const colibri_io *io = (const colibri_io *)context;
    size_t got = 0;
    while (got < len) {
        ssize_t n = pread(io->fd, (uint8_t *)dst + got, len - got, (off_t)(io->at + offset + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -(int64_t)errno;
        if (n == 0) break;
        got += (size_t)n;
    }
    return (int64_t)got;
}

static void push(colibri_io *io, int32_t i, int32_t urgent)
{
    io->reads[i].next = -1;
    io->reads[i].urgent = urgent;
    if (io->tail[urgent] >= 0) io->reads[io->tail[urgent]].next = i;
    else io->head[urgent] = i;
    io->tail[urgent] = i;
}

/* Takes read i out of its queue (a walk of that queue: reads queued, not the table). */
static void unlink_read(colibri_io *io, int32_t i)
{
    int32_t u = io->reads[i].urgent, prev = -1, at = io->head[u];
    while (at >= 0 && at != i) { prev = at; at = io->reads[at].next; }
    if (at < 0) return;
    if (prev >= 0) io->reads[prev].next = io->reads[i].next;
    else io->head[u] = io->reads[i].next;
    if (io->tail[u] == i) io->tail[u] = prev;
}

static void *io_thread(void *arg)
{
    colibri_io *io = arg;
    pthread_mutex_lock(&io->lock);
    for (;;) {
        colibri_io_read *r;
        int32_t i;
        int64_t result;
        while (!io->stopping && io->head[0] < 0 && io->head[1] < 0) pthread_cond_wait(&io->work, &io->lock);
        if (io->stopping) break;
        i = io->head[1] >= 0 ? io->head[1] : io->head[0];
        unlink_read(io, i);
        r = &io->reads[i];
        r->state = COLIBRI_IO_BUSY;
        pthread_mutex_unlock(&io->lock);
        result = io->read(io->context, r->offset, r->dst, r->len);   /* the table entry is ours while BUSY */
        pthread_mutex_lock(&io->lock);
        r->result = result;
        r->state = COLIBRI_IO_DONE;
        pthread_cond_broadcast(&io->done);
    }
    pthread_mutex_unlock(&io->lock);
    return NULL;
}

colibri_status colibri_platform_io_create(const colibri_model *model, colibri_read_fn read, void *context, int direct,
                                          colibri_io_read *reads, int32_t n_reads, void *state, colibri_io **out,
                                          colibri_error *err)
{
    colibri_io *io;
    (void)state; (void)n_reads;   /* the heap holds the thread's state; the queues need no size */
    *out = NULL;
    io = calloc(1, sizeof *io);
    if (!io) return colibri_fail(err, COLIBRI_E_NOMEM, "no memory for the expert reader");
    io->fd = -1;
    io->read = read;
    io->context = context;
    io->reads = reads;
    io->head[0] = io->head[1] = io->tail[0] = io->tail[1] = -1;
    if (!read) {
        const char *path = colibri_posix_weights_path(model, &io->at);
        if (!path) {
            free(io);
            return colibri_fail(err, COLIBRI_E_ARG, "expert streaming: the model was not opened from a file; "
                                "pass expert_read in the session options");
        }
        if (direct && io->at % 4096) {   /* the cache aligns offsets within the weights to direct I/O's blocks */
            uint64_t at = io->at;
            free(io);
            return colibri_fail(err, COLIBRI_E_IO, "%s: its weights start at byte %llu, not on a 4096-byte block: "
                                "stream without direct I/O", path, (unsigned long long)at);
        }
        io->fd = open(path, O_RDONLY | O_NONBLOCK | (direct ? O_DIRECT : 0));   /* never wait on a FIFO */
        if (io->fd < 0) {
            int e = errno;
            free(io);
            if (direct && e == EINVAL)
                return colibri_fail(err, COLIBRI_E_IO, "%s: its file system does not take O_DIRECT (direct I/O): "
                                    "stream without it", path);
            return colibri_fail(err, COLIBRI_E_IO, "cannot open %s for expert streaming: %s", path, strerror(e));
        }
        io->read = read_file;
        io->context = io;
    }
    pthread_mutex_init(&io->lock, NULL);
    pthread_cond_init(&io->work, NULL);
    pthread_cond_init(&io->done, NULL);
    if (pthread_create(&io->thread, NULL, io_thread, io) != 0) {
        pthread_cond_destroy(&io->done);
        pthread_cond_destroy(&io->work);
        pthread_mutex_destroy(&io->lock);
        if (io->fd >= 0) close(io->fd);
        free(io);
        return colibri_fail(err, COLIBRI_E_NOMEM, "cannot start the expert I/O thread");
    }
    *out = io;
    return COLIBRI_OK;
}

int colibri_platform_io_async(const colibri_io *io) { (void)io; return 1; }

void colibri_platform_io_submit(colibri_io *io, int32_t i, int urgent)
{
    colibri_io_read *r = &io->reads[i];
    pthread_mutex_lock(&io->lock);
    r->state = COLIBRI_IO_QUEUED;
    push(io, i, urgent != 0);
    pthread_cond_signal(&io->work);
    pthread_mutex_unlock(&io->lock);
}

int64_t colibri_platform_io_wait(colibri_io *io, int32_t i)
{
    colibri_io_read *r = &io->reads[i];
    int64_t result;
    pthread_mutex_lock(&io->lock);
    if (r->state == COLIBRI_IO_QUEUED && !r->urgent) {   /* waited for: ahead of the guesses */
        unlink_read(io, i);
        push(io, i, 1);
    }
    while (r->state == COLIBRI_IO_QUEUED || r->state == COLIBRI_IO_BUSY) pthread_cond_wait(&io->done, &io->lock);
    result = r->result;
    pthread_mutex_unlock(&io->lock);
    return result;
}

int colibri_platform_io_idle(colibri_io *io, int32_t i)
{
    int idle;
    pthread_mutex_lock(&io->lock);
    idle = io->reads[i].state == COLIBRI_IO_DONE || io->reads[i].state == COLIBRI_IO_IDLE;
    pthread_mutex_unlock(&io->lock);
    return idle;
}

int colibri_platform_io_cancel(colibri_io *io, int32_t i)
{
    int dropped = 0;
    pthread_mutex_lock(&io->lock);
    if (io->reads[i].state == COLIBRI_IO_QUEUED) {
        unlink_read(io, i);
        io->reads[i].state = COLIBRI_IO_IDLE;
        dropped = 1;
    }
    pthread_mutex_unlock(&io->lock);
    return dropped;
}

void colibri_platform_io_destroy(colibri_io *io)
{
    if (!io) return;
    pthread_mutex_lock(&io->lock);
    io->stopping = 1;
    pthread_cond_signal(&io->work);
    pthread_mutex_unlock(&io->lock);
    pthread_join(io->thread, NULL);
    pthread_cond_destroy(&io->done);
    pthread_cond_destroy(&io->work);
    pthread_mutex_destroy(&io->lock);
    if (io->fd >= 0) close(io->fd);
    free(io);
}

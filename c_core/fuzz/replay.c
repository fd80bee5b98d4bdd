/* SPDX-License-Identifier: MIT */
/* The harnesses without libFuzzer: each argument (a file, or a directory of files) is read and
 * given to LLVMFuzzerTestOneInput once, so any compiler replays the corpus and the regressions.
 *
 *   fuzz_NAME FILE_OR_DIR... */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path, size_t *count)
{
    FILE *f = fopen(path, "rb");
    unsigned char *data = NULL;
    long size;
    size_t got;

    if (!f) { fprintf(stderr, "cannot read %s\n", path); return 1; }
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "cannot size %s\n", path);
        fclose(f);
        return 1;
    }
    data = malloc(size ? (size_t)size : 1);   /* exactly the input: ASan sees any read past it */
    got = data ? fread(data, 1, (size_t)size, f) : 0;
    fclose(f);
    if (got != (size_t)size) { fprintf(stderr, "cannot read %s\n", path); free(data); return 1; }
    LLVMFuzzerTestOneInput(data, (size_t)size);
    free(data);
    (*count)++;
    return 0;
}

static int replay(const char *path, size_t *count)
{
    struct stat st;
    DIR *dir;
    struct dirent *e;
    int failed = 0;

    if (stat(path, &st) != 0) { fprintf(stderr, "no such input: %s\n", path); return 1; }
    if (!S_ISDIR(st.st_mode)) return replay_file(path, count);
    dir = opendir(path);
    if (!dir) { fprintf(stderr, "cannot list %s\n", path); return 1; }
    while ((e = readdir(dir)) != NULL) {
        char child[4096];
        if (e->d_name[0] == '.' && (e->d_name[1] == 0 || (e->d_name[1] == '.' && e->d_name[2] == 0))) continue;
        if ((size_t)snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= sizeof child) continue;
        if (stat(child, &st) == 0 && S_ISREG(st.st_mode)) failed |= replay_file(child, count);
    }
    closedir(dir);
    return failed;
}

int main(int argc, char **argv)
{
    size_t count = 0;
    int i, failed = 0;

    LLVMFuzzerInitialize(&argc, &argv);
    for (i = 1; i < argc; i++) failed |= replay(argv[i], &count);
    printf("%zu inputs replayed\n", count);
    return failed;
}

/* fuzz_fs.h - a private folder for the targets that read files.
 *
 * fuzz_fs_init() makes a fresh folder under $TMPDIR (or /tmp) once per
 * process and removes it at exit; the targets write their inputs there and
 * point every path the code under test opens into it, so a fuzz run never
 * reads or writes anything else. */
#ifndef KEMBALI_FUZZ_FS_H
#define KEMBALI_FUZZ_FS_H

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The folder (set once by fuzz_fs_init, read-only afterwards). */
static char fuzz_dir[PATH_MAX];

static inline int fuzz_rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

static inline void fuzz_fs_cleanup(void)
{
    if (fuzz_dir[0])
        nftw(fuzz_dir, fuzz_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* Make the folder; aborts when it cannot (a harness, not the program). */
static inline void fuzz_fs_init(const char *what)
{
    const char *t = getenv("TMPDIR");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/kembali-%s-XXXXXX", t && *t ? t : "/tmp", what);
    if (mkdtemp(fuzz_dir) == NULL) {
        perror("mkdtemp");
        abort();
    }
    atexit(fuzz_fs_cleanup);
}

/* fuzz_dir/rel, in a static buffer per call site's choice (out, cap). */
static inline const char *fuzz_path(char *out, size_t cap, const char *rel)
{
    snprintf(out, cap, "%s/%s", fuzz_dir, rel);
    return out;
}

static inline void fuzz_mkdir(const char *rel)
{
    char p[PATH_MAX];
    if (mkdir(fuzz_path(p, sizeof p, rel), 0700) != 0) {
        perror(p);
        abort();
    }
}

/* Write n bytes to fuzz_dir/rel with mode `mode`, replacing it. */
static inline void fuzz_write(const char *rel, const void *data, size_t n, mode_t mode)
{
    char p[PATH_MAX];
    fuzz_path(p, sizeof p, rel);
    FILE *f = fopen(p, "wb");
    if (f == NULL || (n > 0 && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(p);
        abort();
    }
    chmod(p, mode);
}

static inline void fuzz_unlink(const char *rel)
{
    char p[PATH_MAX];
    unlink(fuzz_path(p, sizeof p, rel));
}

/* A set of pages for every word in both locales under fuzz_dir/rel. */
static inline void fuzz_write_templates(const char *rel, int skip_every)
{
    static const char *const words[] = {
        "succeeded", "failed", "canceled", "expired", "checking", "not_found", "invalid", "unknown_shop",
    };
    static const char *const locales[] = {"id", "en"};
    char p[PATH_MAX];
    fuzz_mkdir(rel);
    for (int l = 0; l < 2; l++) {
        snprintf(p, sizeof p, "%s/%s", rel, locales[l]);
        fuzz_mkdir(p);
        for (int w = 0; w < 8; w++) {
            if (skip_every && w % skip_every == 0)
                continue;
            char page[512];
            int n = snprintf(page, sizeof page,
                             "<!doctype html><html lang=\"%s\" data-status=\"{{status}}\"><title>{{shop_name}}</title>"
                             "<!--card--><p>%s {{id}}</p><a href=\"{{shop_url}}\">back</a> <a href=\"{{retry_url}}\">again</a>"
                             "<!--/card--></html>\n",
                             locales[l], words[w]);
            snprintf(p, sizeof p, "%s/%s/%s.html", rel, locales[l], words[w]);
            fuzz_write(p, page, (size_t)n, 0644);
        }
    }
}

#endif

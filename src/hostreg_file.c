/* hostreg_file.c - the host registry in state_dir: its lock, reading it,
 * replacing it atomically. See hostreg.h. */
#include "hostreg.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int hostreg_lock(const char *dir, char *why, size_t whylen)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/%s", dir, HOSTREG_LOCK) >= (int)sizeof path) {
        snprintf(why, whylen, "state_dir %.200s...: the path is too long", dir);
        return -1;
    }
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        snprintf(why, whylen, "state_dir %s: %s", dir, strerror(errno));
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        return -1;
    }
    /* bounded: a process stopped while it holds the lock must not keep
     * every other one from reloading (nor stall its loop) for good */
    for (int waited = 0;; waited += HOSTREG_LOCK_STEP_MS) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0)
            return fd;
        if (errno != EWOULDBLOCK && errno != EINTR) {
            snprintf(why, whylen, "%s: cannot lock it: %s", path, strerror(errno));
            break;
        }
        if (waited >= HOSTREG_LOCK_WAIT_MS) {
            snprintf(why, whylen, "%s: another process has held it for %d ms (a reload stopped half-way?)", path,
                     HOSTREG_LOCK_WAIT_MS);
            break;
        }
        struct timespec ts = {0, HOSTREG_LOCK_STEP_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    close(fd);
    return -1;
}

void hostreg_unlock(int fd)
{
    if (fd >= 0)
        close(fd); /* releases the flock */
}

int hostreg_load(const char *dir, struct hostreg *out, char *why, size_t whylen)
{
    char path[4200];
    out->e = NULL;
    out->n = 0;
    if (snprintf(path, sizeof path, "%s/%s", dir, HOSTREG_FILE) >= (int)sizeof path) {
        snprintf(why, whylen, "state_dir %.200s...: the path is too long", dir);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT)
        return 0; /* nothing held yet */
    if (fd < 0) {
        snprintf(why, whylen, "%s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > HOSTREG_MAX_BYTES) {
        snprintf(why, whylen, "%s: not a regular file of at most %d MiB", path, HOSTREG_MAX_BYTES >> 20);
        close(fd);
        return -1;
    }
    size_t len = (size_t)st.st_size, n = 0;
    char *buf = malloc(len + 1);
    if (buf == NULL) {
        snprintf(why, whylen, "%s: out of memory", path);
        close(fd);
        return -1;
    }
    while (n < len) {
        ssize_t r = read(fd, buf + n, len - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        n += (size_t)r;
    }
    int rerr = errno;
    close(fd);
    if (n < len) {
        snprintf(why, whylen, "%s: cannot read it: %s", path, n == 0 && rerr ? strerror(rerr) : "cut short");
        free(buf);
        return -1;
    }
    char pwhy[300];
    int rc = hostreg_parse(buf, len, out, pwhy, sizeof pwhy);
    free(buf);
    if (rc != 0)
        snprintf(why, whylen, "%s: %s (it is kembali's: remove it only to forget who holds which host)", path,
                 pwhy);
    return rc;
}

int hostreg_save(const char *dir, const struct hostreg *r, char *why, size_t whylen)
{
    char path[4200], tmp[4210];
    if (snprintf(path, sizeof path, "%s/%s", dir, HOSTREG_FILE) >= (int)sizeof path) {
        snprintf(why, whylen, "state_dir %.200s...: the path is too long", dir);
        return -1;
    }
    snprintf(tmp, sizeof tmp, "%s.new", path);
    size_t len;
    char *buf = hostreg_format(r, &len);
    if (buf == NULL) {
        snprintf(why, whylen, "%s: out of memory", path);
        return -1;
    }
    unlink(tmp); /* left by a process that died while writing (we hold the lock) */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(why, whylen, "%s: %s", tmp, strerror(errno));
        free(buf);
        return -1;
    }
    size_t n = 0;
    while (n < len) {
        ssize_t w = write(fd, buf + n, len - n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        n += (size_t)w;
    }
    free(buf);
    const char *step = n < len ? "cannot write it" : fsync(fd) != 0 ? "cannot sync it" : NULL;
    int err = errno;
    if (close(fd) != 0 && step == NULL) {
        step = "cannot write it";
        err = errno;
    }
    if (step == NULL && rename(tmp, path) != 0) {
        step = "cannot put it in place";
        err = errno;
    }
    if (step != NULL) {
        snprintf(why, whylen, "%s: %s: %s", tmp, step, strerror(err));
        unlink(tmp);
        return -1;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) { /* the rename itself, on disk */
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

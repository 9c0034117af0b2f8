/* An LD_PRELOAD shim that records, in order, what a process asks the OS to make of the files
 * under one store directory: every write with its offset and bytes, every sync, file creation,
 * truncation, rename and unlink. tools/harness/powerloss/crash.py turns a recording into the states a
 * disk could hold after a power cut. Built at test time with the machine's C compiler
 * (tools/harness/powerloss/record.py); no binary is committed.
 *
 * Environment:
 *   PL_RECORD  the recording file (appended); unset by the shim, so child processes do not record
 *   PL_STORE   the store directory: only it and what is under it are recorded
 *   PL_MARKER  a file outside the store whose writes are recorded as MARK events (the writer's
 *              acknowledgements, in order with the store's writes)
 *   PL_EXCLUDE a file name not to record, in any directory of the store (lock.mdb: shared memory,
 *              not state)
 *   PL_DROP    planted faults, for proving a workload needs a sync: comma-separated KIND:SUFFIX
 *              rules; a matching call still runs but is left out of the recording, so the crash
 *              states are those of a program that never made it. KIND is fsync, fdatasync (of a
 *              file), dirsync (fsync/fdatasync of a directory) or dsync (an O_DSYNC/O_SYNC write,
 *              recorded as a plain one); SUFFIX must end the absolute path ("" matches every path;
 *              "*TEXT" matches every path that contains TEXT).
 *
 * The libc functions are interposed (py-lmdb's bundled LMDB calls open, pwrite, writev, lseek,
 * fdatasync, fsync, msync and ftruncate through the dynamic linker). Each recorded call runs under
 * one mutex, so threads' events are recorded in the order the OS saw the calls complete.
 * Descriptors duplicated with dup/dup2/fcntl(F_DUPFD) are not followed: neither LMDB nor the
 * engine duplicates one.
 *
 * Writes through a shared writable mapping of a store file (LMDB's MDB_WRITEMAP, which the engine
 * uses where nothing syncs at a commit) make no call to see. So each such mapping keeps a shadow
 * of the file's bytes as last recorded, and at each msync or munmap of it the pages that differ
 * are recorded as writes of that file (an msync of it then as its fdatasync). They are recorded
 * when synced or unmapped, not when stored: the model has them land no earlier than that, which
 * can only hide a bug of a writer that relies on its file between two syncs, as none may (a
 * `process` writer's store is refused after a power cut while it is open).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
    EV_CREATE = 1,   /* path: a file was created (it did not exist before the open) */
    EV_WRITE = 2,    /* path, offset, bytes; flags & 1: through an O_DSYNC/O_SYNC descriptor */
    EV_FSYNC = 3,    /* path: fsync; flags & 1: of a directory */
    EV_FDATASYNC = 4,/* path; flags & 1: of a directory */
    EV_MSYNC = 5,    /* no path: msync of a mapping (LMDB's writemap only) */
    EV_SFR = 6,      /* path: sync_file_range (not a durability point) */
    EV_TRUNCATE = 7, /* path, offset = new length */
    EV_RENAME = 8,   /* path = "old\0new" */
    EV_UNLINK = 9,   /* path */
    EV_SYNC = 10,    /* sync() or syncfs(): every file */
    EV_MARK = 11,    /* bytes written to PL_MARKER */
    EV_MKDIR = 12,   /* path */
};

struct header {
    uint32_t type;
    uint32_t flags;
    uint64_t offset;
    uint64_t length;   /* bytes following the path */
    uint32_t path_length;
    uint32_t pad;
};

#define MAX_FD 65536
enum { KIND_NONE = 0, KIND_FILE = 1, KIND_DIR = 2, KIND_MARKER = 3 };
struct tracked { unsigned char kind; unsigned char dsync; unsigned char append; char *path; };
static struct tracked fds[MAX_FD];
static int record_fd = -1;
static char store[PATH_MAX];
static size_t store_length;
static char marker[PATH_MAX];
static char exclude[NAME_MAX + 1];
#define MAX_DROPS 16
struct drop { char kind[16]; char suffix[PATH_MAX]; };
static struct drop drops[MAX_DROPS];
static int drop_count;
static pthread_mutex_t lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static __thread int inside;

/* A planted fault: is a `kind` call on `path` to be left out of the recording? */
static int dropped(const char *kind, const char *path) {
    if (!path) return 0;
    size_t length = strlen(path);
    for (int i = 0; i < drop_count; i++) {
        size_t tail = strlen(drops[i].suffix);
        if (strcmp(drops[i].kind, kind) != 0) continue;
        if (drops[i].suffix[0] == '*' ? strstr(path, drops[i].suffix + 1) != NULL
                                      : tail <= length && strcmp(path + length - tail, drops[i].suffix) == 0)
            return 1;
    }
    return 0;
}

static void parse_drops(const char *rules) {
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", rules);
    char *save = NULL;
    for (char *rule = strtok_r(copy, ",", &save); rule && drop_count < MAX_DROPS; rule = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(rule, ':');
        if (!colon) continue;
        *colon = 0;
        snprintf(drops[drop_count].kind, sizeof drops[drop_count].kind, "%s", rule);
        snprintf(drops[drop_count].suffix, sizeof drops[drop_count].suffix, "%s", colon + 1);
        drop_count++;
    }
}

#define REAL(name) static __typeof__(name) *real_##name; if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

static void emit(uint32_t type, uint32_t flags, uint64_t offset, const char *path, size_t path_length,
                 const struct iovec *data, int count, size_t length) {
    struct header h = {type, flags, offset, length, (uint32_t)path_length, 0};
    struct iovec iov[66];
    int n = 0;
    iov[n].iov_base = &h; iov[n++].iov_len = sizeof h;
    if (path_length) { iov[n].iov_base = (void *)path; iov[n++].iov_len = path_length; }
    size_t left = length;
    for (int i = 0; i < count && left > 0 && n < 66; i++) {
        size_t take = data[i].iov_len < left ? data[i].iov_len : left;
        iov[n].iov_base = data[i].iov_base; iov[n++].iov_len = take;
        left -= take;
    }
    size_t total = 0;
    for (int i = 0; i < n; i++) total += iov[i].iov_len;
    /* one writev to an O_APPEND file: a whole event or (if the process dies inside) a torn tail */
    ssize_t done = syscall(SYS_writev, record_fd, iov, n);
    if (done != (ssize_t)total) {
        static const char message[] = "recorder: short write to the recording\n";
        syscall(SYS_write, 2, message, sizeof message - 1);
        abort();
    }
}

static void emit_path(uint32_t type, uint32_t flags, uint64_t offset, const char *path) {
    emit(type, flags, offset, path, strlen(path), NULL, 0, 0);
}

/* The absolute path of `path` (relative to `dirfd`), its directory resolved (the file itself need
 * not exist yet); NULL when the directory does not exist. */
static char *absolute(int dirfd, const char *path) {
    if (path == NULL) return NULL;
    char joined[PATH_MAX * 2];
    if (path[0] == '/') {
        snprintf(joined, sizeof joined, "%s", path);
    } else {
        char base[PATH_MAX];
        if (dirfd == AT_FDCWD) {
            if (!getcwd(base, sizeof base)) return NULL;
        } else {
            char link[64];
            snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
            ssize_t n = readlink(link, base, sizeof base - 1);
            if (n < 0) return NULL;
            base[n] = 0;
        }
        snprintf(joined, sizeof joined, "%s/%s", base, path);
    }
    char resolved[PATH_MAX];
    if (!realpath(joined, resolved)) {
        char *slash = strrchr(joined, '/');
        if (!slash) return NULL;
        *slash = 0;
        char parent[PATH_MAX];
        if (!realpath(joined[0] ? joined : "/", parent)) return NULL;
        snprintf(resolved, sizeof resolved, "%s/%s", parent, slash + 1);
    }
    return strdup(resolved);
}

/* The absolute path of `path` when it is the store directory or anything under it (and not named
 * as the excluded file); NULL otherwise. */
static char *store_path(int dirfd, const char *path) {
    if (record_fd < 0) return NULL;
    char *resolved = absolute(dirfd, path);
    if (!resolved) return NULL;
    const char *rest = resolved + store_length;
    const char *base = strrchr(resolved, '/') + 1;
    int inside_store = strncmp(resolved, store, store_length) == 0 &&
        (rest[0] == 0 || (rest[0] == '/' && !(exclude[0] && strcmp(base, exclude) == 0)));
    if (!inside_store) { free(resolved); return NULL; }
    return resolved;
}

static int is_marker(int dirfd, const char *path) {
    if (record_fd < 0 || !marker[0] || path == NULL) return 0;
    char *where = absolute(dirfd, path);
    int same = where && strcmp(where, marker) == 0;
    free(where);
    return same;
}

__attribute__((constructor)) static void recorder_init(void) {
    const char *record = getenv("PL_RECORD");
    const char *dir = getenv("PL_STORE");
    if (!record || !dir) return;
    record_fd = (int)syscall(SYS_open, record, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (record_fd < 0) return;
    char parent[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash && slash != parent) {
        *slash = 0;
        char real_parent[PATH_MAX];
        if (realpath(parent, real_parent)) snprintf(store, sizeof store, "%s/%s", real_parent, slash + 1);
        else snprintf(store, sizeof store, "%s", dir);
    } else {
        snprintf(store, sizeof store, "%s", dir);
    }
    store_length = strlen(store);
    const char *mark = getenv("PL_MARKER");
    if (mark) {
        char *where = absolute(AT_FDCWD, mark);
        if (where) { snprintf(marker, sizeof marker, "%s", where); free(where); }
    }
    const char *skip = getenv("PL_EXCLUDE");
    if (skip) snprintf(exclude, sizeof exclude, "%s", skip);
    const char *drop = getenv("PL_DROP");
    if (drop) parse_drops(drop);
    unsetenv("PL_RECORD");  /* child processes (and their children) do not record */
    unsetenv("LD_PRELOAD");
}

static void track(int fd, char *path, int flags, int dir) {
    if (fd < 0 || fd >= MAX_FD) { free(path); return; }
    free(fds[fd].path);
    fds[fd].path = path;
    fds[fd].kind = dir ? KIND_DIR : KIND_FILE;
    fds[fd].dsync = (flags & (O_DSYNC | O_SYNC)) != 0;
    fds[fd].append = (flags & O_APPEND) != 0;
}

static int opened(int dirfd, const char *path, int flags, mode_t mode, int at) {
    REAL(openat);
    if (record_fd < 0 || inside) return real_openat(dirfd, path, flags, mode);
    inside = 1;
    int result;
    if (is_marker(dirfd, path)) {
        result = real_openat(dirfd, path, flags, mode);
        if (result >= 0 && result < MAX_FD) {
            free(fds[result].path);
            fds[result].path = NULL;
            fds[result].kind = KIND_MARKER;
        }
        inside = 0;
        return result;
    }
    char *where = store_path(at ? dirfd : AT_FDCWD, path);
    if (!where) {
        result = real_openat(dirfd, path, flags, mode);
        if (result >= 0 && result < MAX_FD && fds[result].kind) { free(fds[result].path); fds[result].path = NULL; fds[result].kind = 0; }
        inside = 0;
        return result;
    }
    pthread_mutex_lock(&lock);
    struct stat before;
    int existed = stat(where, &before) == 0;
    result = real_openat(dirfd, path, flags, mode);
    if (result >= 0) {
        struct stat after;
        int dir = fstat(result, &after) == 0 && S_ISDIR(after.st_mode);
        if (!existed && (flags & O_CREAT)) emit_path(EV_CREATE, 0, 0, where);
        if ((flags & O_TRUNC) && existed && !dir) emit_path(EV_TRUNCATE, 0, 0, where);
        track(result, where, flags, dir);
    } else {
        free(where);
    }
    pthread_mutex_unlock(&lock);
    inside = 0;
    return result;
}

static mode_t mode_of(int flags, va_list args) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(args, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list args; va_start(args, flags); mode_t mode = mode_of(flags, args); va_end(args);
    return opened(AT_FDCWD, path, flags, mode, 0);
}
int open64(const char *path, int flags, ...) {
    va_list args; va_start(args, flags); mode_t mode = mode_of(flags, args); va_end(args);
    return opened(AT_FDCWD, path, flags, mode, 0);
}
int openat(int dirfd, const char *path, int flags, ...) {
    va_list args; va_start(args, flags); mode_t mode = mode_of(flags, args); va_end(args);
    return opened(dirfd, path, flags, mode, 1);
}
int openat64(int dirfd, const char *path, int flags, ...) {
    va_list args; va_start(args, flags); mode_t mode = mode_of(flags, args); va_end(args);
    return opened(dirfd, path, flags, mode, 1);
}
int __open_2(const char *path, int flags) { return opened(AT_FDCWD, path, flags, 0, 0); }
int __open64_2(const char *path, int flags) { return opened(AT_FDCWD, path, flags, 0, 0); }
int __openat_2(int dirfd, const char *path, int flags) { return opened(dirfd, path, flags, 0, 1); }
int creat(const char *path, mode_t mode) { return opened(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }
int creat64(const char *path, mode_t mode) { return opened(AT_FDCWD, path, O_CREAT | O_WRONLY | O_TRUNC, mode, 0); }

int close(int fd) {
    REAL(close);
    if (fd >= 0 && fd < MAX_FD && fds[fd].kind) {
        pthread_mutex_lock(&lock);
        free(fds[fd].path);
        fds[fd].path = NULL;
        fds[fd].kind = 0;
        int result = real_close(fd);
        pthread_mutex_unlock(&lock);
        return result;
    }
    return real_close(fd);
}

static int watched(int fd) {
    return record_fd >= 0 && fd >= 0 && fd < MAX_FD && fds[fd].kind != KIND_NONE && !inside;
}

/* A write of `done` bytes from `iov` at `offset` (-1: the descriptor's offset before the call). */
static void wrote(int fd, const struct iovec *iov, int count, ssize_t done, uint64_t offset) {
    if (done <= 0) return;
    if (fds[fd].kind == KIND_MARKER) {
        emit(EV_MARK, 0, 0, NULL, 0, iov, count, (size_t)done);
    } else if (fds[fd].kind == KIND_FILE) {
        emit(EV_WRITE, fds[fd].dsync && !dropped("dsync", fds[fd].path), offset, fds[fd].path, strlen(fds[fd].path), iov, count, (size_t)done);
    }
}

static uint64_t current_offset(int fd) {
    REAL(lseek);
    if (fds[fd].append) {
        struct stat st;
        return fstat(fd, &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    off_t at = real_lseek(fd, 0, SEEK_CUR);
    return at < 0 ? 0 : (uint64_t)at;
}

ssize_t write(int fd, const void *buffer, size_t count) {
    REAL(write);
    if (!watched(fd)) return real_write(fd, buffer, count);
    pthread_mutex_lock(&lock);
    uint64_t offset = current_offset(fd);
    ssize_t done = real_write(fd, buffer, count);
    struct iovec iov = {(void *)buffer, count};
    wrote(fd, &iov, 1, done, offset);
    pthread_mutex_unlock(&lock);
    return done;
}

ssize_t pwrite(int fd, const void *buffer, size_t count, off_t offset) {
    REAL(pwrite);
    if (!watched(fd)) return real_pwrite(fd, buffer, count, offset);
    pthread_mutex_lock(&lock);
    ssize_t done = real_pwrite(fd, buffer, count, offset);
    struct iovec iov = {(void *)buffer, count};
    wrote(fd, &iov, 1, done, (uint64_t)offset);
    pthread_mutex_unlock(&lock);
    return done;
}

ssize_t pwrite64(int fd, const void *buffer, size_t count, off_t offset) { return pwrite(fd, buffer, count, offset); }

ssize_t writev(int fd, const struct iovec *iov, int count) {
    REAL(writev);
    if (!watched(fd)) return real_writev(fd, iov, count);
    pthread_mutex_lock(&lock);
    uint64_t offset = current_offset(fd);
    ssize_t done = real_writev(fd, iov, count);
    wrote(fd, iov, count, done, offset);
    pthread_mutex_unlock(&lock);
    return done;
}

ssize_t pwritev(int fd, const struct iovec *iov, int count, off_t offset) {
    REAL(pwritev);
    if (!watched(fd)) return real_pwritev(fd, iov, count, offset);
    pthread_mutex_lock(&lock);
    ssize_t done = real_pwritev(fd, iov, count, offset);
    wrote(fd, iov, count, done, (uint64_t)offset);
    pthread_mutex_unlock(&lock);
    return done;
}

ssize_t pwritev64(int fd, const struct iovec *iov, int count, off_t offset) { return pwritev(fd, iov, count, offset); }

ssize_t pwritev2(int fd, const struct iovec *iov, int count, off_t offset, int flags) {
    REAL(pwritev2);
    if (!watched(fd)) return real_pwritev2(fd, iov, count, offset, flags);
    pthread_mutex_lock(&lock);
    uint64_t at = offset == -1 ? current_offset(fd) : (uint64_t)offset;
    ssize_t done = real_pwritev2(fd, iov, count, offset, flags);
    if (done > 0 && fds[fd].kind == KIND_FILE)
        emit(EV_WRITE, (fds[fd].dsync || (flags & (RWF_DSYNC | RWF_SYNC))) && !dropped("dsync", fds[fd].path) ? 1 : 0, at, fds[fd].path,
             strlen(fds[fd].path), iov, count, (size_t)done);
    else
        wrote(fd, iov, count, done, at);
    pthread_mutex_unlock(&lock);
    return done;
}

ssize_t pwritev64v2(int fd, const struct iovec *iov, int count, off_t offset, int flags) {
    return pwritev2(fd, iov, count, offset, flags);
}

static int synced(int fd, int result, uint32_t type) {
    const char *kind = fds[fd].kind == KIND_DIR ? "dirsync" : type == EV_FSYNC ? "fsync" : type == EV_FDATASYNC ? "fdatasync" : "";
    if (dropped(kind, fds[fd].path)) return result;
    if (result == 0 && fds[fd].kind != KIND_MARKER) emit_path(type, fds[fd].kind == KIND_DIR, 0, fds[fd].path);
    return result;
}

int fsync(int fd) {
    REAL(fsync);
    if (!watched(fd)) return real_fsync(fd);
    pthread_mutex_lock(&lock);
    int result = synced(fd, real_fsync(fd), EV_FSYNC);
    pthread_mutex_unlock(&lock);
    return result;
}

int fdatasync(int fd) {
    REAL(fdatasync);
    if (!watched(fd)) return real_fdatasync(fd);
    pthread_mutex_lock(&lock);
    int result = synced(fd, real_fdatasync(fd), EV_FDATASYNC);
    pthread_mutex_unlock(&lock);
    return result;
}

int sync_file_range(int fd, off64_t offset, off64_t count, unsigned int flags) {
    REAL(sync_file_range);
    if (!watched(fd)) return real_sync_file_range(fd, offset, count, flags);
    pthread_mutex_lock(&lock);
    int result = synced(fd, real_sync_file_range(fd, offset, count, flags), EV_SFR);
    pthread_mutex_unlock(&lock);
    return result;
}

#define MAX_MAPS 16
#define SHADOW_PAGE 4096
#define MAX_RUN (64 * SHADOW_PAGE)
struct mapping { char *base; size_t length; off_t offset; int fd; char *path; unsigned char *shadow; };
static struct mapping maps[MAX_MAPS];

static struct mapping *mapping_at(const void *address) {
    for (int i = 0; i < MAX_MAPS; i++)
        if (maps[i].base && (const char *)address >= maps[i].base && (const char *)address < maps[i].base + maps[i].length)
            return &maps[i];
    return NULL;
}

/* Record as writes the pages of `m` that differ from its shadow (bounded by the file's size: a
 * page past the end is not there to read), and make the shadow what was recorded. */
static void record_mapped(struct mapping *m) {
    size_t length = m->length;
    struct stat st;
    if (fds[m->fd].kind == KIND_FILE && fds[m->fd].path && strcmp(fds[m->fd].path, m->path) == 0 && fstat(m->fd, &st) == 0) {
        uint64_t end = st.st_size > m->offset ? (uint64_t)(st.st_size - m->offset) : 0;
        if (end < length) length = (size_t)end;
    }
    size_t at = 0;
    while (at < length) {
        size_t n = length - at < SHADOW_PAGE ? length - at : SHADOW_PAGE;
        if (memcmp(m->base + at, m->shadow + at, n) == 0) { at += n; continue; }
        size_t start = at;
        while (at < length && at - start < MAX_RUN) {
            n = length - at < SHADOW_PAGE ? length - at : SHADOW_PAGE;
            if (memcmp(m->base + at, m->shadow + at, n) == 0) break;
            at += n;
        }
        struct iovec iov = {m->base + start, at - start};
        emit(EV_WRITE, 0, (uint64_t)m->offset + start, m->path, strlen(m->path), &iov, 1, at - start);
        memcpy(m->shadow + start, m->base + start, at - start);
    }
}

static void *mapped(void *result, size_t length, int prot, int flags, int fd, off_t offset) {
    if (result == MAP_FAILED || !watched(fd) || fds[fd].kind != KIND_FILE || !(prot & PROT_WRITE) || !(flags & MAP_SHARED))
        return result;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MAPS; i++) {
        if (maps[i].base) continue;
        unsigned char *shadow = malloc(length);
        if (!shadow) break;
        ssize_t got = pread(fd, shadow, length, offset);
        if (got < 0) got = 0;
        memset(shadow + got, 0, length - (size_t)got);
        maps[i] = (struct mapping){result, length, offset, fd, strdup(fds[fd].path), shadow};
        pthread_mutex_unlock(&lock);
        return result;
    }
    static const char message[] = "recorder: cannot follow a writable mapping of a store file\n";
    syscall(SYS_write, 2, message, sizeof message - 1);
    abort();
}

void *mmap(void *address, size_t length, int prot, int flags, int fd, off_t offset) {
    REAL(mmap);
    return mapped(real_mmap(address, length, prot, flags, fd, offset), length, prot, flags, fd, offset);
}

void *mmap64(void *address, size_t length, int prot, int flags, int fd, off_t offset) {
    REAL(mmap64);
    return mapped(real_mmap64(address, length, prot, flags, fd, offset), length, prot, flags, fd, offset);
}

int munmap(void *address, size_t length) {
    REAL(munmap);
    if (record_fd < 0 || inside) return real_munmap(address, length);
    pthread_mutex_lock(&lock);
    struct mapping *m = mapping_at(address);
    if (m && m->base == (char *)address) {  /* what the process stored and never synced stays in the file */
        record_mapped(m);
        free(m->shadow);
        free(m->path);
        *m = (struct mapping){0};
    }
    int result = real_munmap(address, length);
    pthread_mutex_unlock(&lock);
    return result;
}

int msync(void *address, size_t length, int flags) {
    REAL(msync);
    if (record_fd < 0 || inside) return real_msync(address, length, flags);
    pthread_mutex_lock(&lock);
    struct mapping *m = mapping_at(address);
    if (m) record_mapped(m);
    int result = real_msync(address, length, flags);
    if (result == 0 && (flags & MS_SYNC)) {
        if (m) { if (!dropped("fdatasync", m->path)) emit_path(EV_FDATASYNC, 0, 0, m->path); }
        else emit(EV_MSYNC, (uint32_t)flags, (uint64_t)(uintptr_t)address, NULL, 0, NULL, 0, 0);
    }
    pthread_mutex_unlock(&lock);
    return result;
}

void sync(void) {
    REAL(sync);
    pthread_mutex_lock(&lock);
    real_sync();
    if (record_fd >= 0) emit(EV_SYNC, 0, 0, NULL, 0, NULL, 0, 0);
    pthread_mutex_unlock(&lock);
}

int syncfs(int fd) {
    REAL(syncfs);
    pthread_mutex_lock(&lock);
    int result = real_syncfs(fd);
    if (result == 0 && record_fd >= 0) emit(EV_SYNC, 0, 0, NULL, 0, NULL, 0, 0);
    pthread_mutex_unlock(&lock);
    return result;
}

int ftruncate(int fd, off_t length) {
    REAL(ftruncate);
    if (!watched(fd) || fds[fd].kind != KIND_FILE) return real_ftruncate(fd, length);
    pthread_mutex_lock(&lock);
    int result = real_ftruncate(fd, length);
    if (result == 0) emit_path(EV_TRUNCATE, 0, (uint64_t)length, fds[fd].path);
    pthread_mutex_unlock(&lock);
    return result;
}

int ftruncate64(int fd, off_t length) { return ftruncate(fd, length); }

int truncate(const char *path, off_t length) {
    REAL(truncate);
    char *where = inside ? NULL : store_path(AT_FDCWD, path);
    if (!where) return real_truncate(path, length);
    pthread_mutex_lock(&lock);
    int result = real_truncate(path, length);
    if (result == 0) emit_path(EV_TRUNCATE, 0, (uint64_t)length, where);
    pthread_mutex_unlock(&lock);
    free(where);
    return result;
}

static int renamed(int olddir, const char *old, int newdir, const char *new, unsigned flags, int at) {
    REAL(renameat2);
    char *from = inside ? NULL : store_path(at ? olddir : AT_FDCWD, old);
    char *to = inside ? NULL : store_path(at ? newdir : AT_FDCWD, new);
    if (!from && !to) return real_renameat2(olddir, old, newdir, new, flags);
    pthread_mutex_lock(&lock);
    int result = real_renameat2(olddir, old, newdir, new, flags);
    if (result == 0) {
        const char *a = from ? from : "", *b = to ? to : "";
        size_t la = strlen(a), lb = strlen(b);
        char *both = malloc(la + lb + 2);
        memcpy(both, a, la + 1);
        memcpy(both + la + 1, b, lb + 1);
        emit(EV_RENAME, 0, 0, both, la + lb + 1, NULL, 0, 0);
        free(both);
    }
    pthread_mutex_unlock(&lock);
    free(from);
    free(to);
    return result;
}

int rename(const char *old, const char *new) { return renamed(AT_FDCWD, old, AT_FDCWD, new, 0, 0); }
int renameat(int olddir, const char *old, int newdir, const char *new) { return renamed(olddir, old, newdir, new, 0, 1); }
int renameat2(int olddir, const char *old, int newdir, const char *new, unsigned flags) {
    return renamed(olddir, old, newdir, new, flags, 1);
}

static int unlinked(int dirfd, const char *path, int flags, int at) {
    REAL(unlinkat);
    char *where = inside ? NULL : store_path(at ? dirfd : AT_FDCWD, path);
    if (!where) return real_unlinkat(dirfd, path, flags);
    pthread_mutex_lock(&lock);
    int result = real_unlinkat(dirfd, path, flags);
    if (result == 0) emit_path(EV_UNLINK, 0, 0, where);
    pthread_mutex_unlock(&lock);
    free(where);
    return result;
}

int unlink(const char *path) { return unlinked(AT_FDCWD, path, 0, 0); }
int unlinkat(int dirfd, const char *path, int flags) { return unlinked(dirfd, path, flags, 1); }

/* rmdir is recorded as an unlink of the (empty) directory's name */
int rmdir(const char *path) {
    REAL(rmdir);
    char *where = inside ? NULL : store_path(AT_FDCWD, path);
    if (!where) return real_rmdir(path);
    pthread_mutex_lock(&lock);
    int result = real_rmdir(path);
    if (result == 0) emit_path(EV_UNLINK, 0, 0, where);
    pthread_mutex_unlock(&lock);
    free(where);
    return result;
}

int mkdirat(int dirfd, const char *path, mode_t mode) {
    REAL(mkdirat);
    char *where = inside ? NULL : store_path(dirfd, path);
    if (!where) return real_mkdirat(dirfd, path, mode);
    pthread_mutex_lock(&lock);
    int result = real_mkdirat(dirfd, path, mode);
    if (result == 0) emit_path(EV_MKDIR, 0, 0, where);
    pthread_mutex_unlock(&lock);
    free(where);
    return result;
}

int mkdir(const char *path, mode_t mode) {
    REAL(mkdir);
    char *where = inside ? NULL : store_path(AT_FDCWD, path);
    if (!where) return real_mkdir(path, mode);
    pthread_mutex_lock(&lock);
    int result = real_mkdir(path, mode);
    if (result == 0) emit_path(EV_MKDIR, 0, 0, where);
    pthread_mutex_unlock(&lock);
    free(where);
    return result;
}

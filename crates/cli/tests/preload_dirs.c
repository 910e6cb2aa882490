/* Directory streams as a C program sees them, for the preload tests: run under
 * `orion run` and plainly through the mount, it must print the same lines. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int by_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists `fd` with getdents64 into a buffer of `size` bytes (small: several calls);
 * prints the names that are not "." or "..", sorted, with their types and whether
 * each record's d_off is where the next one starts (lseek agrees). */
static int raw_listing(int fd, size_t size, const char *what) {
    char buf[4096], *names[256];
    int n = 0, offsets_agree = 1;
    for (;;) {
        ssize_t got = getdents64(fd, buf, size);
        if (got < 0) {
            perror("getdents64");
            return -1;
        }
        if (got == 0)
            break;
        for (ssize_t at = 0; at < got;) {
            struct dirent64 *d = (struct dirent64 *)(buf + at);
            at += d->d_reclen;
            if (at == got && d->d_off != lseek(fd, 0, SEEK_CUR))
                offsets_agree = 0;
            if (strcmp(d->d_name, ".") && strcmp(d->d_name, "..") && n < 256) {
                char *s = malloc(strlen(d->d_name) + 8);
                sprintf(s, "%s %d", d->d_name, d->d_type);
                names[n++] = s;
            }
        }
    }
    qsort(names, n, sizeof names[0], by_name);
    printf("getdents64 %s:", what);
    for (int i = 0; i < n; i++) {
        printf(" %s", names[i]);
        free(names[i]);
    }
    printf("; offsets agree with lseek: %d\n", offsets_agree);
    return n;
}

/* A directory opened without O_DIRECTORY, as SQLite opens one to fsync it: the
 * lowest free number, fstat, fsync, dup, and then the calls that need more of it
 * (a read, a name relative to it, a listing, fchdir) behave as the kernel's. */
static int plain_directory_descriptor(const char *dir) {
    int probe = open("/dev/null", O_RDONLY);
    close(probe);
    int d = open(dir, O_RDONLY | O_CLOEXEC);
    struct stat st;
    printf("plain open of a directory: at the lowest free number %d, a directory %d, "
           "fsync %d, fdatasync %d\n",
           d == probe, fstat(d, &st) == 0 && S_ISDIR(st.st_mode), fsync(d), fdatasync(d));
    int again = dup(d);
    printf("its dup: a directory %d, close-on-exec %d then %d\n",
           fstat(again, &st) == 0 && S_ISDIR(st.st_mode), fcntl(d, F_GETFD) & FD_CLOEXEC,
           fcntl(again, F_GETFD) & FD_CLOEXEC);
    errno = 0;
    printf("open for writing: %s\n", open(dir, O_RDWR) < 0 ? strerror(errno) : "opened");
    char c;
    errno = 0;
    ssize_t got = read(d, &c, 1);
    printf("read: %zd %s\n", got, strerror(errno));
    int f = openat(d, "Makefile", O_RDONLY);
    printf("a name relative to it: %d\n", f >= 0 && fstat(f, &st) == 0 && S_ISREG(st.st_mode));
    close(f);
    DIR *s = fdopendir(again);
    int names = 0;
    while (s && readdir(s))
        names++;
    printf("fdopendir of its dup: %d names\n", names);
    if (s)
        closedir(s);
    int moved = fchdir(d);
    printf("fchdir: %d, then a relative name: %d\n", moved, access("Makefile", R_OK) == 0);
    /* One renamed after its open still leads to it. */
    mkdir("before", 0755);
    int sub = open("before", O_RDONLY);
    rename("before", "after");
    int into = fchdir(sub);
    char cwd[4096] = "";
    const char *now = getcwd(cwd, sizeof cwd) ? strrchr(cwd, '/') + 1 : strerror(errno);
    printf("fchdir into a directory renamed since its open: %d, now in %s\n", into, now);
    fchdir(d);
    rmdir("after");
    close(sub);
    printf("close: %d\n", close(d));
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    DIR *s = opendir(argv[1]);
    if (!s) {
        perror("opendir");
        return 1;
    }
    char *rows[1024];
    int n = 0;
    long second_at = -1;
    char second[256] = "";
    struct dirent *e;
    while ((e = readdir(s)) && n < 1024) {
        struct stat st;
        /* dirfd gives a descriptor the *at calls resolve names against. */
        if (fstatat(dirfd(s), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            perror(e->d_name);
            return 1;
        }
        if (st.st_ino != e->d_ino) {
            printf("%s: d_ino %lu, st_ino %lu\n", e->d_name, (unsigned long)e->d_ino,
                   (unsigned long)st.st_ino);
            return 1;
        }
        char row[300];
        snprintf(row, sizeof row, "%s type %d", e->d_name, e->d_type);
        rows[n++] = strdup(row);
        if (n == 1)
            second_at = telldir(s);
        if (n == 2)
            snprintf(second, sizeof second, "%s", e->d_name);
    }
    qsort(rows, n, sizeof rows[0], by_name);
    for (int i = 0; i < n; i++)
        printf("%s\n", rows[i]);
    /* seekdir to a telldir position gives the same entry again. */
    seekdir(s, second_at);
    e = readdir(s);
    printf("seekdir: %s\n", e && strcmp(e->d_name, second) == 0 ? "same entry" : "differs");
    /* rewinddir sees a name made since the open. */
    int fd = openat(dirfd(s), "made-later", O_CREAT | O_WRONLY, 0644);
    if (fd < 0) {
        perror("openat");
        return 1;
    }
    close(fd);
    rewinddir(s);
    int seen = 0;
    while ((e = readdir(s)))
        seen += strcmp(e->d_name, "made-later") == 0;
    printf("rewinddir sees the new name: %d\n", seen);
    if (unlinkat(dirfd(s), "made-later", 0) != 0) {
        perror("unlinkat");
        return 1;
    }
    if (closedir(s) != 0) {
        perror("closedir");
        return 1;
    }
    /* fdopendir of a directory descriptor (as fts walks trees): the same names,
     * dirfd is that descriptor, and closedir closes it. */
    int dfd = open(argv[1], O_RDONLY | O_DIRECTORY);
    DIR *f = dfd < 0 ? NULL : fdopendir(dfd);
    if (!f) {
        perror("fdopendir");
        return 1;
    }
    int names = 0;
    while ((e = readdir(f)))
        names++;
    printf("fdopendir: %d names (opendir: %d), dirfd is the descriptor: %d\n", names, n,
           dirfd(f) == dfd);
    closedir(f);
    printf("closedir closed it: %d\n", fcntl(dfd, F_GETFD) == -1 && errno == EBADF);
    /* The raw call on a directory descriptor: records the size of one or two names
     * at a time, then all again after lseek to 0, and a buffer too small for one. */
    int rfd = open(argv[1], O_RDONLY | O_DIRECTORY);
    if (raw_listing(rfd, 64, "in small steps") < 0)
        return 1;
    lseek(rfd, 0, SEEK_SET);
    if (raw_listing(rfd, sizeof(char[4096]), "after lseek to 0") < 0)
        return 1;
    lseek(rfd, 0, SEEK_SET);
    char tiny[8];
    errno = 0;
    ssize_t none = getdents64(rfd, tiny, sizeof tiny);
    printf("getdents64 into 8 bytes: %zd %s\n", none, strerror(errno));
    close(rfd);
    /* Errors: a file is not a directory; nothing is nothing. */
    char path[4096];
    snprintf(path, sizeof path, "%s/Makefile", argv[1]);
    errno = 0;
    printf("opendir of a file: %s\n", opendir(path) ? "opened" : strerror(errno));
    snprintf(path, sizeof path, "%s/nothing", argv[1]);
    errno = 0;
    printf("opendir of nothing: %s\n", opendir(path) ? "opened" : strerror(errno));
    snprintf(path, sizeof path, "%s/Makefile", argv[1]);
    int file = open(path, O_RDONLY);
    errno = 0;
    printf("fdopendir of a file: %s\n", fdopendir(file) ? "opened" : strerror(errno));
    close(file);
    return plain_directory_descriptor(argv[1]);
}

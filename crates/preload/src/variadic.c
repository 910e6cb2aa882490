/* execl, execle and execlp take their arguments as C varargs, which stable Rust cannot
 * read. Each gathers them into an array and calls execv, execve or execvp: this
 * library's (a preloaded library's definitions come first), which hand the descriptors
 * the new program inherits to the kernel before the C library's exec runs. Without
 * these, glibc's execl would exec through its internal call, unseen, and the program
 * would inherit placeholders where its files were. The exported execl, execlp and
 * execle are jumps to these (`variadic.rs`): a jump leaves a variadic call's
 * registers and stack as the caller set them. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

/* More arguments than this is E2BIG here (the array lives on the stack). */
#define MAX_ARGS 65536

/* The number of arguments from `first` to the NULL that ends them. */
static size_t count(const char *first, va_list ap) {
    if (!first)
        return 0;
    size_t n = 1;
    while (va_arg(ap, const char *))
        n++;
    return n;
}

/* Fills argv[0..n] from `first` and the n - 1 arguments after it, then NULL. */
static void gather(char **argv, size_t n, const char *first, va_list ap) {
    if (n)
        argv[0] = (char *)first;
    for (size_t i = 1; i < n; i++)
        argv[i] = va_arg(ap, char *);
    argv[n] = NULL;
}

enum how { EXECV, EXECVP, EXECVE };

/* Gathers `arg` and what follows it in `ap` into an array and execs with it: execv,
 * execvp, or execve with the environment after the terminating NULL. */
static int exec_list(const char *file, const char *arg, va_list ap, enum how how) {
    va_list counting;
    va_copy(counting, ap);
    size_t n = count(arg, counting);
    va_end(counting);
    if (n > MAX_ARGS) {
        errno = E2BIG;
        return -1;
    }
    char *argv[n + 1];
    gather(argv, n, arg, ap);
    switch (how) {
    case EXECVP:
        return execvp(file, argv);
    case EXECVE: {
        if (n)
            (void)va_arg(ap, char *); /* the NULL after the last argument */
        char *const *envp = va_arg(ap, char *const *);
        return execve(file, argv, envp);
    }
    default:
        return execv(file, argv);
    }
}

int orion_execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int r = exec_list(path, arg, ap, EXECV);
    va_end(ap);
    return r;
}

int orion_execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int r = exec_list(file, arg, ap, EXECVP);
    va_end(ap);
    return r;
}

/* execle: the environment follows the NULL that ends the arguments. */
int orion_execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    int r = exec_list(path, arg, ap, EXECVE);
    va_end(ap);
    return r;
}

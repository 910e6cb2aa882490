/* Open files handed to programs the C library starts without a call the preload
 * library would otherwise see, for the preload tests: execl (variadic) with no fork
 * before it, then system() and popen() (which spawn inside the C library), then a
 * closefrom, after which files are still served. Prints both files at the end.
 *
 *   spawn DIR          opens DIR/f, writes "a", and execl's itself with its number
 *   spawn DIR FD       (after the execl) goes on with descriptor FD */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int fail(const char *what) {
    perror(what);
    return 1;
}

static void show(const char *path) {
    char buf[64] = {0};
    int fd = open(path, O_RDONLY);
    if (fd >= 0 && read(fd, buf, sizeof buf - 1) >= 0)
        fputs(buf, stdout);
    if (fd >= 0)
        close(fd);
}

int main(int argc, char **argv) {
    char f[4096], g[4096], h[4096], cmd[256];
    if (argc < 2)
        return 2;
    snprintf(f, sizeof f, "%s/f", argv[1]);
    snprintf(g, sizeof g, "%s/g", argv[1]);
    snprintf(h, sizeof h, "%s/h", argv[1]);
    if (argc == 2) {
        int fd = open(f, O_RDWR | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || write(fd, "a\n", 2) != 2)
            return fail("open/write f");
        char num[16];
        snprintf(num, sizeof num, "%d", fd);
        execl(argv[0], argv[0], argv[1], num, (char *)NULL);
        return fail("execl");
    }
    /* The new image: the descriptor is open on f, after "a". */
    int fd = atoi(argv[2]);
    if (write(fd, "b\n", 2) != 2)
        return fail("write after execl");
    int gd = open(g, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (gd < 0 || write(gd, "1\n", 2) != 2)
        return fail("open/write g");
    snprintf(cmd, sizeof cmd, "echo 2 >&%d", gd);
    if (system(cmd) != 0)
        return fail("system");
    snprintf(cmd, sizeof cmd, "echo 3 >&%d", gd);
    FILE *p = popen(cmd, "r");
    if (!p || pclose(p) != 0)
        return fail("popen");
    /* A daemon's closefrom: the library's own connections survive it. */
    closefrom((fd > gd ? fd : gd) + 1);
    int hd = open(h, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (hd < 0 || write(hd, "x", 1) != 1 || close(hd) != 0)
        return fail("open/write h after closefrom");
    if (write(gd, "4\n", 2) != 2 || close(gd) != 0 || close(fd) != 0)
        return fail("write/close");
    show(f);
    show(g);
    return 0;
}

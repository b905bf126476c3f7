/*
 * dsec-opaque: print every directory under ROOT that overlayfs marked opaque.
 *
 * Runs inside a microvm guest when its writable layer is packed: busybox has no getfattr,
 * and an opaque directory (one deleted and made again over a lower one) must stay opaque
 * in the packed layer, or the lower directory's old entries would come back.
 * Output: one path per line, relative to ROOT ("." for ROOT itself).
 * Usage: dsec-opaque ROOT
 */
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/xattr.h>

static size_t root_len;

static int visit(const char *path, const struct stat *st, int kind, struct FTW *ftw) {
    char val[4];
    (void)st;
    (void)ftw;
    if (kind != FTW_D) return 0;
    ssize_t n = lgetxattr(path, "trusted.overlay.opaque", val, sizeof val);
    if (n == 1 && val[0] == 'y') {
        const char *rel = path + root_len;
        while (*rel == '/') rel++;
        printf("%s\n", *rel ? rel : ".");
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: dsec-opaque ROOT\n");
        return 2;
    }
    root_len = strlen(argv[1]);
    return nftw(argv[1], visit, 64, FTW_PHYS) ? 1 : 0;
}

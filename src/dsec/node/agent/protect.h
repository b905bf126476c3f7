/*
 * Protected paths: a Landlock ruleset under which a command can neither read nor write
 * some hierarchies, whatever its uid or capabilities (root in the sandbox included).
 *
 * Landlock only allows: a ruleset handles a set of access rights, and an access is granted
 * when some rule on the file or on one of its parent directories grants it. "Everything but
 * P" is therefore written as "every hierarchy that is neither P nor on the way to P": for
 * each directory on the way from / to a protected path (its ancestors), every entry that is
 * neither protected nor itself an ancestor gets a rule granting every handled right (a file
 * only the file rights). The ancestors themselves get no rule, so
 *   - the protected hierarchy can be neither read, listed, written, removed nor renamed, and
 *     nothing can be linked or renamed into or out of it (REFER: a file may not gain rights);
 *   - an ancestor can be walked through (Landlock never checks path walks) but not listed
 *     (`ls /` fails) and nothing can be created in or removed from it directly;
 *   - a path that does not exist yet is protected too: nothing on its way can be created.
 * Paths are resolved with realpath() first (a protected /bin/x where /bin is a symlink is
 * /usr/bin/x), and the rules are rebuilt for every command, so entries made since (by the
 * node or the grading step) are covered. Landlock checks the file reached, never the name
 * used: symlinks, /proc/self/root, /proc/<pid>/cwd and chroot all end at the same denial,
 * and a landlocked process may not mount, nor ptrace or open /proc/<pid>/{fd,root,mem} of a
 * process outside its domain.
 *
 * Hard links: Landlock checks the name used, so another name of a protected file is as
 * reachable as the file. Agent commands cannot make one (REFER, above); the grading step's
 * commands get a ruleset of their own that handles REFER alone (nolink_ruleset): granted on
 * the same entries, so nothing is linked or moved out of a protected hierarchy, nor into one,
 * across directories (EXDEV: mv then copies). A link in the same directory as a protected
 * *file* (`ln /repo/tests/hidden.sh /repo/tests/h2`) needs no REFER; such an entry of a
 * directory on the way, a file with the inode of a protected file, gets no rule in the agent
 * commands' ruleset, so it is as protected as the file. Links shipped in an image are
 * refused by the node at create.
 *
 * Limits: a hierarchy a mount shows twice is protected only where named (dsec makes no such
 * mount; commands cannot mount); stat() is never checked by Landlock, so names and sizes can
 * be probed; kernels before Landlock ABI 3 (Linux 6.2) do not check truncate(2), so there
 * the command also gets a seccomp filter that refuses truncate(2) (ftruncate needs a file
 * opened for writing, which Landlock refuses).
 */
#include <limits.h>
#include <linux/audit.h>
#include <stddef.h>
#include <sys/stat.h>

#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif

#define MAX_PROTECT 64
#define LL_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1
#define LL_REFER (1ULL << 13)
#define LL_TRUNCATE (1ULL << 14)
#define LL_IOCTL_DEV (1ULL << 15)
/* EXECUTE, WRITE_FILE, READ_FILE, TRUNCATE, IOCTL_DEV: the rights a rule on a file may hold */
#define LL_FILE_RIGHTS (1ULL << 0 | 1ULL << 1 | 1ULL << 2 | LL_TRUNCATE | LL_IOCTL_DEV)

/* Only the first field: the kernel takes a shorter struct from older callers. */
struct ll_ruleset_attr {
    uint64_t handled_access_fs;
};

struct ll_path_beneath {
    uint64_t allowed_access;
    int32_t parent_fd;
} __attribute__((packed));

/* The kernel's Landlock ABI version, 0 when it has none (asked once). */
static int ll_abi(void) {
    static int abi = -1;
    if (abi < 0) {
        long v = syscall(__NR_landlock_create_ruleset, NULL, 0, LL_VERSION);
        abi = v < 0 ? 0 : (int)v;
    }
    return abi;
}

/* Every filesystem right this kernel knows (ABI 1: the 13 basic ones). */
static uint64_t ll_handled(int abi) {
    uint64_t r = (1ULL << 13) - 1;
    if (abi >= 2) r |= LL_REFER;
    if (abi >= 3) r |= LL_TRUNCATE;
    if (abi >= 5) r |= LL_IOCTL_DEV;
    return r;
}

/* realpath() of the longest existing prefix of p, with the rest appended; malloc'ed. */
static char *resolve_protected(const char *p) {
    char buf[PATH_MAX];
    size_t n = strlen(p);
    if (n == 0 || n >= PATH_MAX || p[0] != '/') return NULL;
    memcpy(buf, p, n + 1);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = 0;
    for (;;) {
        char *real = realpath(buf, NULL);
        if (real) {
            const char *rest = p + strlen(buf);
            size_t rl = strlen(real);
            char *out = malloc(rl + strlen(rest) + 2);
            if (!out) {
                free(real);
                return NULL;
            }
            strcpy(out, real);
            if (*rest) {
                if (rl == 1) out[0] = 0; /* "/" + "/x" */
                strcat(out, rest);
            }
            free(real);
            return out;
        }
        char *slash = strrchr(buf, '/');
        if (!slash) return NULL;
        if (slash == buf) {
            buf[1] = 0; /* "/" always exists; loop once more */
            if (n == 1) return NULL;
            n = 1;
        } else {
            *slash = 0;
            n = (size_t)(slash - buf);
        }
    }
}

static int in_list(char **list, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(list[i], s)) return 1;
    return 0;
}

/* Is `a` a strict parent directory of `p`? ("/" of everything else) */
static int is_ancestor(const char *a, const char *p) {
    size_t n = strlen(a);
    if (!strcmp(a, "/")) return strcmp(p, "/") != 0;
    return strncmp(a, p, n) == 0 && p[n] == '/';
}

/* Is `st` the inode of one of the `nl` protected files in `linked`? */
static int is_linked(const struct stat *st, const struct stat *linked, int nl) {
    for (int i = 0; i < nl; i++)
        if (st->st_dev == linked[i].st_dev && st->st_ino == linked[i].st_ino) return 1;
    return 0;
}

/* Grants every handled right (`rights`) beneath each entry of directory `dir` that is
 * neither protected, nor an ancestor of a protected path, nor another name of one of the
 * `nl` multiply-linked protected files `linked` (a hard link beside it). */
static int allow_siblings(int rs, const char *dir, char **prot, int np, uint64_t rights,
                          const struct stat *linked, int nl) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1; /* a path not made yet: nothing to allow */
    struct dirent *e;
    char path[PATH_MAX];
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", strcmp(dir, "/") ? dir : "", e->d_name);
        int skip = in_list(prot, np, path);
        for (int i = 0; i < np && !skip; i++) skip = is_ancestor(path, prot[i]);
        if (skip) continue;
        int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) continue; /* gone since readdir */
        struct stat st;
        struct ll_path_beneath pb = {rights, fd};
        if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) {
            pb.allowed_access &= LL_FILE_RIGHTS;
            if (st.st_nlink > 1 && is_linked(&st, linked, nl)) pb.allowed_access = 0;
        }
        /* no right left (a linked name; a file where only REFER is handled): no rule */
        if (pb.allowed_access &&
            syscall(__NR_landlock_add_rule, rs, LL_RULE_PATH_BENEATH, &pb, 0) < 0)
            rc = -1;
        close(fd);
    }
    closedir(d);
    return rc;
}

/* A ruleset handling only EXECUTE, granted everywhere: under ABI 1 (no REFER to handle)
 * any Landlock domain refuses every link or rename across directories. */
static int refer_nowhere_ruleset(void) {
    struct ll_ruleset_attr attr = {1ULL << 0};
    int rs = (int)syscall(__NR_landlock_create_ruleset, &attr, sizeof attr, 0);
    if (rs < 0) return -1;
    int fd = open("/", O_PATH | O_CLOEXEC), saved = 0;
    struct ll_path_beneath pb = {1ULL << 0, fd};
    if (fd < 0 || syscall(__NR_landlock_add_rule, rs, LL_RULE_PATH_BENEATH, &pb, 0) < 0)
        saved = errno;
    if (fd >= 0) close(fd);
    if (saved) {
        close(rs);
        errno = saved;
        return -1;
    }
    return rs;
}

/* A Landlock ruleset fd for the hierarchies `paths` (NULL-terminated), -1 with errno:
 * `nolink` 0 denies them every right (agent commands), 1 only REFER (the grading step:
 * no name of theirs is linked or moved across directories). */
static int paths_ruleset(char **paths, int nolink) {
    int abi = ll_abi();
    if (abi < 1) {
        errno = EOPNOTSUPP;
        return -1;
    }
    if (nolink && abi < 2) return refer_nowhere_ruleset();
    char *prot[MAX_PROTECT], *anc[MAX_PROTECT * 16];
    struct stat linked[MAX_PROTECT];
    int np = 0, na = 0, nl = 0, rs = -1, saved = 0;
    for (int i = 0; paths[i] && !saved; i++) {
        if (np >= MAX_PROTECT) saved = E2BIG;
        else if (!(prot[np] = resolve_protected(paths[i]))) saved = EINVAL;
        else np++;
    }
    /* A path inside another protected one (or twice) adds nothing, and its ancestors
     * include that other path, whose entries must get no rule. */
    for (int i = 0; i < np && !saved; i++) {
        int inside = 0;
        for (int j = 0; j < np && !inside; j++)
            inside = j != i && (is_ancestor(prot[j], prot[i]) || (j < i && !strcmp(prot[j], prot[i])));
        if (inside) {
            free(prot[i]);
            prot[i--] = prot[--np];
        }
    }
    for (int i = 0; i < np && !saved; i++) { /* "/", "/a", "/a/b" for "/a/b/c" */
        char buf[PATH_MAX];
        for (size_t k = 0; prot[i][k] && !saved; k++) {
            if (prot[i][k] != '/') continue;
            memcpy(buf, prot[i], k ? k : 1);
            buf[k ? k : 1] = 0;
            if (!strcmp(buf, prot[i]) || in_list(anc, na, buf)) continue;
            if (na >= (int)(sizeof anc / sizeof anc[0]) || !(anc[na] = strdup(buf))) saved = E2BIG;
            else na++;
        }
    }
    /* protected files with other names (a link the grading step made beside one) */
    for (int i = 0; i < np && !saved && !nolink; i++)
        if (stat(prot[i], &linked[nl]) == 0 && !S_ISDIR(linked[nl].st_mode) &&
            linked[nl].st_nlink > 1)
            nl++;
    uint64_t rights = nolink ? LL_REFER : ll_handled(abi);
    struct ll_ruleset_attr attr = {rights};
    if (!saved && (rs = (int)syscall(__NR_landlock_create_ruleset, &attr, sizeof attr, 0)) < 0)
        saved = errno;
    for (int i = 0; i < na && !saved; i++)
        if (allow_siblings(rs, anc[i], prot, np, rights, linked, nl) < 0)
            saved = errno ? errno : EIO;
    for (int i = 0; i < np; i++) free(prot[i]);
    for (int i = 0; i < na; i++) free(anc[i]);
    if (saved) {
        if (rs >= 0) close(rs);
        errno = saved;
        return -1;
    }
    return rs;
}

/* The ruleset keeping agent commands out of the hierarchies `paths`. */
static int protect_ruleset(char **paths) { return paths_ruleset(paths, 0); }

/* The grading step's: `paths` readable and writable, but no name of theirs is linked or
 * moved out of (or into) them across directories. */
static int nolink_ruleset(char **paths) { return paths_ruleset(paths, 1); }

/* Before ABI 3 Landlock does not check truncate(2): refuse that call to the command. */
static int deny_truncate(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 76, 5, 0),               /* truncate */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0x40000000 | 76, 4, 5), /* x32 truncate */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 92, 1, 0),  /* i386 truncate */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 193, 0, 1), /* i386 truncate64 */
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog);
}

/* In the command's child: enter the ruleset built for it (no_new_privs first; every
 * sandbox process has it already). `truncate` 0: the grading step's, which may truncate. */
static int enter_protection(int rs, int truncate) {
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -1;
    if (!truncate && ll_abi() < 3 && deny_truncate() < 0) return -1;
    if (syscall(__NR_landlock_restrict_self, rs, 0) < 0) return -1;
    close(rs);
    return 0;
}

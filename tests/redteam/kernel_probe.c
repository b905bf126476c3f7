/* Calls each kernel interface a container sandbox must not reach and prints "name errno"
 * per line (0: the call succeeded). Static, so it runs in the busybox image. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/timex.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void report(const char *name, long rc) { printf("%s %d\n", name, rc < 0 ? errno : 0); }

/* A raw clone with flags: the child exits at once, the parent reaps it. */
static long try_clone(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid(pid, 0, 0);
    return pid;
}

/* unshare in a child, so the probe itself stays in the sandbox's namespaces. */
static long try_unshare(int flags) {
    pid_t pid = fork();
    if (pid == 0) _exit(syscall(SYS_unshare, flags) < 0 ? errno : 0);
    int status = 0;
    waitpid(pid, &status, 0);
    errno = WEXITSTATUS(status);
    return errno ? -1 : 0;
}

static long try_clone3(unsigned long flags) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = flags;
    args.exit_signal = SIGCHLD;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) _exit(0);
    if (pid > 0) waitpid(pid, 0, 0);
    return pid;
}

int main(void) {
    char zero[256], buf[8] = "x", dst[8];
    struct timespec now;
    struct timex tx;
    memset(zero, 0, sizeof zero);
    memset(&tx, 0, sizeof tx);
    clock_gettime(CLOCK_REALTIME, &now);
    struct iovec local = {dst, 1}, remote = {buf, 1};
    long pidfd = syscall(SYS_pidfd_open, getpid(), 0);

    report("fork", try_clone(0));
    report("clone_newuser", try_clone(CLONE_NEWUSER));
    report("clone_newnet", try_clone(CLONE_NEWNET));
    report("clone3_newuser", try_clone3(CLONE_NEWUSER));
    report("unshare_newuser", try_unshare(CLONE_NEWUSER));
    report("unshare_newns", try_unshare(CLONE_NEWNS));
    report("setns", syscall(SYS_setns, 0, 0));
    report("mount", syscall(SYS_mount, "none", "/dsec-none", "tmpfs", 0, 0));
    report("io_uring_setup", syscall(SYS_io_uring_setup, 4, zero));
    report("io_uring_enter", syscall(SYS_io_uring_enter, -1, 0, 0, 0, 0, 0));
    report("io_uring_register", syscall(SYS_io_uring_register, -1, 0, 0, 0));
    report("bpf", syscall(SYS_bpf, 0, zero, 64));
    report("perf_event_open", syscall(SYS_perf_event_open, zero, 0, -1, -1, 0));
    report("keyctl", syscall(SYS_keyctl, 0, -3, 0));  /* KEYCTL_GET_KEYRING_ID, session */
    report("add_key", syscall(SYS_add_key, "user", "dsec", "v", 1, -2));
    report("request_key", syscall(SYS_request_key, "user", "dsec", 0, 0));
    report("userfaultfd", syscall(SYS_userfaultfd, 0));
    report("kexec_load", syscall(SYS_kexec_load, 0, 0, 0, 0));
    report("kexec_file_load", syscall(SYS_kexec_file_load, -1, -1, 0, "", 0));
    report("init_module", syscall(SYS_init_module, zero, 0, ""));
    report("finit_module", syscall(SYS_finit_module, -1, "", 0));
    report("delete_module", syscall(SYS_delete_module, "dsec_none", 0));
    report("clock_settime", syscall(SYS_clock_settime, CLOCK_REALTIME, &now));
    report("clock_adjtime", syscall(SYS_clock_adjtime, CLOCK_REALTIME, &tx));
    report("settimeofday", syscall(SYS_settimeofday, 0, 0));
    report("swapon", syscall(SYS_swapon, "/dsec-none", 0));
    report("swapoff", syscall(SYS_swapoff, "/dsec-none"));
    report("ptrace", syscall(SYS_ptrace, 2 /* PTRACE_PEEKDATA */, 0x7ffffff0, 0, 0));
    report("process_vm_readv", syscall(SYS_process_vm_readv, getpid(), &local, 1, &remote, 1, 0));
    report("process_vm_writev", syscall(SYS_process_vm_writev, getpid(), &remote, 1, &local, 1, 0));
    report("pidfd_getfd", syscall(SYS_pidfd_getfd, pidfd, 0, 0));
    report("kcmp", syscall(SYS_kcmp, getpid(), getpid(), 0, 0, 0));  /* KCMP_FILE */
    return 0;
}

"""The fncall worker program: runs INSIDE a worker container, under the image's python3.

Standard library only (cloudpickle is bind-mounted from the node at /.dsec/py and loaded only
for callables), so it runs on any image with Python 3.8+. It must never import dsec.

Protocol on stdin/stdout (relayed by the in-sandbox agent): one JSON object per line.
The first line out is ``{"ready": ...}``; then for each request line one reply line.

Every call runs in a fresh fork of this warm process, in a new session, as the worker's
own unprivileged uid (distinct per worker), with rlimits for CPU time, file size, open
files and processes, and ``oom_score_adj`` 1000 so the kernel's OOM killer picks the call,
never this server. So a call's changes to globals, modules, environment or cwd die with
its fork. After the call every process of that uid is killed (``kill(-1)`` as that uid
reaches daemons and double forks), the scratch directory is removed and anything new in the
world-writable directories (/tmp, /var/tmp, /dev/shm, /dev/mqueue) is deleted: the next
call sees what the first one saw.
"""

import base64
import io
import json
import os
import resource
import select
import signal
import sys
import time
import traceback

SCRATCH = "/fn/call"
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue")
MAX_RESULT = 64 << 20
MAX_FILE = 16 << 20
EXIT_GRACE_S = 0.05  # output still in flight when the program exits
PRELOAD = ("json", "math", "re", "collections", "itertools", "functools", "random", "string",
           "heapq", "bisect", "typing", "dataclasses", "decimal", "fractions", "statistics",
           "datetime", "copy", "operator", "textwrap", "unittest", "traceback", "io")


def _preload(extra):
    loaded = []
    for name in list(PRELOAD) + list(extra):
        try:
            __import__(name)
            loaded.append(name)
        except Exception:
            pass
    return loaded


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _rmtree(path):
    """``shutil.rmtree(path, ignore_errors=True)`` at any depth. A call can nest directories
    far past the recursion limit, where Python 3.11's rmtree recurses per level and its
    RecursionError is not an ignored OSError; so an explicit stack of directory fds, each
    opened ``O_NOFOLLOW`` (symlinks are unlinked, never followed). The same walk as dsec's
    ``node/host/fdtree.py``, which this program cannot import."""
    parent, name = os.path.split(os.path.abspath(path))
    try:
        top = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    stack = []  # (fd, names still to remove, parent fd, name there)
    try:
        _rm_entry(stack, top, name)
        while stack:
            fd, names, up, me = stack[-1]
            if names:
                _rm_entry(stack, fd, names.pop())
                continue
            stack.pop()
            os.close(fd)
            try:
                os.rmdir(me, dir_fd=up)
            except OSError:
                pass
    finally:
        for frame in stack:
            os.close(frame[0])
        os.close(top)


def _rm_entry(stack, dfd, name):
    """Unlink ``name`` in ``dfd``, or push it as a directory to empty first."""
    try:
        os.unlink(name, dir_fd=dfd)
        return
    except IsADirectoryError:
        pass
    except OSError:
        return
    try:
        fd = os.open(name, _DIR, dir_fd=dfd)
    except OSError:
        return
    try:
        names = os.listdir(fd)
    except OSError:
        os.close(fd)
        return
    stack.append((fd, names, dfd, name))


def _baseline():
    out = {}
    for d in SHARED_DIRS:
        try:
            out[d] = set(os.listdir(d))
        except OSError:
            out[d] = set()
    return out


class Worker:
    def __init__(self, uid):
        self.uid = uid
        self._reaped = {}
        self.baseline = _baseline()
        os.makedirs("/fn", mode=0o711, exist_ok=True)
        for d in SHARED_DIRS:
            # copy the directory up into the writable layer now, so the node's snapshot of
            # that layer already holds it and a call writing there is not mistaken for dirt
            try:
                os.chmod(d, os.stat(d).st_mode & 0o7777)
            except OSError:
                pass

    # ---- one call ----
    def handle(self, req):
        t0 = time.monotonic()
        deadline = t0 + req["timeout"]
        self._make_scratch(req["files"])
        steps, value, error, stdin = [], None, None, base64.b64decode(req["stdin"] or "")
        try:
            for i, step in enumerate(req["steps"]):
                last = i == len(req["steps"]) - 1
                res = self._run(step, req, stdin if last else b"", deadline)
                steps.append(res)
                if step["kind"] == "callable":
                    value, error = self._decode_callable(res)
                if res["exit_code"] != 0 or res["timed_out"]:
                    break
            files = self._collect(req["return_files"])
        finally:
            self._kill_uid()
            self._clean()
        return {"steps": steps, "files": files, "value": value, "error": error,
                "duration_ms": (time.monotonic() - t0) * 1000}

    def _make_scratch(self, files):
        _rmtree(SCRATCH)
        os.mkdir(SCRATCH, 0o700)
        for rel, b64 in files.items():
            path = os.path.join(SCRATCH, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(base64.b64decode(b64))
        for root, dirs, names in os.walk(SCRATCH):
            for n in dirs + names + [""]:
                os.chown(os.path.join(root, n) if n else root, self.uid, self.uid)

    def _run(self, step, req, stdin, deadline):
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe()
        res_r, res_w = os.pipe()
        t0 = time.monotonic()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            try:
                os.dup2(in_r, 0)
                os.dup2(out_w, 1)
                os.dup2(err_w, 2)
                os.dup2(res_w, 3)
                os.closerange(4, 1 << 16)
                self._child(step, req)
            except BaseException:
                try:
                    os.write(2, traceback.format_exc().encode())
                except OSError:
                    pass
            os._exit(127)
        for fd in (in_r, out_w, err_w, res_w):
            os.close(fd)
        streams = {out_r: bytearray(), err_r: bytearray(), res_r: bytearray()}
        caps = {out_r: req["max_output"], err_r: req["max_output"], res_r: MAX_RESULT}
        truncated = {out_r: False, err_r: False, res_r: False}
        pidfd = os.pidfd_open(pid)
        try:
            timed_out = self._pump(streams, caps, truncated, in_w, stdin, deadline, pidfd)
        finally:
            os.close(pidfd)
        self._kill_uid()  # the program's exit (or its deadline) ends the call: no leftovers
        status = self._status(pid)
        sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
        code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + (sig or 0)
        return {"stage": step.get("stage", "run"), "exit_code": code, "signal": sig,
                "stdout": bytes(streams[out_r]).decode(errors="replace"),
                "stderr": bytes(streams[err_r]).decode(errors="replace"),
                "stdout_truncated": truncated[out_r], "stderr_truncated": truncated[err_r],
                "result": base64.b64encode(bytes(streams[res_r])).decode(),
                "timed_out": timed_out, "duration_ms": (time.monotonic() - t0) * 1000}

    def _pump(self, streams, caps, truncated, in_w, stdin, deadline, pidfd):
        """Feed stdin and read the outputs until the program has exited and its pipes are
        drained; True if the deadline passed first. Pipes still held open by processes the
        program left behind are given ``EXIT_GRACE_S`` after its exit, then dropped."""
        open_fds = set(streams)
        if stdin:
            os.set_blocking(in_w, False)
        else:
            os.close(in_w)
            in_w = None
        sent, exited_at = 0, None
        try:
            while open_fds or exited_at is None:
                now = time.monotonic()
                if now >= deadline:
                    return True
                if exited_at is not None and now >= exited_at + EXIT_GRACE_S:
                    return False
                until = deadline if exited_at is None else min(deadline,
                                                               exited_at + EXIT_GRACE_S)
                rlist = list(open_fds) + ([pidfd] if exited_at is None else [])
                wlist = [in_w] if in_w is not None else []
                readable, writable, _ = select.select(rlist, wlist, [], until - now)
                if pidfd in readable:
                    exited_at = time.monotonic()
                    readable.remove(pidfd)
                if writable:
                    try:
                        sent += os.write(in_w, stdin[sent:sent + 65536])
                    except BlockingIOError:
                        pass
                    except OSError:  # the program closed its stdin
                        sent = len(stdin)
                    if sent >= len(stdin):
                        os.close(in_w)
                        in_w = None
                for fd in readable:
                    data = os.read(fd, 65536)
                    if not data:
                        open_fds.discard(fd)
                        os.close(fd)
                        continue
                    room = caps[fd] - len(streams[fd])
                    if len(data) > room:
                        truncated[fd] = True
                        data = data[:max(room, 0)]
                    streams[fd] += data
            return False
        finally:
            for fd in open_fds:
                os.close(fd)
            if in_w is not None:
                os.close(in_w)

    def _status(self, pid):
        if pid in self._reaped:
            return self._reaped.pop(pid)
        return os.waitpid(pid, 0)[1]

    def _child(self, step, req):
        os.setsid()
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("1000")
        cpu = max(1, int(req["cpu_time_s"] + 0.999))
        for lim, value in ((resource.RLIMIT_CPU, (cpu, cpu + 1)),
                           (resource.RLIMIT_NPROC, (req["pids"], req["pids"])),
                           (resource.RLIMIT_FSIZE, (req["fsize"], req["fsize"])),
                           (resource.RLIMIT_NOFILE, (256, 256)),
                           (resource.RLIMIT_CORE, (0, 0))):
            resource.setrlimit(lim, value)
        os.chdir(SCRATCH)
        os.setgroups([])
        os.setgid(self.uid)
        os.setuid(self.uid)
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOME": SCRATCH, "TMPDIR": SCRATCH, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        env.update(req["env"])
        kind = step["kind"]
        if kind == "argv":
            os.execvpe(step["argv"][0], step["argv"], env)
        os.environ.clear()
        os.environ.update(env)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False))
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True)
        sys.path[0] = SCRATCH
        code = 0
        try:
            if kind == "python":
                sys.argv = step["argv"]
                glb = {"__name__": "__main__", "__file__": os.path.join(SCRATCH, "main.py"),
                       "__builtins__": __builtins__}
                exec(compile(step["source"], "main.py", "exec"), glb)
            else:
                self._call(step)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:
            code = code or 1
        os._exit(code)

    def _call(self, step):
        """Run a pickled (fn, args, kwargs); write b"V" + pickled value or b"E" + JSON error
        to fd 3, so the node tells them apart without ever unpickling anything."""
        import cloudpickle
        fn, args, kwargs = cloudpickle.loads(base64.b64decode(step["payload"]))
        try:
            data = b"V" + cloudpickle.dumps(fn(*args, **kwargs))
        except BaseException as exc:
            info = {"type": type(exc).__name__, "message": str(exc),
                    "traceback": traceback.format_exc()}
            data = b"E" + json.dumps(info).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(3, view):]

    @staticmethod
    def _decode_callable(res):
        """(value, error) from what a callable's fork wrote to fd 3."""
        raw = base64.b64decode(res["result"])
        res["result"] = ""
        if raw[:1] == b"V":
            return base64.b64encode(raw[1:]).decode(), None
        if raw[:1] == b"E":
            try:  # the call's own code can write fd 3 too: anything at all may be there
                err = json.loads(raw[1:])
            except (ValueError, RecursionError):
                err = None
            if isinstance(err, dict):
                return None, err
            return None, {"type": "WorkerError", "traceback": res["stderr"],
                          "message": "the function's error report was not a JSON object "
                                     "(did its code write to fd 3?)"}
        return None, {"type": "WorkerError",
                      "message": f"the function ended without a result (exit "
                                 f"{res['exit_code']}, signal {res['signal']})",
                      "traceback": res["stderr"]}

    # ---- reset ----
    def _kill_uid(self):
        """SIGKILL every process of the call's uid, as that uid (reaches escaped daemons)."""
        for _ in range(50):
            if not self._uid_alive():
                return
            pid = os.fork()
            if pid == 0:
                try:
                    os.setgid(self.uid)
                    os.setuid(self.uid)
                    os.kill(-1, signal.SIGKILL)
                except BaseException:
                    pass
                os._exit(0)
            os.waitpid(pid, 0)
            self._reap()

    def _uid_alive(self):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/status") as f:
                    for line in f:
                        if line.startswith("Uid:"):
                            if int(line.split()[1]) == self.uid:
                                with open(f"/proc/{name}/stat") as g:
                                    if g.read().rsplit(")", 1)[1].split()[0] != "Z":
                                        return True
                            break
            except (OSError, ValueError, IndexError):
                continue
        return False

    def _reap(self):
        """Reap finished children, keeping their statuses for :meth:`_status`."""
        try:
            while True:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if not pid:
                    return
                self._reaped[pid] = status
        except ChildProcessError:
            pass

    def _collect(self, paths):
        out = {}
        for rel in paths:
            path = os.path.join(SCRATCH, rel)
            real = os.path.realpath(path)
            if not real.startswith(SCRATCH + "/"):
                continue
            try:
                fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as f:
                if not os.path.isfile(real):
                    continue
                out[rel] = base64.b64encode(f.read(MAX_FILE)).decode()
        return out

    def _clean(self):
        _rmtree(SCRATCH)
        for d, before in self.baseline.items():
            try:
                names = os.listdir(d)
            except OSError:
                continue
            for n in names:
                if n in before:
                    continue
                p = os.path.join(d, n)
                _rmtree(p)


def main():
    uid = int(sys.argv[1])
    extra = [m for m in sys.argv[2].split(",") if m] if len(sys.argv) > 2 else []
    sys.path.insert(0, "/.dsec/py")
    loaded = _preload(extra)
    try:
        __import__("cloudpickle")  # warm for callables
        loaded.append("cloudpickle")
    except Exception:
        pass
    worker = Worker(uid)
    import gc
    gc.freeze()  # preloaded objects stay out of the forks' collections: fewer copied pages
    out = sys.stdout
    inp = sys.stdin.buffer
    out.write(json.dumps({"ready": True, "python": sys.version.split()[0],
                          "preloaded": loaded}) + "\n")
    out.flush()
    for line in inp:
        try:
            req = json.loads(line)
            reply = worker.handle(req)
        except Exception:
            reply = {"fatal": traceback.format_exc()}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()

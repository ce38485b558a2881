"""The first Python code that runs inside the sandbox; it then runs the program.

Run as ``python -I -S -B -c <this source> <json config>`` with the work directory as cwd, so it
must use the standard library only and never import reinforge. In order it: optionally becomes
a tiny init that reaps and reports the program's status (when it is PID 1 of a new PID
namespace); in a mount namespace, mounts private size-limited temp dirs, binds the work dir
back, remounts the root read-only and drops to the run's uid; sets no_new_privs and, when its parent is the trainer, dies with it; sets the resource limits; optionally installs an audit hook that
blocks network sockets, exec and ctypes (the weak fallback when there is no network
namespace); writes one byte to the status descriptor so the parent knows the sandbox started;
and runs the program as ``__main__``.
"""

import builtins
import json
import os
import resource
import sys

AF_UNIX = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
# Audit events refused by the guard hook: anything that starts a new program (which would
# run without the hook) or calls C directly (which could open a socket behind its back).
BLOCKED_EVENTS = frozenset(
    {
        "subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.startfile",
        "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function", "ctypes.addressof",
    }
)
BLOCKED_MODULES = frozenset({"_posixsubprocess", "_ctypes"})


def become_init(status_fd: int, lifeline_fd: int) -> None:
    """Fork; the parent stays PID 1: it reaps orphans, exits with the program's status, and
    exits at once when the trainer dies (its end of the lifeline pipe closes), which makes the
    kernel kill every process of the namespace."""
    child = os.fork()
    if child == 0:
        os.close(lifeline_fd)
        return
    os.close(status_fd)
    import select

    try:
        watched = [lifeline_fd, os.pidfd_open(child)]
    except OSError:
        watched = [lifeline_fd]  # no pidfd: poll
    while True:
        ready, _, _ = select.select(watched, [], [], 0.1)
        if lifeline_fd in ready:
            os._exit(128 + 9)
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                os._exit(1)
            if pid == 0:
                break
            if pid == child:
                code = os.waitstatus_to_exitcode(status)
                os._exit(128 - code if code < 0 else code)


def set_prctl(no_new_privs: bool, parent_pid: int | None) -> None:
    """no_new_privs (setuid binaries give no privileges); die with ``parent_pid`` if given."""
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if no_new_privs and libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if parent_pid is not None:
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent_pid:  # the trainer died before the line above
            os._exit(1)


MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384


def _mount(libc, source, target: str, fstype, flags: int, data) -> int:
    def enc(v):
        return v.encode() if isinstance(v, str) else v

    if libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        import ctypes

        return ctypes.get_errno()
    return 0


def private_mounts(spec: dict) -> None:
    """In our own mount namespace (as root there): a fresh tmpfs of ``size_mb`` over each of
    ``tmp_dirs``, the work dir bound back over whatever now hides it, the root filesystem remounted
    read-only (skipped where a user namespace may not), then the process drops to ``uid``."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    workdir = spec["workdir"]
    keep = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)  # reachable after /tmp is covered
    for d in spec["tmp_dirs"]:
        err = _mount(libc, "tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['size_mb']}m,mode=1777")
        if err:
            raise OSError(err, f"mount tmpfs on {d}: {os.strerror(err)}")
    os.makedirs(workdir, exist_ok=True)
    err = _mount(libc, f"/proc/self/fd/{keep}", workdir, None, MS_BIND | MS_REC, None)
    if err:
        raise OSError(err, f"bind the work dir {workdir}: {os.strerror(err)}")
    os.close(keep)
    _mount(libc, None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)  # EPERM in a user namespace: skipped
    os.chdir(workdir)
    uid = spec["uid"]
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        # A uid change makes the process non-dumpable (its /proc files become root's); an exec as
        # that uid, as ``unshare --setuid`` did, would reset it: do the same (RLIMIT_CORE stays 0).
        if libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def set_limits(rlimits: dict[str, list[int]]) -> None:
    for name, (soft, hard) in rlimits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _signal_allowed(pid: int) -> bool:
    """Signals may go to the program's own session only (its group, itself, its children)."""
    if pid == 0 or pid == os.getpid():
        return True
    if pid < 0:
        return -pid == os.getpgid(0)
    try:
        with open(f"/proc/{pid}/stat") as f:
            session = int(f.read().rsplit(")", 1)[1].split()[3])
    except (OSError, ValueError, IndexError):
        return False
    return session == os.getsid(0)


def install_guard() -> None:
    """Audit hook: no network sockets, no exec, no ctypes, no signals outside the session."""

    def hook(event: str, args: tuple) -> None:
        if event == "socket.__new__":
            if args[1] != AF_UNIX:
                raise PermissionError("sandbox: network sockets are blocked (audit hook)")
        elif event in BLOCKED_EVENTS:
            raise PermissionError(f"sandbox: {event} is blocked (audit hook)")
        elif event == "import" and args[0] in BLOCKED_MODULES:
            raise PermissionError(f"sandbox: importing {args[0]} is blocked (audit hook)")
        elif event in ("os.kill", "os.killpg"):
            pid = args[0] if event == "os.kill" else -args[0]
            if not _signal_allowed(pid):
                raise PermissionError(f"sandbox: signalling pid {args[0]} is blocked (audit hook)")

    sys.addaudithook(hook)


def run_program(path: str) -> None:
    """Run ``path`` as ``__main__``; an uncaught exception prints a traceback without launcher frames."""
    reserve = bytearray(1 << 18)  # freed on MemoryError so the traceback can still be printed
    sys.argv = [path]
    sys.path.insert(0, os.getcwd())
    try:
        with open(path, "rb") as f:
            code = compile(f.read(), path, "exec")
        exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": builtins})
    except SystemExit:
        raise
    except BaseException as exc:
        del reserve
        import traceback

        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
        traceback.print_exception(type(exc), exc, tb)
        sys.stderr.flush()
        sys.exit(1)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg["init"]:
        become_init(cfg["status_fd"], cfg["lifeline_fd"])
    if cfg.get("mounts"):
        private_mounts(cfg["mounts"])
    if cfg["no_new_privs"] or cfg["parent_pid"] is not None:
        set_prctl(cfg["no_new_privs"], cfg["parent_pid"])
    set_limits(cfg["rlimits"])
    if cfg["guard"]:
        install_guard()
    os.write(cfg["status_fd"], b"R")
    os.close(cfg["status_fd"])
    run_program(cfg["main"])


if __name__ == "__main__":
    main()

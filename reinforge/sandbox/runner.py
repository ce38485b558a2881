"""`run_python`: run untrusted Python in a fresh sandbox and say what happened.

One run: a fresh work directory (``tempfile.mkdtemp``, removed afterwards) holding ``main.py``
and the caller's files; a private uid when we are root; a new session; the launcher started
under the chosen backend (``backends.py``) sets the resource limits; stdout and stderr are read
incrementally, each capped; a wall-clock deadline kills the whole process group; afterwards
every process the run left behind is killed (``reaper.py``) before the uid is reused.
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from reinforge.sandbox import backends, reaper
from reinforge.sandbox.identity import private_uid
from reinforge.sandbox.records import Isolation, SandboxError, SandboxLimits, SandboxResult, Status

MAIN = "main.py"
WORKDIR_PREFIX = "reinforge-sandbox-"
_CHUNK = 1 << 16
_swept: set[int] = set()  # private uids whose stale work dirs this process has removed


def run_python_in(
    backend: Isolation,
    code: str,
    stdin: str = "",
    limits: SandboxLimits = SandboxLimits(),
    files: dict[str, str] | None = None,
    *,
    python: str | None = None,
) -> SandboxResult:
    """Run ``code`` as ``main.py`` in the sandbox ``backend`` with ``stdin`` as its standard input and
    ``files`` (relative path -> text) beside it; never raises for anything the code does.

    ``python`` defaults to an interpreter the sandbox can use (run with ``-I -S``: standard library
    only). ``reinforge.sandbox.run_python`` picks the strongest backend that works here.
    Raises ``SandboxError`` when the sandbox itself cannot run (bad arguments, broken backend).
    """
    if backend not in backends.BACKENDS:
        raise SandboxError(f"unknown sandbox backend {backend!r}; allowed: {', '.join(backends.BACKENDS)}")
    files = _checked_files(files or {})
    with private_uid() if os.geteuid() == 0 else nullcontext(None) as uid:
        if uid is not None and uid not in _swept:
            _remove_stale_workdirs(uid)
        interpreter = python or backends.default_interpreter(uid is not None)
        return _run(code, stdin, limits, files, backend, interpreter, uid)


def _remove_stale_workdirs(uid: int) -> None:
    """Remove work dirs owned by ``uid`` that a killed trainer left: while we hold the uid no
    other run can be using one."""
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        path = os.path.join(tmp, name)
        if name.startswith(WORKDIR_PREFIX):
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
                shutil.rmtree(path, ignore_errors=True)
    _swept.add(uid)


def _checked_files(files: dict[str, str]) -> dict[str, str]:
    for name in files:
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or not path.parts or str(path) == MAIN:
            raise SandboxError(f"sandbox file name {name!r} must be a relative path without '..' other than {MAIN!r}")
    return files


def _populate(workdir: str, code: str, files: dict[str, str], uid: int | None) -> None:
    for name, text in {MAIN: code, **files}.items():
        path = os.path.join(workdir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    if uid is not None:
        for directory, _dirs, names in os.walk(workdir):
            os.chown(directory, uid, uid)
            for name in names:
                os.chown(os.path.join(directory, name), uid, uid)


def _rlimits(limits: SandboxLimits, plan: backends.Plan, backend: Isolation, uid: int | None) -> dict[str, list[int]]:
    cpu = max(1, round(limits.cpu_s))
    nproc = limits.processes + plan.helper_processes
    if uid is None and backend == "rlimits-only":
        nproc += reaper.task_count(os.getuid())  # no private uid, no user namespace: the limit counts all our tasks
    return {
        "RLIMIT_CPU": [cpu, cpu + 1],
        "RLIMIT_AS": [limits.memory_mb << 20] * 2,
        "RLIMIT_FSIZE": [limits.file_mb << 20] * 2,
        "RLIMIT_NOFILE": [limits.open_files] * 2,
        "RLIMIT_NPROC": [nproc] * 2,
        "RLIMIT_CORE": [0, 0],
    }


@dataclass
class _Watch:
    """What the supervision loop saw."""

    out: dict[str, bytearray] = field(default_factory=lambda: {"stdout": bytearray(), "stderr": bytearray()})
    over: str | None = None  # the stream that passed the cap
    ready: bool = False  # the launcher started the program
    exited: bool = False
    timed_out: bool = False


def _run(code: str, stdin: str, limits: SandboxLimits, files: dict[str, str], backend: Isolation,
         interpreter: str, uid: int | None) -> SandboxResult:
    workdir = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
    try:
        _populate(workdir, code, files, uid)
        marker = secrets.token_hex(8)
        env = backends.sandbox_env(workdir, "/tmp" if backend == "bubblewrap" else workdir, marker)
        plan = backends.plan(backend, workdir, env, uid, limits.file_mb)
        rlimits = _rlimits(limits, plan, backend, uid)
        status_r, status_w = os.pipe()  # the launcher writes b"R" once the program starts
        # The PID-1 launcher exits (and with it the namespace) when the lifeline closes: when we die.
        lifeline_r, lifeline_w = os.pipe() if plan.init else (-1, -1)
        config = {
            "init": plan.init, "guard": plan.guard, "no_new_privs": plan.no_new_privs,
            "parent_pid": os.getpid() if plan.die_with_trainer else None, "rlimits": rlimits,
            "status_fd": status_w, "lifeline_fd": lifeline_r, "main": MAIN, "mounts": plan.mounts,
        }
        argv = plan.prefix + backends.launcher_argv(interpreter, json.dumps(config))
        child_fds = (status_w, lifeline_r) if plan.init else (status_w,)
        try:
            return _supervise(argv, plan, stdin, env, workdir, status_r, child_fds, limits, backend, uid, marker)
        finally:
            os.close(status_r)
            if plan.init:
                os.close(lifeline_w)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _start(argv: list[str], plan: backends.Plan, stdin: str, env: dict[str, str], workdir: str,
           child_fds: tuple[int, ...], backend: Isolation) -> tuple[subprocess.Popen, float]:
    """Start ``argv`` in a new session, passing it ``child_fds`` (closed here); (process, start time)."""
    try:
        with tempfile.TemporaryFile() as stdin_file:
            stdin_file.write(stdin.encode())
            stdin_file.seek(0)
            start = time.monotonic()
            try:
                proc = subprocess.Popen(
                    argv, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    pass_fds=child_fds, cwd=workdir, env=env, start_new_session=True, **plan.popen_kwargs,
                )
            except OSError as exc:
                raise SandboxError(f"could not start the {backend} sandbox ({argv[0]}): {exc}") from exc
    finally:
        for fd in child_fds:
            os.close(fd)
    return proc, start


def _supervise(argv: list[str], plan: backends.Plan, stdin: str, env: dict[str, str], workdir: str, status_r: int,
               child_fds: tuple[int, ...], limits: SandboxLimits, backend: Isolation, uid: int | None,
               marker: str) -> SandboxResult:
    """Start the launcher, watch it, kill whatever is left, and say what happened."""
    proc, start = _start(argv, plan, stdin, env, workdir, child_fds, backend)
    watch, leftovers = _Watch(), 0
    try:
        _watch(proc, status_r, limits, start, watch)
    finally:
        if not watch.exited:
            _kill_group(proc.pid)
        _, wait_status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(wait_status)
        wall = time.monotonic() - start
        proc.stdout.close()
        proc.stderr.close()
        _kill_group(proc.pid)
        # In a PID namespace the kernel kills what is left when its PID 1 exits: give it a moment.
        killed = reaper.kill_all(
            (lambda: reaper.pids_of_uid(uid)) if uid is not None else (lambda: reaper.pids_of_run(marker, proc.pid)),
            grace_s=0.1 if backend != "rlimits-only" else 0.0,
        )
        if watch.exited:
            leftovers = killed
    if not watch.ready and not (watch.timed_out or watch.over):
        err = watch.out["stderr"].decode(errors="replace").strip()
        raise SandboxError(f"the {backend} sandbox failed to start (exit {proc.returncode}): {err[-2000:]}")
    cpu_used = usage.ru_utime + usage.ru_stime
    status, sig, reason = _classify(proc.returncode, watch, limits, backend, cpu_used)
    if leftovers:
        reason += f"; killed {leftovers} leftover process(es)"
    return SandboxResult(
        status=status, exit_code=proc.returncode if sig is None else -sig,
        stdout=watch.out["stdout"].decode(errors="replace"), stderr=watch.out["stderr"].decode(errors="replace"),
        truncated=watch.over is not None, wall_time_s=wall, reason=reason, isolation=backend,
        isolation_note=backends.isolation_note(backend, uid), signal=_signame(sig) if sig else None,
        leftover_killed=leftovers, run_id=marker, uid=uid,
    )


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _watch(proc: subprocess.Popen, status_r: int, limits: SandboxLimits, start: float, watch: _Watch) -> None:
    """Read output and the ready byte until the process exits, the deadline passes or a stream
    passes its cap. Output still buffered when the process exits is drained, without waiting for
    pipes that a leftover process may hold open."""
    names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
    try:
        pidfd = os.pidfd_open(proc.pid)  # readable when the process exits (Linux >= 5.3)
    except OSError:
        pidfd = -1  # poll for the exit instead
    deadline = start + limits.timeout_s
    with selectors.DefaultSelector() as sel:
        for fd in (*names, status_r, pidfd):
            if fd >= 0:
                sel.register(fd, selectors.EVENT_READ)
        try:
            while not watch.exited:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    watch.timed_out = True
                    return
                if pidfd < 0:
                    watch.exited = _has_exited(proc.pid)
                    remaining = min(remaining, 0.01)
                for key, _ in sel.select(remaining):
                    fd = key.fd
                    if fd == pidfd:
                        watch.exited = True
                    elif fd == status_r:
                        byte = os.read(fd, 1)
                        watch.ready = watch.ready or byte == b"R"
                        if not byte:
                            sel.unregister(fd)
                    elif not _read_into(fd, names[fd], limits.output_bytes, watch):
                        sel.unregister(fd)
                    if watch.over:
                        return
            for fd, name in names.items():  # drain what the exited process left in the pipes
                os.set_blocking(fd, False)
                try:
                    while _read_into(fd, name, limits.output_bytes, watch) and not watch.over:
                        pass
                except BlockingIOError:
                    pass
            os.set_blocking(status_r, False)
            try:
                watch.ready = watch.ready or os.read(status_r, 1) == b"R"
            except BlockingIOError:
                pass
        finally:
            if pidfd >= 0:
                os.close(pidfd)


def _has_exited(pid: int) -> bool:
    """The child has exited (it is left unreaped)."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None and info.si_pid == pid


def _read_into(fd: int, name: str, cap: int, watch: _Watch) -> bool:
    """Read one chunk into ``watch``; False at end of file."""
    data = os.read(fd, _CHUNK)
    if not data:
        return False
    buf = watch.out[name]
    room = cap - len(buf)
    buf += data[: max(room, 0)]
    if len(data) > room:
        watch.over = name
    return True


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _classify(returncode: int, watch: _Watch, limits: SandboxLimits, backend: Isolation,
              cpu_used: float) -> tuple[Status, int | None, str]:
    """(status, signal number or None, one-line reason) of a finished run."""
    sig = -returncode if returncode < 0 else None
    if sig is None and backend != "rlimits-only" and 128 < returncode <= 128 + 64:
        sig = returncode - 128  # bwrap and our PID-1 launcher report a signal death as 128 + signal
    if watch.timed_out:
        return "timeout", sig, f"wall-clock timeout: still running after {limits.timeout_s:g}s; process group killed"
    if watch.over:
        return "output_limit", sig, f"{watch.over} exceeded {limits.output_bytes} bytes; process group killed"
    stderr = watch.out["stderr"].decode(errors="replace")
    if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= 0.95 * round(limits.cpu_s)):
        return "timeout", sig, f"CPU time limit ({round(limits.cpu_s)}s) exceeded ({_signame(sig)})"
    if sig == signal.SIGXFSZ or (returncode != 0 and "[Errno 27] File too large" in _last_line(stderr)):
        return "output_limit", sig, f"file size limit ({limits.file_mb} MB) exceeded: {_last_line(stderr) or 'SIGXFSZ'}"
    memory = "MemoryError" in _last_line(stderr) or "Cannot allocate memory" in stderr[-2000:]
    if memory and returncode != 0:
        return "memory", sig, f"memory limit ({limits.memory_mb} MB address space) exceeded: {_last_line(stderr)}"
    if sig is not None:
        return "killed", sig, f"killed by signal {_signame(sig)}"
    if returncode == 0:
        return "ok", None, "exited with code 0"
    return "error", None, f"exited with code {returncode}: {_last_line(stderr) or '(no stderr)'}"


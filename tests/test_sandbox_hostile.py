"""Hostile programs against every sandbox backend that works here.

After each run: a stand-in "trainer" process (and pytest) is alive, no process of the run is
left, nothing outside the run's directory changed, and the result says why the run failed.
"""

from __future__ import annotations

import dataclasses
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from reinforge.sandbox import SandboxError, SandboxLimits, SandboxResult, available_backends, run_python

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox needs Linux")

REPO = Path(__file__).resolve().parents[1]
FAST = SandboxLimits(timeout_s=1.5, cpu_s=1, memory_mb=128, file_mb=1, processes=16, output_bytes=64_000)
ROOT = os.geteuid() == 0


@pytest.fixture(params=available_backends() if sys.platform.startswith("linux") else [])
def backend(request):
    return request.param


def _processes_of(result: SandboxResult) -> list[int]:
    """Live processes carrying the run's marker, or running as its uid without another run's marker."""
    mine = f"REINFORGE_SANDBOX_RUN={result.run_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            status = Path(f"/proc/{name}/status").read_text()
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "\nState:\tZ" in status:
            continue
        uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
        markers = [e for e in environ if e.startswith(b"REINFORGE_SANDBOX_RUN=")]
        if mine in environ or (result.uid is not None and str(result.uid) in uids and not markers):
            found.append(int(name))
    return found


def _snapshot(path: Path) -> dict[str, tuple[int, int, bytes]]:
    return {
        str(p): (p.stat().st_mode, p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in [path, *path.rglob("*")]
    }


@pytest.fixture()
def world(tmp_path):
    """A trainer stand-in, a canary file, and the paths hostile code aims at; checked after the test."""
    canary = tmp_path / "canary.txt"
    canary.write_text("original")
    token = uuid.uuid4().hex
    targets = {
        "canary": str(canary),
        "root": f"/root/reinforge-pwned-{token}",
        "repo": str(REPO / f"reinforge-pwned-{token}"),
        "tmp": f"/tmp/reinforge-pwned-{token}",
        "parent": os.path.join(tempfile.gettempdir(), f"reinforge-pwned-{token}-parent"),
    }
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    before = _snapshot(tmp_path)
    state = {"trainer": trainer, "targets": targets, "results": [], "tmp_writable": False}
    yield state
    try:
        assert trainer.poll() is None, "the trainer stand-in was killed"
        for result in state["results"]:
            assert _processes_of(result) == [], f"processes of run {result.run_id} outlived it"
        assert _snapshot(tmp_path) == before, "files outside the sandbox changed"
        for name in ("root", "repo") + (() if state["tmp_writable"] else ("tmp", "parent")):
            assert not os.path.exists(targets[name]), f"the sandbox wrote {targets[name]}"
    finally:
        trainer.kill()
        trainer.wait()
        for name in ("root", "repo", "tmp", "parent"):
            if os.path.exists(targets[name]):
                os.remove(targets[name])


def _run(world, backend, code: str, **kwargs) -> SandboxResult:
    result = run_python(code, limits=kwargs.pop("limits", FAST), backend=backend, **kwargs)
    world["results"].append(result)
    assert result.isolation == backend
    return result


def test_infinite_loop(world, backend):
    result = _run(world, backend, "while True:\n    pass\n")
    assert result.status == "timeout", result
    assert "CPU time limit" in result.reason or "wall-clock" in result.reason
    assert result.wall_time_s < FAST.timeout_s + 2


def test_sleep_past_timeout(world, backend):
    result = _run(world, backend, "import time\nprint('start', flush=True)\ntime.sleep(60)\n")
    assert result.status == "timeout", result
    assert "wall-clock timeout" in result.reason
    assert result.stdout == "start\n"
    assert result.wall_time_s < FAST.timeout_s + 2


def test_fork_bomb(world, backend):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = _run(world, backend, code)
    assert result.status == "timeout", result
    assert result.wall_time_s < FAST.timeout_s + 3


def test_process_limit_is_enforced(world, backend):
    code = (
        "import os, time\nn = 0\nwhile n < 100:\n    try:\n        pid = os.fork()\n"
        "    except OSError as e:\n        print('refused', n, e.errno, flush=True)\n        break\n"
        "    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nelse:\n    print('unbounded')\n"
    )
    result = _run(world, backend, code)
    assert result.status == "ok", result
    word, count, _ = result.stdout.split()
    assert word == "refused"
    if ROOT or backend != "rlimits-only":  # exact; unprivileged rlimits-only counts the user's other tasks
        assert int(count) == FAST.processes - 1
    else:
        assert int(count) <= FAST.processes - 1


def test_memory_bomb(world, backend):
    # a wall-clock limit that a loaded machine's slow start cannot reach first (it did at 1.5 s: 'timeout')
    slow_start = dataclasses.replace(FAST, timeout_s=15)
    result = _run(world, backend, "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n", limits=slow_start)
    assert result.status == "memory", result
    assert "MemoryError" in result.reason


def test_huge_output(world, backend):
    result = _run(world, backend, "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n")
    assert result.status == "output_limit", result
    assert result.truncated and len(result.stdout) == FAST.output_bytes
    assert "stdout exceeded" in result.reason


def test_file_size_limit(world, backend):
    result = _run(world, backend, "with open('big', 'wb') as f:\n    f.write(b'x' * (4 << 20))\n")
    assert result.status == "output_limit", result
    assert "file size limit" in result.reason


def test_write_outside_the_work_dir(world, backend):
    if not ROOT and backend != "bubblewrap":
        pytest.skip("documented: without root the program may write wherever the trainer may")
    targets = world["targets"]
    code = f"""
import os
targets = {targets!r}
errors = []
def attempt(what, fn):
    try:
        fn()
        print('wrote', what, flush=True)
    except OSError as e:
        errors.append(f'{{what}}: {{e.strerror}}')
attempt('canary', lambda: open(targets['canary'], 'w').write('pwned'))
attempt('canary-unlink', lambda: os.remove(targets['canary']))
attempt('canary-chmod', lambda: os.chmod(targets['canary'], 0o777))
attempt('canary-dir', lambda: open(os.path.join(os.path.dirname(targets['canary']), 'new'), 'w').write('x'))
for name in ('root', 'repo', 'tmp'):
    attempt(name, lambda name=name: open(targets[name], 'w').write('pwned'))
attempt('parent', lambda: open('../' + os.path.basename(targets['parent']), 'w').write('pwned'))
raise SystemExit('blocked: ' + '; '.join(errors))
"""
    result = _run(world, backend, code)
    world["tmp_writable"] = backend == "rlimits-only"  # documented: world-writable dirs stay writable
    assert result.status == "error", result
    assert "blocked: canary:" in result.reason
    assert "wrote canary" not in result.stdout and "wrote root" not in result.stdout
    assert "wrote repo" not in result.stdout
    # under bubblewrap and unshare /tmp is a private tmpfs: "wrote tmp" lands there; the fixture checks
    # the real /tmp


@pytest.mark.parametrize("namespaced", ["bubblewrap", "unshare"])
def test_temp_dirs_are_private_and_bounded_and_the_rest_read_only(world, namespaced, tmp_path):
    """Writes to the system temp dirs land in the run's own size-limited tmpfs, never on the host;
    a world-writable directory elsewhere is read-only; the work dir stays writable."""
    if namespaced not in available_backends():
        pytest.skip(f"{namespaced} does not work here")
    if not ROOT and namespaced == "unshare":
        pytest.skip("without root, a user namespace may not remount the root read-only")
    token = uuid.uuid4().hex
    open_dir = Path(tempfile.mkdtemp(prefix="reinforge-ww-", dir=REPO))  # world-writable, outside any temp dir
    open_dir.chmod(0o777)
    paths = [f"{d}/reinforge-pwned-{token}" for d in ("/tmp", "/var/tmp", "/dev/shm")]
    code = f"""
import os
paths = {paths!r}
for p in paths:
    open(p, 'w').write('pwned')
    print('private', p, open(p).read(), flush=True)
try:
    open({str(open_dir / "x")!r}, 'w').write('pwned')
    print('wrote outside', flush=True)
except OSError as e:
    print('outside blocked:', e.strerror, flush=True)
try:
    with open('/tmp/fill', 'wb') as f:
        for _ in range(64):
            f.write(b'x' * (1 << 20))
    print('filled 64 MiB of /tmp', flush=True)
except OSError as e:
    print('tmp full:', e.strerror, flush=True)
open('result.txt', 'w').write('ok')
print('work dir writable', flush=True)
"""
    limits = SandboxLimits(timeout_s=10, cpu_s=5, memory_mb=256, file_mb=8, processes=16)
    try:
        result = _run(world, namespaced, code, limits=limits)
        assert result.status == "ok", result
        for p in paths:
            assert f"private {p} pwned" in result.stdout and not os.path.exists(p)
        # a checkout under a temp dir (a clone in /tmp) sees its own temp dir replaced by the private one:
        # the directory is then absent inside, which blocks the write as surely as the read-only root
        under_tmp = any(REPO.resolve().is_relative_to(d) for d in ("/tmp", "/var/tmp", "/dev/shm"))
        reason = "No such file or directory" if under_tmp else "Read-only file system"
        assert f"outside blocked: {reason}" in result.stdout and not (open_dir / "x").exists()
        assert "tmp full: " in result.stdout and "filled 64 MiB" not in result.stdout  # bounded by file_mb
        assert "work dir writable" in result.stdout
    finally:
        shutil.rmtree(open_dir, ignore_errors=True)


def test_environment_secrets(world, backend, monkeypatch):
    if not ROOT and backend == "rlimits-only":
        pytest.skip("documented: without root or namespaces the trainer's /proc/<pid>/environ is readable")
    secret = f"sk-{uuid.uuid4().hex}"
    monkeypatch.setenv("REINFORGE_TEST_SECRET", secret)
    code = f"""
import os
print(dict(os.environ))
for pid in ({os.getpid()}, {world['trainer'].pid}, 1):
    try:
        print(open(f'/proc/{{pid}}/environ').read())
    except OSError as e:
        print('refused', pid, e.strerror)
"""
    result = _run(world, backend, code)
    assert result.status == "ok", result
    assert secret not in result.stdout + result.stderr
    assert "REINFORGE_TEST_SECRET" not in result.stdout
    assert f"refused {os.getpid()}" in result.stdout


def test_network(world, backend):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    code = f"""
import socket
socket.create_connection(('127.0.0.1', {port}), timeout=0.5).sendall(b'leak')
print('connected')
"""
    try:
        result = _run(world, backend, code)
        readable, _, _ = select.select([listener], [], [], 0.2)
        assert readable == [], "the sandbox reached a socket of the host"
    finally:
        listener.close()
    assert result.status == "error", result
    assert "connected" not in result.stdout
    assert any(s in result.reason for s in ("unreachable", "blocked", "refused")), result.reason


def test_signal_the_parent(world, backend):
    trainer = world["trainer"].pid
    code = f"""
import os, signal
errors = []
for pid in ({trainer}, {os.getpid()}, -{os.getpgid(0)}, -1):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError as e:
        errors.append(f'{{pid}}: {{e.strerror or e}}')
raise SystemExit('blocked: ' + '; '.join(errors))
"""
    result = _run(world, backend, code)
    time.sleep(0.1)
    assert world["trainer"].poll() is None
    # kill(-1) may hit the program itself (it is in its own reach), which is also a failure
    assert result.status in ("error", "killed"), result
    assert result.status == "killed" or "blocked: " + str(trainer) in result.reason


def test_daemon_is_killed(world, backend):
    code = """
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        time.sleep(30)
        os._exit(0)
    os._exit(0)
time.sleep(0.2)
print('parent done')
"""
    result = _run(world, backend, code)
    assert result.status == "ok", result
    assert result.stdout == "parent done\n"
    assert result.wall_time_s < FAST.timeout_s


def test_daemon_holding_stdout_does_not_stall_the_run(world, backend):
    code = """
import os, time
if os.fork() == 0:
    os.setsid()
    time.sleep(30)
    os._exit(0)
print('parent done')
"""
    result = _run(world, backend, code)
    assert result.status == "ok", result
    assert result.stdout == "parent done\n"
    assert result.wall_time_s < FAST.timeout_s


def test_killed_by_a_signal(world, backend):
    result = _run(world, backend, "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert result.status == "killed", result
    assert result.signal == "SIGSEGV" and "SIGSEGV" in result.reason


def test_isolation_is_named(backend):
    result = run_python("print('hi')", limits=FAST, backend=backend)
    assert result.status == "ok" and result.stdout == "hi\n"
    assert result.isolation == backend and result.isolation_note
    assert (result.uid is not None) == ROOT
    if backend == "rlimits-only":
        assert result.isolation_note.startswith("WEAKER")


def test_stops_on_signal_to_self_in_namespace(world, backend):
    """SIGTERM to itself ends the program even where it would be PID 1 of a namespace."""
    result = _run(world, backend, "import os, signal, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)\n")
    assert result.status == "killed" and result.signal == "SIGTERM", result


def test_without_pidfd_the_exit_is_polled(world, backend, monkeypatch):
    def no_pidfd(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    assert _run(world, backend, "print('hi')").stdout == "hi\n"
    result = _run(world, backend, "import time\ntime.sleep(60)\n")
    assert result.status == "timeout" and result.wall_time_s < FAST.timeout_s + 2


def test_a_run_dies_with_the_trainer(backend):
    """A trainer killed mid-run takes its sandboxed runs with it (bubblewrap: --die-with-parent;
    unshare: the PID-1 launcher's lifeline pipe; rlimits-only: PR_SET_PDEATHSIG)."""
    # The program renames itself once running (it writes nothing: a write to the dead trainer's
    # pipe would end it anyway, and so would the launcher's ready byte if the trainer died first).
    program = "open('/proc/self/comm', 'w').write('sbx-running')\\nimport time\\ntime.sleep(60)"
    trainer = subprocess.Popen([sys.executable, "-c", f"""
from reinforge.sandbox import SandboxLimits, run_python
run_python("{program}", backend={backend!r}, limits=SandboxLimits(timeout_s=60, cpu_s=60))
"""], cwd=REPO)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            children = _sandboxed_children(trainer.pid)
            if any("Name:\tsbx-running" in _read(pid) for pid in children):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the run never started")
        workdirs = {os.readlink(f"/proc/{pid}/cwd") for pid in children if "Name:\tsbx-running" in _read(pid)}
    finally:
        trainer.kill()
        trainer.wait()
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{pid}").exists() and "\nState:\tZ" not in _read(pid) for pid in children):
        assert time.monotonic() < deadline, f"sandboxed processes {children} outlived the trainer"
        time.sleep(0.05)
    for workdir in workdirs:  # a killed trainer cannot remove its work dir (documented)
        assert Path(workdir).name.startswith("reinforge-sandbox-")
        shutil.rmtree(workdir, ignore_errors=True)


def _read(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


def _sandboxed_children(parent: int) -> list[int]:
    """Descendants of ``parent`` that carry a sandbox marker in their environment."""
    children, frontier = [], [parent]
    while frontier:
        pid = frontier.pop()
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            frontier.append(kid)
            try:
                if b"REINFORGE_SANDBOX_RUN=" in Path(f"/proc/{kid}/environ").read_bytes():
                    children.append(kid)
            except OSError:
                pass
    return children


def test_files_beside_the_program_and_the_work_dir_is_removed(world, backend):
    code = "import os\nfrom pkg.helper import VALUE\nprint(VALUE, input(), os.getcwd(), sep='|')\n"
    result = _run(world, backend, code, stdin="from stdin\n", files={"pkg/helper.py": "VALUE = 42\n"})
    assert result.status == "ok", result
    value, line, cwd = result.stdout.strip().split("|")
    assert (value, line) == ("42", "from stdin")
    assert Path(cwd).name.startswith("reinforge-sandbox-") and not Path(cwd).exists()


def test_bad_arguments_raise_a_sandbox_error():
    with pytest.raises(SandboxError, match="memory_mb must be a positive integer"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(SandboxError, match="timeout_s"):
        SandboxLimits(timeout_s=float("inf"))
    for name in ("../escape.py", "/etc/passwd", "main.py"):
        with pytest.raises(SandboxError, match="relative path"):
            run_python("pass", files={name: ""})
    with pytest.raises(SandboxError, match="unknown sandbox backend 'docker'"):
        run_python("pass", backend="docker")  # type: ignore[arg-type]

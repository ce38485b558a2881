"""The device check: everything reinforge must prove on a GPU machine, in one prepared run.

On a GPU machine (docs/gpu.md; the wheels come from `make device-wheels` on a machine with an index):

    python3 scripts/device_check.py --wheels .whl --out OUT_DIR

Here, the same code on the CPU in about a minute (part of `make test`, so it cannot rot between GPU runs):

    python scripts/device_check.py --quick --cpu --out /tmp/device-check

In order, each step bounded in time and the report rewritten after every step:
1. install the carried wheels (``--wheels``: pure-Python packages the machine lacks) into a private
   folder, and the project without dependencies (torch stays the machine's own);
2. the machine: GPU, driver, torch / transformers / CUDA versions; the physical limits the figures are
   compared to (measured bf16 matmul peak, device-to-device bandwidth);
3. the tests marked ``cuda`` (``tests/test_cuda.py``; with ``--cpu`` they run on the CPU where they can);
4. the GPU benchmarks of ``benchmarks/bench_gpu.py`` (generation, learner, one GRPO step at the
   Qwen2.5-0.5B shape, the default recipe to held-out 0.9) and ``benchmarks/bench_async.py`` on the
   machine's CPU cores.
Writes ``device_report.json`` and ``device_report.md`` to ``--out``; exits 1 if any step failed, having
still written every figure it got.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks" / "bench_gpu.py"
# (step, seconds allowed on a GPU, with --quick); the whole run is also bounded by --budget-s. On a GPU the
# allowances fit the whole check in 8 minutes; --quick runs one repeat of everything and allows much more
# than it needs, so that a loaded CPU (make test's other workers) slows it down without failing it.
STEPS = [("install", 40, 60), ("machine", 30, 120), ("cuda_tests", 120, 400), ("generate", 80, 240),
         ("learner", 60, 240), ("grpo_step", 50, 240), ("recipe", 70, 240), ("async", 150, 300)]
QUICK_BENCH_S = 2.0  # a quick benchmark's own budget: one measured repeat
# on the CPU the cuda tests whose CPU twins the default suite already runs are left out (time): resume
# (tests/test_kill_resume.py), LoRA (tests/test_lora.py), bf16 autocast (tests/test_memory_features.py)
CPU_TESTS = "engine_logprobs or grpo_trains"


class Report:
    """The run's figures, rewritten as JSON and Markdown after every step."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out, self.meta, self.steps = out, meta, []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, status: str, seconds: float, figures: dict[str, Any], error: str = "") -> None:
        self.steps.append({"step": name, "status": status, "seconds": round(seconds, 1), "figures": figures,
                           "error": error[-4000:]})
        self.write()

    @property
    def failed(self) -> list[str]:
        return [s["step"] for s in self.steps if s["status"] == "failed"]

    def write(self) -> None:
        doc = {"meta": self.meta, "steps": self.steps, "failed": self.failed}
        (self.out / "device_report.json").write_text(json.dumps(doc, indent=1, default=str))
        (self.out / "device_report.md").write_text(self.markdown())

    def markdown(self) -> str:
        m = self.meta
        lines = [f"# Device check: {m.get('device_name', m['device'])}", "",
                 f"commit {m.get('commit')}, {m['started']}, quick={m['quick']}", "",
                 "| step | status | s | figures |", "|---|---|---|---|"]
        for s in self.steps:
            figures = ", ".join(f"{k}={_short(v)}" for k, v in _flat(s["figures"]).items())
            lines.append(f"| {s['step']} | {s['status']} | {s['seconds']} | {figures} |")
        for s in self.steps:
            if s["error"]:
                lines += ["", f"## {s['step']}: {s['status']}", "", "```", s["error"][-2000:], "```"]
        return "\n".join(lines) + "\n"


def _flat(figures: dict[str, Any]) -> dict[str, Any]:
    """Scalars, and the scalars of a dict one level down as ``key.sub`` (lists and deeper dicts: JSON only)."""
    out: dict[str, Any] = {}
    for k, v in figures.items():
        if isinstance(v, dict):
            out.update({f"{k}.{sk}": sv for sk, sv in v.items() if not isinstance(sv, (dict, list))})
        elif not isinstance(v, list):
            out[k] = v
    return out


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def install(args, env: dict[str, str]) -> dict[str, Any]:
    """The carried wheels into ``<out>/site`` (on PYTHONPATH from here on), then the project without its
    dependencies; where pip cannot install the project offline the repository root goes on PYTHONPATH."""
    site = args.out / "site"
    wheels = sorted(Path(args.wheels).glob("*.whl"))
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
          "--upgrade", "--target", str(site), *map(str, wheels)], env, 300)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    project = _run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                    "-e", str(ROOT)], env, 300, check=False)
    if project.returncode != 0:
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env["PYTHONPATH"]])
    return {"wheels": [w.name for w in wheels], "project": "pip -e" if project.returncode == 0 else "PYTHONPATH"}


def machine(args, env: dict[str, str]) -> dict[str, Any]:
    """Versions and the physical limits (``bench_gpu.py limits``), in a child with the installed packages."""
    code = ("import json, platform, torch, transformers, pydantic, reinforge; d = torch.cuda.is_available(); "
            "print(json.dumps({'python': platform.python_version(), 'torch': torch.__version__, "
            "'transformers': transformers.__version__, 'pydantic': pydantic.__version__, "
            "'cuda': torch.version.cuda, 'cuda_available': d, 'cpu_count': __import__('os').cpu_count(), "
            "'device_name': torch.cuda.get_device_name(0) if d else platform.processor() or 'cpu', "
            "'bf16_supported': d and torch.cuda.is_bf16_supported(), "
            "'gpu_memory_gb': d and torch.cuda.get_device_properties(0).total_memory / 2**30}))")
    figures = json.loads(_run([sys.executable, "-c", code], env, 120).stdout.strip().splitlines()[-1])
    smi = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], env, 30,
               check=False) if not args.cpu else None
    if smi is not None and smi.returncode == 0:
        figures["nvidia_smi"] = smi.stdout.strip()
    if not args.cpu and not figures["cuda_available"]:
        raise RuntimeError("no CUDA device visible to torch (pass --cpu to check on the CPU)")
    figures.update(_bench("limits", args, env, 60))
    return figures


def cuda_tests(args, env: dict[str, str], timeout: float) -> dict[str, Any]:
    xml = args.out / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "cuda", "-o", "addopts=",
           f"--junitxml={xml}", str(ROOT / "tests" / "test_cuda.py")]
    child = dict(env)
    if args.cpu:
        child["REINFORGE_TEST_DEVICE"] = "cpu"
        cmd += ["-k", CPU_TESTS]
    proc = _run(cmd, child, timeout, check=False, cwd=ROOT)
    suite = ET.parse(xml).getroot() if xml.exists() else None
    suite = suite.find("testsuite") if suite is not None and suite.tag == "testsuites" else suite
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")} if suite is not None else {}
    counts["passed"] = counts.get("tests", 0) - sum(counts.get(k, 0) for k in ("failures", "errors", "skipped"))
    if proc.returncode != 0:
        raise StepFailed(counts, proc.stdout[-6000:] + proc.stderr[-2000:])
    return counts


def benches(name: str, args, env: dict[str, str], timeout: float, bandwidth: float | None) -> dict[str, Any]:
    extra = ["--bandwidth-gbs", str(bandwidth)] if name == "generate" and bandwidth else []
    return _bench(name, args, env, timeout, extra)


def bench_async(args, env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Sync against async at equal samples on this machine's CPU cores (the code-interpreter agent with
    200 ms environment latency; with --quick the default recipe for 2 updates)."""
    out = args.out / "async.json"
    workers = max(2, min(4, (os.cpu_count() or 2) // 4))
    if args.quick:
        cmd = ["--steps", "1", "--repeats", "1", "--staleness", "1", "--eval-every", "1", "--heldout", "10",
               "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=4"]
    else:
        cmd = ["--recipe", "agent_code", "--steps", "10", "--repeats", "1", "--staleness", "2", "--eval-every", "10",
               "--heldout", "50", "--target", "0.8", "--set", "env.latency={dist: fixed, mean_s: 0.2}",
               "--set", f"orchestrate.rollout_workers={workers}"]
    _run([sys.executable, str(ROOT / "benchmarks" / "bench_async.py"), *cmd, "--json", str(out)], env, timeout, cwd=ROOT)
    return json.loads(out.read_text())


class StepFailed(Exception):
    def __init__(self, figures: dict[str, Any], detail: str) -> None:
        super().__init__(detail)
        self.figures = figures


def _bench(name: str, args, env: dict[str, str], timeout: float, extra: list[str] | None = None) -> dict[str, Any]:
    """``bench_gpu.py NAME`` in a child process; its JSON (partial if it was cut short) either way."""
    out = args.out / f"bench_{name}.json"
    device = "cpu" if args.cpu else "cuda"
    budget = QUICK_BENCH_S if args.quick else max(5.0, timeout * 0.6)
    cmd = [sys.executable, str(BENCH), name, "--device", device, "--budget-s", str(budget),
           "--json", str(out), *(["--quick"] if args.quick else []), *(extra or [])]
    try:
        _run(cmd, env, timeout, cwd=ROOT)
    except (subprocess.TimeoutExpired, RuntimeError) as e:
        raise StepFailed(json.loads(out.read_text()) if out.exists() else {}, str(e)) from e
    return json.loads(out.read_text())


def _run(cmd: list[str], env: dict[str, str], timeout: float, check: bool = True, cwd: Path | None = None
         ) -> subprocess.CompletedProcess:
    """``cmd`` in its own process group: on timeout the whole group is killed (a benchmark's children too),
    so that no process of a step cut short keeps holding GPU memory into the next step."""
    print(f"$ {' '.join(cmd)[:300]}", flush=True)
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          start_new_session=True) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.communicate()
            raise
    proc = subprocess.CompletedProcess(cmd, child.returncode, out, err)
    if check and proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)[:300]}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def gpu_memory_used_mb(args) -> int | None:
    """Memory in use on GPU 0 (nvidia-smi), read before each step: a step should start on an empty GPU."""
    if args.cpu:
        return None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
        return int(smi.stdout.split()[0]) if smi.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def wait_for_free_gpu(args, limit_s: float = 30.0, idle_mb: int = 2048) -> int | None:
    """Wait (at most ``limit_s``) until no more than ``idle_mb`` is in use on the GPU; the last reading."""
    t_end, used = time.monotonic() + limit_s, gpu_memory_used_mb(args)
    while used is not None and used > idle_mb and time.monotonic() < t_end:
        time.sleep(1.0)
        used = gpu_memory_used_mb(args)
    return used


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def run_steps(args, report: Report, env: dict[str, str], deadline: float) -> None:
    bandwidth = None
    for name, gpu_s, quick_s in STEPS:
        allowed = min(quick_s if args.quick else gpu_s, deadline - time.monotonic())
        if (name == "install" and not args.wheels) or (args.steps and name not in args.steps):
            continue
        if allowed < 5:
            report.add(name, "skipped", 0.0, {}, "the run's --budget-s was spent")
            continue
        t0, figures, status, error = time.monotonic(), {}, "ok", ""
        used_before = wait_for_free_gpu(args)
        try:
            figures = _step(name, args, env, allowed, bandwidth)
            bandwidth = figures.get("copy_bandwidth_gbs", bandwidth)
            report.meta.update({k: figures[k] for k in ("device_name", "torch", "cuda") if k in figures and name == "machine"})
        except StepFailed as e:
            status, figures, error = "failed", e.figures, str(e)
        except Exception as e:  # noqa: BLE001 - every failure is reported, the run goes on
            status, error = "failed", f"{type(e).__name__}: {e}"
        if used_before is not None:
            figures = {**figures, "gpu_mb_in_use_before": used_before}
            if used_before > 2048:  # who holds it (a step cut short, a leftover child)
                figures["gpu_processes_before"] = _run(
                    ["nvidia-smi", "--query-compute-apps=pid,used_memory,process_name", "--format=csv,noheader"],
                    env, 20, check=False).stdout.strip()[-500:]
        report.add(name, status, time.monotonic() - t0, figures, error)
        print(f"[{name}] {status} in {time.monotonic() - t0:.1f} s", flush=True)


def _step(name: str, args, env: dict[str, str], allowed: float, bandwidth: float | None) -> dict[str, Any]:
    if name == "install":
        return install(args, env)
    if name == "machine":
        return machine(args, env)
    if name == "cuda_tests":
        return cuda_tests(args, env, allowed)
    if name == "async":
        return bench_async(args, env, allowed)
    return benches(name, args, env, allowed, bandwidth)


def _steps(p: argparse.ArgumentParser, given: str | None) -> set[str] | None:
    if not given:
        return None
    names, known = {n.strip() for n in given.split(",") if n.strip()}, {s[0] for s in STEPS}
    if names - known:
        p.error(f"--steps: unknown {sorted(names - known)}; known: {', '.join(s[0] for s in STEPS)}")
    return names


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder for device_report.json / .md and the raw figures")
    p.add_argument("--wheels", default=None, help="folder of carried wheels to install first (make device-wheels)")
    p.add_argument("--quick", action="store_true", help="shrunken shapes and short runs: the same code in about a minute")
    p.add_argument("--cpu", action="store_true", help="check on the CPU (no GPU needed)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="the whole run's time (default 8 minutes; with --quick 30 minutes, a bound for a loaded machine)")
    p.add_argument("--steps", default=None,
                   help=f"comma-separated steps to run (a rerun of the failed ones), from: {', '.join(s[0] for s in STEPS)}")
    args = p.parse_args(argv)
    args.steps = _steps(p, args.steps)
    args.out = args.out.resolve()
    args.budget_s = args.budget_s or (1800.0 if args.quick else 480.0)
    deadline = time.monotonic() + args.budget_s
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # a JAX imported on the way must not take 75% of the GPU
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    report = Report(args.out, {"device": "cpu" if args.cpu else "cuda", "quick": args.quick, "commit": _commit(),
                               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host_python": platform.python_version(),
                               "budget_s": args.budget_s})
    run_steps(args, report, env, deadline)
    print((args.out / "device_report.md").read_text())
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's quick start runs as written: it opens with `make demo` / `make test` (CI runs `make test`, the
user's first commands), and the code blocks of its three paths (your data and reward, your model, agents and
Gymnasium) run, each `reinforge` command with tiny settings appended (one step, a few prompts, no final
sampling) and the Python snippet with `reinforge.train` given the same settings."""

from __future__ import annotations

import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import reinforge

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PATHS = ("### (a)", "### (b)", "### (c)")
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)

# appended to each command (later overrides win), so a README command runs in seconds
TINY_LLM = ["train.steps=1", "train.time_limit_s=0", "rollout.prompts_per_step=2", "rollout.group_size=2",
            "task.heldout_size=4", "eval.final_samples=0", "checkpoint.every=0", "log.report=false"]
TINY_CLASSIC = ["classic.train.total_env_steps=512", "classic.eval.episodes=1"]
TINY_API = dict(train={"steps": 1, "time_limit_s": 0}, rollout={"prompts_per_step": 2, "group_size": 2},
                eval={"final_samples": 0}, checkpoint={"every": 0}, log={"report": False})


def section(heading: str) -> str:
    """The README's text from the line starting with ``heading`` to the next heading."""
    start = README.index("\n" + heading) + 1
    end = re.compile(r"^#{1,3} ", re.MULTILINE).search(README, start + len(heading))
    return README[start:end.start() if end else len(README)]


def blocks(heading: str, lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(section(heading)) if kind == lang]


def steps(block: str) -> list[tuple[str, str]]:
    """A bash block as ("shell", lines) chunks (setup: files it writes) and ("reinforge", command line)."""
    out: list[tuple[str, str]] = []
    for line in block.splitlines(keepends=True):
        if line.startswith("reinforge "):
            out.append(("reinforge", line))
        elif out and out[-1][0] == "shell":
            out[-1] = ("shell", out[-1][1] + line)
        else:
            out.append(("shell", line))
    return out


def is_classic(args: list[str]) -> bool:
    recipe = next((a for a in args[1:] if "=" not in a), None)
    return recipe is not None and (ROOT / "reinforge" / "recipes" / "classic" / f"{recipe}.yaml").exists()


def test_readme_starts_with_make_demo_and_make_test():
    body = README.split("\n", 1)[1].lstrip("\n")  # after the title
    assert body.startswith("```\n"), "the README's first content is the code block with `make demo` and `make test`"
    first = body[4:body.index("```", 4)]
    assert [line.split("#")[0].strip() for line in first.splitlines()] == ["make demo", "make test"]


def test_each_path_has_runnable_blocks():
    for heading in PATHS:
        commands = [c for block in blocks(heading, "bash") for kind, c in steps(block) if kind == "reinforge"]
        assert commands, f"no `reinforge` command under {heading}"
    assert len(blocks("### (a)", "python")) == 1


def test_python_snippet_of_path_a_runs(tmp_path, monkeypatch):
    (snippet,) = blocks("### (a)", "python")
    real_train = reinforge.train

    def tiny_train(*args, **kwargs):
        for key, value in TINY_API.items():
            kwargs[key] = {**kwargs.get(key, {}), **value}
        kwargs.update({"task.heldout_size": 4, "output_dir": str(tmp_path / "runs")})
        return real_train(*args, **kwargs)

    monkeypatch.setattr(reinforge, "train", tiny_train)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as `python quickstart.py` puts its own folder first
    setup = next(text for kind, text in steps(blocks("### (a)", "bash")[0]) if kind == "shell")
    subprocess.run(["bash", "-euo", "pipefail", "-c", setup], cwd=tmp_path, check=True)  # writes my_rewards.py
    (tmp_path / "readme_quickstart.py").write_text(snippet)
    try:
        run = importlib.import_module("readme_quickstart").run
        assert run.steps == 1 and run.heldout_before is not None and 0.0 <= run.heldout_after <= 1.0
        assert (run.run_dir / "metrics.jsonl").exists() and run.run_dir.parent == tmp_path / "runs"
        assert "my_rewards:score" in (run.run_dir / "config.yaml").read_text()
    finally:
        sys.modules.pop("readme_quickstart", None)
        sys.modules.pop("my_rewards", None)


def _run_block(block: str, cwd: Path) -> None:
    from typer.testing import CliRunner

    from reinforge.cli import app

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for kind, text in steps(block):
        if kind == "shell":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=cwd, env=env,
                                  capture_output=True, text=True)
            assert done.returncode == 0, f"{text}\n{done.stderr}"
            continue
        args = shlex.split(text, comments=True)[1:]
        tiny = TINY_CLASSIC if is_classic(args) else TINY_LLM
        result = CliRunner().invoke(app, [*args, *tiny, f"output_dir={cwd / 'runs'}"])
        assert result.exit_code == 0, f"{text}\n{result.output}\n{result.exception!r}"
        assert "run directory:" in result.output


def _block_params() -> list:
    params = []
    for heading in PATHS:
        for i, block in enumerate(blocks(heading, "bash")):
            slow = "agent_calculator" in block or "model.lora" in block  # over ~30 s: several runs or long episodes
            params.append(pytest.param(block, id=f"{heading[4:7]}-{i}", marks=[pytest.mark.slow] if slow else []))
    return params


@pytest.mark.parametrize("block", _block_params())
def test_cli_blocks_of_the_three_paths_run(block, tmp_path, monkeypatch):
    (tmp_path / "reinforge").symlink_to(ROOT / "reinforge")  # paths "as written from the repository root"
    monkeypatch.chdir(tmp_path)
    _run_block(block, tmp_path)


def test_readme_links_point_to_files_that_exist():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    relative = [t for t in targets if not re.match(r"\w+://", t)]
    assert relative and [t for t in relative if not (ROOT / t).exists()] == []


def test_every_docs_page_is_in_the_feature_table():
    table = section("## Features")
    assert [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"(docs/{p.name})" not in table] == []

"""`verifiers` environments (verifiers 0.4, the ``verifiers.v1`` stack) played by our collector.

A verifiers environment is a **taskset** (``Taskset.load()`` yields typed ``Task`` s: ``TaskData`` with
a ``prompt`` and a ``system_prompt``, and the task's ``@vf.reward`` / ``@vf.metric`` methods that score a
``Trace``) and an **Env** class (``Env.run(task, agents)``: how one task becomes one episode; a plain
taskset gets ``SingleAgentEnv``, one model answer). ``env.id`` names the taskset as verifiers' own
loaders do (``verifiers.utils.loaders.taskset_class`` / ``environment_class``: an installed package or an
importable module exporting its ``Taskset`` subclass in ``__all__``; ``env.env_id`` an Env module).

What maps to what:

- the taskset's tasks are our tasks (``task: {kind: env}``; `verifiers_tasks`), the first ``limit``;
- a ``SingleAgentEnv`` episode is one model turn on the task's messages; an Env with its own ``run``
  (a game engine, a scripted user, verifiers' multi-turn form) is run as a coroutine
  (`reinforge.envs.episode_bridge`): each ``await interaction.turn(text)`` becomes an observation (a
  user message) and our model's next turn, sampled by OUR engine, so the episode stays token-exact;
- at the end the task's rubric scores the trace of the conversation (``Task.score``, without a
  runtime): the reward is the trace's weighted sum, ``sum_i w_i s_i`` (plus what ``run`` recorded
  itself), and each named score ``s_i`` is logged as a reward term (``reward/term/<name>``).

Not supported: Envs with more than one agent role (a second model), harnesses (bash, tools, sandboxes:
the episode is a plain chat), scoring hooks that need a runtime (skipped, as verifiers itself skips
them without one), ``Env.setup`` / ``finalize``, judges that call a model.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from reinforge.data.base import TaskSplits
from reinforge.envs.base import Message, StepResult
from reinforge.envs.episode_bridge import Ask, EpisodeBridge
from reinforge.types import Task

EXTRA = 'pip install "reinforge[envs]"'


def import_verifiers() -> Any:
    """``verifiers.v1``, or an ImportError naming the extra."""
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError(f"env.name=verifiers needs the verifiers package: {EXTRA}") from e
    return vf


@dataclass(frozen=True)
class LoadedVerifiers:
    """A loaded verifiers environment: its Env (None: a plain taskset, one model turn), its tasks and
    the role our policy plays."""

    id: str
    env: Any
    role: str
    tasks: tuple[Any, ...]


def _check_params(id: Any, env_id: Any, args: Any, env_args: Any, limit: Any) -> None:
    if not isinstance(id, str) or not id:
        raise ValueError("env.id: name the verifiers taskset (an installed package or importable module), "
                         f"got {id!r}")
    if not isinstance(env_id, str):
        raise ValueError(f"env.env_id must be a string (a verifiers Env module; '' = the taskset's own), got {env_id!r}")
    for field, value in (("args", args), ("env_args", env_args)):
        if not isinstance(value, dict):
            raise ValueError(f"env.{field} must be a mapping, got {value!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"env.limit must be an integer >= 1 or null, got {limit!r}")


def load_verifiers(id: str, env_id: str = "", args: dict | None = None, env_args: dict | None = None,
                   limit: int | None = None) -> LoadedVerifiers:
    """The verifiers environment ``id`` (cached per arguments: every episode shares one)."""
    args, env_args = dict(args or {}), dict(env_args or {})
    _check_params(id, env_id, args, env_args, limit)
    return _load(id, env_id, json.dumps(args, sort_keys=True), json.dumps(env_args, sort_keys=True), limit)


@functools.lru_cache(maxsize=16)
def _load(id: str, env_id: str, args_json: str, env_args_json: str, limit: int | None) -> LoadedVerifiers:
    vf = import_verifiers()
    from pydantic import ValidationError
    from verifiers.v1.utils import loaders
    from verifiers.v1.utils.generic import concrete_type

    args, env_args = json.loads(args_json), json.loads(env_args_json)
    try:
        taskset_cls, env_cls = _classes(vf, loaders, id, env_id)
    except (ModuleNotFoundError, AttributeError, TypeError, ValueError) as e:
        raise ValueError(f"env.id={id!r} / env.env_id={env_id!r}: {e}") from None
    try:
        if env_cls is vf.SingleAgentEnv:
            if env_args:
                raise ValueError(f"env.env_args: taskset {id!r} has no Env of its own to configure")
            cfg_cls = concrete_type(taskset_cls, vf.TasksetConfig) or vf.TasksetConfig
            taskset, env, role = taskset_cls(cfg_cls.model_validate({**args, "id": id})), None, "agent"
        else:
            env, role = _custom_env(vf, env_cls, taskset_cls, id, args, env_args)
            taskset = env.taskset
    except ValidationError as e:
        raise ValueError(f"env.args / env.env_args of {id!r}: {e}") from None
    if not taskset.bounded and limit is None:
        raise ValueError(f"env.limit: taskset {id!r} is infinite; give the number of tasks to take")
    tasks = tuple(itertools.islice(iter(taskset), limit))
    if not tasks:
        raise ValueError(f"env.id={id!r}: the taskset yielded no tasks")
    return LoadedVerifiers(id, env, role, tasks)


def _classes(vf: Any, loaders: Any, id: str, env_id: str) -> tuple[type, type]:
    """The taskset and Env classes of ``id`` / ``env_id``. A dotted id (``my_pkg.my_taskset``) is imported as
    that module (verifiers' loader looks a dotted name up under ``verifiers.v1.tasksets`` and fails); its
    exports are read as verifiers reads them (``__all__``)."""
    if "." not in id:
        return loaders.taskset_class(id), loaders.environment_class(id, env_id)
    import importlib

    module = importlib.import_module(id)
    taskset_cls = loaders._plugin_class(module, vf.Taskset, "taskset")
    if env_id:
        return taskset_cls, loaders.environment_class(id, env_id)
    try:
        return taskset_cls, loaders._plugin_class(module, vf.Env, "environment")
    except TypeError:  # no Env exported: the taskset's tasks are single answers
        return taskset_cls, vf.SingleAgentEnv


def _custom_env(vf: Any, env_cls: type, taskset_cls: type, id: str, args: dict, env_args: dict) -> tuple[Any, str]:
    """An Env with its own ``run``, built from its config without loading harnesses or runtimes."""
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.utils.generic import concrete_type

    cfg_cls = concrete_type(env_cls, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
    config = cfg_cls.model_validate({**env_args, "taskset": {**args, "id": id}})
    roles = list(agent_config_fields(config))
    if len(roles) != 1:
        raise ValueError(f"env.env_id: verifiers Env {env_cls.__name__} has roles {roles}; only Envs with one agent "
                         "role (the policy) are supported")
    env = env_cls.__new__(env_cls)  # Env.__init__ would load harnesses and runtimes the episode does not use
    env.config, env.taskset = config, taskset_cls(config.taskset)
    return env, roles[0]


def _task_id(loaded: LoadedVerifiers, i: int, data: Any) -> str:
    return f"vf-{loaded.id}-{data.id or data.name or i}"


def verifiers_tasks(loaded: LoadedVerifiers, system_prompt: str | None = None) -> list[Task]:
    """Our tasks: each verifiers task's messages, ``answer`` when its data has one, its index."""
    out = []
    for i, vf_task in enumerate(loaded.tasks):
        data = vf_task.data
        out.append(Task(id=_task_id(loaded, i, data), prompt=prompt_messages(data, system_prompt),
                        answer=str(getattr(data, "answer", "") or ""),
                        metadata={"verifiers_index": i, "verifiers_key": vf_task.key}))
    return out


def verifiers_splits(loaded: LoadedVerifiers, heldout_size: int, seed: int) -> TaskSplits:
    from reinforge.envs.adapter_tasks import seeded_splits

    return seeded_splits(verifiers_tasks(loaded), heldout_size, seed, f"verifiers({loaded.id})")


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    from verifiers.v1.types import content_text

    return content_text(content)


def prompt_messages(data: Any, system_prompt: str | None = None) -> list[Message]:
    """A task's opening messages: its (or our) system prompt, then its prompt."""
    messages: list[Message] = []
    system = system_prompt if system_prompt is not None else data.system_prompt
    if system:
        messages.append({"role": "system", "content": system})
    prompt = data.prompt
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    else:
        messages += [{"role": m.role, "content": _content(m.content)} for m in prompt or []]
    return messages


class _Interaction:
    """What ``agents.<role>.interaction(task)`` yields inside ``Env.run``: ``turn`` asks our model."""

    def __init__(self, ask: Callable[[Any], Awaitable[str]], trace: Any) -> None:
        self._ask, self.trace = ask, trace

    async def turn(self, message: Any = None) -> Any:
        from verifiers.v1.agent import Segment
        from verifiers.v1.types import AssistantMessage

        reply = await self._ask(message)
        return Segment(messages=[AssistantMessage(content=reply)])


class _Seat:
    """``agents.<role>``: our policy's seat (``interaction``, ``run``)."""

    def __init__(self, ask: Callable[[Any], Awaitable[str]], trace: Any) -> None:
        self._ask, self.trace, self.trainable = ask, trace, True

    @asynccontextmanager
    async def interaction(self, task: Any = None):
        yield _Interaction(self._ask, self.trace)

    async def run(self, task: Any = None) -> Any:
        return await _Interaction(self._ask, self.trace).turn()


class _Agents:
    def __init__(self, role: str, seat: _Seat) -> None:
        self._role, self._seat = role, seat

    def __getattr__(self, name: str) -> _Seat:
        if name.startswith("_"):
            raise AttributeError(name)
        return self[name]

    def __getitem__(self, name: str) -> _Seat:
        if name != self._role:
            raise KeyError(f"verifiers env asked for role {name!r}; only {self._role!r} (the policy) is played")
        return self._seat


class VerifiersEnv:
    """One episode of a loaded verifiers environment (module docstring). ``info`` at the end: ``reward_terms``
    (each rubric function's score), ``verifiers_metrics`` and ``correct`` (reward >= ``correct_at``)."""

    def __init__(self, loaded: LoadedVerifiers, system_prompt: str | None = None, timeout_s: float = 60.0,
                 correct_at: float = 1.0) -> None:
        self.loaded, self.system_prompt, self.timeout_s, self.correct_at = loaded, system_prompt, timeout_s, correct_at
        self.bridge: EpisodeBridge | None = None

    def reset(self, task: Task, seed: int = 0) -> list[Message]:
        vf_task = self._vf_task(task)
        from verifiers.v1.state import state_cls
        from verifiers.v1.trace import AgentInfo, Trace, TraceTask

        vf = import_verifiers()
        self.trace = Trace(task=TraceTask(type=type(vf_task).__name__, data=vf_task.data, key=vf_task.key),
                           state=state_cls(type(vf_task))(), agent=AgentInfo(config=vf.AgentConfig()))
        opening = prompt_messages(vf_task.data, self.system_prompt)
        self._record(opening)
        self.bridge = EpisodeBridge(functools.partial(self._play, vf_task), self.timeout_s)
        event = self.bridge.start()
        if not isinstance(event, Ask):
            raise RuntimeError(f"verifiers env {self.loaded.id!r} ended task {task.id!r} before the model's first turn")
        return opening + self._observation(event.text)

    def step(self, assistant: Message) -> StepResult:
        if self.bridge is None:
            raise RuntimeError("step() before reset()")
        text = assistant.get("content") or ""
        self._record([{"role": "assistant", "content": text}], sampled=True)
        event = self.bridge.reply(text)
        if isinstance(event, Ask):
            return StepResult(self._observation(event.text), 0.0, False, {})
        return self._final()

    def _vf_task(self, task: Task) -> Any:
        i = task.metadata.get("verifiers_index")
        if not isinstance(i, int) or not 0 <= i < len(self.loaded.tasks) \
                or self.loaded.tasks[i].key != task.metadata.get("verifiers_key"):
            raise ValueError(f"task {task.id!r} is not a task of verifiers env {self.loaded.id!r} (use task.kind=env)")
        return self.loaded.tasks[i]

    async def _play(self, vf_task: Any, ask: Callable[[Any], Awaitable[str]]) -> None:
        agents = _Agents(self.loaded.role, _Seat(ask, self.trace))
        if self.loaded.env is None:
            await agents[self.loaded.role].run(vf_task)
        else:
            await self.loaded.env.run(vf_task, agents)
        await vf_task.score(self.trace)

    def _observation(self, text: Any) -> list[Message]:
        if text is None:
            return []
        messages = [{"role": "user", "content": text}] if isinstance(text, str) else \
            [{"role": m.role, "content": _content(m.content)} for m in text]
        self._record(messages)
        return messages

    def _record(self, messages: list[Message], sampled: bool = False) -> None:
        from pydantic import TypeAdapter
        from verifiers.v1.graph import MessageNode
        from verifiers.v1.types import Message as VfMessage

        adapter = TypeAdapter(VfMessage)
        for m in messages:
            parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
            self.trace.nodes.append(MessageNode(parent=parent, message=adapter.validate_python(m), sampled=sampled))

    def _final(self) -> StepResult:
        rewards = self.trace.rewards
        missing = sorted(name for name, r in rewards.items() if r is None)
        if missing:
            raise RuntimeError(f"verifiers env {self.loaded.id!r}: rewards {missing} were not scored")
        reward = float(self.trace.reward)
        info: dict[str, Any] = {"correct": reward >= self.correct_at,
                                "reward_terms": {name: float(r.score) for name, r in rewards.items()}}
        if self.trace.metrics:
            info["verifiers_metrics"] = {k: v for k, v in self.trace.metrics.items() if v is not None}
        return StepResult([], reward, True, info)

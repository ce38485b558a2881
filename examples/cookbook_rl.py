"""The Tinker cookbook's own RL loop (``tinker_cookbook.rl.train``) against ``reinforge service`` (docs/service.md).

Nothing in the cookbook is changed but the base URL (``Config.base_url``). What the cookbook cannot know
about the shipped ``tiny-base`` model is added through its own extension points: the tokenizer
(``register_tokenizer``: the model directory's), a renderer for the model's chat template
(``register_renderer``: ``<bos>`` + message contents, each assistant turn closed by ``<eos>``, which is
also the stop token) and a problem environment (``ProblemEnv``: the built-in 2-digit ``a+b=`` task,
correct = the answer's exact digits). The cookbook's loop then does the rest: its rollouts, its
advantages (reward minus the group's mean), its ``importance_sampling`` loss, its AdamW steps and its
final checkpoint. Held-out greedy accuracy (200 problems never trained on) is measured before and after
with the cookbook's ``RLTestSetEvaluator`` and a temperature-0 ``TinkerTokenCompleter``. Measured
(docs/service.md, 2 loaded CPU cores): 0.395 -> 0.450 (seed 0) and 0.455 (seed 1) after 40
steps, 323-677 s.

    pip install --no-deps --target /tmp/tcbpkgs tinker-cookbook==0.6.1 chz blobfile pyrage termcolor pycryptodomex lxml
    PYTHONPATH=.:/tmp/tcbpkgs python examples/cookbook_rl.py --steps 40      # starts the service in this process
    PYTHONPATH=.:/tmp/tcbpkgs python examples/cookbook_rl.py --base-url http://127.0.0.1:8000  # key: $TINKER_API_KEY

(``--no-deps``: the cookbook pins ``tml-renderers>=0.4.1``, which the package index does not have; it is
imported only for thinkingmachines/Kimi-K3 tokenizers, never on this path.) Needs the ``service``,
``serve`` and ``lora`` extras.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial

import chz
import tinker
from tinker_cookbook import renderers
from tinker_cookbook.completers import TinkerTokenCompleter
from tinker_cookbook.renderers.base import ParseTermination, RenderContext, RenderedMessage
from tinker_cookbook.rl import train
from tinker_cookbook.rl.metric_util import RLTestSetEvaluator
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer, register_tokenizer

from reinforge.assets import SHIPPED_MODELS
from reinforge.data.arithmetic import arithmetic_splits

MODEL = "tiny-base"
MAX_TOKENS = 8  # the default recipe's max_new_tokens


class TinyBaseRenderer(renderers.Renderer):
    """tiny-base's chat template: ``<bos>`` + message contents, each assistant turn closed by ``<eos>``."""

    @property
    def _bos_tokens(self) -> list[int]:
        return [self.tokenizer.bos_token_id]

    def render_message(self, message: renderers.Message, ctx: RenderContext) -> RenderedMessage:
        ids = self.tokenizer.encode(renderers.ensure_text(message["content"]), add_special_tokens=False)
        if message["role"] == "assistant":
            ids = [*ids, self.tokenizer.eos_token_id]
        return RenderedMessage(header=None, output=[tinker.types.EncodedTextChunk(tokens=ids)])

    def get_stop_sequences(self) -> list[int]:
        return [self.tokenizer.eos_token_id]

    def parse_response(self, response: list[int]) -> tuple[renderers.Message, ParseTermination]:
        eos = self.tokenizer.eos_token_id
        done = bool(response) and response[-1] == eos
        text = self.tokenizer.decode([t for t in response if t != eos], skip_special_tokens=True)
        return renderers.Message(role="assistant", content=text), (
            ParseTermination.STOP_SEQUENCE if done else ParseTermination.MALFORMED)


def register_tiny_base() -> None:
    """The model's tokenizer and renderer, through the cookbook's registries."""
    from transformers import AutoTokenizer

    register_tokenizer(MODEL, lambda: AutoTokenizer.from_pretrained(SHIPPED_MODELS[MODEL]))
    renderers.register_renderer(MODEL, lambda tok, _image_processor=None: TinyBaseRenderer(tok))


class AdditionEnv(ProblemEnv):
    """``a+b=``; correct when the answer is exactly the sum's digits (the built-in ``exact_match``)."""

    def __init__(self, a: int, b: int, renderer: renderers.Renderer):
        super().__init__(renderer)
        self.a, self.b = a, b

    def get_question(self) -> str:
        return f"{self.a}+{self.b}="

    def check_answer(self, sample_str: str) -> bool:
        return sample_str.strip() == str(self.a + self.b)

    def check_format(self, sample_str: str) -> bool:
        return True

    def get_reference_answer(self) -> str:
        return str(self.a + self.b)


def _operands(task) -> tuple[int, int]:
    a, b = task.prompt[-1]["content"].removesuffix("=").split("+")
    return int(a), int(b)


class AdditionDataset(RLDataset):
    """Batch i: ``batch_size`` train problems drawn with seed ``seed + i``, ``group_size`` rollouts each."""

    def __init__(self, split, renderer, batch_size: int, group_size: int, n_batches: int, seed: int):
        self.split, self.renderer, self.seed = split, renderer, seed
        self.batch_size, self.group_size, self.n_batches = batch_size, group_size, n_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        import random

        rng = random.Random(self.seed * 1_000_003 + index)
        picks = rng.sample(range(len(self.split)), self.batch_size)
        return [ProblemGroupBuilder(partial(AdditionEnv, *_operands(self.split[i]), renderer=self.renderer),
                                    num_envs=self.group_size, dataset_name="addition") for i in picks]

    def __len__(self) -> int:
        return self.n_batches


class HeldoutDataset(RLDataset):
    """The first ``n`` held-out problems as one batch, one rollout each."""

    def __init__(self, renderer, n: int):
        heldout = arithmetic_splits(digits=2, ops="+").heldout
        self.builders = [ProblemGroupBuilder(partial(AdditionEnv, *_operands(heldout[i]), renderer=renderer),
                                             num_envs=1, dataset_name="heldout") for i in range(n)]

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return self.builders

    def __len__(self) -> int:
        return 1


@chz.chz
class AdditionDatasetBuilder(RLDatasetBuilder):
    batch_size: int
    group_size: int
    n_batches: int
    seed: int = 0

    async def __call__(self) -> tuple[AdditionDataset, None]:
        renderer = renderers.get_renderer(MODEL, tokenizer=get_tokenizer(MODEL))
        return AdditionDataset(arithmetic_splits(digits=2, ops="+").train, renderer, self.batch_size,
                               self.group_size, self.n_batches, self.seed), None


async def heldout_accuracy(sampler: tinker.SamplingClient, n: int = 200) -> float:
    """Greedy accuracy on the first ``n`` held-out problems, through the cookbook's evaluator."""
    renderer = renderers.get_renderer(MODEL, tokenizer=get_tokenizer(MODEL))
    evaluator = RLTestSetEvaluator(HeldoutDataset(renderer, n), max_tokens=MAX_TOKENS, name="heldout", num_groups_to_log=0)
    metrics = await evaluator.eval_token_completer(TinkerTokenCompleter(sampler, MAX_TOKENS, temperature=0.0))
    return metrics["heldout/env/all/correct"]


def local_service():
    """The service on a free loopback port of this process (key ``tml-example``)."""
    from reinforge.orchestrate.agent_episodes import BackgroundServer
    from reinforge.service.app import create_app
    from reinforge.service.command import build_service

    return BackgroundServer(create_app(build_service([MODEL], tempfile.mkdtemp()), api_key="tml-example"),
                            log_level="error")


def run(base_url: str | None, steps: int, batch_size: int, group_size: int, rank: int, lr: float, seed: int,
        log_path: str) -> tuple[float, float]:
    """The cookbook's RL loop on the service; the held-out greedy accuracy before and after."""
    register_tiny_base()
    os.environ.setdefault("TINKER_API_KEY", "tml-example")
    with (nullcontext(base_url) if base_url else local_service()) as url:
        service = tinker.ServiceClient(base_url=url)
        before = asyncio.run(heldout_accuracy(service.create_sampling_client(base_model=MODEL).result()))
        print(f"held-out greedy accuracy before: {before:.3f}", flush=True)
        config = train.Config(
            learning_rate=lr, model_name=MODEL, recipe_name="reinforge_cookbook_rl", max_tokens=MAX_TOKENS,
            log_path=log_path, renderer_name=MODEL, lora_rank=rank, eval_every=0, save_every=0, base_url=url,
            dataset_builder=AdditionDatasetBuilder(batch_size=batch_size, group_size=group_size, n_batches=steps,
                                                   seed=seed))
        asyncio.run(train.main(config))
        from tinker_cookbook import checkpoint_utils

        final = checkpoint_utils.get_last_checkpoint(log_path, required_key="sampler_path")
        after = asyncio.run(heldout_accuracy(service.create_sampling_client(model_path=final.sampler_path).result()))
    return before, after


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", default=None, help="a running service (default: start one in this process)")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=16, help="problems (groups) per step")
    p.add_argument("--group-size", type=int, default=8, help="rollouts per problem")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-path", default=None, help="the cookbook's log directory (default: a new temporary one)")
    args = p.parse_args()
    start = time.perf_counter()
    before, after = run(args.base_url, args.steps, args.batch_size, args.group_size, args.rank, args.lr, args.seed,
                        args.log_path or tempfile.mkdtemp(prefix="cookbook_rl_"))
    print(f"held-out greedy accuracy: {before:.3f} -> {after:.3f} after {args.steps} steps "
          f"({time.perf_counter() - start:.0f}s)", flush=True)


if __name__ == "__main__":
    main()

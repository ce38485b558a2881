"""``reinforge service``: build the training service and run it under uvicorn (docs/service.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reinforge.errors import ConfigError, ReinforgeError

API_KEY_ENV = "REINFORGE_API_KEY"

command = typer.Typer(add_completion=False, rich_markup_mode=None)


def build_service(models: list[str], checkpoint_dir: Path, device: str = "cpu", dtype: str = "float32",
                  seed: int = 0, limits=None, shared_base: bool = True):  # type: ignore[no-untyped-def]
    """The ``TrainingService`` over ``models`` (shipped aliases such as ``tiny-base``, or model directories;
    a client names each by the string given here). ``shared_base``: LoRA clients of one base model are
    adapters on one copy of it (``service/shared_base.py``); otherwise each client loads its own copy."""
    from reinforge.assets import resolve_model_path
    from reinforge.service.core import TrainingService

    paths = {}
    for name in models:
        path = resolve_model_path(name)
        if not (path / "config.json").is_file():
            raise ConfigError(f"--model {name}: {path} is not a model directory (no config.json)")
        paths[name] = str(path)
    if not paths:
        raise ConfigError("--model: give at least one base model clients may train (e.g. --model tiny-base)")
    from reinforge.service.shared_base import SharedBases

    return TrainingService(paths, checkpoint_dir, limits, device, dtype, seed,
                           make_state=SharedBases() if shared_base else None)


@command.command()
def service(
    model: Annotated[list[str], typer.Option(help="a base model clients may train: a shipped alias (tiny-base) or "
                                                  "an HF model directory; repeat for several")],
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    checkpoint_dir: Annotated[Path, typer.Option(help="where save_state writes checkpoints")] = Path("service_checkpoints"),
    device: Annotated[str, typer.Option()] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32 | bfloat16 | float16")] = "float32",
    seed: Annotated[int, typer.Option(help="the sampling engines' seed (requests may give their own)")] = 0,
    max_body_bytes: Annotated[int, typer.Option(help="largest request body; 413 above")] = 64 << 20,
    max_datums: Annotated[int, typer.Option(help="datums of one forward_backward; 422 above")] = 1024,
    max_tokens: Annotated[int, typer.Option(help="tokens of one forward_backward; 422 above")] = 65536,
    max_samples: Annotated[int, typer.Option(help="num_samples of one sample request; 422 above")] = 64,
    max_new_tokens: Annotated[int, typer.Option(help="max_tokens of one sample request; 422 above")] = 1024,
    max_models: Annotated[int, typer.Option(help="training clients held at once")] = 8,
    shared_base: Annotated[bool, typer.Option(help="LoRA clients of a base model share one copy of it (each an "
                                                   "adapter); --no-shared-base: a copy per client")] = True,
    api_key: Annotated[str | None, typer.Option(envvar=API_KEY_ENV, show_default=False,
                                                help="require 'X-API-Key: KEY' (or 'Authorization: Bearer KEY') "
                                                     "on every route but the health checks; the Tinker client "
                                                     "wants a key that starts with tml-")] = None,
) -> None:
    """A Tinker-compatible training service: point the tinker client's base_url here."""
    from reinforge.service.schema import ServiceLimits

    try:
        import uvicorn

        from reinforge.service.app import create_app
    except ImportError as e:
        raise ReinforgeError(f"reinforge service needs the serve extra ({e.name} is missing): "
                             "pip install 'reinforge[serve]'") from None
    limits = ServiceLimits(max_body_bytes=max_body_bytes, max_datums=max_datums, max_tokens=max_tokens,
                           max_samples=max_samples, max_new_tokens=max_new_tokens, max_models=max_models)
    svc = build_service(model, checkpoint_dir, device, dtype, seed, limits, shared_base)
    print(f"training service for {', '.join(svc.models)} at http://{host}:{port} "
          f"(tinker.ServiceClient(base_url='http://{host}:{port}'); Ctrl-C stops)")
    uvicorn.run(create_app(svc, api_key), host=host, port=port, log_level="warning")


def run_command(args: list[str]) -> None:
    """Run ``reinforge service ARGS`` (the main CLI hands its arguments over)."""
    command(args=args, prog_name="reinforge service", standalone_mode=True)

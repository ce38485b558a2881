"""Build the server app from a model path (what ``reinforge serve`` runs)."""

from __future__ import annotations

from reinforge.errors import ReinforgeError


def build_server_app(model: str, served_name: str | None = None, device: str = "cpu", dtype: str = "float32",
                     max_batch_sequences: int = 256, seed: int = 0, limits=None, tool_parser: str | None = "hermes",
                     engine: str = "torch", api_key: str | None = None, image_root: str | None = None):
    """The app over the registered rollout engine ``engine`` (``torch``, ``vllm``, ``auto``: as
    ``rollout.engine``) holding the model at ``model``; ``api_key``: required of every request but
    ``GET /health`` (``Authorization: Bearer``); ``image_root``: the directory chat image parts may name files in."""
    try:
        from reinforge.serve.app import create_app
    except ImportError as e:
        raise ReinforgeError(f"reinforge serve needs the serve extra ({e.name} is missing): "
                             "pip install 'reinforge[serve]'") from None
    from reinforge.config import config_from_dict
    from reinforge.eval.cli_eval import resolve_eval_model
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.orchestrate.components import resolve_config
    from reinforge.rollout.engines import build_engine

    path = resolve_eval_model(model)
    cfg = resolve_config(config_from_dict({"model": {"path": path, "dtype": dtype, "device": device},
                                           "rollout": {"engine": engine}}, source="--engine"))
    policy = load_model(path, dtype, device)
    names = [name for name, _ in policy.named_parameters()]
    rollout_engine = build_engine(cfg.rollout, policy, load_tokenizer(path), device, seed, path, copy_policy=False)
    return create_app(rollout_engine, served_name or model, max_batch_sequences, limits, tool_parser,
                      parameter_names=names, api_key=api_key, image_root=image_root)

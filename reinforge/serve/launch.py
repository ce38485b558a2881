"""Build the server app from a model path (what ``reinforge serve`` runs)."""

from __future__ import annotations

from reinforge.errors import ReinforgeError


def build_server_app(model: str, served_name: str | None = None, device: str = "cpu", dtype: str = "float32",
                     max_batch_sequences: int = 256, seed: int = 0, limits=None, tool_parser: str | None = "hermes"):
    try:
        from reinforge.serve.app import create_app
    except ImportError as e:
        raise ReinforgeError(f"reinforge serve needs the serve extra ({e.name} is missing): "
                             "pip install 'reinforge[serve]'") from None
    from reinforge.eval.cli_eval import resolve_eval_model
    from reinforge.models.loading import load_model, load_tokenizer
    from reinforge.rollout.torch_engine import TorchRolloutEngine

    path = resolve_eval_model(model)
    engine = TorchRolloutEngine(load_model(path, dtype, device), load_tokenizer(path), device, seed=seed,
                                max_batch_sequences=max_batch_sequences)
    return create_app(engine, served_name or model, max_batch_sequences, limits, tool_parser)

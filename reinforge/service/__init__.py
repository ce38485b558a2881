"""A Tinker-compatible training service (``reinforge service``, docs/service.md): the Tinker client's HTTP
protocol over reinforge's model loading, log-probs, registered losses, optimizer, LoRA, rollout engine and
checkpoints. Imports nothing at package import; ``app.py`` needs the serve extra (FastAPI)."""

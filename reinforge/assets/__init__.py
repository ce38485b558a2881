"""Shipped assets: `tiny-base`, a small Llama-architecture model built by scripts/build_tiny_base.py,
`tiny-agent`, its extension to tool calls and multi-turn games built by scripts/build_tiny_agent.py,
`tiny-agent-tools`, tiny-agent continued by the same script on the `python` and `search` tools, and
`tiny-agent-search`, tiny-agent-tools continued on the `search` tool with value-first passages, and
`tiny-rm`, a reference-based reward model for the addition task built from tiny-base by
scripts/build_tiny_rm.py, and `tiny-vlm`, a LLaVA-architecture vision-language model pretrained on the built-in
`shapes` task by scripts/build_tiny_vlm.py."""

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
SHIPPED_MODELS = {name: ASSETS_DIR / name for name in ("tiny-base", "tiny-agent", "tiny-agent-tools", "tiny-agent-search",
                                                          "tiny-rm", "tiny-vlm")}


def resolve_model_path(name_or_path: str) -> Path:
    """Map a shipped model alias (e.g. ``tiny-base``) or a filesystem path to a directory."""
    if name_or_path in SHIPPED_MODELS:
        return SHIPPED_MODELS[name_or_path]
    return Path(name_or_path).expanduser()

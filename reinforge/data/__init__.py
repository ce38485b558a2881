"""Task sources: procedural tasks and prompts read from local files."""

from reinforge.data.base import TaskSampler, TaskSplits
from reinforge.types import Task

__all__ = ["Task", "TaskSampler", "TaskSplits"]

"""Task sources: procedural tasks and prompts read from local files."""

from reinforge.data.base import Task, TaskSampler, TaskSplits

__all__ = ["Task", "TaskSampler", "TaskSplits"]

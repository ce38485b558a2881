"""User-facing errors: the CLI prints their message without a traceback."""


class ReinforgeError(Exception):
    """An error caused by the user's config, data or environment, with a message that says how to fix it."""


class ConfigError(ReinforgeError):
    """A bad config value or key; the message names the field and the allowed values."""


class DataError(ReinforgeError):
    """A bad dataset; the message names the file and line (or row) and what is wrong."""


class TrainingDiverged(ReinforgeError):
    """NaN/inf in the loss or gradients; the message gives the step and the offending statistic."""

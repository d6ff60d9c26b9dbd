"""The errors a user can cause, each with a message that says what was wrong and how to fix it.

The CLI prints any `UserError` as its message alone, without a traceback (`HYDRA_FULL_ERROR=1` shows everything).
"""


class UserError(Exception):
    """Something the user can fix: a setting, an input file, a plugin. The message says what and how."""


class PluginError(UserError):
    """A plugin could not be found, loaded or registered; the message says which and how to fix it."""


class ConfigError(UserError, ValueError):
    """A setting, or a combination of settings, that cannot run; the message says how to fix it."""


class InputFileError(ConfigError, FileNotFoundError):
    """A file or folder the run was told to read is missing or unreadable; the message names it."""


class RewardError(UserError):
    """A reward function returned something the run cannot use, or raised it to stop the run (any other exception
    a reward raises scores its completions None, and the run goes on)."""


class GenerationUnavailable(UserError):
    """The generation backend stopped answering; the run saves a checkpoint and says how to resume."""


class ReportError(ValueError):
    """A directory, or an option, the report cannot be made of; the message says what to give instead."""

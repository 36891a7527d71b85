"""Domain errors. Each says what is wrong and what to do; the CLI prints them without a trace."""


class MiniStreamError(Exception):
    """Base class: an error the user can act on (bad input, unreachable storage, ...)."""


class CheckpointError(MiniStreamError, ValueError):
    """The raw checkpoint, its config or a converted directory is invalid."""


class ShardError(MiniStreamError, ValueError):
    """A shard set does not fit the model or tensor-parallel size it is served with."""


class StorageError(MiniStreamError):
    """Object storage is unreachable, refuses the credentials, or lacks an object."""

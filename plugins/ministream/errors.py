"""Domain errors. Each says what is wrong and what to do; the CLI prints them without a trace."""

import errno

# How a full disk reads in the texts that reach us: Python's OSError, safetensors' Rust
# SafetensorError ("... (os error 28)" / "code: 28"), and a child process's last log line.
_ENOSPC_MARKERS = (
    "No space left on device",
    f"(os error {errno.ENOSPC})",
    f"[Errno {errno.ENOSPC}]",
)


class MiniStreamError(Exception):
    """Base class: an error the user can act on (bad input, unreachable storage, ...)."""


class CheckpointError(MiniStreamError, ValueError):
    """The raw checkpoint, its config or a converted directory is invalid."""


class ShardError(MiniStreamError, ValueError):
    """A shard set does not fit the model or tensor-parallel size it is served with."""


class StorageError(MiniStreamError):
    """Object storage is unreachable, refuses the credentials, or lacks an object."""


def is_enospc(exc: BaseException) -> bool:
    """Whether `exc` (or the child-process error text it carries) is a full disk."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return any(marker in str(exc) for marker in _ENOSPC_MARKERS)

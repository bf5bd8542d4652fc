"""Errors raised by mlotspark, each naming the bad value.

MlotsparkError
 ├── ModelError            model cannot be found, fetched or loaded
 │    ├── ModelNotFoundError
 │    ├── ModelFormatError     corrupt / truncated / unsupported file or architecture
 │    └── OfflineError         a hub download was needed but there is no network
 ├── OptionError           an invalid option value (temperature, top_p, cascade, ...)
 ├── PromptTooLongError    prompt longer than a non-cascade model's context
 ├── SnapshotError         a saved state that cannot be used (other model, corrupt)
 ├── DistributedError      ranks that disagree (model files), cannot split a model, or died
 └── StoreError            the on-disk store (conversations, memory) cannot be used

The CLI prints ``str(error)`` on one line and exits non-zero; the TUI shows it as a
notification. ``OptionError`` also derives from ``ValueError`` so plain Python
callers can catch what they expect.
"""

from __future__ import annotations


class MlotsparkError(Exception):
    """Base class of every error mlotspark raises on purpose."""


class ModelError(MlotsparkError):
    """A model cannot be found, fetched or loaded."""


class ModelNotFoundError(ModelError):
    """The model name, path or repo id does not resolve to a model."""


class ModelFormatError(ModelError):
    """A model file is corrupt, truncated, or of an unsupported kind."""


class OfflineError(ModelError):
    """A download was needed and the network (or hub) is not reachable."""


class OptionError(MlotsparkError, ValueError):
    """An option has an invalid value."""


class PromptTooLongError(MlotsparkError, ValueError):
    """The prompt does not fit in a model that runs without the cascade."""


class SnapshotError(MlotsparkError):
    """A saved KV snapshot cannot be used (other model, corrupt, truncated)."""


class DistributedError(MlotsparkError):
    """A multi-rank run cannot go on: ranks hold other model files, the model does not
    split that way, or a rank died or stopped answering."""


class StoreError(MlotsparkError):
    """The on-disk store cannot be read or written."""


__all__ = [
    "MlotsparkError",
    "ModelError",
    "ModelNotFoundError",
    "ModelFormatError",
    "OfflineError",
    "OptionError",
    "PromptTooLongError",
    "SnapshotError",
    "DistributedError",
    "StoreError",
]

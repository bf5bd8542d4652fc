"""Errors raised by mlotspark, each naming the bad value.

MlotsparkError
 ├── ModelError            model cannot be found, fetched or loaded
 │    ├── ModelNotFoundError
 │    ├── ModelFormatError     corrupt / truncated / unsupported file or architecture
 │    └── OfflineError         a hub download was needed but there is no network
 ├── OptionError           an invalid option value (temperature, top_p, cascade, ...),
 │                         or two options that conflict
 ├── PromptTooLongError    prompt longer than a non-cascade model's context
 ├── SnapshotError         a saved state that cannot be used (other model, corrupt)
 ├── DistributedError      ranks that disagree (model files), cannot split a model, or died
 └── StoreError            the on-disk store (conversations, memory) cannot be used

The CLI prints ``str(error)`` on one line and exits non-zero; the TUI shows it as a
notification. ``OptionError`` also derives from ``ValueError`` so plain Python
callers can catch what they expect.
"""

from __future__ import annotations

from typing import Callable


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
    """An option has an invalid value, or two options conflict.

    Made with :meth:`about`, it knows which options it is about, so each surface
    can name them its own way: ``render`` with CLI flags in the CLI (``--beams``),
    slash commands in the TUI; ``str(e)`` uses the API's names (``num_beams``).

    Args:
        message: the one-line message (API names).
        options: the option names the message is about, in template order.
        template: the message with ``{0}``, ``{1}`` ... where the names go.
    """

    def __init__(self, message: str, *, options: tuple[str, ...] = (), template: str | None = None):
        super().__init__(message)
        self.options = tuple(options)
        self.template = template

    @classmethod
    def about(cls, template: str, *options: str) -> "OptionError":
        """An error naming ``options`` through ``template`` (``"{0} conflicts with {1}"``)."""
        return cls(template.format(*options), options=options, template=template)

    def render(self, name_of: "Callable[[str], str]") -> str:
        """The message with each option named by ``name_of`` (e.g. its CLI flag)."""
        if self.template is None:
            return str(self)
        return self.template.format(*(name_of(o) for o in self.options))


def literal(value: object) -> str:
    """``repr(value)``, safe to put in an :meth:`OptionError.about` template."""
    return repr(value).replace("{", "{{").replace("}", "}}")


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
    "literal",
]

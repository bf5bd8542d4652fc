"""mlotspark: a desktop LLM inference engine on MLX with a memory cascade."""

# Must run before anything imports mlx: it makes MLX's BLAS calls resolve to OpenBLAS.
from . import _blas  # noqa: F401  isort: skip

from .errors import (
    MlotsparkError,
    ModelError,
    ModelFormatError,
    ModelNotFoundError,
    OfflineError,
    OptionError,
    PromptTooLongError,
    SnapshotError,
    StoreError,
)

__version__ = "0.1.0"

__all__ = [
    "MlotsparkError",
    "ModelError",
    "ModelFormatError",
    "ModelNotFoundError",
    "OfflineError",
    "OptionError",
    "PromptTooLongError",
    "SnapshotError",
    "StoreError",
    "__version__",
]

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

from .engine import Engine
from .conversation import Conversation, ConversationInfo
from .persistence import PersistenceConfig
from .snapshot import SnapshotWarning
from .generate import GenerationResult, GenerationStats
from .handle import RequestHandle
from .options import GenerationOptions

__version__ = "0.1.0"

__all__ = [
    "Conversation",
    "ConversationInfo",
    "Engine",
    "GenerationOptions",
    "GenerationResult",
    "GenerationStats",
    "RequestHandle",
    "MlotsparkError",
    "ModelError",
    "ModelFormatError",
    "ModelNotFoundError",
    "OfflineError",
    "OptionError",
    "PersistenceConfig",
    "PromptTooLongError",
    "SnapshotError",
    "SnapshotWarning",
    "StoreError",
    "__version__",
]

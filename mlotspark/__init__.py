"""mlotspark: a desktop LLM inference engine on MLX with a memory cascade."""

# Must run before anything imports mlx: it makes MLX's BLAS calls resolve to OpenBLAS.
from mlotspark.platform import blas  # noqa: F401  isort: skip
from mlotspark.platform.blas import blas_warning

from mlotspark.errors import (
    DistributedError,
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

# Slow first-time steps (conversion, KV cache probe, embedder load): stdlib only.
from mlotspark.steps import StepProgress
from mlotspark.steps import active as active_steps
from mlotspark.steps import listen as listen_steps
# Heavy names load on first use (PEP 562), so ``import mlotspark.memory.semantic`` or the
# ``memory`` CLI never pulls in MLX; ``from mlotspark import Engine`` works as usual.
_LAZY = {
    "Engine": ".engine",
    "CascadeConfig": ".memory.cascade",
    "Conversation": ".conversations.conversation",
    "ConversationInfo": ".conversations.record",
    "PersistenceConfig": ".conversations.persistence",
    "SnapshotWarning": ".memory.snapshots",
    "GenerationResult": ".results",
    "GenerationStats": ".results",
    "ReasoningPiece": ".results",
    "RequestHandle": ".runtime.request_handle",
    "GenerationOptions": ".options",
    "RequestOptions": ".options",
    "PrefillProgress": ".runtime.progress",
    "EngineProtocol": ".runtime.engine_api",
    "ConversationProtocol": ".runtime.engine_api",
    # For clients that show tool calls (the TUI): the call record, the model's format, a splitter.
    "ToolCall": ".results",
    "CallSplitter": ".decoding.tool_calls",
    "tool_format": ".decoding.tool_calls",
    # MCP servers' tools, run for the model (``chat --mcp``, ``serve --mcp``, Python).
    "McpHub": ".tools.mcp_hub",
    "load_mcp_config": ".tools.mcp_config",
    "Approval": ".tools.loop",
    "run_turn": ".tools.loop",
    # What a user can open by name: catalogue aliases and what `mlotspark list` shows.
    "available_models": ".models.hub.inventory",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mlotspark' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__version__ = "0.1.0"

__all__ = [
    "Approval",
    "CascadeConfig",
    "Conversation",
    "ConversationInfo",
    "ConversationProtocol",
    "Engine",
    "EngineProtocol",
    "GenerationOptions",
    "GenerationResult",
    "GenerationStats",
    "McpHub",
    "ReasoningPiece",
    "RequestHandle",
    "RequestOptions",
    "MlotsparkError",
    "DistributedError",
    "ModelError",
    "ModelFormatError",
    "ModelNotFoundError",
    "OfflineError",
    "OptionError",
    "PersistenceConfig",
    "PrefillProgress",
    "PromptTooLongError",
    "SnapshotError",
    "SnapshotWarning",
    "StepProgress",
    "StoreError",
    "ToolCall",
    "CallSplitter",
    "__version__",
    "active_steps",
    "available_models",
    "blas_warning",
    "listen_steps",
    "load_mcp_config",
    "run_turn",
    "tool_format",
]

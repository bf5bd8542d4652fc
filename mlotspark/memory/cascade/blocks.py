"""Episodic memory: KV blocks evicted from the window, stored compact, spilled to disk.

A block is B consecutive tokens of one layer: keys (without RoPE) and values,
``(Hkv, B, D)`` each, stored as float16 or quantized along D (``mx.quantize``, q8 /
q4). One ``EpisodicStore`` serves every layer of a model, so the byte budget is one
number for the whole tier. With kind ``auto`` (the default) blocks are stored float16
and, past the budget, the least-recently-retrieved ones are re-stored 8-bit in memory
(about half the bytes; a 1M-token prompt with 8-bit blocks answered its needle,
RESULTS) before any is spilled. Past the budget still, the least-recently-retrieved blocks are
written to disk (safetensors, one file per block, 0600 in a 0700 directory) and read
back when routing selects them again. Routing never needs the payload: it scores
the block summaries (``routing.py``) that stay in memory.
"""

from __future__ import annotations

import contextlib
import os
from collections import OrderedDict
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx

from mlotspark.errors import StoreError
from mlotspark.storage import process_dir, subdir
from mlotspark.memory.cascade.block_codec import decode, encode_blocks, quant_group, split_blocks
from mlotspark.memory.cascade.config import CascadeConfig

#: What ``auto`` stores blocks as first, and re-stores the least recently used as past the budget.
AUTO_FIRST, AUTO_PRESSED = "float16", "q8"
#: Blocks re-stored per MLX op when ``auto`` makes room: few ops for a long prompt, and a
#: small shared buffer (a block's view kept alive, e.g. by a saved state, holds its batch's).
#: A batch runs on past it to the end of the ``add_many`` group it is in (see ``_compress``).
COMPRESS_BATCH = 64


#: Share of a fixed pool (the Metal working set, a memory limit) the episodic tier leaves to
#: what runs beside it: the cascade's working memory, a prefill piece's activations, the
#: question pass's scoring step. Measured at 1M tokens on Qwen2.5-0.5B (H100, q8 blocks):
#: 0.66 GB beside weights, blocks and summaries (peak 8.8 GB), 6% of a 16 GB Mac's 10.7 GB
#: working set, which a store filling working set - weights would have pushed past it.
EPISODIC_HEADROOM = 0.10


def episodic_budget_bytes(config: CascadeConfig, weights_bytes: int = 0, memory_limit: int | None = None) -> int:
    """Bytes the episodic tier keeps in memory: ``config.episodic_budget_mb`` when set, else
    the machine's KV budget (``platform.memory.memory_budget``, read now), less
    ``EPISODIC_HEADROOM`` of the pool (at most half that budget) when the pool is fixed
    (Metal's working set, a memory limit; off Metal the KV budget is already half of what
    is available)."""
    if config.episodic_budget_mb is not None:
        return int(config.episodic_budget_mb * 1e6)
    from mlotspark.platform.memory import memory_budget  # psutil / MLX device queries: only when needed

    b = memory_budget(weights_bytes, memory_limit)
    if b.admission_limit_bytes is None:  # available memory: the other half is the headroom
        return b.kv_bytes
    # At most half of what KV may take: a limit just above the weights keeps a budget (0
    # would spill every block float16, each retrieval a disk read).
    return b.kv_bytes - min(int(EPISODIC_HEADROOM * b.pool_bytes), b.kv_bytes // 2)


@dataclass
class Block:
    """One stored block of one layer; ``payload`` is None while it is on disk."""

    layer: int
    index: int  # order within its layer = original order in the sequence
    start: int  # sequence position of its first token
    shape: tuple[int, int, int]  # (Hkv, B, D) of its keys and of its values
    nbytes: int
    payload: dict[str, mx.array] | None  # keys "k.w", "k.scales", ..., "v.w", ...
    kind: str = "float16"  # how its payload is stored: ``float16 | q8 | q4``
    last_used: int = 0  # store clock at the last retrieval (or creation)
    hits: int = 0  # retrievals served from memory
    loads: int = 0  # retrievals that read the block back from disk
    path: Path | None = None  # spill file, kept while it is valid
    # Blocks stored by one ``add_many`` share one buffer (their payloads are views of
    # it); the id of that group while more than one of them may hold it, else None.
    slab: int | None = None


@dataclass
class StoreCounters:
    """What the store did since it was made (for ``cascade_stats``)."""

    spills: int = 0
    loads: int = 0
    compressed: int = 0  # blocks re-stored 8-bit to stay within the budget (kind ``auto``)
    hits: int = 0
    bytes_written: int = 0
    bytes_read: int = 0


@dataclass
class EpisodicStore:
    """Blocks of every layer, with one memory budget and spill to disk.

    Args:
        kind: ``auto | float16 | q8 | q4`` (``auto``: float16, re-stored 8-bit past the
            budget before spilling; each block records the kind it is stored as).
        budget_bytes: bytes the tier keeps in memory: block payloads, and the routing
            summaries of every block (``summary_rows``), which stay in memory when a
            block spills (at 1M tokens on Qwen2.5-0.5B 0.8 GB of the 8.8 GB peak).
        spill_dir: parent of the spill directory; None = ``$MLOTSPARK_HOME/spill``.
        summary_rows: float32 rows of D per KV head that routing keeps for each block
            (2 for ``minmax``, 1 ``mean``, B ``keys``); 0 = not counted.
    """

    kind: str
    budget_bytes: int
    spill_dir: str | None = None
    summary_rows: int = 0
    blocks: dict[tuple[int, int], Block] = field(default_factory=dict)
    resident_bytes: int = 0
    summary_bytes: int = 0  # of every block, resident or spilled (``summary_rows``)
    clock: int = 0
    counters: StoreCounters = field(default_factory=StoreCounters)
    # Resident blocks, least recently retrieved first: spilling takes from the front.
    _lru: OrderedDict = field(default_factory=OrderedDict)
    # With kind ``auto``: the resident float16 blocks, least recently retrieved first (what
    # ``_compress`` re-stores 8-bit; a scan of ``_lru`` would pass every 8-bit block each time).
    _f16: OrderedDict = field(default_factory=OrderedDict)
    _dir: Path | None = None
    # Blocks whose payloads are views of one buffer made by ``add_many``, per group.
    _slabs: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    _next_slab: int = 0

    @classmethod
    def from_config(cls, config: CascadeConfig, weights_bytes: int = 0,
                    memory_limit: int | None = None) -> "EpisodicStore":
        """The store ``config`` asks for; its budget is ``config.episodic_budget_mb``, or when
        that is None the machine's KV budget for a model of ``weights_bytes`` under
        ``memory_limit`` (see ``episodic_budget_bytes``)."""
        rows = {"minmax": 2, "mean": 1}.get(config.representation, config.block_size)
        return cls(config.block_kind, episodic_budget_bytes(config, weights_bytes, memory_limit), config.spill_dir,
                   summary_rows=rows)

    @property
    def memory_bytes(self) -> int:
        """What the budget bounds: resident payloads and every block's summary."""
        return self.resident_bytes + self.summary_bytes

    def _count_summary(self, shape: tuple[int, int, int], n: int = 1) -> None:
        H, _, D = shape
        self.summary_bytes += n * H * self.summary_rows * D * 4

    @property
    def first_kind(self) -> str:
        """How new blocks are stored (``auto`` stores float16 first)."""
        return AUTO_FIRST if self.kind == "auto" else self.kind

    def _new_kind(self, nbytes_f16: int, shape: tuple[int, ...]) -> str:
        """How blocks of ``nbytes_f16`` float16 bytes and block ``shape`` (..., B, D) being added
        are stored: ``auto`` stores them 8-bit at once when they would pass the budget, no older
        float16 block is left to re-store (they would be re-stored right away: a quantize of
        float16 copies, a sync) and 8-bit can group their values (else they stay float16)."""
        if self.kind == "auto" and not self._f16 and self.budget_bytes > self.summary_bytes \
                and quant_group(shape[-2] * shape[-1]) is not None \
                and self.memory_bytes + nbytes_f16 > self.budget_bytes:
            return AUTO_PRESSED
        return self.first_kind

    # ----------------------------------------------------------------- writing
    def add(self, layer: int, index: int, start: int, k: mx.array, v: mx.array) -> Block:
        """Store a block's keys and values, (Hkv, B, D) each; may spill older blocks
        (``add_many`` of one block: the same payload as ``encode`` gives)."""
        return self.add_many(layer, index, start, k[None], v[None])[0]

    def add_many(self, layer: int, index: int, start: int, k: mx.array, v: mx.array) -> list[Block]:
        """Store ``n`` consecutive blocks of ``layer`` at once: what ``n`` calls of ``add``
        do (indices ``index..``, starts ``start + j * B``, one clock tick each, the same
        spills), with a few MLX ops in all instead of a few per block.

        Args:
            layer: the layer they belong to.
            index: the first block's index within its layer.
            start: sequence position of the first block's first token.
            k, v: keys and values of the blocks, (n, Hkv, B, D) each.

        Returns:
            The ``n`` new blocks, in order.
        """
        n, H, B, D = k.shape
        kind = self._new_kind(2 * k.size * 2, k.shape)
        if kind != self.first_kind:  # 8-bit of the float16 values, as re-storing later would give
            k, v = k.astype(mx.float16), v.astype(mx.float16)
        packed = {f"k.{name}": a for name, a in encode_blocks(k, kind).items()}
        packed.update({f"v.{name}": a for name, a in encode_blocks(v, kind).items()})
        # Each block's payload is a view of its rows of the stored arrays.
        pieces = {name: split_blocks(a, n) for name, a in packed.items()}
        slab = None
        if n > 1:
            slab, self._next_slab = self._next_slab, self._next_slab + 1
            self._slabs[slab] = [(layer, index + j) for j in range(n)]
        blocks = []
        for j in range(n):
            payload = {name: parts[j] for name, parts in pieces.items()}
            nbytes = sum(a.nbytes for a in payload.values())
            self.clock += 1
            block = Block(layer, index + j, start + j * B, (H, B, D), nbytes, payload, kind=kind,
                          last_used=self.clock, slab=slab)
            self.blocks[(layer, index + j)] = block
            self._lru[(layer, index + j)] = None
            self._touch(block)
            self.resident_bytes += nbytes
            blocks.append(block)
        self._count_summary((H, B, D), n)
        # Once for all: the resident set after spilling the LRU front is the one that
        # spilling after every block would leave (adds only append at the back).
        self._enforce_budget(protect=())
        return blocks

    def restore(self, block: Block) -> None:
        """Put back a block read from a snapshot (payload in memory); call
        ``settle`` after the last one."""
        key = (block.layer, block.index)
        self.blocks[key] = block
        self.clock = max(self.clock, block.last_used)
        self._count_summary(block.shape)
        if block.payload is not None:
            self.resident_bytes += block.nbytes
            self._lru[key] = None
            self._touch(block)

    def settle(self) -> None:
        """Order restored blocks by their last retrieval and spill what the budget excludes."""
        self._lru = OrderedDict((k, None) for k in sorted(self._lru, key=lambda k: self.blocks[k].last_used))
        self._f16 = OrderedDict((k, None) for k in self._lru if k in self._f16)
        self._enforce_budget(protect=())

    # ----------------------------------------------------------------- reading
    def fetch(self, layer: int, indices: list[int], dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """Keys and values of the given blocks of ``layer``, concatenated in the given
        order and decoded to ``dtype``: (Hkv, len(indices) * B, D) each.

        Counts a retrieval for each block (the LRU order) and reads spilled blocks
        back from disk; the blocks fetched together are never spilled by it.
        """
        self.clock += 1
        blocks = []
        for i in indices:
            b = self.blocks[(layer, i)]
            self._lru[(layer, i)] = None
            self._lru.move_to_end((layer, i))
            if b.payload is None:
                b.payload = self._read(b)
                b.loads += 1
                self.counters.loads += 1
                self.resident_bytes += b.nbytes
            else:
                b.hits += 1
                self.counters.hits += 1
            b.last_used = self.clock
            self._touch(b)
            blocks.append(b)
        out = self._decode_many(blocks, [b.payload for b in blocks], dtype, "kv")
        self._enforce_budget(protect={(layer, i) for i in indices})
        return out

    def peek_keys(self, layer: int, indices: list[int], dtype: mx.Dtype) -> mx.array:
        """Keys of the given blocks of ``layer``, (Hkv, len(indices) * B, D), read without
        counting a retrieval: residency, LRU order and hit/load counters stay as they were
        (a spilled block is read from disk and not kept). For scoring, not attending."""
        blocks = [self.blocks[(layer, i)] for i in indices]
        return self._decode_many(blocks, [self.payload_of(b) for b in blocks], dtype, "k")

    def _decode_many(self, blocks: list[Block], payloads: list[dict[str, mx.array]], dtype: mx.Dtype,
                     which: str) -> Any:
        """Keys (``which`` "k") or keys and values ("kv") of ``blocks``, joined along
        tokens in the given order. Runs of blocks stored alike are joined in their stored
        form and decoded once (one decode for all blocks, not one each)."""
        parts: dict[str, list[mx.array]] = {n: [] for n in which}
        start = 0
        while start < len(blocks):
            end = start + 1
            while end < len(blocks) and blocks[end].kind == blocks[start].kind:
                end += 1
            H, B, D = blocks[start].shape
            shape, kind = (H, B * (end - start), D), blocks[start].kind
            for n in which:
                joined = {name[2:]: mx.concatenate([p[name] for p in payloads[start:end]], axis=1)
                          for name in payloads[start] if name.startswith(f"{n}.")}
                parts[n].append(decode(joined, kind, dtype, shape))
            start = end
        out = tuple(p[0] if len(p) == 1 else mx.concatenate(p, axis=1) for p in parts.values())
        return out if which == "kv" else out[0]

    def unpack(self, block: Block, payload: dict[str, mx.array], dtype: mx.Dtype) -> tuple[mx.array, mx.array]:
        """Decode a payload of ``block`` to keys and values, (Hkv, B, D) each."""
        return self._decode_many([block], [payload], dtype, "kv")

    def payload_of(self, block: Block) -> dict[str, mx.array]:
        """A block's stored arrays, read from disk if spilled (residency unchanged)."""
        return block.payload if block.payload is not None else self._read(block)

    def set_budget(self, budget_mb: float) -> None:
        """Change the in-memory budget; blocks past it spill now.

        Raises:
            OptionError: a negative or non-numeric budget.
        """
        from mlotspark.errors import OptionError

        if isinstance(budget_mb, bool) or not isinstance(budget_mb, (int, float)) or not budget_mb >= 0:
            raise OptionError(f"invalid episodic budget {budget_mb!r} MB: must be a number >= 0")
        self.budget_bytes = int(budget_mb * 1e6)
        self._enforce_budget(protect=())

    # ------------------------------------------------------------------- spill
    def _enforce_budget(self, protect: set | tuple) -> None:
        if self.memory_bytes <= self.budget_bytes:
            return
        if self.kind == "auto" and self.budget_bytes > self.summary_bytes:  # else every block spills anyway
            self._compress(protect)
            if self.memory_bytes <= self.budget_bytes:
                return
        groups = set()
        while self.memory_bytes > self.budget_bytes and self._lru:
            key = next(iter(self._lru))
            if key in protect:  # blocks in use were moved to the end: only they remain
                break
            if self.blocks[key].slab is not None:
                groups.add(self.blocks[key].slab)
            self._spill(self.blocks[key])
        self._detach(groups)

    def _touch(self, block: Block) -> None:
        """Mark a resident float16 block most recently used for ``_compress`` (``auto`` only)."""
        if self.kind == "auto" and block.kind == AUTO_FIRST:
            key = (block.layer, block.index)
            self._f16[key] = None
            self._f16.move_to_end(key)

    def _compress(self, protect: set | tuple) -> None:
        """Re-store the least recently retrieved float16 blocks 8-bit, in memory, until
        the tier's bytes (``memory_bytes``) are within the budget or none is left (``auto``).

        An 8-bit block reads back within half a step of 1/255 of each group's range
        (``encode``) for a decode, while a spilled block costs a disk read each time
        routing selects it again."""
        groups: set[int] = set()
        while self.memory_bytes > self.budget_bytes:
            # 8-bit keeps a little over half the bytes: re-store what that frees, in batches.
            need = self.memory_bytes - self.budget_bytes
            batch, freed, never = [], 0, []
            for key in self._f16:  # from the front: no pass over the rest
                b = self.blocks[key]
                # A batch ends where an ``add_many`` group does: a group left in part would
                # copy its other blocks out of the shared buffer (``_detach``), a copy per array
                # per block (at 64k tokens a fifth of the re-stored blocks were copied first).
                if (len(batch) >= COMPRESS_BATCH or freed >= need) and not (
                        batch and b.slab is not None and b.slab == batch[-1].slab):
                    break
                if quant_group(b.shape[1] * b.shape[2]) is None:
                    never.append(key)  # a shape 8-bit cannot group: it stays float16
                elif key not in protect:
                    batch.append(b)
                    freed += b.nbytes * 15 // 32  # q8 keeps (1 + 1/16) / 2 of float16
            for key in never:
                del self._f16[key]
            if not batch:
                break
            self._restore_8bit(batch, groups)
        self._detach(groups)

    def _restore_8bit(self, batch: list[Block], groups: set[int]) -> None:
        """Re-store ``batch`` (resident float16 blocks, any layers) 8-bit: one quantize per
        shape for the batch, each block's payload a view of the result (one new slab)."""
        by_shape: dict[tuple[int, int, int], list[Block]] = {}
        for b in batch:
            by_shape.setdefault(b.shape, []).append(b)
        for shape, blocks in by_shape.items():
            packed = {}
            for n in ("k", "v"):
                x = mx.stack([b.payload[f"{n}.w"] for b in blocks])  # (m, Hkv, B, D) float16
                packed.update({f"{n}.{name}": a for name, a in encode_blocks(x, AUTO_PRESSED).items()})
            pieces = {name: split_blocks(a, len(blocks)) for name, a in packed.items()}
            mx.async_eval(list(packed.values()))  # the float16 payloads go once this is computed
            slab = None
            if len(blocks) > 1:
                slab, self._next_slab = self._next_slab, self._next_slab + 1
                self._slabs[slab] = [(b.layer, b.index) for b in blocks]
            for j, b in enumerate(blocks):
                key = (b.layer, b.index)
                if b.slab is not None:  # it leaves its old group: the group's rest get their own copies
                    groups.add(b.slab)
                    members = self._slabs.get(b.slab)
                    if members is not None and key in members:
                        members.remove(key)
                if b.path is not None:  # a spill file of the float16 payload: no longer what it holds
                    with contextlib.suppress(OSError):
                        b.path.unlink()
                    b.path = None
                payload = {name: parts[j] for name, parts in pieces.items()}
                nbytes = sum(a.nbytes for a in payload.values())
                self.resident_bytes += nbytes - b.nbytes
                b.payload, b.nbytes, b.kind, b.slab = payload, nbytes, AUTO_PRESSED, slab
                del self._f16[key]
                self.counters.compressed += 1

    def _spill(self, b: Block) -> None:
        if b.path is None or not b.path.exists():
            # Payloads never change, so a file written once stays valid for reloads.
            b.path = self.directory() / f"l{b.layer:03d}_b{b.index:07d}.safetensors"
            fd, tmp = tempfile.mkstemp(dir=b.path.parent, suffix=".safetensors")
            os.close(fd)
            try:
                mx.save_safetensors(tmp, b.payload)
                os.chmod(tmp, 0o600)
                os.replace(tmp, b.path)
            except OSError as e:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise StoreError(f"cannot spill an episodic block to {b.path}: {e.strerror or e}") from e
            self.counters.bytes_written += b.nbytes
        b.payload = None
        self._lru.pop((b.layer, b.index), None)
        self._f16.pop((b.layer, b.index), None)
        self.resident_bytes -= b.nbytes
        self.counters.spills += 1

    def _detach(self, groups: set[int]) -> None:
        """Blocks of these ``add_many`` groups left memory: the group's resident blocks
        get payloads of their own, so the buffer the group shared is freed and memory
        stays what ``resident_bytes`` counts (a retrieved block would otherwise hold
        all its group's bytes). After the spills, so blocks spilled together are not copied."""
        copies = []
        for group in groups:
            for key in self._slabs.pop(group, ()):
                m = self.blocks[key]
                m.slab = None
                if m.payload is not None:
                    m.payload = {n: mx.array(a) for n, a in m.payload.items()}  # a copy, not a view
                    copies += list(m.payload.values())
        if copies:
            mx.async_eval(copies)  # left lazy, a copy would hold the shared buffer through its input

    def _read(self, b: Block) -> dict[str, mx.array]:
        try:
            arrays = mx.load(str(b.path))
            # mx.load is lazy and each array holds its file open until evaluated: read
            # now, or a pass over thousands of spilled blocks runs out of descriptors.
            mx.eval(list(arrays.values()))
        except (OSError, ValueError, RuntimeError) as e:
            raise StoreError(f"cannot read spilled episodic block {b.path}: {e}") from e
        self.counters.bytes_read += b.nbytes
        return dict(arrays)

    def directory(self) -> Path:
        """The spill directory of this store (private, created on first use)."""
        if self._dir is None:
            if self.spill_dir is not None:
                parent = Path(self.spill_dir).expanduser()
            else:
                parent = subdir("spill")
            try:
                # In this process's directory, which a later process deletes if this one dies.
                self._dir = Path(tempfile.mkdtemp(prefix="cascade-", dir=process_dir(parent, "proc-")))  # 0700
            except OSError as e:
                raise StoreError(f"cannot create spill directory under {parent}: {e.strerror or e}") from e
        return self._dir

    def close(self) -> None:
        """Delete this store's spill files (blocks on disk are lost)."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
            for b in self.blocks.values():
                b.path = None

    # ------------------------------------------------------------------- stats
    def layer_blocks(self, layer: int) -> list[Block]:
        return [b for (l, _), b in self.blocks.items() if l == layer]

    def __del__(self) -> None:  # spill files are a cache of this process only
        with contextlib.suppress(Exception):
            self.close()

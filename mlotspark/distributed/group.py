"""The rank group: MLX's ``mx.distributed`` group, and small JSON messages over it.

Ranks are started by ``mlx.launch`` (ring backend over TCP or Thunderbolt, JACCL over
RDMA on Thunderbolt 5, or MPI); this module only joins the group MLX sets up from the
launcher's environment, so the launcher picks the backend. MLX 0.32's ``any``
(``distributed.cpp``) tries NCCL (CUDA only), the ring (``MLX_RANK`` + ``MLX_HOSTFILE``),
MPI (a world of more than one), then JACCL (a rank + ``MLX_IBV_DEVICES`` /
``MLX_JACCL_COORDINATOR``, what ``mlx.launch --backend jaccl`` sets, with no hostfile
variable); each is skipped when its environment is absent. Control
messages (load handshake, the requests rank 0 hands to the other ranks) travel as
JSON bytes through collectives, never pickles: a message from another machine is data.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from mlotspark.errors import DistributedError

#: backends ``join`` accepts; ``any`` lets MLX pick in its own order (ring, mpi, jaccl).
BACKENDS = ("any", "jaccl", "ring", "mpi")
#: what each launcher sets in every rank's environment.
_LAUNCH_ENV = {"jaccl": ("MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR", "JACCL_IBV_DEVICES", "JACCL_COORDINATOR"),
               "ring": ("MLX_HOSTFILE",),
               "mpi": ("OMPI_COMM_WORLD_RANK", "PMI_RANK")}
_FAILURE_TAGS = ("[ring]", "[mpi]", "[jaccl]", "peer")
_JOINED: "RankGroup | None" = None


@dataclass
class RankGroup:
    """This process's place in the group.

    Args:
        group: the MLX group (``mx.distributed.init()``).
        backend: ``ring``, ``mpi`` or ``jaccl``: the one MLX joined (None: a group of one).
    """

    group: Any
    backend: str | None = None  #: ``launched_backend()`` at join; None for a group of one

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def gather_json(self, obj: Any) -> list[Any]:
        """Every rank contributes ``obj``; every rank gets the list, in rank order.

        Raises:
            DistributedError: a rank is gone (the connection was lost).
        """
        data = json.dumps(obj, separators=(",", ":")).encode()
        with _collective("gather a message"):
            sizes = mx.distributed.all_gather(mx.array([len(data)], dtype=mx.int32), group=self.group)
            width = int(mx.max(sizes).item())
            buf = mx.zeros((width,), dtype=mx.uint8)
            if data:
                buf[: len(data)] = mx.array(list(data), dtype=mx.uint8)
            rows = mx.distributed.all_gather(buf[None], group=self.group)
            mx.eval(rows)  # (inputs are constants: nothing lazy under the collective)
        out = []
        for n, row in zip(sizes.tolist(), rows.tolist()):
            out.append(json.loads(bytes(row[:n]).decode()))
        return out

    def broadcast_json(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` to every rank (what other ranks pass is ignored).

        Other ranks block here until rank 0 sends: that is how they wait for work.

        Raises:
            DistributedError: a rank is gone (the connection was lost).
        """
        data = json.dumps(obj, separators=(",", ":")).encode() if self.is_leader else b""
        with _collective("receive rank 0's message"):
            n = int(mx.distributed.all_sum(mx.array(len(data), dtype=mx.int32), group=self.group).item())
            # int32, not uint8: the ring's sum of uint8 would be fine, but not every backend sums uint8.
            buf = mx.array(list(data), dtype=mx.int32) if self.is_leader else mx.zeros((n,), dtype=mx.int32)
            buf = mx.distributed.all_sum(buf, group=self.group)
            mx.eval(buf)
        return json.loads(bytes(buf.tolist()).decode())

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        with _collective("synchronise"):
            mx.eval(mx.distributed.all_sum(mx.array(1.0), group=self.group, stream=mx.cpu))


class _collective:
    """Turn MLX's lost-connection errors into a DistributedError naming what failed."""

    def __init__(self, what: str):
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if exc is not None and is_rank_failure(exc):
            raise DistributedError(f"could not {self.what}: a rank is gone ({exc})") from exc
        return False


def is_rank_failure(exc: BaseException) -> bool:
    """True for MLX's errors of a lost peer or link (``[ring] connection to a peer was
    lost``, any ``[jaccl]`` or ``[mpi]`` error)."""
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(tag in text for tag in _FAILURE_TAGS)


def launched_backend() -> str | None:
    """The backend MLX's ``any`` joins, read from the launcher's environment in MLX's own
    order; None when no launcher started this process as one rank of several.

    The ring's launcher sets ``MLX_RANK`` and ``MLX_HOSTFILE``; mpirun its ``OMPI_``/``PMI_``
    rank; JACCL's (``mlx.launch --backend jaccl`` or ``jaccl-ring``) a rank and
    ``MLX_IBV_DEVICES`` / ``MLX_JACCL_COORDINATOR``, with no hostfile variable.
    """
    env = os.environ
    if "MLX_RANK" in env and env.get("MLX_HOSTFILE"):
        return "ring"
    if any(k in env for k in _LAUNCH_ENV["mpi"]):
        return "mpi"
    ranked = "MLX_RANK" in env or "JACCL_RANK" in env  # JACCL reads either (jaccl.h)
    if ranked and any(env.get(k) for k in _LAUNCH_ENV["jaccl"]):
        return "jaccl"
    return None


def launched() -> bool:
    """True when a launcher (``mlx.launch``, mpirun) started this process as one rank of
    several: then a group that cannot form is an error, never a quiet group of one."""
    return launched_backend() is not None


def join(backend: str = "any") -> RankGroup:
    """Join the group the launcher set up.

    Args:
        backend: ``any`` (MLX picks), ``jaccl``, ``ring`` or ``mpi``.

    Returns:
        The RankGroup; a group of one when no launcher started this process.

    Raises:
        DistributedError: MLX has no distributed backend here, or the ranks cannot connect.
    """
    if backend not in BACKENDS:
        raise DistributedError(f"invalid distributed backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if not mx.distributed.is_available():
        raise DistributedError("this MLX build has no distributed backend (mx.distributed.is_available() is False)")
    global _JOINED
    if _JOINED is not None:  # one group per process: a second init would open new connections
        return _JOINED
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile and os.path.isfile(hostfile) and not open(hostfile).read().strip():
        # ``mlx.launch -n 1`` writes an empty hostfile, which MLX's ring cannot parse: a group of one.
        del os.environ["MLX_HOSTFILE"]
    try:
        group = mx.distributed.init(strict=launched(), backend=backend)
    except RuntimeError as e:
        raise DistributedError(f"cannot join the rank group ({backend} backend): {e}") from e
    _JOINED = RankGroup(group, backend=launched_backend() if group.size() > 1 else None)
    return _JOINED


def host_name() -> str:
    """This machine's name, for per-rank reports."""
    return socket.gethostname()

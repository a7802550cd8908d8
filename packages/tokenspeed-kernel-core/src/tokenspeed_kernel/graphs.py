"""Eager calls of a multi-launch host path replayed from a cached CUDA graph (host cost).

Some kernels' host paths cost far more than their device time when called eagerly:
``triton_kernels``' MoE layer runs two library matmuls whose Python (option
heuristics, device-property queries, tensor wrappers) costs 1.3-2.4 ms per call at
one token on the H200 machine (``tools/host_probe.py``), against 89.5 us for the whole
layer, route included, in a CUDA graph (``docs/benchmarks/h200-2026-12-01``).
:class:`GraphCache` captures such a path once per call shape and replays it::

    _graphs = GraphCache("triton_kernels.moe_apply")
    out = _graphs.run(key, (x, topk_weights, topk_ids), lambda x, w, i: layer(x, w, i))

- ``key`` names everything the graph bakes in besides the copied inputs: the
  weights (by address: they are converted once and kept), shapes, dtypes, strides,
  Python scalars, the device. Inputs must match the captured ones in shape, dtype
  and strides (the key must say so: :func:`tensor_key`).
- The copied inputs (small: activations and routing) are copied into the graph's
  static buffers, the graph is replayed, and the output is cloned (the next replay
  reuses the graph's buffers). So a call costs the copies, one replay and one clone.
- ``in_place=True``: a graph that reads the inputs where they are is tried first, keyed by
  ``key`` and the inputs' addresses: a call on tensors at addresses it has seen before (a
  decode loop allocates the same blocks step after step) costs one replay and one clone,
  no copies. Its replays read whatever the tensors at those addresses hold now, and the key
  says their shape, strides and dtype (``key`` must hold :func:`tensor_key` of each), so a
  replay computes the call it stands for; the graph keeps no reference to them. Calls whose
  addresses do not recur take the copying graph of ``key``. These graphs have their own budget
  (``max_graphs`` of them, at most ``PLACES_PER_KEY`` address sets a key), so they never crowd
  out the copying graphs of new shapes. A key's in-place graph not replayed in ``STALE_CALLS`` calls of the key
  gives its place to an address set seen twice since (a decode loop's first steps allocate differently from
  its steady ones: session 18 found 5808 of 5904 MoE calls of a decode run on the copying graph, every place
  taken by a warm-up step's addresses). With ``new_output`` (a function making the call's output tensor) the
  in-place graph also writes that tensor where it is, keyed by its address: a replay returns it, with no clone.
- The first call of a key runs directly; the second warms the path up on a side stream
  and captures it (a few ms, once); later ones replay. A shape seen once (a prefill
  chunk, a one-off batch) never costs a capture.
- At most ``max_graphs`` graphs are kept, and none is dropped: once the cache is full,
  new keys run directly. Evicting would let shapes that keep changing (a batch size that
  varies every step) recapture on every call, which costs more than the direct path.
  Each graph holds its own memory pool (its intermediates; a few MB at 64 tokens).
- A capture that fails (the path turned out not to be capturable) warns once for the key,
  and that key runs directly from then on.

Used only where it is correct and pays: the callable must be a pure function of
its copied inputs and the keyed state (no in-place writes to arguments, no host
reads of device values), and the caller falls back to the direct call inside a
graph capture (no nested capture), on a CPU, and when ``TOKENSPEED_KERNEL_EAGER_GRAPHS=0``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import torch

from .core import recording as _recording

__all__ = ["GraphCache", "eager_graphs_enabled", "in_place_key", "no_eager_graphs", "tensor_key"]

_ENABLED = os.environ.get("TOKENSPEED_KERNEL_EAGER_GRAPHS", "1").strip() not in ("0", "false", "no", "off")
_state = threading.local()


@contextlib.contextmanager
def no_eager_graphs() -> Iterator[None]:
    """Within the block, on this thread, every :class:`GraphCache` path runs directly (``bench --host`` compares)."""
    before = getattr(_state, "off", False)
    _state.off = True
    try:
        yield
    finally:
        _state.off = before


def eager_graphs_enabled() -> bool:
    """False when ``TOKENSPEED_KERNEL_EAGER_GRAPHS=0`` (read at import)."""
    return _ENABLED


def tensor_key(t: torch.Tensor) -> tuple:
    """What a graph bakes in about a copied input: shape, strides, dtype, device."""
    return (t.shape, t.stride(), t.dtype, t.device)


def in_place_key(*tensors: torch.Tensor | None) -> tuple:
    """What a graph bakes in about tensors it reads where they are (weights): address, shape, strides, dtype."""
    return tuple(None if t is None else (t.data_ptr(), t.shape, t.stride(), t.dtype) for t in tensors)


class _Graph:
    __slots__ = ("graph", "inputs", "last", "output")

    def __init__(self, graph: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        self.graph, self.inputs, self.output = graph, inputs, output
        self.last = 0  # in-place graphs: the key's call count at the last replay


#: in-place graphs a key may have (address sets: a decode loop's allocations settle into one or two).
PLACES_PER_KEY = 2
#: an in-place graph not replayed in this many calls of its key is stale: an address set seen twice since may
#: take its place (the first steps of a decode loop allocate differently from the steady ones).
STALE_CALLS = 8


class GraphCache:
    """Captured graphs of one host path, by key (module doc)."""

    def __init__(self, name: str, *, max_graphs: int = 128) -> None:
        self.name = name
        self.max_graphs = max_graphs
        self._graphs: dict[Hashable, _Graph] = {}
        self._places: dict[Hashable, list] = {}  # key -> the address sets of its in-place graphs
        self._key_calls: dict[Hashable, int] = {}  # key -> in-place calls of it (the staleness clock)
        self.evictions = 0
        self._in_place = 0
        self._seen: set[Hashable] = set()
        self._failed: set[Hashable] = set()
        self._lock = threading.Lock()
        self.captures = 0
        #: calls by path: replays of an in-place graph, of a copying graph, and direct calls (``stats()``).
        self.in_place_replays = self.copying_replays = self.direct_calls = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def usable(self, *tensors: torch.Tensor) -> bool:
        """Whether a call on these tensors may replay a graph (CUDA, not capturing, not disabled)."""
        return (
            _ENABLED
            and not getattr(_state, "off", False)
            and tensors[0].is_cuda
            and not torch.cuda.is_current_stream_capturing()
            and all(type(t) is torch.Tensor for t in tensors)
        )

    def run(
        self,
        key: Hashable,
        inputs: Sequence[torch.Tensor],
        fn: Callable[..., torch.Tensor],
        *,
        in_place: bool = False,
        new_output: Callable[[], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``fn(*inputs)``, replayed from the graph captured for ``key`` (captured now on a miss).

        ``in_place``: first the graph of these inputs' addresses, which reads them without copies (module doc).
        ``new_output``: with ``in_place``, makes the call's output (``torch.empty_like(x)``), which ``fn`` then fills
        through ``out=``: the in-place graph is keyed by its address too and writes it, so a replay returns it
        without a clone (a decode loop's allocations recur, the output's as well); other paths copy into it.
        """
        if _recording.active:  # a launch-plan recording cannot replay a graph: the call is not recordable
            _recording.refuse(f"{self.name}: an eager CUDA graph")
        result = None
        if in_place:
            addresses = [t.data_ptr() for t in inputs]
            if new_output is not None:
                result = new_output()
                addresses.append(result.data_ptr())
            place = (key, tuple(addresses))
            tick = self._key_calls[key] = self._key_calls.get(key, 0) + 1
            entry = self._graphs.get(place)
            if entry is None and place not in self._failed and self._seen_before(place):
                places = self._places.get(key, ())
                if len(places) >= PLACES_PER_KEY:
                    self._evict_stale(key, tick)
                if self._in_place < self.max_graphs and len(self._places.get(key, ())) < PLACES_PER_KEY:
                    call = fn if result is None else (lambda *a: fn(*a, out=result))
                    entry = self._try_capture(place, inputs, call, copy_inputs=False, keep_output=result is None)
                    if entry is not None:
                        with self._lock:
                            self._in_place += 1
                            self._places.setdefault(key, []).append(place)
            if entry is not None:
                self.in_place_replays += 1
                entry.last = tick
                entry.graph.replay()
                return result if result is not None else entry.output.clone()
        entry = self._graphs.get(key)
        if entry is None:
            if (
                len(self._graphs) - self._in_place >= self.max_graphs
                or key in self._failed
                or not self._seen_before(key)
            ):
                self.direct_calls += 1
                return fn(*inputs) if result is None else fn(*inputs, out=result)
            entry = self._try_capture(key, inputs, fn, copy_inputs=True)
            if entry is None:
                self.direct_calls += 1
                return fn(*inputs) if result is None else fn(*inputs, out=result)
        self.copying_replays += 1
        for static, t in zip(entry.inputs, inputs):
            static.copy_(t)
        entry.graph.replay()
        return entry.output.clone() if result is None else result.copy_(entry.output)

    def _evict_stale(self, key: Hashable, tick: int) -> None:
        """Drop ``key``'s least recently replayed in-place graph if it is stale (:data:`STALE_CALLS`). The current
        stream is synchronised first: the graph's memory pool goes back to the allocator, and its last replay must
        be done with it (rare: a decode loop's address sets settle after a few steps)."""
        places = self._places[key]
        old = min(places, key=lambda p: self._graphs[p].last)
        if tick - self._graphs[old].last <= STALE_CALLS:
            return
        torch.cuda.current_stream().synchronize()
        with self._lock:
            places.remove(old)
            del self._graphs[old]
            self._in_place -= 1
            self.evictions += 1

    def stats(self) -> dict[str, int]:
        """Graphs held (in place / copying), captures, and calls by path since the cache was made."""
        return {
            "graphs": len(self._graphs), "in_place_graphs": self._in_place, "captures": self.captures,
            "in_place_replays": self.in_place_replays, "copying_replays": self.copying_replays,
            "direct_calls": self.direct_calls, "evictions": self.evictions,
        }  # fmt: skip

    def _seen_before(self, key: Hashable) -> bool:
        """True from a key's second sighting on (the first one is only remembered)."""
        if key in self._seen:
            return True
        with self._lock:
            if len(self._seen) >= 16 * self.max_graphs:
                self._seen.clear()
            self._seen.add(key)
        return False

    def _try_capture(
        self,
        key: Hashable,
        inputs: Sequence[torch.Tensor],
        fn: Callable[..., torch.Tensor],
        *,
        copy_inputs: bool,
        keep_output: bool = True,
    ) -> _Graph | None:
        """The graph captured for ``key``, or None when the path is not capturable (then the key runs directly).
        ``keep_output=False``: the graph writes a caller's tensor (``new_output``), which the entry must not hold."""
        try:
            return self._capture(key, inputs, fn, copy_inputs=copy_inputs, keep_output=keep_output)
        except Exception as exc:  # the path is not capturable after all: run it directly from now on
            self._failed.add(key)
            warnings.warn(
                f"{self.name}: eager CUDA-graph capture failed, calling directly: {type(exc).__name__}: {exc}",
                RuntimeWarning,
                stacklevel=4,
            )
            return None

    def _capture(
        self,
        key: Hashable,
        inputs: Sequence[torch.Tensor],
        fn: Callable[..., torch.Tensor],
        *,
        copy_inputs: bool,
        keep_output: bool = True,
    ) -> _Graph:
        # Copying: the graph reads static buffers it owns. In place: the caller's tensors, which the entry must not
        # keep alive (an address held would never be handed out again, so it would never recur).
        static = tuple(t.clone() for t in inputs) if copy_inputs else tuple(inputs)
        current = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(current)
        with torch.cuda.stream(side):
            fn(*static)  # warm-up: compiles and fills the path's own caches, so the capture records launches only
        current.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = fn(*static)
        entry = _Graph(graph, static if copy_inputs else (), output if keep_output else None)
        with self._lock:
            self._graphs[key] = entry
            self.captures += 1
        return entry

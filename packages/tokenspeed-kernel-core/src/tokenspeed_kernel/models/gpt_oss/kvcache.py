"""A paged KV cache with a simple block manager (the engine side of the attention ops)."""

from __future__ import annotations

import torch

from .config import GptOssConfig

__all__ = ["PagedKVCache"]


class PagedKVCache:
    """Per layer ``k, v [num_pages, page_size, Hkv, D]`` (NHD) and one page-table row per sequence slot.

    The block manager hands out whole pages from a free list; a sequence's pages
    need not be contiguous. All bookkeeping is on the host; the device page table
    (``int32 [max_batch, max_pages_per_seq]``) is updated with one copy per
    :meth:`reserve` call, so nothing here synchronises with the device.
    """

    def __init__(
        self,
        cfg: GptOssConfig,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        max_batch: int,
        max_pages_per_seq: int,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        shape = (num_pages, page_size, cfg.num_key_value_heads, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.page_size = page_size
        self.num_pages = num_pages
        self.device = torch.device(device)
        self.page_table = torch.zeros(max_batch, max_pages_per_seq, dtype=torch.int32, device=device)
        self._host_table = torch.zeros(max_batch, max_pages_per_seq, dtype=torch.int32)
        self.seqlens = [0] * max_batch
        self._pages: list[list[int]] = [[] for _ in range(max_batch)]
        self._free = list(range(num_pages))

    @classmethod
    def for_batch(
        cls,
        cfg: GptOssConfig,
        *,
        num_layers: int,
        max_batch: int,
        max_tokens_per_seq: int,
        page_size: int = 16,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
    ) -> PagedKVCache:
        """A cache with room for ``max_batch`` sequences of up to ``max_tokens_per_seq`` tokens each."""
        pages_per_seq = -(-max_tokens_per_seq // page_size)
        return cls(
            cfg,
            num_layers=num_layers,
            num_pages=max_batch * pages_per_seq,
            page_size=page_size,
            max_batch=max_batch,
            max_pages_per_seq=pages_per_seq,
            device=device,
            dtype=dtype,
        )

    @property
    def free_pages(self) -> int:
        return len(self._free)

    def reserve(self, seq: int, new_tokens: int) -> torch.Tensor:
        """Make room for ``new_tokens`` more tokens of sequence slot ``seq``.

        Returns their cache slots (``page * page_size + row``), ``int64 [new_tokens]`` on the cache's device.
        """
        start = self.seqlens[seq]
        end = start + new_tokens
        pages_needed = -(-end // self.page_size)
        if pages_needed > self.page_table.shape[1]:
            raise RuntimeError(f"PagedKVCache: sequence {seq} would exceed {self.page_table.shape[1]} pages")
        need = pages_needed - len(self._pages[seq])
        if need > len(self._free):
            raise RuntimeError(f"PagedKVCache: out of pages ({need} needed, {len(self._free)} free)")
        if need > 0:
            first = len(self._pages[seq])
            new = self._free[:need]
            del self._free[:need]
            self._pages[seq].extend(new)
            self._host_table[seq, first : first + need] = torch.tensor(new, dtype=torch.int32)
            self.page_table[seq].copy_(self._host_table[seq], non_blocking=True)
        self.seqlens[seq] = end
        pos = torch.arange(start, end)
        pages = self._host_table[seq].long()[pos // self.page_size]
        return (pages * self.page_size + pos % self.page_size).to(self.device, non_blocking=True)

    def release(self, seq: int) -> None:
        """Return sequence slot ``seq``'s pages to the free list and empty it."""
        self._free.extend(self._pages[seq])
        self._pages[seq] = []
        self.seqlens[seq] = 0
        self._host_table[seq].zero_()
        self.page_table[seq].zero_()

    def reset(self) -> None:
        """Release every sequence slot."""
        for seq in range(len(self._pages)):
            if self._pages[seq]:
                self.release(seq)

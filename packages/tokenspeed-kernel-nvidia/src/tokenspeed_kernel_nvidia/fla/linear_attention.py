"""``gdn_chunk_prefill`` through flash-linear-attention's ``chunk_gated_delta_rule``.

fla takes a batch dim (packed sequences: batch 1 with ``cu_seqlens``), int64
``cu_seqlens``, and ``beta`` in q's dtype: beta is rounded to q's dtype here (the op
takes it in fp32), which is the one difference from the op's numerics.
"""

from __future__ import annotations

import torch
from fla.ops.gated_delta_rule import chunk_gated_delta_rule

__all__ = ["gdn_chunk_prefill"]


def gdn_chunk_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    output_final_state: bool,
    use_qk_l2norm: bool,
    out: torch.Tensor | None,
):
    o, final = chunk_gated_delta_rule(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), g.float().unsqueeze(0), beta.to(q.dtype).unsqueeze(0),
        scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=None if cu_seqlens is None else cu_seqlens.long(),
    )  # fmt: skip
    o = o.squeeze(0)
    if out is not None:
        o = out.copy_(o)
    return (o, final) if output_final_state else o

"""Triton gated-delta-rule kernels (``gdn_chunk_prefill``, ``gdn_decode``) against the recurrence.

On CPU the kernels run under ``TRITON_INTERPRET=1`` (conftest) with the interpreter tiles
(16-column K/V steps), on K, V = 16 / 32: the lengths cross the 64-token chunks and the
16-row sub-blocks of the WY solve (1; 63, 64, 65; 130, 0, 7 with an empty sequence),
with and without initial / final states, HV = 2H and HV = H, the L2 norm and a scale.
Results must meet the ``recurrence`` tolerance against
``tokenspeed_kernel.reference.linear_attention.gdn_recurrent`` (float32, token by token).
"""

from __future__ import annotations

import pytest
import torch
from _checks import assert_triton

import tokenspeed_kernel as tk
from tokenspeed_kernel.core.formats import DTYPE_NAMES
from tokenspeed_kernel.numerics.compare import check_close
from tokenspeed_kernel.numerics.tolerances import tolerance
from tokenspeed_kernel.reference.linear_attention import gdn_decode as ref_decode
from tokenspeed_kernel.reference.linear_attention import gdn_recurrent
from tokenspeed_kernel_triton import linear_attention as la

pytestmark = pytest.mark.usefixtures("triton_on_gpu")


def _inputs(n, h, hv, dk, dv, dtype, device, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn((n, h, dk), generator=gen).to(dtype)
    k = (torch.randn((n, h, dk), generator=gen) * dk**-0.5).to(dtype)
    v = torch.randn((n, hv, dv), generator=gen).to(dtype)
    g = -(torch.rand((n, hv), generator=gen) * 0.49 + 0.01)
    beta = torch.sigmoid(torch.randn((n, hv), generator=gen))
    return [x.to(device) for x in (q, k, v, g, beta)], gen


def _check(name, got, want, dtype):
    result = check_close(name, got, want, tolerance("recurrence", dtype))
    assert result.passed, f"{name}: {result}"


def _cu(lengths, device):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "lengths, heads, l2norm, states",
    [
        ((1,), (2, 4), False, False),
        ((63, 64, 65), (2, 4), True, True),
        ((130, 0, 7), (2, 2), False, True),
    ],
    ids=["one-token", "chunk-edges", "varlen-empty"],
)
def test_gdn_chunk_prefill(device, dtype, lengths, heads, l2norm, states):
    h, hv = heads
    dk, dv = 32, 32
    (q, k, v, g, beta), gen = _inputs(sum(lengths), h, hv, dk, dv, dtype, device, sum(lengths) + hv)
    cu = _cu(lengths, device)
    init = (torch.randn((len(lengths), hv, dk, dv), generator=gen) * 0.1).to(device) if states else None
    if q.device.type == "cpu":  # on a GPU, other vendors' kernels (fla) may rank first: the call forces triton
        assert_triton("gdn_chunk_prefill", (DTYPE_NAMES[dtype],),
                      {"head_dim": dk, "head_dim_v": dv, "qk_l2norm": l2norm}, q.device)  # fmt: skip
    got = tk.gdn_chunk_prefill(q, k, v, g, beta, scale=0.3, initial_state=init, cu_seqlens=cu,
                               output_final_state=states, use_qk_l2norm=l2norm, solution="triton")  # fmt: skip
    o, final = got if states else (got, None)
    want_o, want_final = gdn_recurrent(q.float(), k.float(), v.float(), g, beta, scale=0.3, initial_state=init,
                                       cu_seqlens=cu, use_qk_l2norm=l2norm)  # fmt: skip
    assert o.dtype == dtype and o.shape == v.shape
    _check("out", o, want_o, dtype)
    if states:
        assert final.dtype == torch.float32 and final.shape == (len(lengths), hv, dk, dv)
        _check("final_state", final, want_final, dtype)
    if init is not None and 0 in lengths:  # an empty sequence passes its state through
        i = lengths.index(0)
        assert torch.equal(final[i], init[i])


def test_gdn_chunk_prefill_direct(device):
    """One sequence without cu_seqlens, default scale, no initial state, K != V, ``out=``."""
    n, h, hv, dk, dv = 70, 1, 2, 16, 32
    (q, k, v, g, beta), _ = _inputs(n, h, hv, dk, dv, torch.float32, device, 7)
    buffer = torch.full((n, hv, dv + 8), 5.0, device=device)
    out = buffer[:, :, 4 : 4 + dv]
    o, final = la.gdn_chunk_prefill(q, k, v, g, beta, scale=dk**-0.5, initial_state=None, cu_seqlens=None,
                                    output_final_state=True, use_qk_l2norm=True, out=out)  # fmt: skip
    assert o.data_ptr() == out.data_ptr()
    assert bool((buffer[:, :, :4] == 5).all()) and bool((buffer[:, :, 4 + dv :] == 5).all())
    want_o, want_final = gdn_recurrent(q, k, v, g, beta, scale=dk**-0.5, use_qk_l2norm=True)
    _check("out", o, want_o, torch.float32)
    _check("final_state", final, want_final, torch.float32)
    # no tokens: the state passes through
    e = [x[:0] for x in (q, k, v, g, beta)]
    init = torch.randn((1, hv, dk, dv), device=device)
    o0, f0 = la.gdn_chunk_prefill(*e, scale=1.0, initial_state=init, cu_seqlens=None, output_final_state=True,
                                  use_qk_l2norm=False, out=None)  # fmt: skip
    assert o0.shape == (0, hv, dv) and torch.equal(f0, init)


def test_gdn_chunk_prefill_strided_inputs(device):
    """q, k, v as views of one packed projection (token stride > H * K), bf16 beta."""
    n, h, hv, dk, dv = 40, 2, 4, 16, 16
    gen = torch.Generator().manual_seed(3)
    mixed = torch.randn((n, 2 * h * dk + hv * dv), generator=gen).to(device)
    q = mixed[:, : h * dk].view(n, h, dk)
    k = (mixed[:, h * dk : 2 * h * dk] * 0.25).view(n, h, dk)
    v = mixed[:, 2 * h * dk :].view(n, hv, dv)
    g = -(torch.rand((n, hv), generator=gen) * 0.3).to(device)
    beta = torch.sigmoid(torch.randn((n, hv), generator=gen)).to(device, torch.bfloat16)
    cu = _cu((25, 15), device)
    o = tk.gdn_chunk_prefill(q, k, v, g, beta, scale=0.5, cu_seqlens=cu, use_qk_l2norm=True, solution="triton")
    want, _ = gdn_recurrent(q, k, v, g, beta, scale=0.5, cu_seqlens=cu, use_qk_l2norm=True)
    _check("out", o, want, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("indexed", [False, True])
def test_gdn_decode(device, dtype, indexed):
    b, h, hv, dk, dv = 4, 1, 2, 16, 32
    l2norm = indexed
    (q, k, v, g, beta), gen = _inputs(b, h, hv, dk, dv, dtype, device, 11 + indexed)
    slots = b + 2
    state = (torch.randn((slots, hv, dk, dv), generator=gen) * 0.1).to(device)
    idx = torch.tensor([4, -1, 0, 2], dtype=torch.int32, device=device) if indexed else None
    assert_triton("gdn_decode", (DTYPE_NAMES[dtype],), {"head_dim": dk, "head_dim_v": dv, "qk_l2norm": l2norm},
                  q.device)  # fmt: skip
    want_state = state.clone()
    want = ref_decode(q.float(), k.float(), v.float(), g, beta, want_state, scale=0.7, state_indices=idx,
                      use_qk_l2norm=l2norm)  # fmt: skip
    before = state.clone()
    o = tk.gdn_decode(q, k, v, g, beta, state, scale=0.7, state_indices=idx, use_qk_l2norm=l2norm,
                      solution="triton")  # fmt: skip
    assert o.dtype == dtype and o.shape == (b, hv, dv)
    _check("out", o, want, dtype)
    _check("state", state, want_state, dtype)
    touched = [4, 0, 2] if indexed else list(range(b))
    for slot in range(slots):
        if slot not in touched:
            assert torch.equal(state[slot], before[slot]), f"state {slot} changed"
    if indexed:
        assert bool((o[1] == 0).all())


def test_gdn_decode_out_and_prefill_agree(device):
    """Decode steps continue a prefill: prefill(40) then 3 decode steps == prefill(43)."""
    n, h, hv, dk, dv = 43, 2, 4, 16, 16
    (q, k, v, g, beta), _ = _inputs(n, h, hv, dk, dv, torch.float32, device, 5)
    o_all, f_all = la.gdn_chunk_prefill(q, k, v, g, beta, scale=0.25, initial_state=None, cu_seqlens=None,
                                        output_final_state=True, use_qk_l2norm=True, out=None)  # fmt: skip
    _, state = la.gdn_chunk_prefill(*(x[:40] for x in (q, k, v, g, beta)), scale=0.25, initial_state=None,
                                    cu_seqlens=None, output_final_state=True, use_qk_l2norm=True, out=None)  # fmt: skip
    out = torch.empty((1, hv, dv), device=device)
    for t in range(40, n):
        step = [x[t : t + 1] for x in (q, k, v, g, beta)]
        o = la.gdn_decode(*step, state, scale=0.25, state_indices=None, use_qk_l2norm=True, out=out)
        assert o.data_ptr() == out.data_ptr()
        _check("out", o[0], o_all[t], torch.float32)
    _check("state", state, f_all, torch.float32)

"""Fuzzing the attention and MoE entry points (hypothesis): a clear error or the right answer, nothing else.

Each example is a call of ``mha_prefill``, ``mha_extend_with_kvcache``,
``mha_decode_with_kvcache`` or ``moe_apply`` with random shapes, dtypes, options and
values, and at most one fault (a wrong dtype, shape, index value, scalar, ...). The
op must then either

- raise ``TypeError`` / ``ValueError`` whose message names the faulty argument (an
  example with a fault must raise), or
- (no fault) return what an independent float64 computation written here gives.

Any other exception fails the example, and so does a call that runs past
:data:`CALL_SECONDS` (an alarm turns a hang into a failure). Runs on the CPU, where
every value check runs (host tensors), against the PyTorch references that selection
picks there; the Triton kernels' agreement with the references is the Triton
package's tests' job. Bounded: a fixed number of examples per op, a deadline per
example, derandomized (the same examples on every run), no example database.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

import tokenspeed_kernel as tk

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis (./run installs it)")
st = pytest.importorskip("hypothesis.strategies")

EXAMPLES = 80
CALL_SECONDS = 30
SETTINGS = hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=5000,  # ms per example; the calls take a few ms
    derandomize=True,
    database=None,
    suppress_health_check=[hypothesis.HealthCheck.too_slow, hypothesis.HealthCheck.data_too_large],
)
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
TOL = {torch.float32: 2e-4, torch.bfloat16: 2.5e-2, torch.float16: 4e-3}


@dataclass
class Call:
    op: Callable[..., Any]
    args: list
    kwargs: dict
    #: the argument names one of which the error must name (empty: the call is valid)
    fault: tuple[str, ...] = ()
    label: str = "valid"
    expected: Callable[[], Any] | None = None
    extra: dict = field(default_factory=dict)


@contextlib.contextmanager
def _time_limit(seconds: int):
    def fail(signum, frame):
        raise TimeoutError(f"the call ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _names_an_argument(message: str, names: tuple[str, ...]) -> bool:
    return any(message.startswith(n) or re.search(rf"\b{re.escape(n)}\b", message) for n in names)


def _check(call: Call) -> None:
    with _time_limit(CALL_SECONDS):
        try:
            result = call.op(*call.args, **call.kwargs)
        except (TypeError, ValueError) as exc:
            message = str(exc)
            params = tuple(__import__("inspect").signature(call.op).parameters)
            assert _names_an_argument(message, params), f"{call.label}: the error names no argument: {message}"
            if call.fault:
                assert _names_an_argument(message, call.fault), f"{call.label}: expected {call.fault} in: {message}"
                return
            raise AssertionError(f"a valid call raised {type(exc).__name__}: {message}") from exc
    assert not call.fault, f"{call.label}: the call should have raised naming {call.fault}, it returned"
    _compare(result, call.expected(), call.extra["dtype"], call.label)


def _compare(got: Any, want: Any, dtype: torch.dtype, label: str) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), label
        for g, w in zip(got, want):
            _compare(g, w, dtype, label)
        return
    assert isinstance(got, torch.Tensor) and got.shape == want.shape, (label, getattr(got, "shape", got), want.shape)
    g, w = got.double(), want.double()
    assert torch.equal(torch.isneginf(g), torch.isneginf(w)), f"{label}: -inf pattern differs"
    finite = torch.isfinite(w)
    assert torch.isfinite(g[finite]).all(), f"{label}: non-finite values where the oracle has none"
    tol = TOL[dtype if got.dtype in FLOATS and got.dtype != torch.float32 else torch.float32]
    tol = max(tol, TOL[dtype])
    scale = 1.0 + w[finite].abs().max().item() if finite.any() else 1.0
    err = (g[finite] - w[finite]).abs().max().item() if finite.any() else 0.0
    assert err <= tol * scale, f"{label}: max |error| {err:.3g} > {tol * scale:.3g}"


# ---------------------------------------------------------------------------
# The independent attention: float64, one query and one head at a time, the mask written out.


def _attend(q, keys, values, first_pos, *, causal, window, sinks, scale, cap):
    """q ``[Lq, Hq, D]``, keys/values ``[Lk, Hkv, D]``; query i at ``first_pos + i``; (out, lse) float64."""
    lq, hq, d = q.shape
    lk, hkv = keys.shape[0], keys.shape[1]
    out = torch.zeros(lq, hq, d, dtype=torch.float64)
    lse = torch.full((lq, hq), -math.inf, dtype=torch.float64)
    for i in range(lq):
        p = first_pos + i
        for h in range(hq):
            logits, vs = [], []
            for j in range(lk):
                if (causal and j > p) or (window >= 0 and j < p - window):
                    continue
                s = float(q[i, h].double() @ keys[j, h // (hq // hkv)].double()) * scale
                logits.append(cap * math.tanh(s / cap) if cap > 0 else s)
                vs.append(values[j, h // (hq // hkv)].double())
            extra = [float(sinks[h])] if sinks is not None else []
            if not logits and not extra:
                continue
            m = max(logits + extra)
            weights = [math.exp(s - m) for s in logits]
            denom = sum(weights) + sum(math.exp(s - m) for s in extra)
            if vs:
                out[i, h] = sum(w * v for w, v in zip(weights, vs)) / denom
            lse[i, h] = m + math.log(denom)
    return out, lse


def _packed(outs, lses, q, return_lse):
    out = torch.cat(outs) if outs else torch.zeros(0, *q.shape[1:], dtype=torch.float64)
    lse = torch.cat(lses) if lses else torch.zeros(0, q.shape[1], dtype=torch.float64)
    return (out.to(q.dtype), lse) if return_lse else out.to(q.dtype)


def _offsets(lengths):
    return torch.tensor([0, *torch.tensor(lengths, dtype=torch.int64).cumsum(0).tolist()], dtype=torch.int32)


def _common_options(data, hq):
    causal = data.draw(st.booleans(), label="causal")
    window = data.draw(st.sampled_from([-1, -1, 0, 1, 3, 50]), label="window_left")
    sinks = torch.randn(hq) if data.draw(st.booleans(), label="sinks") else None
    scale = data.draw(st.sampled_from([None, None, 0.3, 1.5]), label="softmax_scale")
    cap = data.draw(st.sampled_from([0.0, 0.0, 2.0, 30.0]), label="logit_cap")
    lse = data.draw(st.booleans(), label="return_lse")
    return causal, window, sinks, scale, cap, lse


SCALAR_FAULTS = [
    ("window_left", True),
    ("window_left", 2.5),
    ("window_left", -3),
    ("softmax_scale", math.nan),
    ("softmax_scale", math.inf),
    ("softmax_scale", 0.0),
    ("softmax_scale", "0.1"),
    ("logit_cap", math.inf),
    ("logit_cap", math.nan),
    ("logit_cap", -1.0),
    ("solution", 123),
]


def _scalar_fault(data, kwargs: dict) -> tuple[str, ...]:
    name, value = data.draw(st.sampled_from(SCALAR_FAULTS), label="scalar fault")
    kwargs[name] = value
    return (name,)


def _prefill_call(data) -> Call:
    torch.manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    dtype = data.draw(st.sampled_from(FLOATS), label="dtype")
    hkv, group, d = (
        data.draw(st.sampled_from([1, 2])),
        data.draw(st.sampled_from([1, 3])),
        data.draw(st.sampled_from([8, 16])),
    )
    hq = hkv * group
    batch = data.draw(st.integers(1, 3), label="batch")
    lq = [data.draw(st.integers(0, 7)) for _ in range(batch)]
    lk = lq if data.draw(st.booleans(), label="same lengths") else [data.draw(st.integers(0, 7)) for _ in range(batch)]
    causal, window, sinks, scale, cap, return_lse = _common_options(data, hq)
    q = torch.randn(sum(lq), hq, d).to(dtype)
    k, v = torch.randn(sum(lk), hkv, d).to(dtype), torch.randn(sum(lk), hkv, d).to(dtype)
    cu_q, cu_k = _offsets(lq), _offsets(lk)
    args = [q, k, v, cu_q, cu_k, max(lq), max(lk)]
    kwargs = {"causal": causal, "window_left": window, "sinks": sinks, "softmax_scale": scale, "logit_cap": cap,
              "return_lse": return_lse}  # fmt: skip

    def expected():
        outs, lses = [], []
        for b in range(batch):
            qs, ks, vs = q[cu_q[b] : cu_q[b + 1]], k[cu_k[b] : cu_k[b + 1]], v[cu_k[b] : cu_k[b + 1]]
            o, s = _attend(qs, ks, vs, lk[b] - lq[b], causal=causal, window=window, sinks=sinks,
                           scale=scale if scale is not None else 1 / math.sqrt(d), cap=cap)  # fmt: skip
            outs.append(o)
            lses.append(s)
        return _packed(outs, lses, q, return_lse)

    call = Call(tk.mha_prefill, args, kwargs, expected=expected, extra={"dtype": dtype})
    fault = data.draw(st.sampled_from(["none"] * 6 + [
        "q dtype", "k dtype", "v shape", "heads", "q rank", "cu dtype", "cu last", "cu order", "cu_k batch",
        "max_seqlen_q", "max_seqlen_k type", "sinks", "out", "scalar",
    ]), label="fault")  # fmt: skip
    call.label = f"mha_prefill {fault} lq={lq} lk={lk} hq={hq} hkv={hkv} d={d} {dtype}"
    other = torch.float16 if dtype != torch.float16 else torch.bfloat16
    if fault == "q dtype":
        args[0], call.fault = q.to(torch.int32), ("q",)
    elif fault == "k dtype":
        args[1], call.fault = k.to(other), ("k",)
    elif fault == "v shape":
        args[2], call.fault = v[..., :-1], ("v",)
    elif fault == "heads":
        args[1] = args[2] = torch.randn(sum(lk), hq + 1, d).to(dtype)
        call.fault = ("k",)
    elif fault == "q rank":
        args[0], call.fault = q.reshape(q.shape[0], -1), ("q",)
    elif fault == "cu dtype":
        args[3], call.fault = cu_q.long(), ("cu_seqlens_q",)
    elif fault == "cu last":
        bad = cu_q.clone()
        bad[-1] += data.draw(st.sampled_from([-2, -1, 1, 5]))
        args[3], call.fault = bad, ("cu_seqlens_q",)
    elif fault == "cu order" and batch >= 2 and lq[0] > 0:
        bad = cu_q.clone()
        bad[1] = cu_q[-1] + 1
        args[3], call.fault = bad, ("cu_seqlens_q",)
    elif fault == "cu_k batch":
        args[4], call.fault = _offsets([*lk, 0]), ("cu_seqlens_k",)
    elif fault == "max_seqlen_q" and max(lq) > 0:
        args[5], call.fault = max(lq) - 1, ("max_seqlen_q",)
    elif fault == "max_seqlen_k type":
        args[6], call.fault = (
            data.draw(st.sampled_from([float(max(lk)), True, torch.tensor(max(lk))])),
            ("max_seqlen_k",),
        )
    elif fault == "sinks":
        kwargs["sinks"] = data.draw(st.sampled_from([torch.zeros(hq + 1), torch.zeros(hq, dtype=torch.bfloat16)]))
        call.fault = ("sinks",)
    elif fault == "out":
        kwargs["out"] = data.draw(st.sampled_from([torch.empty(q.shape[0] + 1, hq, d, dtype=dtype),
                                                   torch.empty(q.shape, dtype=other)]))  # fmt: skip
        call.fault = ("out",)
    elif fault == "scalar":
        call.fault = _scalar_fault(data, kwargs)
    return call


def _paged(data, dtype, hkv, d, cache_lens):
    """A shuffled paged cache holding ``cache_lens`` tokens; unused page-table entries hold garbage."""
    page_size = data.draw(st.sampled_from([1, 2, 4, 8]), label="page_size")
    pages = [-(-n // page_size) for n in cache_lens]
    cols = max(max(pages), 1) + data.draw(st.integers(0, 2), label="spare columns")
    num_pages = max(sum(pages) + data.draw(st.integers(0, 2), label="spare pages"), 1)
    kv_dtype = torch.float8_e4m3fn if data.draw(st.integers(0, 4), label="fp8 cache") == 0 else dtype
    k_cache = torch.randn(num_pages, page_size, hkv, d).to(kv_dtype)
    v_cache = torch.randn(num_pages, page_size, hkv, d).to(kv_dtype)
    order = torch.randperm(num_pages).to(torch.int32)
    table = torch.randint(-9, num_pages + 9, (len(cache_lens), cols), dtype=torch.int32)  # unused: never read
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = order[at : at + n]
        at += n
    lens = torch.tensor(cache_lens, dtype=torch.int32)

    def keys_of(b):
        n = cache_lens[b]
        pos = torch.arange(n)
        page = table[b, pos // page_size].long()
        return k_cache[page, pos % page_size].double(), v_cache[page, pos % page_size].double()

    return k_cache, v_cache, table, lens, keys_of, num_pages, page_size


def _paged_faults(data, call: Call, args: list, kwargs: dict, *, decode: bool, cache_lens, num_pages, page_size):
    """One fault in the paged arguments (indices: 1 k_cache, 2 v_cache, 3 page_table, 4 cache_seqlens)."""
    kinds = ["none"] * 6 + ["capacity", "page id", "table rows", "table dtype", "lens dtype", "v_cache dtype",
                            "head_dim", "heads", "scalar", "zero" if decode else "short"]  # fmt: skip
    fault = data.draw(st.sampled_from(kinds), label="fault")
    table, lens = args[3], args[4]
    used = [b for b, n in enumerate(cache_lens) if n > 0]
    if fault == "capacity":
        bad = lens.clone()
        bad[-1] = table.shape[1] * page_size + 1
        args[4], call.fault = bad, ("cache_seqlens",)
    elif fault == "page id" and used:
        bad = table.clone()
        bad[used[0], 0] = data.draw(st.sampled_from([num_pages, -1, num_pages + 100]))
        args[3], call.fault = bad, ("page_table",)
    elif fault == "table rows":
        args[3], call.fault = torch.cat([table, table[:1]]), ("page_table",)
    elif fault == "table dtype":
        args[3], call.fault = table.long(), ("page_table",)
    elif fault == "lens dtype":
        args[4], call.fault = lens.long(), ("cache_seqlens",)
    elif fault == "v_cache dtype":
        args[2] = args[2].to(torch.float32 if args[1].dtype != torch.float32 else torch.bfloat16)
        call.fault = ("v_cache",)
    elif fault == "head_dim":
        args[1] = args[2] = torch.zeros(*args[1].shape[:3], args[1].shape[3] * 2, dtype=args[1].dtype)
        call.fault = ("k_cache",)
    elif fault == "heads":
        hq = args[0].shape[1]
        args[1] = args[2] = torch.zeros(args[1].shape[0], args[1].shape[1], hq + 1, args[1].shape[3]).to(args[1].dtype)
        call.fault = ("k_cache",)
    elif fault == "scalar":
        call.fault = _scalar_fault(data, kwargs)
    elif fault == "zero":
        bad = lens.clone()
        bad[0] = 0
        args[4], call.fault = bad, ("cache_seqlens",)
    elif fault == "short":
        qlen = call.extra["q_lens"]
        hit = [b for b, n in enumerate(qlen) if n > 0]
        if hit:
            bad = lens.clone()
            bad[hit[0]] = qlen[hit[0]] - 1
            args[4], call.fault = bad, ("cache_seqlens",)
    call.label += f" {fault}"


def _decode_call(data) -> Call:
    torch.manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    dtype = data.draw(st.sampled_from(FLOATS), label="dtype")
    hkv, group, d = (
        data.draw(st.sampled_from([1, 2])),
        data.draw(st.sampled_from([1, 4])),
        data.draw(st.sampled_from([8, 16])),
    )
    hq = hkv * group
    cache_lens = [data.draw(st.integers(1, 12)) for _ in range(data.draw(st.integers(1, 3), label="batch"))]
    _, window, sinks, scale, cap, return_lse = _common_options(data, hq)
    k_cache, v_cache, table, lens, keys_of, num_pages, page_size = _paged(data, dtype, hkv, d, cache_lens)
    q = torch.randn(len(cache_lens), hq, d).to(dtype)
    args = [q, k_cache, v_cache, table, lens]
    kwargs = {"window_left": window, "sinks": sinks, "softmax_scale": scale, "logit_cap": cap, "return_lse": return_lse}

    def expected():
        outs, lses = [], []
        for b, n in enumerate(cache_lens):
            ks, vs = keys_of(b)
            o, s = _attend(q[b : b + 1], ks, vs, n - 1, causal=True, window=window, sinks=sinks,
                           scale=scale if scale is not None else 1 / math.sqrt(d), cap=cap)  # fmt: skip
            outs.append(o)
            lses.append(s)
        return _packed(outs, lses, q, return_lse)

    call = Call(tk.mha_decode_with_kvcache, args, kwargs, expected=expected, extra={"dtype": dtype})
    call.label = f"mha_decode cache_lens={cache_lens} page_size={page_size} hq={hq} hkv={hkv} d={d} {dtype}"
    _paged_faults(data, call, args, kwargs, decode=True, cache_lens=cache_lens, num_pages=num_pages,
                  page_size=page_size)  # fmt: skip
    return call


def _extend_call(data) -> Call:
    torch.manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    dtype = data.draw(st.sampled_from(FLOATS), label="dtype")
    hkv, group, d = (
        data.draw(st.sampled_from([1, 2])),
        data.draw(st.sampled_from([1, 2])),
        data.draw(st.sampled_from([8, 16])),
    )
    hq = hkv * group
    batch = data.draw(st.integers(1, 3), label="batch")
    q_lens = [data.draw(st.integers(0, 5)) for _ in range(batch)]
    cache_lens = [n + data.draw(st.integers(0, 9)) for n in q_lens]
    causal, window, sinks, scale, cap, return_lse = _common_options(data, hq)
    k_cache, v_cache, table, lens, keys_of, num_pages, page_size = _paged(data, dtype, hkv, d, cache_lens)
    q = torch.randn(sum(q_lens), hq, d).to(dtype)
    cu_q = _offsets(q_lens)
    args = [q, k_cache, v_cache, table, lens, cu_q, max(q_lens)]
    kwargs = {"causal": causal, "window_left": window, "sinks": sinks, "softmax_scale": scale, "logit_cap": cap,
              "return_lse": return_lse}  # fmt: skip

    def expected():
        outs, lses = [], []
        for b, n in enumerate(cache_lens):
            ks, vs = keys_of(b)
            o, s = _attend(q[cu_q[b] : cu_q[b + 1]], ks, vs, n - q_lens[b], causal=causal, window=window, sinks=sinks,
                           scale=scale if scale is not None else 1 / math.sqrt(d), cap=cap)  # fmt: skip
            outs.append(o)
            lses.append(s)
        return _packed(outs, lses, q, return_lse)

    call = Call(tk.mha_extend_with_kvcache, args, kwargs, expected=expected, extra={"dtype": dtype, "q_lens": q_lens})
    call.label = f"mha_extend q_lens={q_lens} cache_lens={cache_lens} page_size={page_size} hq={hq} {dtype}"
    if data.draw(st.integers(0, 5), label="cu fault") == 0:
        bad = cu_q.clone()
        bad[-1] += 1
        args[5], call.fault, call.label = bad, ("cu_seqlens_q",), call.label + " cu last"
    elif max(q_lens) > 0 and data.draw(st.integers(0, 5), label="max fault") == 0:
        args[6], call.fault, call.label = max(q_lens) - 1, ("max_seqlen_q",), call.label + " max_seqlen_q"
    else:
        _paged_faults(data, call, args, kwargs, decode=False, cache_lens=cache_lens, num_pages=num_pages,
                      page_size=page_size)  # fmt: skip
    return call


# ---------------------------------------------------------------------------
# MoE: the independent layer, one token and one slot at a time in float64.


def _moe_expected(x, topk_weights, topk_ids, w: tk.MoEWeights, act: tk.MoEActivation):
    out = torch.zeros(x.shape, dtype=torch.float64)
    inter = w.w13.shape[1] // 2
    for t in range(x.shape[0]):
        for s in range(topk_ids.shape[1]):
            e = int(topk_ids[t, s])
            h = w.w13[e].double() @ x[t].double()
            if w.w13_bias is not None:
                h = h + w.w13_bias[e].double()
            gate, up = (h[0::2], h[1::2]) if w.gate_up_interleaved else (h[:inter], h[inter:])
            if act.limit is not None:
                gate, up = gate.clamp(max=act.limit), up.clamp(-act.limit, act.limit)
            y = (up + act.up_offset) * gate * torch.sigmoid(act.alpha * gate)
            o = w.w2[e].double() @ y
            if w.w2_bias is not None:
                o = o + w.w2_bias[e].double()
            out[t] += float(topk_weights[t, s]) * o
    return out.to(x.dtype)


def _moe_call(data) -> Call:
    torch.manual_seed(data.draw(st.integers(0, 2**16), label="seed"))
    dtype = data.draw(st.sampled_from(FLOATS), label="x dtype")
    fmt = data.draw(st.sampled_from(["fp32", "bf16", "fp16"]), label="weight format")
    wdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[fmt]
    e, h, inter = data.draw(st.integers(1, 4)), data.draw(st.sampled_from([8, 16])), data.draw(st.sampled_from([4, 8]))
    t = data.draw(st.integers(0, 5), label="tokens")
    k = data.draw(st.integers(1, e), label="top_k")
    bias = data.draw(st.booleans(), label="bias")
    act = data.draw(st.sampled_from([tk.MoEActivation(), tk.MoEActivation.silu(),
                                     tk.MoEActivation(alpha=1.0, limit=None, up_offset=0.5)]), label="activation")  # fmt: skip
    w = tk.MoEWeights(
        w13=(torch.randn(e, 2 * inter, h) / math.sqrt(h)).to(wdt),
        w2=(torch.randn(e, h, inter) / math.sqrt(inter)).to(wdt),
        format=fmt,
        w13_bias=torch.randn(e, 2 * inter) * 0.1 if bias else None,
        w2_bias=torch.randn(e, h) * 0.1 if bias else None,
        gate_up_interleaved=data.draw(st.booleans(), label="interleaved"),
    )
    x = torch.randn(t, h).to(dtype)
    ids = (
        torch.stack([torch.randperm(e)[:k] for _ in range(t)]).to(torch.int32)
        if t
        else torch.zeros(0, k, dtype=torch.int32)
    )
    tw = torch.softmax(torch.randn(t, k), dim=-1)
    args = [x, tw, ids, w, act]
    kwargs: dict = {}
    call = Call(tk.moe_apply, args, kwargs, expected=lambda: _moe_expected(x, tw, ids, w, act), extra={"dtype": dtype})
    fault = data.draw(st.sampled_from(["none"] * 6 + [
        "id high", "id low", "ids dtype", "ids rows", "weights shape", "weights dtype", "x hidden", "x dtype",
        "w2 shape", "w13 rows", "bias shape", "activation", "weights type", "out", "solution",
    ]), label="fault")  # fmt: skip
    call.label = f"moe_apply {fault} E={e} H={h} I={inter} T={t} k={k} x {dtype} w {fmt} {act}"
    if fault == "id high" and t:
        bad = ids.clone()
        bad[-1, -1] = e + data.draw(st.integers(0, 3))
        args[2], call.fault = bad, ("topk_ids",)
    elif fault == "id low" and t:
        bad = ids.clone()
        bad[0, 0] = -1
        args[2], call.fault = bad, ("topk_ids",)
    elif fault == "ids dtype":
        args[2], call.fault = ids.long(), ("topk_ids",)
    elif fault == "ids rows":
        args[2], call.fault = torch.zeros(t + 1, k, dtype=torch.int32), ("topk_ids",)
    elif fault == "weights shape":
        args[1], call.fault = torch.ones(t, k + 1) / (k + 1), ("topk_weights",)
    elif fault == "weights dtype":
        args[1], call.fault = tw.to(torch.bfloat16), ("topk_weights",)
    elif fault == "x hidden":
        args[0], call.fault = torch.randn(t, h + 8).to(dtype), ("x",)
    elif fault == "x dtype":
        args[0], call.fault = x.to(torch.int32), ("x",)
    elif fault == "w2 shape":
        args[3] = tk.MoEWeights(w.w13, torch.randn(e, h, inter + 1).to(wdt), fmt)
        call.fault = ("w2",)
    elif fault == "w13 rows":
        args[3] = tk.MoEWeights(torch.randn(e, 2 * inter + 1, h).to(wdt), w.w2, fmt)
        call.fault = ("w13",)
    elif fault == "bias shape":
        args[3] = tk.MoEWeights(w.w13, w.w2, fmt, w13_bias=torch.zeros(e, inter))
        call.fault = ("w13_bias",)
    elif fault == "activation":
        args[4], call.fault = "swiglu", ("activation",)
    elif fault == "weights type":
        args[3], call.fault = (w.w13, w.w2), ("weights",)
    elif fault == "out":
        kwargs["out"] = torch.empty(t, h, dtype=torch.float64)
        call.fault = ("out",)
    elif fault == "solution":
        kwargs["solution"] = data.draw(st.sampled_from([123, [], ["reference", 4]]))
        call.fault = ("solution",)
    return call


@pytest.fixture(autouse=True)
def _host_checks_only(monkeypatch):
    """As a plain process runs: no TOKENSPEED_KERNEL_DEBUG, one thread (tiny tensors)."""
    monkeypatch.delenv("TOKENSPEED_KERNEL_DEBUG", raising=False)
    tk.reload_settings()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "make",
    [_prefill_call, _extend_call, _decode_call, _moe_call],
    ids=["mha_prefill", "mha_extend_with_kvcache", "mha_decode_with_kvcache", "moe_apply"],
)
def test_fuzz_a_clear_error_or_the_right_answer(make):
    outcomes: dict[str, int] = {"valid": 0, "fault": 0}

    @SETTINGS
    @hypothesis.given(st.data())
    def run(data):
        call = make(data)
        outcomes["fault" if call.fault else "valid"] += 1
        _check(call)

    run()
    # Both kinds were exercised (derandomized: the same examples every run).
    assert outcomes["valid"] >= EXAMPLES // 5 and outcomes["fault"] >= EXAMPLES // 5, outcomes

"""Prepared calls (``Op.prepare``, ``core/op.py``): validated and selected once, then the kernel directly.

On every op's CPU cases a call prepared on one set of arguments and run on another set of the same
metadata must give what the op gives on that set (outputs and in-place writes, bit for bit: the same
reference kernel runs). The promise (same metadata) is checked under ``TOKENSPEED_KERNEL_DEBUG=1``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tokenspeed_kernel as tk
from tokenspeed_kernel.core import profiling
from tokenspeed_kernel.core import settings as settings_module
from tokenspeed_kernel.core.op import NotPreparable
from tokenspeed_kernel.numerics.cases import standard_cases
from tokenspeed_kernel.numerics.inputs import make_generator

OPS = sorted(tk.all_contracts())
CPU = torch.device("cpu")


def _clone(call):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in call.items()}


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    if dataclasses.is_dataclass(out):  # MoEDispatchResult
        return [t for f in dataclasses.fields(out) for t in _flat(getattr(out, f.name))]
    return [out]


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("name", OPS)
def test_a_prepared_call_gives_what_the_op_gives(name):
    op = tk.get_contract(name)
    oc = op.cases
    ran = 0
    for case in standard_cases(name, "cpu")[:2]:
        first = oc.make(case, CPU, make_generator(CPU, case.seed(0)))
        second = oc.make(case, CPU, make_generator(CPU, case.seed(1)))
        try:
            prepared = op.prepare(**first)
        except NotPreparable as exc:  # bind builds kernel arguments from the call (the sampler's [B] constants)
            assert "cannot rebuild" in str(exc), exc
            continue
        a, b = _clone(second), _clone(second)
        want = op(**a, solution="reference") if prepared.kernel.startswith("reference.") else op(**a)
        got = prepared(**b)
        assert all(_equal(x, y) for x, y in zip(_flat(got), _flat(want), strict=True)), f"{name} {case.describe()}"
        for k in a:  # in-place writes (kvcache_store, gdn_decode's state) match too
            assert _equal(a[k], b[k]), f"{name}: argument {k} after the call"
        ran += 1
    if name != "top_k_top_p_sample":
        assert ran, f"{name}: no case ran prepared"


def test_the_call_form_must_match():
    x, w = torch.randn(2, 8), torch.ones(8)
    p = tk.rmsnorm.prepare(x, w, 1e-5)
    with pytest.raises(TypeError, match="3 positional"):
        p(x, w)
    with pytest.raises(TypeError, match="residual"):
        p(x, w, 1e-5, residual=x)
    with pytest.raises(ValueError, match="passed twice"):
        tk.mm.prepare(x, x)


def test_debug_mode_checks_the_promise(monkeypatch):
    x, w = torch.randn(2, 8), torch.ones(8)
    p = tk.rmsnorm.prepare(x, w, 1e-5)
    monkeypatch.setattr(settings_module, "debug_checks_enabled", lambda: True)
    monkeypatch.setattr("tokenspeed_kernel.core.op.debug_checks_enabled", lambda: True)
    assert torch.equal(p(x, w, 1e-5), tk.rmsnorm(x, w, 1e-5))
    with pytest.raises(ValueError, match="prepare it anew"):
        p(torch.randn(4, 8), w, 1e-5)  # another row count: another size bucket
    with pytest.raises(ValueError, match="weight"):
        p(x, torch.ones(7), 1e-5)  # the call's own checks run too


def test_prepared_calls_reach_the_dispatch_hook():
    seen = []
    x, w = torch.randn(2, 8), torch.ones(8)
    p = tk.rmsnorm.prepare(x, w, 1e-5)

    def hook(name, signature, traits, args, kwargs):
        seen.append((name, args[0]))

    profiling.add_dispatch_hook(hook)
    try:
        p(x, w, 1e-5)
    finally:
        profiling.remove_dispatch_hook(hook)
    assert seen == [("rmsnorm", x)]

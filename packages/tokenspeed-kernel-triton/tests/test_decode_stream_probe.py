"""``tools/decode_stream_probe.py``'s kernels under the Triton interpreter: each reads exactly the words it claims.

The probe's H200 numbers (bytes over time) mean something only if its streaming, pattern and persistent
kernels read the bytes the report says they read: here each kernel's XOR of what it loaded is compared with
torch's XOR of those words, on small shapes (ragged K tail, several experts, more items than programs).
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[3] / "tools"

pytestmark = pytest.mark.skipif(
    not (TOOLS / "decode_stream_probe.py").exists(), reason="tools/ is not in this checkout"
)

_SCRIPT = r"""
import functools, operator, sys, torch
sys.path.insert(0, sys.argv[1])
import decode_stream_probe as d

def xor(t):
    return functools.reduce(operator.xor, t.reshape(-1).tolist(), 0)

w = torch.randint(-2**31, 2**31 - 1, (5, 64, 40), dtype=torch.int32)  # 5 experts, 64 rows, 40 words (2 blocks + tail)
ex = torch.tensor([1, 3], dtype=torch.int32)
out = torch.empty(2 * 3, dtype=torch.int32)
d._stream[(2, 3)](w, ex, w.stride(0), out, 64 * 40, WORDS=256, ITERS=4)
for s in range(2):
    for c in range(3):
        assert xor(w[ex[s]].reshape(-1)[c * 1024:(c + 1) * 1024]) == out[s * 3 + c].item(), ("stream", s, c)
out = torch.empty(2 * 2 * 2, dtype=torch.int32)
d._pattern[(2, 2, 2)](w, ex, w.stride(0), out, ROW_WORDS=40, NB=40 // 16, KSPLIT=2, BLOCK_M=32)
for s in range(2):
    for n in range(2):
        for ks in range(2):
            want = xor(w[ex[s], n * 32:(n + 1) * 32, ks * 16:(ks + 1) * 16])
            assert want == out[(s * 2 + n) * 2 + ks].item(), ("pattern", s, n, ks)
# 2 slots x 2 N tiles x 2 splits = 8 items over 3 programs (the last program has two)
out = torch.empty(3, dtype=torch.int32)
d._persistent[(3,)](w, w, ex, w.stride(0), w.stride(0), out, 8, 8, 3, ROW_WORDS=40, NB=40 // 16, NT13=2, NT2=2,
                    KSPLIT=2, BLOCK_M=32, ITEMS=3)
for p in range(3):
    want = 0
    for item in range(p, 8, 3):
        s, n, ks = item // 4, (item // 2) % 2, item % 2
        want ^= xor(w[ex[s], n * 32:(n + 1) * 32, ks * 16:(ks + 1) * 16])
    assert want == out[p].item(), ("persistent", p)
# the layer: experts' gate/up codes (w) then down codes (w2, 32 rows), 2 splits; 2 x (2 + 1) x 2 = 12 items, 5 programs
w2 = torch.randint(-2**31, 2**31 - 1, (5, 32, 40), dtype=torch.int32)
out = torch.empty(5, dtype=torch.int32)
d._persistent[(5,)](w, w2, ex, w.stride(0), w2.stride(0), out, 8, 12, 5, ROW_WORDS=40, NB=40 // 16, NT13=2, NT2=1,
                    KSPLIT=2, BLOCK_M=32, ITEMS=3)
for p in range(5):
    want = 0
    for item in range(p, 12, 5):
        if item < 8:
            s, n, ks = item // 4, (item // 2) % 2, item % 2
            want ^= xor(w[ex[s], n * 32:(n + 1) * 32, ks * 16:(ks + 1) * 16])
        else:
            s, ks = (item - 8) // 2, (item - 8) % 2
            want ^= xor(w2[ex[s], :, ks * 16:(ks + 1) * 16])
    assert want == out[p].item(), ("layer", p)
print("ok")
"""


def test_probe_kernels_read_the_words_they_claim():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(TOOLS)], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.stdout[-2000:], r.stderr[-3000:])

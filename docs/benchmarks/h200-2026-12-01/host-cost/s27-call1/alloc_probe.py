"""Session 27: what a launch plan's replay pays on a GPU host besides the launch (issue 13), us a call.

Each statement runs 2000 times in a loop (perf_counter), five rounds, median kept; the allocations are freed at
once (the caching allocator hands the same block back, as in a decode loop). Prints one line a statement and
writes ``OUT/alloc_probe.json``.

    python alloc_probe.py OUT
"""

import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

dev = torch.device("cuda", torch.cuda.current_device())
bf, f32, i32 = torch.bfloat16, torch.float32, torch.int32
x = torch.randn(1, 2880, device=dev, dtype=bf)
w = torch.randn(2880, device=dev, dtype=bf)
es, e, el = torch.empty_strided, torch.empty, torch.empty_like
g = dict(torch=torch, F=F, x=x, w=w, dev=dev, bf=bf, f32=f32, i32=i32, es=es, e=e, el=el, idx=dev.index)
STMTS = [
    "pass",
    "es((1, 2880), (2880, 1), dtype=bf, device=dev)",
    "es((1, 2880), (2880, 1), dtype=bf, device=idx)",
    "e((1, 2880), dtype=bf, device=dev)",
    "el(x)",
    "x.new_empty((1, 2880))",
    "x.new_empty_strided((1, 2880), (2880, 1))",
    "x.new_empty((4,), dtype=f32)",
    "es((1, 4), (4, 1), dtype=f32, device=dev); es((1, 4), (4, 1), dtype=i32, device=dev); "
    "es((1, 2880), (2880, 1), dtype=bf, device=dev); es((1, 2880), (2880, 1), dtype=bf, device=dev)",
    "es((11552,), (1,), dtype=torch.uint8, device=dev)",
    "torch.cuda.is_current_stream_capturing()",
    "torch._C._cuda_isCurrentStreamCapturing()",
    "torch._C._cuda_getCurrentRawStream(idx)",
    "torch.cuda.current_device()",
    "torch._C._cuda_getDevice()",
    "x.data_ptr()",
    "x.shape; x.stride(); x.dtype; x.device",
    "F.rms_norm(x, (2880,), w, 1e-5)",
    "torch.argmax(x, dim=-1)",
]


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    res = {}
    for s in STMTS:
        code = compile(f"for _ in range(2000):\n    {s}\n", "<stmt>", "exec")
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            t = time.perf_counter()
            exec(code, g)
            rounds.append((time.perf_counter() - t) / 2000 * 1e6)
            torch.cuda.synchronize()
        res[s] = round(statistics.median(rounds), 3)
        print(f"{res[s]:8.3f} us  {s}")
    with open(f"{out}/alloc_probe.json", "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "us": res}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""PyTorch side of bench/run_foundation.sh: the eager Qwen3 forward of tests/reference/qwen3_reference.py on the
same tiny/small shapes as trl_bench_foundation ([1, 32] tokens, f32, 2 threads). Prints one JSON line per preset."""
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from qwen3_reference import forward, random_qwen3  # noqa: E402

PRESETS = {"tiny": (64, 128, 2, 4, 2, 16), "small": (256, 768, 4, 4, 2, 64)}


def main():
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    for name, (C, F, L, H, Hkv, D) in PRESETS.items():
        cfg, W, _ = random_qwen3(C, F, L, H, Hkv, D)
        ids = (100 + 37 * torch.arange(32)).view(1, 32)
        mask = torch.ones_like(ids)
        pos = torch.arange(32).view(1, 32)
        with torch.no_grad():
            forward(cfg, W, ids, mask, pos)
            best = 1e9
            for _ in range(5):
                t0 = time.perf_counter()
                forward(cfg, W, ids, mask, pos)
                best = min(best, time.perf_counter() - t0)
        print(json.dumps({"bench": "torch_eager_forward", "preset": name, "dtype": "f32", "batch": 1, "tokens": 32,
                          "ms": best * 1e3, "tokens_per_s": 32 / best, "torch": torch.__version__,
                          "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()

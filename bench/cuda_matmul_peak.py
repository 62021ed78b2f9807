#!/usr/bin/env python3
"""The GPU's measured bfloat16 matrix peak: the denominator of model FLOP utilisation.

An 8192 x 8192 x 8192 bfloat16 matrix product (2 * 8192^3 FLOPs) through PyTorch (cuBLAS) on
random data (zeros run faster and would overstate the peak), 3 warm-up products, then the
median of 20 products each timed with CUDA events. Prints one JSON line.
"""
import json
import statistics

import torch


def main():
    if not torch.cuda.is_available():
        raise SystemExit("cuda_matmul_peak: no CUDA device")
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b)
    times_ms = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(a, b)
        end.record()
        end.synchronize()
        times_ms.append(start.elapsed_time(end))
    median_ms = statistics.median(times_ms)
    print(json.dumps({
        "device": torch.cuda.get_device_name(0),
        "matmul": f"{n}x{n}x{n} bf16",
        "median_ms": median_ms,
        "bf16_tflops": 2 * n**3 / (median_ms / 1000) / 1e12,
    }))


if __name__ == "__main__":
    main()

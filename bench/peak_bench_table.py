#!/usr/bin/env python3
"""Prints bench/run_peak_bench.sh's table from its JSON lines (peak_bench_results.jsonl).

Usage: peak_bench_table.py RESULTS.jsonl
MFU = achieved FLOP/s / the matching peak: the same dtype, and the convolution peak for the
CNNs (small_cnn, resnet*), the GEMM peak for the transformer and the MLP. Achieved FLOP/s use
Largo's analytic training FLOPs per image (3 x forward, include/largo/models/flop_count.h) on
both sides; the "flops" column says whether PyTorch's profiler count of the same model agrees.
Exits 1 when the counts disagree (the two sides would not be measuring the same model).
"""
import json
import statistics
import sys
from collections import defaultdict

CNNS = ("small_cnn", "resnet18", "resnet50")
SIDES = ("largo", "pytorch", "pytorch_tuned")


def main():
    peaks, machine, runs = {}, "", defaultdict(list)
    for line in open(sys.argv[1]):
        record = json.loads(line)
        if "peaks" in record:
            peaks = record["peaks"]
        elif "machine" in record:
            machine = record["machine"]
        elif "impl" in record:
            runs[(record["model"], record["precision"], record["impl"])].append(record)
    print(f"machine: {machine}")
    print("peaks (GFLOP/s): " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(peaks.items())))
    header = (f"{'model':10} {'precision':9} {'batch':>5} {'side':14} {'images/s':>9} "
              f"{'GFLOP/s':>8} {'MFU':>6} {'of peak':>14} {'largo/side':>10}  flops")
    print(header)
    failed = False
    largo_rate = {}
    for (model, precision, side) in sorted(runs, key=lambda k: (k[0], k[1], SIDES.index(k[2]))):
        records = runs[(model, precision, side)]
        rate = statistics.median(r["images_per_sec"] for r in records)
        largo_records = runs.get((model, precision, "largo"), [])
        flops = largo_records[0]["flops_per_sample"] if largo_records else None
        if side == "largo":
            largo_rate[(model, precision)] = rate
        peak_key = ("conv_" if model in CNNS else "gemm_") + precision
        achieved = flops * rate / 1e9 if flops else float("nan")
        mfu = achieved / peaks[peak_key] if peak_key in peaks else float("nan")
        ratio = largo_rate.get((model, precision), float("nan")) / rate
        check = "-"
        if side != "largo" and flops:
            counted = records[0]["flops_per_sample_profiler"]
            check = "same" if counted == flops else f"DIFFER ({counted} vs {flops})"
            failed |= counted != flops
        print(f"{model:10} {precision:9} {records[0]['batch']:>5} {side:14} {rate:9.1f} "
              f"{achieved:8.1f} {100 * mfu:5.1f}% {peak_key:>14} {ratio:9.2f}x  {check}")
    print("bfloat16 / float32 images/s (Largo): " + ", ".join(
        f"{m} {largo_rate[(m, 'bfloat16')] / largo_rate[(m, 'float32')]:.2f}x"
        for m in dict.fromkeys(m for m, _ in largo_rate)
        if (m, "bfloat16") in largo_rate and (m, "float32") in largo_rate))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

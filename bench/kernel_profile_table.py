#!/usr/bin/env python3
"""Where a training step's GPU time goes: two Kineto traces side by side.

Reads the Chrome traces that `precision_bench --profile` (Largo, through libtorch's Kineto
profiler) and `precision_reference.py --profile` (PyTorch, torch.profiler) write for the same
model, batch and precision, each over the same number of steps, and prints per step:
  - the wall time of the profiled window, the GPU's busy time (the union of its kernels',
    copies' and memsets' intervals) and its idle share: idle time is the host not keeping the
    GPU fed (launch overhead, synchronisation) rather than slower kernels;
  - kernel time and kernel count by kind (convolution, matmul, layout transposes,
    normalisation, elementwise, reduction, optimizer (multi-tensor), copies, other), matched
    by kernel name;
  - the kernel names whose time differs most between the two (total over the steps / steps).
Both traces use the same kernels where the two sides do the same work, so a difference in a
kind is work that one side does and the other does not, or another algorithm for it.

Usage: kernel_profile_table.py LARGO_TRACE PYTORCH_TRACE --steps K [--top N] [--json PATH]
"""
import argparse
import json
import re
import sys

# First match wins; matched against the lower-cased kernel name.
KINDS = [
    ("layout (NCHW <-> NHWC)", re.compile(r"nchwtonhwc|nhwctonchw|nchw_to_nhwc|nhwc_to_nchw|"
                                          r"transpose")),
    ("normalisation", re.compile(r"batch_norm|batchnorm|bn_|layer_norm|layernorm|welford")),
    ("convolution", re.compile(r"conv|implicit_gemm|xmma_fprop|xmma_dgrad|xmma_wgrad|cudnn|"
                               r"fprop|dgrad|wgrad|winograd")),
    ("matmul", re.compile(r"gemm|nvjet|cutlass|cublas|sm90_xmma")),
    ("optimizer (multi-tensor)", re.compile(r"multi_tensor_apply|foreach")),
    ("reduction", re.compile(r"reduce|softmax|nll_loss|cross_entropy|max_pool|avg_pool|"
                             r"adaptive")),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|copy_kernel|fill|"
                               r"threshold|clamp|where|cast")),
]


def kind_of(name):
    lowered = name.lower()
    for kind, pattern in KINDS:
        if pattern.search(lowered):
            return kind
    return "other"


def load(path):
    with open(path) as trace_file:
        trace = json.load(trace_file)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def busy_time(intervals):
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def summarise(path, steps):
    events = load(path)
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        sys.exit(f"kernel_profile_table: {path} holds no GPU events (was it a CUDA run?)")
    launches = [e for e in events if e.get("cat") == "cuda_runtime"
                and "launch" in e.get("name", "").lower()]
    start = min(e["ts"] for e in gpu + launches)
    end = max(e["ts"] + e["dur"] for e in gpu)
    kinds, names = {}, {}
    for e in gpu:
        kind = "copies" if e["cat"] != "kernel" else kind_of(e["name"])
        time, count = kinds.get(kind, (0.0, 0))
        kinds[kind] = (time + e["dur"], count + 1)
        names[e["name"]] = names.get(e["name"], 0.0) + e["dur"]
    return {
        "wall_us": (end - start) / steps,
        "busy_us": busy_time([(e["ts"], e["ts"] + e["dur"]) for e in gpu]) / steps,
        "kernel_us": sum(e["dur"] for e in gpu) / steps,
        "kernels": len(gpu) / steps,
        "launches": len(launches) / steps,
        "kinds": {k: (t / steps, c / steps) for k, (t, c) in kinds.items()},
        "names": {n: t / steps for n, t in names.items()},
    }


def ms(us):
    return f"{us / 1000.0:.3f}"


def print_tables(largo, torch, top):
    print("| per step | Largo | PyTorch | Largo - PyTorch |")
    print("|---|---|---|---|")
    for label, key in (("wall (ms)", "wall_us"), ("GPU busy (ms)", "busy_us"),
                       ("kernel time (ms)", "kernel_us")):
        print(f"| {label} | {ms(largo[key])} | {ms(torch[key])} | {ms(largo[key] - torch[key])} |")
    for side in (largo, torch):
        side["idle_us"] = side["wall_us"] - side["busy_us"]
    print(f"| GPU idle (ms) | {ms(largo['idle_us'])} | {ms(torch['idle_us'])} | "
          f"{ms(largo['idle_us'] - torch['idle_us'])} |")
    print(f"| GPU kernels + copies | {largo['kernels']:.0f} | {torch['kernels']:.0f} | "
          f"{largo['kernels'] - torch['kernels']:+.0f} |")
    print(f"| kernel launches (host) | {largo['launches']:.0f} | {torch['launches']:.0f} | "
          f"{largo['launches'] - torch['launches']:+.0f} |")
    print()
    print("| kind | Largo ms (kernels) | PyTorch ms (kernels) | Largo - PyTorch (ms) |")
    print("|---|---|---|---|")
    kinds = sorted(set(largo["kinds"]) | set(torch["kinds"]),
                   key=lambda k: -max(largo["kinds"].get(k, (0, 0))[0], torch["kinds"].get(k, (0, 0))[0]))
    for kind in kinds:
        lt, lc = largo["kinds"].get(kind, (0.0, 0))
        tt, tc = torch["kinds"].get(kind, (0.0, 0))
        print(f"| {kind} | {ms(lt)} ({lc:.0f}) | {ms(tt)} ({tc:.0f}) | {ms(lt - tt)} |")
    print()
    print(f"The {top} kernels whose time per step differs most (ms; a name missing on one side "
          "is 0 there):")
    print("| kernel | Largo | PyTorch | difference |")
    print("|---|---|---|---|")
    names = set(largo["names"]) | set(torch["names"])
    diffs = sorted(names, key=lambda n: -abs(largo["names"].get(n, 0.0) - torch["names"].get(n, 0.0)))
    for name in diffs[:top]:
        lt, tt = largo["names"].get(name, 0.0), torch["names"].get(name, 0.0)
        shown = name if len(name) <= 90 else name[:87] + "..."
        print(f"| `{shown}` | {ms(lt)} | {ms(tt)} | {ms(lt - tt)} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("largo_trace")
    parser.add_argument("pytorch_trace")
    parser.add_argument("--steps", type=int, required=True, help="steps each trace covers")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", help="also write both summaries here")
    args = parser.parse_args()
    largo = summarise(args.largo_trace, args.steps)
    torch = summarise(args.pytorch_trace, args.steps)
    print_tables(largo, torch, args.top)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"largo": largo, "pytorch": torch}, out)


if __name__ == "__main__":
    main()

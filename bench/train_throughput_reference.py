#!/usr/bin/env python3
"""PyTorch reference for bench/train_throughput_bench.cpp.

Builds the same model as Largo (same layers in the same order, same layouts, same parameter
count), the same optimizer setup (SGD, Nesterov momentum 0.9, weight decay 5e-4 except on
BatchNorm parameters), the same fixed batch (same generator, seed and draw order) and thread
count, runs the same step (zero_grad(set_to_none) -> forward -> cross-entropy -> loss.item()
-> backward -> step) and prints the same JSON line.

Usage: train_throughput_reference.py MODEL [--batch N] [--threads T] [--warmup W]
                                     [--steps S] [--precision float32|bfloat16] [--foreach]
                                     [--phases] [--compile [--compile-warmup C]]
  MODEL: small_cnn, resnet18, resnet50, vit, mlp (shapes as in train_throughput_bench.cpp)
  --precision bfloat16: forward and loss under torch.autocast("cpu", torch.bfloat16).
  --foreach uses torch.optim.SGD(foreach=True) (multi-tensor kernels); without it, the
  default of PyTorch 2.11 on CPU (one update per parameter).
  --compile runs forward and loss through torch.compile (default inductor backend, default
  mode); "impl" becomes pytorch_compile (pytorch_compile_foreach with --foreach).

What --compile compiles: the function images, labels -> cross_entropy(model(images), labels),
i.e. `torch.compile(model)` as the PyTorch docs recommend, with the loss inside the graph.
AOTAutograd compiles the matching backward graph from it, so forward, loss and backward run
inductor's generated C++ (OpenMP, torch.get_num_threads() threads: set before compiling).
zero_grad, loss.item() and optimizer.step() stay eager, as in the other variants: item() is
a graph break anyway, loss.backward() inside a compiled function would need compiled
autograd, and compiling the optimizer (torch.compile(optimizer.step)) would replace ATen's
SGD arithmetic with a fused kernel -- the step Largo and the eager variants time is
torch.optim's, so the compiled variant keeps it and differs only in forward and backward.

Compile time stays out of the timed steps: the first --compile-warmup C steps (default 2)
compile (and recompile, should a guard fail on the second call), then the weights, the
BatchNorm statistics and the optimizer state are restored in place to their initial values
(same tensors, so no guard changes), and the usual W warm-up and S timed steps follow, so
final_loss is the loss after the same W + S updates as in every other variant. Only the
float rounding differs: inductor fuses pointwise ops and reorders reductions, so the loss
agrees with eager's to rounding amplified over the steps, not bit for bit: relative 1e-7 to
1e-4 in short runs of the MLP, the ViT and the small CNN, but 5 % for ResNet-50 at batch 2
after 2 steps, where BatchNorm over 2 images leaves layer4's weight gradients so
ill-conditioned that eager float32's own are 10-20 % off float64's. The JSON line adds
  compile_s                the compile warm-up's wall time minus C timed steps' (~compiling)
  graphs                   dynamo graphs compiled (frames, graph breaks split them)
  recompiles_in_warmup, recompiles_in_timed
                           graphs compiled during the W and the S steps (dynamo's
                           unique_graphs counter; TORCH_LOGS=recompiles says why): 0 and 0
                           with the default C on 2.11, all five models (one graph each,
                           no graph break)
  fx_graph_cache_hits / fx_graph_cache_misses
                           inductor's FX graph cache (/tmp/torchinductor_$USER by default):
                           all misses = a cold compile, all hits = warm (only the Python
                           side is retraced; the C++ kernels are loaded, not rebuilt)
If compiling or running the compiled model fails, the line carries "error" (the exception's
type and first line) instead of timings, the traceback goes to stderr and the exit status
stays 0, so that bench/run_train_throughput.sh goes on and its table shows why.
The JSON line also carries flops_per_sample_profiler: 3 x the forward FLOPs torch.profiler
counts (with_flops) for one image in aten::conv2d / addmm / mm / bmm, a check on Largo's
analytic count (largo::models::training_flops_per_sample) that the driver prints.
"""
import argparse
import copy
import json
import math
import sys
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision

# Keep in sync with the defaults in train_throughput_bench.cpp.
DEFAULTS = {
    "small_cnn": {"batch": 128, "warmup": 10, "steps": 100, "shape": (1, 28, 28)},
    "resnet18": {"batch": 16, "warmup": 2, "steps": 3, "shape": (3, 32, 32)},
    "resnet50": {"batch": 8, "warmup": 1, "steps": 2, "shape": (3, 224, 224)},
    "vit": {"batch": 32, "warmup": 2, "steps": 4, "shape": (3, 32, 32)},
    "mlp": {"batch": 256, "warmup": 3, "steps": 15, "shape": (3, 32, 32)},
}


class SmallCnnStage(nn.Module):
    """Mirrors largo::models::SmallCnnStageImpl (src/largo/models/small_cnn.cpp)."""

    def __init__(self, in_channels, out_channels, pooled_size, channels_last=True):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        self.pooled_size = pooled_size
        self.channels_last = channels_last

    def forward(self, x):
        weight = self.conv.weight
        # Like Largo, contiguous(): for the 1-channel first stage it keeps the NCHW strides
        # (a [b, 1, h, w] tensor counts as channels-last contiguous), so that stage runs NCHW.
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
            weight = weight.contiguous(memory_format=torch.channels_last)
        x = F.conv2d(x, weight, None, 1, 1)
        x = F.max_pool2d(x, 2)
        x = self.bn(x).relu_()
        if self.pooled_size > 0:
            p = self.pooled_size
            if x.size(2) != p or x.size(3) != p:
                x = F.adaptive_avg_pool2d(x, (p, p))
            x = x.flatten(1)
        return x


class TrunkHead(nn.Module):
    """Mirrors largo::models::TrunkHeadModelImpl: parameters named trunk.<i>.* and head.*."""

    def __init__(self, trunk_blocks, head):
        super().__init__()
        self.trunk = nn.Sequential(*trunk_blocks)
        self.head = nn.Sequential(head)

    def forward(self, x):
        return self.head(self.trunk(x))


def small_cnn(channels=(16, 32, 64), pooled_size=3, in_channels=1, num_classes=10):
    blocks = []
    c = in_channels
    for i, out in enumerate(channels):
        last = i + 1 == len(channels)
        blocks.append(SmallCnnStage(c, out, pooled_size if last else 0))
        c = out
    return TrunkHead(blocks, nn.Linear(c * pooled_size * pooled_size, num_classes))


def resnet(depth, cifar_stem, num_classes=10):
    """torchvision's ResNet-18 / 50; with cifar_stem, the stem Largo's STEM: cifar builds
    (3x3 stride-1 conv1, no max pool). Same blocks, shapes and ops as Largo's trunk (NCHW).

    The weights are then drawn again in the order Largo's build_model draws them, so both
    sides start from the same weights and, running the same kernels, reach the same loss:
    a check that the two models really are the same."""
    state = torch.get_rng_state()
    net = getattr(torchvision.models, f"resnet{depth}")(num_classes=num_classes)
    if cifar_stem:
        net.conv1 = nn.Conv2d(3, 64, 3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    torch.set_rng_state(state)
    # Largo: each conv is constructed with libtorch's default init (in module order, which
    # is also torchvision's), then re-initialized like torchvision, then the head is built.
    convs = [m for m in net.modules() if isinstance(m, nn.Conv2d)]
    for conv in convs:
        conv.reset_parameters()
    for conv in convs:
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    net.fc.reset_parameters()
    return net


def mlp(in_features=3 * 32 * 32, hidden=(2048, 2048, 2048), num_classes=10):
    """Mirrors largo::models::build_mlp_trunk + the linear head: Linear layers constructed in
    the same order draw the same default initialization as libtorch's."""
    blocks, f = [], in_features
    for h in hidden:
        blocks.append(nn.Sequential(nn.Linear(f, h), nn.ReLU(inplace=True)))
        f = h
    return TrunkHead([nn.Flatten(), *blocks], nn.Linear(f, num_classes))


def trunc_normal_(tensor, std):
    """largo::models::trunc_normal_: the same draws and ops, so the same values."""
    with torch.no_grad():
        low = 0.5 * (1.0 + math.erf(-2.0 / math.sqrt(2.0)))
        high = 0.5 * (1.0 + math.erf(2.0 / math.sqrt(2.0)))
        tensor.uniform_(2.0 * low - 1.0, 2.0 * high - 1.0)
        tensor.erfinv_()
        tensor.mul_(std * math.sqrt(2.0))
        tensor.clamp_(-2.0 * std, 2.0 * std)


class VitEncoderLayer(nn.Module):
    """Mirrors largo::models::VitEncoderLayerImpl (src/largo/models/vit.cpp): modules built
    and initialized in the same order, the same ops in the forward."""

    def __init__(self, d, heads, mlp_dim):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d, eps=1e-6)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, eps=1e-6)
        self.fc1 = nn.Linear(d, mlp_dim)
        self.fc2 = nn.Linear(mlp_dim, d)
        for linear in (self.qkv, self.proj, self.fc1, self.fc2):
            trunc_normal_(linear.weight, 0.02)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        qkv = self.qkv(self.norm1(x)).reshape(b, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        # Largo's kernel (at::scaled_dot_product_attention): scaling q and running matmul,
        # softmax, matmul computes the same to float rounding only, never bit for bit.
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        out = out.transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(out)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VitPatchEmbedding(nn.Module):
    def __init__(self, in_channels, image, patch, d):
        super().__init__()
        self.conv_proj = nn.Conv2d(in_channels, d, patch, stride=patch)
        self.class_token = nn.Parameter(torch.empty(1, 1, d))
        trunc_normal_(self.class_token, 0.02)
        self.pos_embedding = nn.Parameter(torch.empty(1, (image // patch) ** 2 + 1, d))
        trunc_normal_(self.pos_embedding, 0.02)

    def forward(self, x):
        x = self.conv_proj(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.class_token.expand(x.size(0), -1, -1), x], 1)
        return x + self.pos_embedding


class VitFinalNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d, eps=1e-6)

    def forward(self, x):
        return self.norm(x)[:, 0]


def vit(in_channels=3, image=32, patch=4, layers=6, heads=6, d=384, mlp_dim=1536,
        num_classes=10):
    blocks = [VitPatchEmbedding(in_channels, image, patch, d)]
    blocks += [VitEncoderLayer(d, heads, mlp_dim) for _ in range(layers)]
    blocks.append(VitFinalNorm(d))
    return TrunkHead(blocks, nn.Linear(d, num_classes))


def build(model):
    if model == "small_cnn":
        return small_cnn()
    if model.startswith("resnet"):
        return resnet(int(model[len("resnet"):]), cifar_stem=model == "resnet18")
    return vit() if model == "vit" else mlp()


def profiler_training_flops(model, shape):
    """3 x the forward FLOPs torch.profiler counts for one image (convs, Linear, attention)."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        model(torch.zeros(1, *shape))
    ops = ("aten::conv2d", "aten::addmm", "aten::mm", "aten::bmm")
    return 3 * sum(e.flops for e in prof.events() if e.name in ops and e.flops)


# largo::optim's is_norm_layer: BatchNorm, InstanceNorm, LayerNorm, GroupNorm.
NORM_LAYERS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
               nn.LayerNorm, nn.GroupNorm)


def param_groups(model, lr, weight_decay):
    """Largo's build_param_groups with VISSL's defaults (regularize_bn False, regularize_bias
    True): trunk (decayed), trunk_no_wd (BatchNorm), head (decayed); empty groups dropped."""
    groups = {"trunk": [], "trunk_no_wd": [], "head": []}
    head_modules = {"fc", "head"}
    for module_name, module in model.named_modules():
        for _, param in module.named_parameters(recurse=False):
            in_head = module_name.split(".")[0] in head_modules
            is_bn = isinstance(module, NORM_LAYERS)
            key = "head" if in_head else ("trunk_no_wd" if is_bn else "trunk")
            groups[key].append(param)
    return [
        {"params": params, "lr": lr, "weight_decay": 0.0 if key == "trunk_no_wd" else weight_decay}
        for key, params in groups.items()
        if params
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", choices=sorted(DEFAULTS))
    parser.add_argument("--batch", type=int)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--foreach", action="store_true")
    parser.add_argument("--phases", action="store_true")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--compile-warmup", type=int, default=2)
    args = parser.parse_args()
    if args.compile and args.compile_warmup < 1:
        parser.error("--compile-warmup must be at least 1 (the step that compiles)")
    defaults = DEFAULTS[args.model]
    batch = args.batch or defaults["batch"]
    warmup = args.warmup or defaults["warmup"]
    steps = args.steps or defaults["steps"]

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    images = torch.randn((batch, *defaults["shape"]))
    labels = torch.randint(0, 10, (batch,), dtype=torch.long)
    model = build(args.model)
    model.train()
    bfloat16 = args.precision == "bfloat16"
    num_parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.SGD(
        param_groups(model, 0.05, 5e-4),
        lr=0.05,
        momentum=0.9,
        nesterov=True,
        foreach=True if args.foreach else None,
    )

    def forward_loss(x, y):
        return F.cross_entropy(model(x), y)

    loss_fn = torch.compile(forward_loss) if args.compile else forward_loss
    impl = "pytorch_compile" if args.compile else "pytorch"
    impl += "_foreach" if args.foreach else ""

    timing = {"forward": 0.0, "backward": 0.0, "step": 0.0}
    last_loss = 0.0

    def one_step(time_phases):
        nonlocal last_loss
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bfloat16):
            loss = loss_fn(images, labels)
        last_loss = loss.item()
        if time_phases:
            now = time.perf_counter()
            timing["forward"] += now - start
            start = now
        loss.backward()
        if time_phases:
            now = time.perf_counter()
            timing["backward"] += now - start
            start = now
        optimizer.step()
        if time_phases:
            timing["step"] += time.perf_counter() - start

    result = {
        "impl": impl,
        "model": args.model,
        "precision": args.precision,
        "batch": batch,
        "threads": args.threads,
        "steps": steps,
        "num_parameters": num_parameters,
    }
    compile_info = {}
    try:
        if args.compile:
            from torch._dynamo.utils import counters
            initial_model = copy.deepcopy(model.state_dict())
            start = time.perf_counter()
            for _ in range(args.compile_warmup):
                one_step(False)
            compile_warmup_s = time.perf_counter() - start
            with torch.no_grad():
                model.load_state_dict(initial_model)  # copy_ into the same tensors
            optimizer.zero_grad(set_to_none=True)
            optimizer.state.clear()  # momentum buffers: recreated by the next step, as at first
            graphs = counters["stats"]["unique_graphs"]
            compile_info = {
                "graphs": graphs,
                "fx_graph_cache_hits": counters["inductor"]["fxgraph_cache_hit"],
                "fx_graph_cache_misses": counters["inductor"]["fxgraph_cache_miss"],
            }
        for _ in range(warmup):
            one_step(False)
        if args.compile:
            graphs_before_timed = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        cpu_start = time.process_time()  # CPU time of all threads, like std::clock() in C++
        for _ in range(steps):
            one_step(args.phases)
        ms_per_step = (time.perf_counter() - start) * 1000.0 / steps
        cpu_ms_per_step = (time.process_time() - cpu_start) * 1000.0 / steps
    except Exception as error:  # noqa: BLE001 -- only the compiled variant gets here
        if not args.compile:
            raise
        traceback.print_exc()
        lines = str(error).strip().splitlines()
        result["error"] = f"{type(error).__name__}: {lines[0] if lines else ''}"
        print(json.dumps(result))
        return

    result.update({
        "ms_per_step": ms_per_step,
        "cpu_ms_per_step": cpu_ms_per_step,
        "images_per_sec": batch * 1000.0 / ms_per_step,
        "final_loss": last_loss,
    })
    if args.compile:
        result["compile_s"] = compile_warmup_s - args.compile_warmup * ms_per_step / 1000.0
        result.update(compile_info)
        result["recompiles_in_warmup"] = graphs_before_timed - graphs
        result["recompiles_in_timed"] = counters["stats"]["unique_graphs"] - graphs_before_timed
        if result["recompiles_in_warmup"] or result["recompiles_in_timed"]:
            print("train_throughput_reference: graphs compiled after the compile warm-up "
                  f"({result['recompiles_in_warmup']} in the warm-up, "
                  f"{result['recompiles_in_timed']} in the timed steps): raise --compile-warmup",
                  file=sys.stderr)
    model.eval()  # after the timed steps: BatchNorm's running statistics are not touched
    result["flops_per_sample_profiler"] = profiler_training_flops(model, defaults["shape"])
    if args.phases:
        for phase, seconds in timing.items():
            result[f"{phase}_ms"] = seconds * 1000.0 / steps
    print(json.dumps(result))


if __name__ == "__main__":
    main()

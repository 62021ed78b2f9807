"""PyTorch's side of the GPU memory bench (bench/run_gpu_memory_bench.sh): what the CUDA
allocator holds after one training step of the bench's workload, against the model state the
tensors add up to. torchvision's ResNet-50 (the same 25,557,032 parameters as Largo's resnet
trunk with a 2048 -> 1000 head), batch 32 of 224x224 images, bfloat16 autocast, AdamW; one
process (a DDP rank holds the same model state). After the step the batch, outputs and loss
are dropped, so what the allocator holds beyond the model state is what PyTorch and the CUDA
libraries keep for themselves (cuBLAS workspaces, cuDNN's), the offset to expect on Largo's
side too.

Usage: cuda_model_state_reference.py  (needs a GPU; prints one line)
"""
import torch
import torchvision

MIB = 2.0 ** 20


def tensor_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def main():
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=1000).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    images = torch.rand(32, 3, 224, 224, device=device)
    labels = torch.randint(0, 1000, (32,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    del images, labels, loss
    torch.cuda.synchronize()
    parameters = tensor_bytes(model.parameters())
    gradients = tensor_bytes(p.grad for p in model.parameters())
    state = tensor_bytes(
        value for per_parameter in optimizer.state.values() for value in per_parameter.values()
        if torch.is_tensor(value) and value.dim() > 0)
    model_state = parameters + gradients + state
    allocated = torch.cuda.memory_allocated(device)
    print(f"pytorch  model state {model_state / MIB:.2f} MiB (parameters {parameters / MIB:.2f}, "
          f"gradients {gradients / MIB:.2f}, optimizer state {state / MIB:.2f}); CUDA allocator "
          f"{allocated / MIB:.2f} MiB allocated now, {(allocated - model_state) / MIB:.2f} MiB "
          f"beyond the model state; peak {torch.cuda.max_memory_allocated(device) / MIB:.2f} MiB")


if __name__ == "__main__":
    main()

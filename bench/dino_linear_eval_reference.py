"""The PyTorch side of `bench/run_ssl_linear_eval.sh ... dino`: DINO with the script's recipe
(torchvision's ResNet-18, 2 x 24 + 4 x 16 crops with VISSL's colour distortion, a dino_head of
1,024 prototypes with BatchNorm1d, teacher temperature 0.04, momentum from 0.99, SGD from 0.3,
the last layer frozen for the first epoch), written from DINO's and VISSL's formulas, then the
same linear evaluation of the student, the teacher and a random trunk. It tells whether the
recipe learns in PyTorch too, and by how much; not bit for bit (other initialisation,
augmentation RNG, the head's BatchNorm over each crop size rather than every crop, and the
teacher's BatchNorm statistics copied from the student each step, where VISSL's teacher keeps
its own: only the teacher's evaluation sees them).
  python bench/dino_linear_eval_reference.py --data PNG_ROOT [--epochs 10]
where PNG_ROOT holds train/ and test/ as bench/fashion_mnist_png_folder.py writes them."""
import argparse, math, random, time
import torch, torch.nn as nn, torch.nn.functional as F
import torchvision
from torchvision import transforms as T

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=10)
p.add_argument("--lr", type=float, default=0.3)
p.add_argument("--momentum_teacher", type=float, default=0.99)
p.add_argument("--k", type=int, default=1024)
p.add_argument("--teacher_temp", type=float, default=0.04)
p.add_argument("--use_bn", type=int, default=1)
p.add_argument("--data", default="/tmp/largo_ssl_linear_eval/png")
args = p.parse_args()
torch.manual_seed(0); random.seed(0)
torch.set_num_threads(2)
MEAN, STD = [0.286] * 3, [0.353] * 3
color = T.Compose([T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8), T.RandomGrayscale(p=0.2)])
def crop(size, scale):
    return T.Compose([T.RandomResizedCrop(size, scale=scale), T.RandomHorizontalFlip(), color,
                      T.ToTensor(), T.Normalize(MEAN, STD)])
glob, loc = crop(24, (0.3, 1.0)), crop(16, (0.1, 0.3))
class MultiCrop:
    def __call__(self, img):
        img = img.convert("RGB")
        return [glob(img), glob(img)] + [loc(img) for _ in range(4)]
root = args.data

def trunk():
    m = torchvision.models.resnet18()
    m.fc = nn.Identity()
    return m

class Head(nn.Module):
    def __init__(self, k, use_bn):
        super().__init__()
        layers = [nn.Linear(512, 2048)] + ([nn.BatchNorm1d(2048)] if use_bn else []) + [nn.GELU(),
                  nn.Linear(2048, 2048)] + ([nn.BatchNorm1d(2048)] if use_bn else []) + [nn.GELU(),
                  nn.Linear(2048, 256)]
        self.mlp = nn.Sequential(*layers)
        for l in self.mlp:
            if isinstance(l, nn.Linear):
                nn.init.trunc_normal_(l.weight, std=0.02); nn.init.zeros_(l.bias)
        self.last = nn.utils.weight_norm(nn.Linear(256, k, bias=False))
        self.last.weight_g.data.fill_(1)
    def forward(self, x):
        return self.last(F.normalize(self.mlp(x), dim=-1))

def pretrain():
    data = torchvision.datasets.ImageFolder(f"{root}/train", transform=MultiCrop())
    loader = torch.utils.data.DataLoader(data, batch_size=128, shuffle=True, drop_last=True, num_workers=1)
    student = nn.Sequential(trunk(), Head(args.k, args.use_bn))
    teacher = nn.Sequential(trunk(), Head(args.k, args.use_bn)); teacher.load_state_dict(student.state_dict())
    for q in teacher.parameters(): q.requires_grad = False
    decay = [q for n, q in student.named_parameters() if q.ndim > 1]
    no_decay = [q for n, q in student.named_parameters() if q.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0.0}],
                          lr=args.lr, momentum=0.9)
    total = args.epochs * len(loader); it = 0
    center = torch.zeros(1, args.k)
    t0 = time.time()
    for epoch in range(args.epochs):
        for crops, _ in loader:
            lr = 0.5 * args.lr * (1 + math.cos(math.pi * it / total))
            for g in opt.param_groups: g["lr"] = lr
            s_out = torch.cat([student(torch.cat(crops[:2])), student(torch.cat(crops[2:]))])
            with torch.no_grad():
                t_out = teacher(torch.cat(crops[:2]))
            s_chunks = (s_out / 0.1).chunk(6)
            t_chunks = F.softmax((t_out - center) / args.teacher_temp, -1).chunk(2)
            loss, n = 0, 0
            for i, t in enumerate(t_chunks):
                for v, s in enumerate(s_chunks):
                    if v == i: continue
                    loss = loss + torch.sum(-t * F.log_softmax(s, -1), -1).mean(); n += 1
            loss = loss / n
            center = center * 0.9 + t_out.mean(0, keepdim=True) * 0.1
            opt.zero_grad(); loss.backward()
            if it < len(loader):
                for q in student[1].last.parameters(): q.grad = None
            opt.step()
            m = 1 - (1 - args.momentum_teacher) * (math.cos(math.pi * it / total) + 1) / 2
            with torch.no_grad():
                for qs, qt in zip(student.parameters(), teacher.parameters()):
                    qt.mul_(m).add_((1 - m) * qs.detach())
                for bs, bt in zip(student.buffers(), teacher.buffers()):
                    bt.copy_(bs)
            if it % 20 == 0:
                print(f"epoch {epoch} iter {it} loss {loss.item():.4f} lr {lr:.4f} {time.time()-t0:.0f}s", flush=True)
            it += 1
    return student[0], teacher[0]

def linear_eval(net, name):
    tf = T.Compose([T.Grayscale(3), T.CenterCrop(24), T.ToTensor(), T.Normalize(MEAN, STD)])
    train = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(f"{root}/train", tf), batch_size=128, shuffle=True, drop_last=True)
    test = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(f"{root}/test", tf), batch_size=256)
    net.eval()
    for q in net.parameters(): q.requires_grad = False
    clf = nn.Linear(512, 10)
    opt = torch.optim.SGD(clf.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=5e-4)
    total = 5 * len(train); it = 0
    for epoch in range(5):
        for x, y in train:
            for g in opt.param_groups: g["lr"] = 0.5 * 0.1 * (1 + math.cos(math.pi * it / total))
            with torch.no_grad(): f = net(x)
            loss = F.cross_entropy(clf(f), y); opt.zero_grad(); loss.backward(); opt.step(); it += 1
    correct = 0
    with torch.no_grad():
        for x, y in test: correct += (clf(net(x)).argmax(1) == y).sum().item()
    print(f"linear evaluation, {name}: {100.0 * correct / len(test.dataset):.2f} %", flush=True)

student, teacher = pretrain()
linear_eval(student, "DINO student")
linear_eval(teacher, "DINO teacher")
torch.manual_seed(0)
linear_eval(trunk(), "random trunk")

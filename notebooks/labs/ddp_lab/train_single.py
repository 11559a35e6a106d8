"""Train a small CNN on one device: the starting point of the DDP lab in notebook 02.

    python train_single.py                      # a few seconds on a laptop CPU
    python train_single.py --epochs 5 --out-dir my-run

Plain PyTorch, nothing else. The images are CIFAR-shaped noise, each with a faint coarse
pattern of its class, made here in memory: nothing to download, and the loss still falls.
"""

import argparse
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def synthetic_cifar(samples: int, seed: int = 0) -> TensorDataset:
    """``samples`` noisy images of 3 x 32 x 32: each shows a faint, coarse pattern of its class (0-9)."""
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 3, 4, 4, generator=generator).repeat_interleave(8, 2).repeat_interleave(8, 3)
    labels = torch.randint(0, 10, (samples,), generator=generator)
    images = 0.1 * patterns[labels] + torch.randn(samples, 3, 32, 32, generator=generator)
    return TensorDataset(images, labels)


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10),
    )


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step")
    parser.add_argument("--samples", type=int, default=1024, help="size of the synthetic training set")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out-dir", default="runs/ddp-lab", help="folder for the checkpoint")
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(0)  # the same initial weights on every run

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    dataset = synthetic_cifar(args.samples)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)

    model = build_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    seen, start = 0, time.perf_counter()
    for epoch in range(args.epochs):
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = loss_fn(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(images)
        print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)  # .item() waits for the GPU
    elapsed = time.perf_counter() - start
    print(f"throughput: {seen / elapsed:.0f} samples/s", flush=True)

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), out / "checkpoint.pt")
    print(f"saved {out / 'checkpoint.pt'}", flush=True)


if __name__ == "__main__":
    main()

"""train_single.py turned into a DistributedDataParallel script: the lab of notebook 02.

    torchrun --nproc-per-node=2 train_ddp.py                  # gloo on CPUs, NCCL on GPUs
    torchrun --nproc-per-node=2 train_ddp.py --epochs 5 --out-dir my-run

Each numbered comment in main() is one change to the single-device script. Under each
"# YOUR CODE HERE", replace the `...` or change the single-device line that is there.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


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
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step on each process")
    parser.add_argument("--samples", type=int, default=1024, help="size of the synthetic training set")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--out-dir", default="runs/ddp-lab", help="folder for the checkpoint")
    return parser.parse_args()


def main():
    args = parse_args()
    torch.manual_seed(0)  # the same initial weights on every rank

    # 1. Who am I? torchrun sets RANK, LOCAL_RANK and WORLD_SIZE in every process it starts.
    ### BEGIN SOLUTION
    ### PLACEHOLDER rank = ...
    ### PLACEHOLDER local_rank = ...
    ### PLACEHOLDER world_size = ...
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    ### END SOLUTION

    # 2. One device per local rank (cuda:<local rank> on a GPU node, else the CPU), then join the
    #    process group: NCCL between GPUs, gloo between CPU processes.
    ### BEGIN SOLUTION
    ### PLACEHOLDER device = ...
    ### PLACEHOLDER dist.init_process_group(...)
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    ### END SOLUTION

    dataset = synthetic_cifar(args.samples)
    # 3. Every rank reads its own shard of the data: a DistributedSampler in place of shuffle=True.
    ### BEGIN SOLUTION
    ### PLACEHOLDER sampler = ...
    ### PLACEHOLDER loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    ### END SOLUTION

    model = build_model().to(device)
    # 4. Wrap the model: DDP averages the gradients over the ranks inside loss.backward().
    ### BEGIN SOLUTION
    ### PLACEHOLDER ddp_model = ...
    ddp_model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    ### END SOLUTION
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    seen, start = 0, time.perf_counter()
    for epoch in range(args.epochs):
        # 5. A new shuffle every epoch, the same one on every rank.
        ### BEGIN SOLUTION
        ### PLACEHOLDER ...
        sampler.set_epoch(epoch)
        ### END SOLUTION
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            loss = loss_fn(ddp_model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += len(images)
        # 6. Rank 0 alone logs.
        ### BEGIN SOLUTION
        ### PLACEHOLDER print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)  # rank 0's last batch
        ### END SOLUTION
    elapsed = time.perf_counter() - start
    # 7. The throughput of the whole job (every rank's samples), printed once.
    ### BEGIN SOLUTION
    ### PLACEHOLDER print(f"throughput: {seen / elapsed:.0f} samples/s", flush=True)
    if rank == 0:
        print(f"throughput: {seen * world_size / elapsed:.0f} samples/s on {world_size} processes", flush=True)
    ### END SOLUTION

    out = Path(args.out_dir)
    # 8. One checkpoint, written by rank 0: the plain model's weights (the ranks hold the same ones).
    ### BEGIN SOLUTION
    ### PLACEHOLDER out.mkdir(parents=True, exist_ok=True)
    ### PLACEHOLDER torch.save(model.state_dict(), out / "checkpoint.pt")
    ### PLACEHOLDER print(f"saved {out / 'checkpoint.pt'}", flush=True)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), out / "checkpoint.pt")
        print(f"saved {out / 'checkpoint.pt'}", flush=True)
    ### END SOLUTION

    # 9. Leave the process group cleanly.
    ### BEGIN SOLUTION
    ### PLACEHOLDER ...
    dist.destroy_process_group()
    ### END SOLUTION


if __name__ == "__main__":
    main()

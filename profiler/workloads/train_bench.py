"""Synthetic-data image training benchmark on Horovod (PyTorch, CPU or GPU).

Trains a model written in plain torch on one fixed random batch per rank and
reports images/sec, like Horovod's own synthetic benchmarks::

    mpirun -n 2 python -m profiler.workloads.train_bench --model resnet8
    HOROVOD_PROFILE=1 mpirun -n 2 python -m profiler.workloads.train_bench
    python -m profiler.workloads.train_bench --no-horovod     # one process

Timeline: ``--num-warmup-batches`` optimizer steps (not timed), then
``--num-iters`` timed iterations of ``--num-batches-per-iter`` steps each.
Rank 0 prints images/sec per rank and the job's, each with a 95% confidence
interval of the mean over iterations (Student t), and one machine-readable
line ``RESULT {json}``.  The job's images/sec of an iteration is the
profiler's definition (profiler.formats.steps): the images of a step (every
rank's) over the ranks' mean step time, never the ranks' own rates summed.

Step marking for the profiler: by default (``--step-marking auto``) a Horovod
run relies on the profiler's DistributedOptimizer hook (no code change) and a
``--no-horovod`` run calls ``profiler.step`` itself; ``explicit`` forces the
calls.  Both record the same steps: the first optimizer step opens the step
timeline, warm-up steps carry 0 images (excluded from images/sec), every timed
step carries ``--batch-size`` images.  ``RESULT`` reports what was recorded.

Models: ``cnn`` (2 conv layers + linear, 6 parameter tensors), ``resnet8``
(CIFAR-style ResNet, 3 stages of 1 basic block), ``resnet18`` (ImageNet-style
ResNet-18).  torchvision is not used (it does not import beside the CPU torch
build this project targets).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("cnn", "resnet8", "resnet18")

# Two-sided 95% Student t quantiles (0.975) for 1..30 degrees of freedom.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------
class SmallCNN(nn.Module):
    """conv(3->16) - pool - conv(16->32) - global pool - linear: 6 parameter tensors."""

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1) shortcut."""

    def __init__(self, in_ch: int, out_ch: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.shortcut: nn.Module
        if stride != 1 or in_ch != out_ch:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_ch),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """A ResNet of basic blocks: a stem, stages of blocks, global pool, linear."""

    def __init__(
        self,
        widths: Sequence[int],
        blocks: Sequence[int],
        num_classes: int,
        imagenet_stem: bool,
    ) -> None:
        super().__init__()
        first = widths[0]
        if imagenet_stem:
            self.stem = nn.Sequential(
                nn.Conv2d(3, first, 7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(first),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1),
            )
        else:
            self.stem = nn.Sequential(
                nn.Conv2d(3, first, 3, stride=1, padding=1, bias=False),
                nn.BatchNorm2d(first),
                nn.ReLU(inplace=True),
            )
        stages: list[nn.Module] = []
        in_ch = first
        for i, (width, n) in enumerate(zip(widths, blocks)):
            layers: list[nn.Module] = []
            for j in range(n):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(BasicBlock(in_ch, width, stride))
                in_ch = width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def build_model(name: str, num_classes: int = 10) -> nn.Module:
    """One of MODELS, freshly initialised (seed torch first for reproducibility)."""
    if name == "cnn":
        return SmallCNN(num_classes)
    if name == "resnet8":
        return ResNet((16, 32, 64), (1, 1, 1), num_classes, imagenet_stem=False)
    if name == "resnet18":
        return ResNet((64, 128, 256, 512), (2, 2, 2, 2), num_classes, imagenet_stem=True)
    raise ValueError(f"unknown model {name!r} (choose from {', '.join(MODELS)})")


def gradient_tensors(model: nn.Module) -> list[tuple[str, int]]:
    """(name, elements) of every parameter that receives a gradient, in order."""
    return [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]


# --------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------
def mean_ci95(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and the half-width of its 95% confidence interval (None for n < 2)."""
    n = len(values)
    if n == 0:
        return float("nan"), None
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    return mean, t * math.sqrt(var / n)


def _fmt(mean: float, ci: float | None) -> str:
    return f"{mean:.1f} +-{ci:.1f}" if ci is not None else f"{mean:.1f}"


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------
def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m profiler.workloads.train_bench",
        description="Synthetic-data image training benchmark on Horovod (images/sec).",
    )
    p.add_argument("--model", choices=MODELS, default="resnet8")
    p.add_argument("--batch-size", type=_positive, default=32, help="images per rank per step")
    p.add_argument("--image-size", type=_positive, default=32, help="height = width (pixels)")
    p.add_argument("--num-classes", type=_positive, default=10)
    p.add_argument("--num-warmup-batches", type=_positive, default=5,
                   help="untimed steps first (>= 1: the first step opens the step timeline)")
    p.add_argument("--num-batches-per-iter", type=_positive, default=5)
    p.add_argument("--num-iters", type=_positive, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the allreduce")
    p.add_argument("--seed", type=int, default=42,
                   help="model initialisation seed (data: seed + rank)")
    p.add_argument("--threads", type=_positive, default=1,
                   help="torch intra-op threads per rank (default 1: one core per rank)")
    p.add_argument("--no-horovod", action="store_true",
                   help="single process without Horovod (no communication)")
    p.add_argument("--step-marking", choices=("auto", "hook", "explicit"), default="auto",
                   help="auto: the profiler's DistributedOptimizer hook with Horovod, "
                        "profiler.step() without")
    p.add_argument("--save-weights", metavar="PATH",
                   help="save the final state_dict (rank 0; every rank if PATH has {rank})")
    p.add_argument("--quiet", action="store_true", help="only the RESULT line")
    return p.parse_args(argv)


# --------------------------------------------------------------------------
# The benchmark
# --------------------------------------------------------------------------
def run(args: argparse.Namespace,
        before_iteration: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the RESULT dict (complete on rank 0).

    before_iteration(i), when given, is called before timed iteration i
    starts its clock, and once more with i = num_iters when the last one has
    stopped it (benchmarks/ab_driver.py switches the profiler there)."""
    from profiler.collect import steps as prof_steps

    torch.set_num_threads(args.threads)
    hvd: Any = None
    rank, size = 0, 1
    if not args.no_horovod:
        import horovod.torch

        hvd = horovod.torch
        hvd.init()
        rank, size = hvd.rank(), hvd.size()
    explicit = args.step_marking == "explicit" or (
        args.step_marking == "auto" and args.no_horovod
    )
    say = (lambda *a: print(*a, flush=True)) if (rank == 0 and not args.quiet) else (
        lambda *a: None
    )

    torch.manual_seed(args.seed)
    model = build_model(args.model, args.num_classes)
    grads = gradient_tensors(model)
    optimizer: Any = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if hvd is not None:
        compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression
        )
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(args.seed + 1 + rank)
    data = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=gen)
    target = torch.randint(0, args.num_classes, (args.batch_size,), generator=gen)

    def train_step(images: int) -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if explicit:
            prof_steps.step(images=images)

    say(f"Model: {args.model}  parameters: {sum(n for _, n in grads)} in {len(grads)} tensors")
    say(f"Batch size: {args.batch_size} per rank  image size: {args.image_size}  "
        f"ranks: {size}  threads per rank: {args.threads}  "
        f"horovod: {'no' if hvd is None else 'yes'}  fp16 allreduce: {args.fp16_allreduce}")
    say(f"Running {args.num_warmup_batches} warm-up batches...")
    prof_steps.set_batch_size(0)  # warm-up steps: no images (hook-marked steps)
    for _ in range(args.num_warmup_batches):
        train_step(0)

    say(f"Running {args.num_iters} iterations of {args.num_batches_per_iter} batches...")
    prof_steps.set_batch_size(args.batch_size)
    rates: list[float] = []
    seconds: list[float] = []
    for i in range(args.num_iters):
        if before_iteration is not None:
            before_iteration(i)
        t0 = time.perf_counter()
        for _ in range(args.num_batches_per_iter):
            train_step(args.batch_size)
        dt = time.perf_counter() - t0
        seconds.append(dt)
        rates.append(args.batch_size * args.num_batches_per_iter / dt)
        say(f"Iter #{i}: {rates[-1]:.1f} img/sec per rank")
    if before_iteration is not None:
        before_iteration(args.num_iters)
    prof_steps.set_batch_size(None)

    if hvd is not None:
        all_rates: list[list[float]] = hvd.allgather_object(rates)
        all_seconds: list[list[float]] = hvd.allgather_object(seconds)
    else:
        all_rates, all_seconds = [rates], [seconds]
    per_rank: list[dict[str, Any]] = []
    for r, vals in enumerate(all_rates):
        m, ci = mean_ci95(vals)
        per_rank.append({"rank": r, "images_per_sec": m, "ci95": ci, "iterations": vals})
    totals = [job_images_per_sec([secs[i] for secs in all_seconds], args.batch_size,
                                 args.num_batches_per_iter) for i in range(args.num_iters)]
    total_mean, total_ci = mean_ci95(totals)
    rank_mean, rank_ci = mean_ci95([v for vals in all_rates for v in vals])

    if args.save_weights:
        path = args.save_weights
        if "{rank}" in path:
            torch.save(model.state_dict(), path.format(rank=rank))
        elif rank == 0:
            torch.save(model.state_dict(), path)

    result: dict[str, Any] = {
        "benchmark": "train_bench",
        "model": args.model,
        "batch_size": args.batch_size,
        "image_size": args.image_size,
        "num_classes": args.num_classes,
        "ranks": size,
        "threads": args.threads,
        "horovod": hvd is not None,
        "fp16_allreduce": bool(args.fp16_allreduce),
        "num_warmup_batches": args.num_warmup_batches,
        "num_batches_per_iter": args.num_batches_per_iter,
        "num_iters": args.num_iters,
        "optimizer_steps": args.num_warmup_batches + args.num_iters * args.num_batches_per_iter,
        "timed_steps": args.num_iters * args.num_batches_per_iter,
        "images_per_sec": total_mean,
        "images_per_sec_ci95": total_ci,
        "images_per_sec_per_rank": rank_mean,
        "images_per_sec_per_rank_ci95": rank_ci,
        "per_iteration": totals,
        "per_rank": per_rank,
        "iteration_seconds": seconds,
        "gradient_tensors": len(grads),
        "gradient_elements": sum(n for _, n in grads),
        "step_marking": "explicit" if explicit else "hook",
        "profiler_mode": prof_steps.mode(),
        "profiler_steps": prof_steps.steps_recorded(),
    }
    if rank == 0:
        if not args.quiet:
            for pr in per_rank:
                print(f"Img/sec rank {pr['rank']}: {_fmt(pr['images_per_sec'], pr['ci95'])}")
            print(f"Img/sec per rank: {_fmt(rank_mean, rank_ci)}")
            print(f"Job img/sec on {size} rank(s): {_fmt(total_mean, total_ci)} (95% CI; "
                  "a step's images over the ranks' mean step time)")
        print("RESULT " + json.dumps(result, allow_nan=False, default=_json_default), flush=True)
    return result


def job_images_per_sec(seconds: Sequence[float], batch_size: int, steps: int) -> float:
    """The job's images/sec over one iteration (each rank's seconds for the
    same `steps` steps of `batch_size` images): profiler.formats.steps'
    definition, the figure the profiler gives the same steps."""
    from profiler.formats.steps import StepTotals, images_per_s

    return images_per_s(StepTotals(images=batch_size * steps * len(seconds),
                                   rank_ns=round(sum(seconds) * 1e9),
                                   rank_steps=steps * len(seconds), steps=steps))


def _json_default(obj: object) -> object:
    raise TypeError(f"not JSON serialisable: {obj!r}")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())


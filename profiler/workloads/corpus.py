"""The models and Horovod features people train with, as workloads to profile
end to end: repeated layers, ResNet-50, a BERT-style encoder, an
LSTM language model with an embedding (dense, sparse_as_dense, sparse),
fp16 compression, gradient accumulation, grouped and uneven collectives,
process sets, uneven data with hvd.join and Adasum.

    mpirun -n 2 python -m profiler.workloads.corpus WORKLOAD [--steps N] ...
    HOROVOD_PROFILE=1 mpirun -n 2 python -m profiler.workloads.corpus bert --layers 12
    python -m profiler.workloads.corpus --list

Every model is written in torch itself (torchvision does not load beside this
project's CPU torch build) and trained on fixed random data, each rank its
own, from fixed seeds, one thread per rank (torch.set_num_threads(1)): the
same command gives the same losses, profiled or not, fused or not.

Rank 0 prints one line ``RESULT {json}``: the workload, the world size, the
optimizer steps and backward passes, the gradient tensors from the model's
own parameter list (name, elements, bytes as sent: fp16 compression halves
them), and what that makes per optimizer step (``expected``): the tensors
and bytes each Horovod operation carries (allreduce, allgather, ...), which
an unfused run (HOROVOD_FUSION_THRESHOLD=0) makes as exactly that many data
calls, and the losses rank 0 saw, step by step.

Workloads (``WORKLOADS``; np=2 in the tests):

* ``mlp6``: six nn.Linear(96, 96): 12 tensors, six of each shape (many
  equal sizes: the hardest case for the fusion lineage);
* ``mlp50``: fifty nn.Linear(16, 16): 100 tensors of 64 bytes to 1 KiB in
  short steps (the profiler's cost where the tensors are many and the
  step short);
* ``resnet50``: ResNet-50 (bottleneck blocks [3, 4, 6, 3], ImageNet stem,
  1000 classes) at a small image size: 161 gradient tensors, 25,557,032
  parameters (the model of Awan et al., "Communication Profiling and
  Characterization of Deep Learning Workloads on Clusters with
  High-Performance Interconnects"; torchvision's parameter list);
* ``bert``: a BERT-style encoder (word, position and token-type embeddings
  with LayerNorm, ``--layers`` identical layers of attention and
  feed-forward with two LayerNorms each, a pooler and a classifier):
  5 + 16 x layers + 4 tensors, most of a few equal shapes;
* ``lstm``, ``lstm-sad``, ``lstm-sparse``: a 2-layer LSTM language model
  with an embedding, its gradient dense; sparse made dense
  (sparse_as_dense=True); sparse, which Horovod sends as two allgathers
  (the indices, int64, and the values) of every rank's rows;
* ``fp16``: mlp6 with hvd.Compression.fp16 (half the bytes on the wire);
* ``accum``: mlp6 with backward_passes_per_step=2 (two backward passes per
  optimizer step, one allreduce per tensor per optimizer step);
* ``ops``: per step one hvd.grouped_allreduce of three tensors, an
  hvd.allgather of uneven rows (rank r gives r + 1), an hvd.alltoall with
  uneven splits and an hvd.reducescatter (steps marked with profiler.step);
* ``procset``: mlp6 on the global set, plus per step an allreduce on a
  process set of rank 0 alone and one of rank 1 alone (hvd.init's
  process_sets; ``--dynamic``: hvd.add_process_set, which needs
  HOROVOD_DYNAMIC_PROCESS_SETS=1);
* ``join``: mlp6 where the last rank has ``--extra`` more batches than the
  others, which call hvd.join() when theirs run out (every rank calls it,
  also with ``--extra 0``; RESULT's ``expected.join.last_rank``: what it
  returned);
* ``adasum``: mlp6 with op=hvd.Adasum (Horovod's MPI CPU path).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["WORKLOADS", "build_model", "gradient_tensors", "main", "MLP6", "ResNet50",
           "Bert", "LSTMLM"]


# --------------------------------------------------------------------------
# models (torch only)
# --------------------------------------------------------------------------

class MLP6(nn.Module):
    """Six nn.Linear(96, 96) with ReLU between: 12 tensors of two shapes."""

    def __init__(self, width: int = 96, layers: int = 6) -> None:
        super().__init__()
        self.body = nn.Sequential(*[m for _ in range(layers)
                                    for m in (nn.Linear(width, width), nn.ReLU())])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1, 3x3 (stride), 1x1 x4, batch norm after each."""

    expansion = 4

    def __init__(self, in_ch: int, width: int, stride: int) -> None:
        super().__init__()
        out_ch = width * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride,
                                                      bias=False), nn.BatchNorm2d(out_ch))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet50(nn.Module):
    """ResNet-50 as torchvision builds it (v1.5: stride in the 3x3)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages = []
        in_ch = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layer = []
            for i in range(blocks):
                layer.append(Bottleneck(in_ch, width, stride if i == 0 else 1))
                in_ch = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, stride=2, padding=1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class EncoderLayer(nn.Module):
    """Post-LayerNorm BERT layer: self-attention (q, k, v, o), feed-forward."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden)
        self.ffn_in = nn.Linear(hidden, 4 * hidden)
        self.ffn_out = nn.Linear(4 * hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        att = torch.softmax(q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5, dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, t, h)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ffn_out(F.gelu(self.ffn_in(x))))


class Bert(nn.Module):
    """A BERT-style encoder with a classification head on the first token."""

    def __init__(self, vocab: int = 1000, hidden: int = 64, layers: int = 4, heads: int = 4,
                 max_len: int = 64, classes: int = 2) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_len, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        pos = torch.arange(t).unsqueeze(0)
        types = (torch.arange(t) >= t // 2).long().unsqueeze(0)
        x = self.ln(self.word(ids) + self.position(pos) + self.token_type(types))
        for layer in self.layers:
            x = layer(x)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))


class LSTMLM(nn.Module):
    """Embedding, a 2-layer LSTM and a decoder to the vocabulary."""

    def __init__(self, vocab: int = 1000, embed: int = 64, hidden: int = 64,
                 sparse: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed, sparse=sparse)
        self.rnn = nn.LSTM(embed, hidden, num_layers=2, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(ids))
        return self.decoder(out)


def gradient_tensors(model: nn.Module) -> list[tuple[str, int]]:
    """(name, elements) of every parameter that takes a gradient, in order."""
    return [(n, p.numel()) for n, p in model.named_parameters() if p.requires_grad]


# --------------------------------------------------------------------------
# workloads
# --------------------------------------------------------------------------

@dataclass
class Workload:
    """What a workload trains and how Horovod is asked to reduce it."""

    model: nn.Module
    batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]  # (rank, step) -> x, y
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    optimizer: dict[str, Any] = field(default_factory=dict)  # DistributedOptimizer kwargs
    sparse: bool = False           # the model's embedding gives sparse gradients
    images: int = 0                # samples per step per rank


def _regression(width: int, n: int) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(n, width, generator=g), torch.randn(n, width, generator=g)
    return batch


def _tokens(vocab: int, n: int, t: int, classes: int | None
            ) -> Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]:
    def batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(1000 * rank + step)
        ids = torch.randint(0, vocab, (n, t), generator=g)
        if classes is None:  # language model: the next token
            return ids[:, :-1], ids[:, 1:]
        return ids, torch.randint(0, classes, (n,), generator=g)
    return batch


def _lm_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def build_model(name: str, args: argparse.Namespace) -> Workload:
    """The workload's model, data and optimizer settings (seeded: the same
    initial weights on every rank before the broadcast)."""
    torch.manual_seed(1234)
    if name in ("mlp6", "fp16", "accum", "procset", "join", "adasum"):
        wl = Workload(MLP6(), _regression(96, args.batch_size), F.mse_loss,
                      images=args.batch_size)
        if name == "fp16":
            wl.optimizer["compression"] = "fp16"
        if name == "accum":
            wl.optimizer["backward_passes_per_step"] = 2
        if name == "adasum":
            wl.optimizer["op"] = "adasum"
        return wl
    if name == "mlp50":
        return Workload(MLP6(width=16, layers=50), _regression(16, args.batch_size),
                        F.mse_loss, images=args.batch_size)
    if name == "resnet50":
        s = args.image_size

        def images(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
            g = torch.Generator().manual_seed(1000 * rank + step)
            return (torch.randn(args.batch_size, 3, s, s, generator=g),
                    torch.randint(0, 1000, (args.batch_size,), generator=g))
        return Workload(ResNet50(), images, F.cross_entropy, images=args.batch_size)
    if name == "bert":
        return Workload(Bert(layers=args.layers, hidden=args.hidden),
                        _tokens(1000, args.batch_size, 32, 2), F.cross_entropy,
                        images=args.batch_size)
    if name in ("lstm", "lstm-sad", "lstm-sparse"):
        wl = Workload(LSTMLM(sparse=name != "lstm"), _tokens(1000, args.batch_size, 17, None),
                      _lm_loss, sparse=name != "lstm", images=args.batch_size)
        if name == "lstm-sad":
            wl.optimizer["sparse_as_dense"] = True
        return wl
    raise ValueError(f"unknown workload {name!r}")


#: workload -> one line (python -m profiler.workloads.corpus --list)
WORKLOADS: dict[str, str] = {
    "mlp6": "six nn.Linear(96, 96): 12 tensors, six of each shape",
    "mlp50": "fifty nn.Linear(16, 16): 100 small tensors, short steps",
    "resnet50": "ResNet-50 at a small image size: 161 tensors, 25.6M parameters",
    "bert": "BERT-style encoder: embeddings, --layers identical layers, LayerNorm",
    "lstm": "2-layer LSTM language model, dense embedding gradient",
    "lstm-sad": "the same, sparse embedding gradient sent dense (sparse_as_dense=True)",
    "lstm-sparse": "the same, sparse gradient: two allgathers (indices, values)",
    "fp16": "mlp6 with hvd.Compression.fp16",
    "accum": "mlp6 with backward_passes_per_step=2",
    "ops": "grouped_allreduce, uneven allgather, alltoall, reducescatter",
    "procset": "mlp6 plus allreduces on process sets of one rank each",
    "join": "mlp6, the last rank with more batches, hvd.join()",
    "adasum": "mlp6 with op=hvd.Adasum",
}


def _embedding(model: nn.Module) -> nn.Embedding:
    emb = model.get_submodule("embed")
    assert isinstance(emb, nn.Embedding)
    return emb


def _elem(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def _busy(us: float) -> None:
    """Spin on the clock for `us` microseconds (the main thread's work, no wait)."""
    end = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < end:
        pass


def _train(name: str, args: argparse.Namespace, hvd: Any, mark: Callable[[int], None],
           before_step: Callable[[int, Any], None] | None = None) -> dict[str, Any]:
    """Train workload `name` for args.steps optimizer steps; RESULT's fields.
    `before_step(step, optimizer)`, where given, runs as each step begins
    and once more with the step count at the end, outside the step's work
    (the within-run A/B's switch: benchmarks/overhead/ab_corpus.py)."""
    wl = build_model(name, args)
    model = wl.model
    rank, size = hvd.rank(), hvd.size()
    kwargs: dict[str, Any] = dict(wl.optimizer)
    wire = 4
    if kwargs.get("compression") == "fp16":
        kwargs["compression"] = hvd.Compression.fp16
        wire = 2
    if kwargs.get("op") == "adasum":
        kwargs["op"] = hvd.Adasum
    passes = int(kwargs.get("backward_passes_per_step", 1))
    base = torch.optim.SGD(model.parameters(), lr=args.lr)
    opt = hvd.DistributedOptimizer(base, named_parameters=model.named_parameters(), **kwargs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    steps = args.steps + (args.extra if name == "join" and rank == size - 1 else 0)
    losses: list[float] = []
    sparse_rows: list[int] = []
    ps_single = None
    if name == "procset":
        ps_single = _own_process_set(hvd, args)
    clock = _LoopClock()
    for step in range(steps):
        if before_step is not None:
            before_step(step, opt)
        clock.tick(step)
        opt.zero_grad()
        for p in range(passes):
            x, y = wl.batch(rank, step * passes + p)
            loss = wl.loss(model(x), y)
            loss.backward()
        if wl.sparse and not kwargs.get("sparse_as_dense"):
            g = _embedding(model).weight.grad
            sparse_rows.append(int(g._nnz()) if g is not None and g.is_sparse else 0)
        clock.phase(step)
        opt.step()
        if args.busy_us > 0:
            _busy(args.busy_us)
        losses.append(float(loss.detach()))
        if ps_single is not None:  # a collective on a process set of this rank alone
            hvd.allreduce(torch.full((8,), float(rank)), name=f"single.{rank}",
                          process_set=ps_single)
    if before_step is not None:
        before_step(steps, opt)
    clock.tick(steps)
    joined_last = hvd.join() if name == "join" else None  # --extra 0: joins all the same
    grads = [(n, p.numel(), p.dtype) for n, p in model.named_parameters() if p.requires_grad]
    dense = [(n, k, d) for n, k, d in grads
             if not (wl.sparse and not kwargs.get("sparse_as_dense") and n == "embed.weight")]
    out: dict[str, Any] = {
        "optimizer_steps": args.steps, "backward_passes_per_step": passes,
        "images_per_step": wl.images * passes,
        "params": [[n, k, wire if d.is_floating_point else _elem(d)] for n, k, d in grads],
        "parameters": sum(k for _, k, _ in grads),
        "losses": losses,
        "timing": clock.result(),
    }
    expected: dict[str, Any] = {
        "allreduce": {"tensors": len(dense), "bytes": sum(k * wire for _, k, _ in dense)},
    }
    if wl.sparse and not kwargs.get("sparse_as_dense"):
        embed = int(_embedding(model).weight.shape[1])
        rows = hvd.allgather_object(sparse_rows)
        per_step = [sum(r[i] for r in rows) for i in range(len(sparse_rows))]
        expected["allgather"] = {"tensors": 2, "bytes_by_step": [
            n * 8 + n * embed * 4 for n in per_step]}
    if name == "procset":
        expected["single_set_allreduce"] = {"tensors": 1, "bytes": 8 * 4}
    if name == "join":
        expected["join"] = {"extra_steps_last_rank": args.extra, "last_rank": joined_last}
    return out | {"expected": expected}


#: steps left out of ``timing`` at the start (first use of memory, Horovod's
#: response cache filling)
WARM_STEPS = 10


class _LoopClock:
    """The training loop's pace on this rank: wall and main-thread CPU time
    from the start of step WARM_STEPS (step 0 when the loop is shorter) to
    the end of the last step: ``timing`` in RESULT, for benchmarks that
    compare runs (benchmarks/overhead/job_rate.py).  Each step in two
    phases: ``compute`` (zero_grad, the forward and backward passes, with
    the gradient hooks that hand tensors to Horovod) and ``step`` (the
    optimizer's step: Horovod's synchronize, the wait for the allreduces,
    the update), each step's phase counted from its step's start; and the
    quantiles of each phase's wall time over the timed steps (whether a
    cost sits in every step or in a few long ones)."""

    def __init__(self) -> None:
        self.first: tuple[int, float, float] | None = None
        self.warm: tuple[int, float, float] | None = None
        self.end: tuple[int, float, float] | None = None
        self.at: tuple[float, float] | None = None  # this step's start (wall, CPU)
        self.split: tuple[float, float] | None = None  # its phase boundary
        # per phase and step index from 0 (the first step) and from WARM_STEPS
        self.sums: dict[str, list[float]] = {"all": [0.0] * 4, "warm": [0.0] * 4}
        # each step's two wall times, from the first step
        self.walls: list[tuple[int, float, float]] = []

    def tick(self, step: int) -> None:
        """Called as step `step` begins (and with the step count at the end)."""
        point = (step, time.perf_counter(), time.thread_time())
        if self.at is not None and self.split is not None:
            parts = (self.split[0] - self.at[0], self.split[1] - self.at[1],
                     point[1] - self.split[0], point[2] - self.split[1])
            for key in ("all", "warm") if step > WARM_STEPS else ("all",):
                self.sums[key] = [a + b for a, b in zip(self.sums[key], parts)]
            self.walls.append((step - 1, parts[0], parts[2]))
        self.at, self.split = (point[1], point[2]), None
        if self.first is None:
            self.first = point
        if step == WARM_STEPS:
            self.warm = point
        self.end = point

    def phase(self, step: int) -> None:
        """Called between the backward passes and the optimizer's step."""
        self.split = (time.perf_counter(), time.thread_time())

    def result(self) -> dict[str, Any]:
        e = self.end
        s = self.warm if self.warm is not None and e is not None and e[0] > self.warm[0] \
            else self.first
        if s is None or e is None or e[0] <= s[0] or e[1] <= s[1]:
            return {"steps": 0}
        n = e[0] - s[0]
        sums = self.sums["warm" if s is self.warm else "all"]
        timed = [w for w in self.walls if w[0] >= s[0]]
        return {"steps": n, "first_step": s[0], "wall_s": round(e[1] - s[1], 6),
                "main_cpu_s": round(e[2] - s[2], 6), "steps_per_s": round(n / (e[1] - s[1]), 3),
                "compute_s": round(sums[0], 6), "compute_cpu_s": round(sums[1], 6),
                "step_s": round(sums[2], 6), "step_cpu_s": round(sums[3], 6),
                "compute_us_q": _quantiles([w[1] for w in timed]),
                "step_us_q": _quantiles([w[2] for w in timed]),
                "slow_share": _slow_share([w[1] + w[2] for w in timed])}


#: the quantiles RESULT's timing gives of each phase (corpus._LoopClock)
QUANTILES = (0.1, 0.5, 0.9, 0.99)


#: a step this many times the fast steps' (the 10th percentile) or longer
#: is a slow one
SLOW_FACTOR = 1.5


def _slow_share(seconds: list[float]) -> float | None:
    """The share of steps at least SLOW_FACTOR times the 10th percentile
    step (None when none were timed): whether a cost is in every step or in
    more steps taking a slow mode.  Against the median it would read near 0
    where most steps are slow (a job waiting a second Horovod cycle in half
    its steps: the median step is then a slow one)."""
    if not seconds:
        return None
    v = sorted(seconds)
    limit = SLOW_FACTOR * v[int(0.1 * len(v))]
    return round(sum(1 for x in v if x >= limit) / len(v), 4)


def _quantiles(seconds: list[float]) -> list[float]:
    """QUANTILES of `seconds` in microseconds (nearest rank); [] when empty."""
    if not seconds:
        return []
    v = sorted(seconds)
    return [round(v[min(len(v) - 1, int(q * len(v)))] * 1e6, 1) for q in QUANTILES]


def _own_process_set(hvd: Any, args: argparse.Namespace) -> Any:
    """This rank's process set of one (made at init, or added when --dynamic)."""
    if args.dynamic:
        sets = [hvd.add_process_set([r]) for r in range(hvd.size())]
    else:
        sets = _INIT_SETS
    return sets[hvd.rank()]


_INIT_SETS: list[Any] = []


def init_horovod(hvd: Any, workload: str, dynamic: bool = False) -> None:
    """hvd.init() as the workload needs it: procset's process sets of one rank
    each are made at init unless they are added later (--dynamic)."""
    if workload == "procset" and not dynamic:
        sets = [hvd.ProcessSet([r]) for r in range(int(os.environ.get("OMPI_COMM_WORLD_SIZE",
                                                                      "2")))]
        hvd.init(process_sets=sets)
        _INIT_SETS[:] = sets
    else:
        hvd.init()


def _ops(args: argparse.Namespace, hvd: Any, mark: Callable[[int], None]) -> dict[str, Any]:
    """Per step: grouped_allreduce, uneven allgather, alltoall, reducescatter."""
    rank, size = hvd.rank(), hvd.size()
    losses: list[float] = []
    g = torch.Generator().manual_seed(rank)
    shapes = [(10,), (20,), (30, 2)]
    for _ in range(args.steps):
        group = [torch.randn(*s, generator=g) for s in shapes]
        red = hvd.grouped_allreduce(group, name="grp")
        gath = hvd.allgather(torch.full((rank + 1, 4), float(rank)), name="uneven")
        splits = torch.tensor([r + 1 for r in range(size)], dtype=torch.int32)  # r+1 rows to r
        a2a = hvd.alltoall(torch.arange(int(splits.sum()) * 3, dtype=torch.float32)
                           .reshape(-1, 3) + rank, splits=splits, name="a2a")
        if isinstance(a2a, tuple):
            a2a = a2a[0]
        rs = hvd.reducescatter(torch.arange(4 * size, dtype=torch.float32) * (rank + 1),
                               name="rs")
        losses.append(float(sum(t.sum() for t in red) + gath.sum() + a2a.sum() + rs.sum()))
        mark(0)
    el = 4
    return {
        "optimizer_steps": args.steps, "backward_passes_per_step": 1, "images_per_step": 0,
        "params": [], "parameters": 0, "losses": losses,
        "expected": {
            "grouped_allreduce": {"tensors": len(shapes),
                                  "bytes": sum(int(torch.Size(s).numel()) * el
                                               for s in shapes)},
            "allgather": {"tensors": 1,
                          "bytes": sum((r + 1) * 4 * el for r in range(size))},
            "alltoall": {"tensors": 1, "bytes": sum(r + 1 for r in range(size)) * 3 * el},
            "reducescatter": {"tensors": 1, "bytes": 4 * size * el},
        },
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m profiler.workloads.corpus",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("workload", nargs="?", choices=sorted(WORKLOADS))
    p.add_argument("--list", action="store_true", help="the workloads, one line each")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps (default 4)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=32, help="resnet50 (default 32)")
    p.add_argument("--layers", type=int, default=4, help="bert's layers (default 4)")
    p.add_argument("--hidden", type=int, default=64, help="bert's width (default 64)")
    p.add_argument("--extra", type=int, default=3, help="join: the last rank's extra steps")
    p.add_argument("--dynamic", action="store_true",
                   help="procset: hvd.add_process_set (HOROVOD_DYNAMIC_PROCESS_SETS=1)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--busy-us", type=float, default=0.0, metavar="US",
                   help="a busy loop of US microseconds on the main thread after each "
                        "optimizer step (after Horovod's synchronize, in series with the "
                        "step): a known cost, to calibrate what the job loses to that much "
                        "work a step (benchmarks/overhead/job_rate.py --busy)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list or not args.workload:
        for k, v in WORKLOADS.items():
            print(f"{k:12s} {v}")
        return 0
    torch.set_num_threads(1)  # the same losses run after run
    import horovod.torch as hvd

    init_horovod(hvd, args.workload, args.dynamic)

    def mark(images: int) -> None:
        import profiler

        profiler.step(images=images)

    if args.workload == "ops":
        out = _ops(args, hvd, mark)
    else:
        out = _train(args.workload, args, hvd, mark)
    out = {"workload": args.workload, "size": hvd.size(), **out}
    hvd.barrier()
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

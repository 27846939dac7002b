"""A model of data-parallel step time: N GPUs on one node and M nodes of 8, from measured inputs.

What a data-parallel step adds to the 1-GPU step is the gradient's communication that backward
does not hide. The trainer (distributed/data_parallel.py) reduces the fp32 gradient in buckets
of whole tensors in buffer order (`ParameterBuffer.buckets`, BUCKET_MB); a bucket's all-reduce
is launched on a side stream once backward has completed every tensor in it, the side stream
runs them one after another, and the step waits for it at the end of backward. So:

- each bucket k becomes ready at r_k (from backward's start), its reduce takes d_k, and it
  starts at max(r_k, end of the previous reduce);
- exposed communication = max(0, end of the last reduce - backward's length): what sticks out
  after backward's last compute;
- the reduces that do overlap backward still take SMs and memory bandwidth from it:
  `contention` c charges c ms of compute per ms of hidden reduce (0: perfect overlap);
- step(N) = step(1) + exposed + c x hidden; with ZeRO-1 (SHARD_OPTIMIZER) one reduce-scatter
  after backward and one all-gather after the optimizer, both exposed, and 1/N of the
  optimizer's time.

An all-reduce of S bytes on n GPUs of a node takes alpha + 2 (n - 1) / n x S / busbw (a ring
over NVLink), alpha and busbw fitted to a measured sweep (benchmarks/allreduce_sweep.py) or to
the whole-gradient all-reduces `benchmarks/scaling.py` records. Across M nodes of G GPUs it is
hierarchical: the node's all-reduce (reduce-scatter and all-gather over NVLink) plus an
all-reduce of each GPU's 1/G shard over the network, latency + 2 (M - 1) / M x S / G / B, B
the stated per-GPU network bandwidth. Every input is printed with where it came from:
measured (a file), from the code, estimated (by a stated rule) or assumed (a number given on
the command line or a default); nothing assumed is shown as measured.

    python benchmarks/scaling_model.py --scaling benchmarks/results/scaling-h200x4.json \
        --shape medium --backward-fraction 0.63 \
        --validate benchmarks/results/scaling-h200x4.json benchmarks/results/scaling-h200x2.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's package, installed or not

from benchmarks.scaling import SHAPES as SCALING_SHAPES  # noqa: E402  (the JSON's shapes)
from rustyflow_py.model.gpt import GPTConfig, weight_inits  # noqa: E402
from rustyflow_py.model.init import Init  # noqa: E402
from rustyflow_py.model.params import ParameterBuffer  # noqa: E402
from rustyflow_py.reporting.log_parser import read_log  # noqa: E402
from rustyflow_py.reporting.record_schema import (  # noqa: E402
    Record,
    model_shape,
    parallel_of,
    world_size,
)

MB = 1e6  # bytes per MB; busbw in GB/s is then MB per ms
NODE_GPUS = (1, 2, 4, 8)
NODES = (2, 4, 8, 16)


class InputError(Exception):
    """An input the model cannot use; main() prints it as one `Error:` line."""


# ---- the arithmetic -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Link:
    """An all-reduce's cost on one node: alpha + 2 (n - 1) / n x bytes / busbw."""

    alpha_ms: float
    busbw_gbs: float

    def all_reduce_ms(self, nbytes: float, n: int) -> float:
        return 0.0 if n < 2 else self.alpha_ms + 2 * (n - 1) / n * nbytes / (self.busbw_gbs * MB)

    def half_ms(self, nbytes: float, n: int) -> float:
        """A reduce-scatter or an all-gather: half an all-reduce's traffic."""
        return 0.0 if n < 2 else self.alpha_ms + (n - 1) / n * nbytes / (self.busbw_gbs * MB)


@dataclasses.dataclass(frozen=True)
class Network:
    """Intra-node links by GPU count, and the network between nodes of `node_gpus` GPUs."""

    links: dict[int, Link]  # GPUs on the node -> its all-reduce fit
    inter_gbps: float  # per GPU, Gb/s
    inter_latency_ms: float
    node_gpus: int = 8

    def link(self, n: int) -> Link:
        """The fit for n GPUs, else the largest measured count's (labelled by the caller)."""
        return self.links.get(n) or self.links[max(self.links)]

    def all_reduce_ms(self, nbytes: float, gpus: int) -> float:
        if gpus <= self.node_gpus:
            return self.link(gpus).all_reduce_ms(nbytes, gpus)
        g, m = self.node_gpus, gpus // self.node_gpus
        inter = self.inter_latency_ms + 2 * (m - 1) / m * nbytes / g / (self.inter_gbps / 8 * MB)
        return self.link(g).all_reduce_ms(nbytes, g) + inter

    def half_ms(self, nbytes: float, gpus: int) -> float:
        if gpus <= self.node_gpus:
            return self.link(gpus).half_ms(nbytes, gpus)
        return self.all_reduce_ms(nbytes, gpus) / 2


@dataclasses.dataclass(frozen=True)
class Bucket:
    nbytes: int  # bytes reduced
    ready_ms: float  # from backward's start, when backward has completed its last tensor


@dataclasses.dataclass(frozen=True)
class Timeline:
    comm_ms: float  # the reduces' own time, summed
    end_ms: float  # when the last reduce ends, from backward's start
    exposed_ms: float  # what sticks out after backward's end


def overlap(buckets: Iterable[Bucket], backward_ms: float,
            reduce_ms: Callable[[float], float]) -> Timeline:
    """The side stream's reduces, in the order backward completes their buckets."""
    end = total = 0.0
    for b in sorted(buckets, key=lambda b: b.ready_ms):
        d = reduce_ms(b.nbytes)
        end, total = max(b.ready_ms, end) + d, total + d
    return Timeline(total, end, max(0.0, end - backward_ms))


@dataclasses.dataclass(frozen=True)
class StepInputs:
    """The 1-GPU step and its gradient, with where each number came from (`labels`)."""

    step_ms: float
    backward_ms: float
    optimizer_ms: float | None
    tokens_per_step: int  # per GPU
    buckets: tuple[Bucket, ...]
    param_bytes: int  # what ZeRO-1 all-gathers: the float32 master, or a 16-bit copy
    labels: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Prediction:
    gpus: int
    step_ms: float
    tokens_per_s: float
    speedup: float
    efficiency: float
    comm_ms: float
    exposed_ms: float


def predict(inputs: StepInputs, net: Network, gpus: int, contention: float = 0.0,
            zero1: bool = False) -> Prediction:
    """The step of `gpus` data-parallel GPUs (same per-GPU batch as the 1-GPU step)."""
    base = inputs.step_ms
    if gpus == 1:
        comm = exposed = 0.0
        step = base
    elif zero1:
        if inputs.optimizer_ms is None:
            raise InputError("ZeRO-1 needs the optimizer's time: pass --optimizer-fraction "
                             "or give optimizer_ms in the step JSON")
        grad = sum(b.nbytes for b in inputs.buckets)
        comm = exposed = net.half_ms(grad, gpus) + net.half_ms(inputs.param_bytes, gpus)
        step = base - inputs.optimizer_ms * (1 - 1 / gpus) + exposed
    else:
        t = overlap(inputs.buckets, inputs.backward_ms, lambda b: net.all_reduce_ms(b, gpus))
        comm, exposed = t.comm_ms, t.exposed_ms
        step = base + exposed + contention * (comm - exposed)
    speedup = gpus * base / step
    return Prediction(gpus, step, gpus * inputs.tokens_per_step / step * 1e3, speedup,
                      speedup / gpus, comm, exposed)


def fit_link(points: list[tuple[float, float]], n: int) -> Link:
    """alpha and busbw of `points` (bytes, ms) on n GPUs: least squares in relative error
    (each point weighted by 1 / its time, so small messages count as much as large ones)."""
    if len(points) < 2:
        raise InputError(f"fitting alpha and busbw on {n} GPUs needs 2 or more message sizes "
                         f"(got {len(points)}): give a sweep from allreduce_sweep.py")
    c = np.array([2 * (n - 1) / n * b / MB for b, _ in points])  # MB on the links
    t = np.array([ms for _, ms in points])
    a = np.stack([np.ones_like(c), c], axis=1) / t[:, None]
    (alpha, inv_bw), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if inv_bw <= 0:
        raise InputError(f"the {n}-GPU points do not grow with size: no bandwidth to fit")
    return Link(max(float(alpha), 0.0), float(1 / inv_bw))


def errors(predicted: float, measured: float) -> float:
    """Relative error of a prediction: (predicted - measured) / measured."""
    return (predicted - measured) / measured


# ---- where the gradient's buckets come from ---------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Shape:
    layers: int
    heads: int
    embed: int
    seq_len: int
    batch: int
    vocab: int

    def gpt(self) -> GPTConfig:
        return GPTConfig(vocab_size=self.vocab, seq_len=self.seq_len, n_layer=self.layers,
                         n_head=self.heads, n_embd=self.embed)


def code_buckets(shape: Shape, bucket_mb: float,
                 reduce_bytes: int = 4) -> list[tuple[int, list[str]]]:
    """(elements, tensor names) of each bucket, from the trainer's own code: the parameter
    buffer's layout and `ParameterBuffer.buckets` with BUCKET_MB counted in the reduce
    dtype's bytes, as the trainer counts it (zero-filled: no initial values drawn)."""
    zeros = {n: Init(i.shape) for n, i in weight_inits(shape.gpt(), 0).items()}
    buffer = ParameterBuffer(zeros, "cpu", np.float32)
    return [(stop - start, [s.name for s in buffer.spans if start <= s.offset < stop])
            for start, stop in buffer.buckets(int(bucket_mb * 2**20), reduce_bytes)]


def completion_fractions(shape: Shape) -> dict[str, float]:
    """When backward completes each tensor's gradient, as a fraction of backward, if its
    time follows GEMM and attention FLOPs: the LM head first (its tied weight, wte, completes
    only with the embedding at the very end), then each block from the last, then wpe, wte."""
    bt, e, t = shape.batch * shape.seq_len, shape.embed, shape.seq_len
    steps: list[tuple[float, list[str]]] = [(4 * bt * e * shape.vocab, ["ln_f.weight",
                                                                         "ln_f.bias"])]
    for i in reversed(range(shape.layers)):
        p = f"h.{i}."
        steps += [(4 * bt * 4 * e * e, [p + "mlp.c_proj.weight", p + "mlp.c_proj.bias"]),
                  (4 * bt * e * 4 * e, [p + "mlp.c_fc.weight", p + "mlp.c_fc.bias",
                                        p + "ln_2.weight", p + "ln_2.bias"]),
                  (4 * bt * e * e, [p + "attn.c_proj.weight", p + "attn.c_proj.bias"]),
                  (5 * shape.batch * t * t * e, []),  # causal attention's backward
                  (4 * bt * e * 3 * e, [p + "attn.c_attn.weight", p + "attn.c_attn.bias",
                                        p + "ln_1.weight", p + "ln_1.bias"])]
    total = sum(w for w, _ in steps)
    done, out = 0.0, {}
    for w, names in steps:
        done += w
        out.update(dict.fromkeys(names, done / total))
    return out  # wpe, wte: absent, i.e. at the end


def estimated_buckets(shape: Shape, bucket_mb: float, reduce_bytes: int,
                      backward_ms: float) -> tuple[Bucket, ...]:
    done = completion_fractions(shape)
    return tuple(Bucket(n * reduce_bytes, backward_ms * max(done.get(x, 1.0) for x in names))
                 for n, names in code_buckets(shape, bucket_mb, reduce_bytes))


# ---- reading inputs -------------------------------------------------------------------------
def _fraction(value: float | None, what: str, flag: str, source: str) -> float:
    if value is None:
        raise InputError(f"{source} has no {what} time: pass {flag} (the share of the 1-GPU "
                         "step, from a profile of the same shape) to assume one")
    return value


def scaling_inputs(data: dict[str, Any], shape_name: str, source: str, args: Any) -> StepInputs:
    """The 1-GPU row of a benchmarks/scaling.py JSON: its step is measured, its phases not."""
    if shape_name not in data or "1" not in data[shape_name]:
        raise InputError(f"{source} has no 1-GPU {shape_name!r} row (it has "
                         f"{', '.join(k for k in data if k in SCALING_SHAPES)}): pass --shape")
    one = data[shape_name]["1"]
    layers, heads, embed, seq_len, batch = SCALING_SHAPES[shape_name]
    rest = one["params"] - seq_len * embed - layers * (12 * embed * embed + 13 * embed) \
        - 2 * embed
    shape = Shape(layers, heads, embed, seq_len, batch, rest // embed)
    return _inputs(shape, one["step_s"] * 1e3, one["tokens_per_step"], None, None,
                   (source, f"measured: {source} [{shape_name}][1] (scaling.py, graph "
                            "replay, best of the repeats)"), args)


def _runs(path: str, shape: str | None = None) -> tuple[list[Record], list[Record]]:
    """A training log's finished runs with a tokens/s (of `shape`, when given): those that
    profiled and those that did not, each in file order."""
    recs = [r for r in read_log(path) if r.get("tokens_per_s") and r.get("model")
            and shape in (None, model_shape(r))]
    return [r for r in recs if r.get("profile")], [r for r in recs if not r.get("profile")]


def record_inputs(path: str, args: Any) -> StepInputs:
    """A training log's 1-GPU runs: the phase times of the last profiled one, the step of the
    last one that did not profile (else of the profiled one)."""
    profiled, plain = (
        [r for r in rs if world_size(r) == 1] for rs in _runs(path))
    if not profiled:
        raise InputError(f"{path} holds no profiled 1-GPU run with a tokens/s: train one "
                         "with --gpus 1 and the profile on")
    r, m = profiled[-1], profiled[-1]["model"]
    shape = Shape(m["layers"], m["heads"], m["embed"], m["seq_len"], m["batch"], m["vocab"])
    same = [p for p in plain if model_shape(p) == model_shape(r)]
    timed = same[-1] if same else r
    phases, steps = r["profile"]["phases"], max(r["profile"].get("profiled_steps", 1), 1)
    tokens = shape.batch * shape.seq_len
    return _inputs(shape, tokens / timed["tokens_per_s"] * 1e3, tokens,
                   phases["backward"] / steps * 1e3, phases["optimizer"] / steps * 1e3,
                   (path, f"measured: {path} (tokens/s of a 1-GPU run, profile "
                          f"{'off' if same else 'on'})"), args,
                   f"measured: {path} (the 1-GPU profile's phase times)")


def step_json_inputs(path: str, args: Any) -> StepInputs:
    """A hand-made or tool-made step JSON: step_ms, tokens_per_step, model, and optionally
    backward_ms, optimizer_ms, bucket_mb, reduce_bytes, buckets [{bytes, ready_ms}]."""
    d = json.loads(Path(path).read_text())
    shape = Shape(**d["model"])
    labels = d.get("labels", {})
    inputs = _inputs(shape, d["step_ms"], d["tokens_per_step"], d.get("backward_ms"),
                     d.get("optimizer_ms"), (path, labels.get("step_ms", f"from {path}")), args,
                     labels.get("backward_ms", f"from {path}"), d.get("bucket_mb"),
                     d.get("reduce_bytes"))
    if "buckets" not in d:
        return inputs
    buckets = tuple(Bucket(b["bytes"], b["ready_ms"]) for b in d["buckets"])
    return dataclasses.replace(inputs, buckets=buckets, labels={
        **inputs.labels, "buckets": labels.get("buckets", f"from {path}")})


def _inputs(shape: Shape, step_ms: float, tokens: int, backward_ms: float | None,
            optimizer_ms: float | None, step_label: tuple[str, str], args: Any,
            phase_label: str = "", bucket_mb: float | None = None,
            reduce_bytes: int | None = None) -> StepInputs:
    source, step_label = step_label
    labels = {"step_ms": step_label, "shape": f"L{shape.layers} H{shape.heads} E{shape.embed} "
              f"T{shape.seq_len} B{shape.batch} V{shape.vocab}"}
    if backward_ms is None:
        frac = _fraction(args.backward_fraction, "backward", "--backward-fraction", source)
        backward_ms = frac * step_ms
        labels["backward_ms"] = f"assumed: {frac:g} of the step (--backward-fraction)"
    else:
        labels["backward_ms"] = phase_label
    if optimizer_ms is None and args.optimizer_fraction is not None:
        optimizer_ms = args.optimizer_fraction * step_ms
        labels["optimizer_ms"] = (f"assumed: {args.optimizer_fraction:g} of the step "
                                  "(--optimizer-fraction)")
    elif optimizer_ms is not None:
        labels["optimizer_ms"] = phase_label
    bucket_mb = args.bucket_mb if bucket_mb is None else bucket_mb
    reduce_bytes = args.reduce_bytes if reduce_bytes is None else reduce_bytes
    buckets = estimated_buckets(shape, bucket_mb, reduce_bytes, backward_ms)
    labels["buckets"] = (f"from the code: ParameterBuffer.buckets at BUCKET_MB={bucket_mb:g}, "
                         f"{reduce_bytes} bytes an element; ready times estimated: backward's "
                         "time shared over the layers by GEMM and attention FLOPs")
    params = sum(n for n, _ in code_buckets(shape, 1e9))
    labels["param_bytes"] = (f"{args.gather_bytes} bytes a parameter all-gathered by ZeRO-1 "
                             "(--gather-bytes)")
    return StepInputs(step_ms, backward_ms, optimizer_ms, tokens, buckets,
                      args.gather_bytes * params, labels)


def sweep_network(files: list[str], dtype: str, args: Any) -> tuple[Network, dict[str, str]]:
    """Intra-node fits from allreduce_sweep.py files (one per GPU count)."""
    links, labels = {}, {}
    for f in files:
        d = json.loads(Path(f).read_text())
        pts = [(p["bytes"], p["ms"]) for p in d["points"]
               if p["dtype"] == dtype and p["bytes"] >= args.fit_min_bytes]
        n = int(d["gpus"])
        links[n] = fit_link(pts, n)
        labels[f"{n} GPUs"] = (f"measured: {f} ({len(pts)} {dtype} sizes >= "
                               f"{args.fit_min_bytes:,} B on {d.get('machine', '?')}), fitted")
    return _network(links, labels, args)


def scaling_network(data: dict[str, Any], source: str, args: Any
                    ) -> tuple[Network, dict[str, str]]:
    """Intra-node fits from the whole-gradient all-reduces scaling.py timed (one size per
    shape: the shapes' gradients are the sizes of the fit)."""
    by_n: dict[int, list[tuple[float, float]]] = {}
    for name, rows in data.items():
        if name not in SCALING_SHAPES:
            continue
        for n, r in rows.items():
            if r.get("allreduce_s"):
                by_n.setdefault(int(n), []).append((4 * r["params"], r["allreduce_s"] * 1e3))
    links = {n: fit_link(p, n) for n, p in by_n.items()}
    labels = {f"{n} GPUs": f"measured: {source} (scaling.py's all-reduce of the whole fp32 "
              f"gradient, {len(p)} sizes), fitted" for n, p in by_n.items()}
    return _network(links, labels, args)


def _network(links: dict[int, Link], labels: dict[str, str], args: Any
             ) -> tuple[Network, dict[str, str]]:
    if not links:
        raise InputError("no all-reduce measurements: pass --sweep FILE (allreduce_sweep.py) "
                         "or --scaling FILE with all-reduce times")
    top = max(links)
    for n in (n for n in NODE_GPUS[1:] if n not in links):
        labels[f"{n} GPUs"] = (f"assumed: the {top}-GPU fit (no {n}-GPU measurement; an "
                               "NVSwitch board keeps the per-GPU bus bandwidth)")
    if args.intra_busbw_8 is not None:
        links[8] = dataclasses.replace(links[top], busbw_gbs=args.intra_busbw_8)
        labels["8 GPUs"] = f"assumed: busbw {args.intra_busbw_8:g} GB/s (--intra-busbw-8)"
    labels["inter-node"] = (f"assumed: {args.inter_gbps:g} Gb/s per GPU at line rate, "
                            f"{args.inter_latency_us:g} us per all-reduce (--inter-gbps, "
                            "--inter-latency-us); hierarchical, not pipelined")
    return Network(links, args.inter_gbps, args.inter_latency_us / 1e3), labels


# ---- validation -----------------------------------------------------------------------------
def measured_rows(path: str, shape_name: str, shape: str, tokens_per_gpu: int,
                  reduce_dtype: str = "fp32", zero1: bool = False,
                  ) -> tuple[float | None, list[tuple[int, float]]]:
    """The 1-GPU step (None: not measured there) and the (GPUs, step ms) of the multi-GPU
    runs in a scaling.py JSON, or of the runs of `shape` in a training log (those that did
    not profile, where there are any) that summed their gradient in `reduce_dtype`, with
    ZeRO-1 on or off as `zero1` says."""
    if path.endswith(".json"):
        rows = json.loads(Path(path).read_text()).get(shape_name, {})
        steps = {int(n): r["step_s"] * 1e3 for n, r in rows.items()}
    else:
        profiled, plain = (
            [r for r in rs if world_size(r) == 1
             or (parallel_of(r).get("grad_reduce_dtype", "fp32") == reduce_dtype
                 and bool(parallel_of(r).get("shard_optimizer")) == zero1)]
            for rs in _runs(path, shape))
        steps = {world_size(r): world_size(r) * tokens_per_gpu / r["tokens_per_s"] * 1e3
                 for r in plain or profiled}  # the last run of each count
    return steps.get(1), sorted((n, ms) for n, ms in steps.items() if n > 1)


def validate(inputs: StepInputs, net: Network, files: list[str], shape_name: str,
             contention: float, zero1: bool, reduce_dtype: str = "fp32") -> list[str]:
    """A row per measured run (of a training log: those that summed in `reduce_dtype`, with
    ZeRO-1 as `zero1` says):
    predicted and measured step, the error, and the contention that would make the row
    exact."""
    lines = ["| measured in | 1-GPU ms | GPUs | measured ms | predicted ms | error | measured "
             "extra ms | predicted extra ms | implied contention |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for f in files:
        base, rows = measured_rows(f, shape_name, inputs.labels["shape"],
                                   inputs.tokens_per_step, reduce_dtype, zero1)
        here = inputs if base is None else dataclasses.replace(inputs, step_ms=base)
        for n, meas in rows:
            p = predict(here, net, n, contention, zero1)
            lines.append(validation_row(Path(f).name, here.step_ms, n, meas, p))
    return lines


def validation_row(where: str, base: float, gpus: int, measured: float, p: Prediction) -> str:
    """One run against its prediction; the implied contention is what would make it exact."""
    hidden = p.comm_ms - p.exposed_ms
    implied = (f"{(measured - base - p.exposed_ms) / hidden:.2f}" if hidden > 0.01
               else "- (nothing hidden)")
    return (f"| {where} | {base:.2f} | {gpus} | {measured:.2f} | {p.step_ms:.2f} | "
            f"{errors(p.step_ms, measured):+.1%} | {measured - base:.2f} | "
            f"{p.step_ms - base:.2f} | {implied} |")


# ---- the report -----------------------------------------------------------------------------
def assumptions(inputs: StepInputs, net_labels: dict[str, str], net: Network,
                contention: float, contention_label: str) -> list[str]:
    grad = sum(b.nbytes for b in inputs.buckets)
    rows = [("1-GPU step", f"{inputs.step_ms:.2f} ms, {inputs.tokens_per_step:,} tokens",
             inputs.labels["step_ms"]),
            ("shape", inputs.labels["shape"], "the 1-GPU run's"),
            ("backward", f"{inputs.backward_ms:.2f} ms", inputs.labels["backward_ms"]),
            ("buckets", f"{len(inputs.buckets)}, {grad / MB:.1f} MB, last ready at "
             f"{max(b.ready_ms for b in inputs.buckets):.2f} ms", inputs.labels["buckets"])]
    if inputs.optimizer_ms is not None:
        rows.append(("optimizer", f"{inputs.optimizer_ms:.2f} ms", inputs.labels["optimizer_ms"]))
    if "param_bytes" in inputs.labels:
        rows.append(("ZeRO-1 all-gather", f"{inputs.param_bytes / MB:.1f} MB",
                     inputs.labels["param_bytes"]))
    for n in NODE_GPUS[1:]:
        link = net.link(n)
        rows.append((f"all-reduce, {n} GPUs", f"alpha {link.alpha_ms * 1e3:.1f} us, busbw "
                     f"{link.busbw_gbs:.0f} GB/s", net_labels[f"{n} GPUs"]))
    rows += [("network", f"{net.inter_gbps:g} Gb/s, {net.inter_latency_ms * 1e3:g} us",
              net_labels["inter-node"]),
             ("contention", f"{contention:g}", contention_label)]
    return ["| input | value | source |", "|---|---|---|",
            *(f"| {a} | {b} | {c} |" for a, b, c in rows)]


def prediction_table(inputs: StepInputs, net: Network, contention: float, zero1: bool
                     ) -> tuple[list[str], list[Prediction]]:
    lines = ["| setting | GPUs | step ms | tokens/s | speed-up | efficiency | comm ms | "
             "exposed ms |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    preds = []
    for label, gpus in ([(f"1 node x {n}", n) for n in NODE_GPUS]
                        + [(f"{m} nodes x 8", 8 * m) for m in NODES]):
        p = predict(inputs, net, gpus, contention, zero1)
        preds.append(p)
        lines.append(f"| {label} | {gpus} | {p.step_ms:.2f} | {p.tokens_per_s:,.0f} | "
                     f"{p.speedup:.2f}x | {p.efficiency:.1%} | {p.comm_ms:.2f} | "
                     f"{p.exposed_ms:.2f} |")
    return lines, preds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--scaling", help="a benchmarks/scaling.py JSON (its 1-GPU row)")
    src.add_argument("--record", help="a training log: its last profiled 1-GPU run")
    src.add_argument("--step", help="a step JSON (see step_json_inputs)")
    ap.add_argument("--shape", default="medium", help="the --scaling file's shape")
    ap.add_argument("--sweep", nargs="*", default=[], help="allreduce_sweep.py JSON files")
    ap.add_argument("--dtype", default=None, help="the sweep's dtype: bf16 or fp32 "
                    "(default: fp32 for 4-byte reduces, bf16 for 2)")
    ap.add_argument("--reduce-bytes", type=int, default=4, help="bytes per gradient element "
                    "reduced (4: the trainer's fp32 gradient)")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="BUCKET_MB")
    ap.add_argument("--backward-fraction", type=float, help="assumed backward share of the "
                    "1-GPU step, where the inputs lack phase times")
    ap.add_argument("--optimizer-fraction", type=float, help="assumed optimizer share")
    ap.add_argument("--contention", type=float, default=0.0, help="compute ms lost per ms "
                    "of hidden reduce (assumed)")
    ap.add_argument("--zero1", action="store_true", help="SHARD_OPTIMIZER=true")
    ap.add_argument("--gather-bytes", type=int, default=4, choices=(2, 4), help="bytes per "
                    "parameter ZeRO-1 all-gathers: 4 (the float32 parameters), 2 (a bf16 or "
                    "fp16 run without weight averaging, which gathers its 16-bit compute copy)")
    ap.add_argument("--inter-gbps", type=float, default=400.0, help="network per GPU, Gb/s "
                    "(assumed)")
    ap.add_argument("--inter-latency-us", type=float, default=10.0, help="(assumed)")
    ap.add_argument("--intra-busbw-8", type=float, help="8-GPU busbw GB/s (assumed)")
    ap.add_argument("--fit-min-bytes", type=int, default=2**20, help="sweep sizes fitted")
    ap.add_argument("--validate", nargs="*", default=[], help="scaling.py JSONs or training "
                    "logs with 2- and 4-GPU runs of the same shape")
    ap.add_argument("--json", help="write the predictions here")
    return ap.parse_args(argv)


def report(args: argparse.Namespace) -> str:
    scaling = json.loads(Path(args.scaling).read_text()) if args.scaling else None
    if scaling is not None:
        inputs = scaling_inputs(scaling, args.shape, args.scaling, args)
    elif args.record:
        inputs = record_inputs(args.record, args)
    else:
        inputs = step_json_inputs(args.step, args)
    dtype = args.dtype or ("bf16" if args.reduce_bytes == 2 else "fp32")
    if args.sweep:
        net, net_labels = sweep_network(args.sweep, dtype, args)
    elif scaling is not None:
        net, net_labels = scaling_network(scaling, args.scaling, args)
    else:
        raise InputError("no all-reduce measurements: pass --sweep FILE... "
                         "(benchmarks/allreduce_sweep.py's JSON)")
    c_label = ("assumed (--contention)" if args.contention else
               "assumed: 0, perfect overlap (--contention)")
    lines = ["# Data-parallel scaling model (benchmarks/scaling_model.py)", "",
             "Command: `python benchmarks/scaling_model.py " + " ".join(sys.argv[1:]) + "`",
             "", "## Inputs", "", *assumptions(inputs, net_labels, net, args.contention,
                                               c_label)]
    if args.validate:
        lines += ["", "## Validation against measured runs", "",
                  *validate(inputs, net, args.validate, args.shape, args.contention,
                            args.zero1, "bf16" if args.reduce_bytes == 2 else "fp32")]
    table, preds = prediction_table(inputs, net, args.contention, args.zero1)
    lines += ["", "## Predictions (same per-GPU batch)", "", *table]
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"inputs": inputs.labels, "network": net_labels,
             "predictions": [dataclasses.asdict(p) for p in preds]}, indent=1))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        print(report(args))
    except (InputError, OSError, KeyError, ValueError) as exc:
        text = exc.args[0] if isinstance(exc, InputError) else f"{type(exc).__name__}: {exc}"
        print(f"Error: {text}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

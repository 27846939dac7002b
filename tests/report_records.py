"""Synthetic run records for the reporting tests: a CPU run, a GPU run, an interrupted
run that fell back to the CPU, and data-parallel runs (every field a block renders)."""

from __future__ import annotations

import copy

CPU_OPS = [
    {"name": "matmul", "category": "matmul", "phase": "forward", "calls": 4200, "time_s": 0.7},
    {"name": "matmul", "category": "matmul", "phase": "backward", "calls": 8400, "time_s": 1.9},
    {"name": "softmax", "category": "other", "phase": "forward", "calls": 600, "time_s": 0.45},
    {"name": "adamw", "category": "other", "phase": "optimizer", "calls": 300, "time_s": 0.2},
]


def cpu_record(**changes: object) -> dict:
    """A completed CPU run with every step profiled."""
    record = {
        "version": 1,
        "timestamp": "2026-11-22T07:00:00Z",
        "status": "completed",
        "device": "cpu",
        "device_requested": "cpu",
        "fallback_reason": None,
        "hardware": "AMD EPYC 9654 96-Core Processor",
        "backend": "numpy 2.4.6, OpenBLAS 0.3.29, 2 threads",
        "dataset": "wikitext-2",
        "model": {
            "layers": 2,
            "heads": 4,
            "embed": 128,
            "seq_len": 64,
            "batch": 16,
            "vocab": 33278,
            "params": 4657408,
        },
        "precision": "fp32",
        "optimizer": "adamw",
        "graph": False,
        "epochs": 2,
        "epochs_planned": 2,
        "steps": 300,
        "train_time_s": 4.25,
        "avg_epoch_time_s": 1.875,
        "tokens_per_s": 21000.0,
        "val_ppl": 412.3456,
        "test_ppl": 398.1,
        "final_loss": 5.9,
        "checkpoint": "models/wikitext-2-L2-H4-E128-cpu.npz",
        "message": None,
        "profile": {
            "timing": "wall",
            "note": "every op timed on the host",
            "profiled_steps": 300,
            "profiled_time_s": 3.5,
            "ops": copy.deepcopy(CPU_OPS),
            "phases": {
                "forward": 1.4,
                "backward": 1.8,
                "optimizer": 0.2,
                "data": 0.05,
                "eval": 0.75,
            },
            "host_launch_s": None,
            "device_busy_s": None,
            "transfers": {
                "h2d_count": 0,
                "h2d_bytes": 0,
                "d2h_count": 0,
                "d2h_bytes": 0,
                "steps": 300,
            },
            "memory": {"kind": "rss", "peak_bytes": 3 * 2**29, "pool_total_bytes": None},
            "matmul_floor": {
                "gflops": 410.5,
                "flops_per_step": 1.9e9,
                "floor_s_per_step": 0.0046,
                "step_s": 0.0115,
            },
        },
    }
    record.update(changes)
    return record


def gpu_record(**changes: object) -> dict:
    """A completed GPU run (CUDA graphs) whose per-op times come from a 20-step window."""
    return cpu_record(**{**_gpu_fields(), **changes})


def _gpu_fields() -> dict:
    """What gpu_record changes in cpu_record's (a fresh copy each call: tests mutate it)."""
    return dict(
        timestamp="2026-11-22T08:00:00Z",
        device="gpu",
        device_requested="auto",
        hardware="NVIDIA H100 80GB HBM3",
        backend="cupy 14.2.0, CUDA 13.0",
        precision="tf32",
        graph=True,
        train_time_s=0.5,
        avg_epoch_time_s=0.16,
        tokens_per_s=252000.0,
        checkpoint="models/wikitext-2-L2-H4-E128-gpu.npz",
        profile={
            "timing": "cuda-events",
            "note": "per-op device times from an eager profiled window of 20 steps after "
            "warm-up; totals from the full (graph) run",
            "profiled_steps": 20,
            "profiled_time_s": 0.08,
            "ops": [
                {
                    "name": "matmul",
                    "category": "matmul",
                    "phase": "forward",
                    "calls": 280,
                    "time_s": 0.021,
                },
                {
                    "name": "layernorm",
                    "category": "other",
                    "phase": "forward",
                    "calls": 100,
                    "time_s": 0.012,
                },
                {
                    "name": "matmul",
                    "category": "matmul",
                    "phase": "backward",
                    "calls": 560,
                    "time_s": 0.033,
                },
            ],
            "phases": {
                "forward": 0.03,
                "backward": 0.04,
                "optimizer": 0.006,
                "data": 0.001,
                "eval": 0.05,
            },
            "host_launch_s": 0.025,
            "device_busy_s": 0.066,
            "transfers": {
                "h2d_count": 300,
                "h2d_bytes": 300 * 8192,
                "d2h_count": 30,
                "d2h_bytes": 120,
                "steps": 300,
            },
            "memory": {"kind": "gpu_pool", "peak_bytes": 3 * 2**29, "pool_total_bytes": 2**31},
            "matmul_floor": None,
        },
    )


def interrupted_record(**changes: object) -> dict:
    """A GPU request that fell back to the CPU and was interrupted before an epoch ended."""
    return cpu_record(**{**_interrupted_fields(), **changes})


def _interrupted_fields() -> dict:
    """What interrupted_record changes in cpu_record's."""
    return dict(timestamp="2026-11-22T09:00:00Z", status="interrupted", device_requested="gpu",
                fallback_reason="no CUDA driver", epochs=0, steps=40, steps_per_epoch=150,
                train_time_s=2.0, avg_epoch_time_s=None, val_ppl=None, test_ppl=None,
                checkpoint=None, message="KeyboardInterrupt at step 40", profile=None)


def parallel(world: int, **changes: object) -> dict:
    """The record's `parallel` field for `world` processes of 16 streams, no accumulation."""
    value = {
        "world_size": world,
        "grad_accum_steps": 1,
        "effective_batch": 16 * world,
        "shard_optimizer": False,
        "launcher": "rustyflow" if world > 1 else "none",
        "tokens_per_s_per_rank": None,
        "bucket_mb": 25.0,
        "buckets": 4 if world > 1 else 0,
    }
    value.update(changes)
    return value


def dp_record(world: int = 2, tokens_per_s: float | None = 812345.0, **changes: object) -> dict:
    """A GPU run over `world` processes whose profiled window timed an all-reduce."""
    per_rank = tokens_per_s / world if tokens_per_s is not None else None
    record = gpu_record(
        device="gpu:0", tokens_per_s=tokens_per_s,
        parallel=parallel(world, tokens_per_s_per_rank=per_rank),
    )
    record["profile"]["ops"].append(
        {"name": "all_reduce", "category": "comm", "phase": "backward", "calls": 80,
         "time_s": 0.009}
    )
    record.update(changes)
    return record

"""Every `systems` command refuses a value it cannot run with: exit status 2 and one line on
stderr, before any work (a workload, a rendezvous, a kernel launch)."""

from __future__ import annotations

import pytest
import torch

import systems.attention.flash_triton.tune as tune
import systems.bench.cli as bench_cli
import systems.bench.distributed.cli as dist_cli
import systems.profiling.cli as profile_cli
from systems import cli


@pytest.fixture
def no_work(monkeypatch):
    """Each command's first piece of work fails the test if it is reached."""
    def work(*args, **kwargs):
        raise AssertionError("work started before the arguments were refused")

    monkeypatch.setattr(bench_cli, "_run_mode", work)
    for name in ("run_compute", "run_memory", "run_breakdown"):
        monkeypatch.setattr(profile_cli, name, work)
    monkeypatch.setattr(dist_cli, "init_from_env", work)
    monkeypatch.setattr(tune, "make_inputs", work)


def _refusal(argv: list[str], capsys) -> str:
    try:
        code = cli.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    return err


OUT = ["--out", "unused"]
BAD_COUNTS = {
    "bench --steps 0": ["bench", "--size", "tiny", "--steps", "0"],
    "bench --steps -2": ["bench", "--size", "tiny", "--steps", "-2"],
    "bench --warmup -1": ["bench", "--size", "tiny", "--warmup", "-1"],
    "bench --batch-size 0": ["bench", "--size", "tiny", "--batch-size", "0"],
    "bench --seq-len 0": ["bench", "--size", "tiny", "--seq-len", "0"],
    "profile compute --steps 0": ["profile", "compute", "--steps", "0", *OUT],
    "profile memory --steps 0": ["profile", "memory", "--steps", "0", *OUT],
    "profile breakdown --steps 0": ["profile", "breakdown", "--steps", "0", *OUT],
    "dist train --steps 0": ["dist", "train", "--steps", "0"],
    "dist train --bucket-size-mb 0": ["dist", "train", "--bucket-size-mb", "0"],
    "dist allreduce --iterations 0": ["dist", "allreduce", "--iterations", "0"],
    "dist allreduce --sizes-mb -1": ["dist", "allreduce", "--sizes-mb", "-1"],
    "dist --timeout-s 0": ["dist", "--timeout-s", "0", "allreduce"],
    "tune --seq-len 0": ["tune", "--seq-len", "0"],
}


@pytest.mark.parametrize("name", list(BAD_COUNTS))
def test_counts_and_sizes_below_their_least_are_refused(name, no_work, capsys):
    flag = name.split()[-2]
    assert f"argument {flag}" in _refusal(BAD_COUNTS[name], capsys)


def test_nccl_without_gpus_is_refused(no_work, monkeypatch, capsys):
    monkeypatch.setattr(dist_cli, "gpu_count", lambda: 0)
    err = _refusal(["dist", "--backend", "nccl", "allreduce"], capsys)
    assert "--backend nccl needs a CUDA GPU" in err and "--backend gloo" in err


def test_tune_without_cuda_is_refused(no_work, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "times kernels on a CUDA GPU" in _refusal(["tune"], capsys)


@pytest.mark.parametrize(("argv", "reason"), [
    (["--attention", "sdpa_flash", "--device", "cpu"], "runs on CUDA only"),
    (["--attention", "sdpa_flash", "--device", "cpu", "--precision", "bf16"],
     "runs on CUDA only"),
])
def test_bench_refuses_an_attention_backend_that_cannot_run_on_the_device(argv, reason, no_work,
                                                                          capsys):
    err = _refusal(["bench", "--size", "tiny", "--seq-len", "16", *argv], capsys)
    assert "'sdpa_flash' cannot run on cpu" in err and reason in err

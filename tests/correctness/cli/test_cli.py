"""`systems bench` end to end on a tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import systems
from systems.bench.cli import main


def test_cli_prints_a_table_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "result.json"
    code = main(["--size", "tiny", "--seq-len", "32", "--batch-size", "2",
                 "--warmup", "1", "--steps", "2", "--precision", "bf16", "--json", str(out)])
    assert code == 0
    table = capsys.readouterr().out
    for mode in ("forward", "forward_backward", "train_step"):
        assert mode in table
    payload = json.loads(out.read_text())
    assert payload["machine"]["torch"]
    results = payload["results"]
    assert [r["mode"] for r in results] == ["forward", "forward_backward", "train_step"]
    for r in results:
        assert r["outcome"] == "ok" and r["precision"] == "bf16"
        assert len(r["timing"]["times"]) == 2 and r["timing"]["mean"] > 0
        # The host time until a step returned; on the CPU the step is done by then.
        assert 0 < r["timing"]["host_median"] <= r["timing"]["max"]
        assert r["tflops"] > 0 and r["tokens_per_s"] > 0


def test_cli_hyperparameter_overrides(tmp_path) -> None:
    out = tmp_path / "r.json"
    assert main(["--size", "tiny", "--d-model", "32", "--num-heads", "2", "--num-layers", "1",
                 "--seq-len", "16", "--mode", "forward", "--warmup", "0", "--steps", "1",
                 "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert (result["d_model"], result["num_heads"], result["num_layers"]) == (32, 2, 1)


def test_cli_runs_a_recipe_with_changed_settings(tmp_path) -> None:
    out = tmp_path / "r.json"
    assert main(["--size", "tiny", "--seq-len", "16", "--batch-size", "1",
                 "--mode", "train_step", "--warmup", "0", "--steps", "1",
                 "--recipe", "optimized", "--option", "precision=fp32",
                 "--option", "compiled=false", "--option", "attention=sdpa",
                 "--option", "checkpoint_every=1", "--option", "cuda_graph=false",
                 "--json", str(out)]) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["recipe"] == "optimized" and result["outcome"] == "ok"
    assert (result["precision"], result["compiled"], result["attention"]) == (
        "fp32", False, "sdpa")
    assert (result["optimizer"], result["fused_loss"], result["checkpoint_every"]) == (
        "mixed_precision", True, 1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--recipe", "optimized", "--option", "warp_speed=9"],
         "unknown setting 'warp_speed'; the recipe's settings are attention, checkpoint_blocks, "
         "checkpoint_every, compile_mode, compile_scope, compiled, cuda_graph, fused_loss, lr, "
         "optimizer, overlap_optimizer, precision"),
        (["--recipe", "optimized", "--option", "lr=fast"], "--option lr takes a number"),
        (["--recipe", "optimized", "--option", "cuda_graph=no"],
         "--option cuda_graph takes true or false, got 'no'"),
        (["--recipe", "optimized", "--option", "compiled=yes"], "takes true or false"),
        (["--recipe", "optimized", "--option", "checkpoint_every=many"], "takes an integer"),
        (["--recipe", "optimized", "--option", "compiled"], "KEY=VALUE"),
        (["--recipe", "optimized", "--precision", "fp32"], "with --recipe"),
        (["--option", "compiled=false"], "--option needs --recipe"),
        (["--size", "tiny", "--seq-len", "16", "--recipe", "optimized", "--device",
          "cpu"], "bf16 Triton kernels need a GPU"),
        (["--size", "tiny", "--seq-len", "16", "--recipe", "optimized", "--device", "cpu",
          "--option", "attention=reference"], "cuda_graph needs a CUDA device"),
        (["--recipe", "optimized", "--option", "compile_scope=everything"],
         "unknown compile scope"),
        (["--size", "tiny", "--seq-len", "100000"], "seq_len"),
        (["--size", "tiny", "--d-model", "65"], "not divisible"),
    ],
)
def test_cli_bad_input_exits_with_a_message(args, message: str, capsys) -> None:
    assert main(["--size", "tiny", *args, "--steps", "1", "--warmup", "0"]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--precision", "fp64"], ["--attention", "magic"],
                                  ["--size", "gigantic"]])
def test_cli_rejects_unknown_choices(args) -> None:
    src = str(Path(systems.__file__).parents[1])
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, "-m", "systems.bench", *args],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


def test_unwritable_json_destination_fails_before_any_work(tmp_path, monkeypatch,
                                                           capsys) -> None:
    import systems.bench.cli as cli

    def no_work(*args, **kwargs):
        raise AssertionError("a workload ran before the --json destination was checked")

    monkeypatch.setattr(cli, "_run_mode", no_work)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    # Under a regular file: no folder can be made there, whoever runs the test (root too).
    for target in (blocker / "out" / "x.json", blocker / "x.json", tmp_path):
        assert main(["--size", "tiny", "--seq-len", "16", "--json", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --json") and str(target) in err


@pytest.mark.parametrize("text", ["false", "FALSE", "False", "0"])
def test_cli_option_booleans_read_true_false_and_one_zero(text: str) -> None:
    from systems.bench.cli import _recipe_overrides, build_parser

    args = build_parser().parse_args(["--recipe", "optimized", "--option", f"cuda_graph={text}",
                                      "--option", "compile_mode=none"])
    assert _recipe_overrides(args) == {"cuda_graph": False, "compile_mode": None}


@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:3"])
def test_cli_cuda_device_without_cuda_is_a_clear_error(device: str, monkeypatch,
                                                       capsys) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    assert main(["--size", "tiny", "--seq-len", "16", "--device", device]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --device {device}: no CUDA device here")


def test_cli_help_shows_defaults(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for shown in ("--seq-len SEQ_LEN tokens per sequence (default: 512)",
                  "--steps STEPS timed steps (default: 10)", "model preset (default: small)"):
        assert shown in text

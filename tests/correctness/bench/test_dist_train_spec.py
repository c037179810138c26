"""The data-parallel benchmark's configuration: bucketed DDP steps each bucket as its
all-reduce lands unless told otherwise (FSDP when asked), and the command line says the
same."""

from __future__ import annotations

import dataclasses

import pytest

from systems.bench.distributed.cli import build_parser
from systems.bench.distributed.train_step import STEPPED_EARLY, VARIANTS, TrainSpec


@pytest.mark.parametrize("variant", STEPPED_EARLY)
def test_steps_early_by_default(variant: str) -> None:
    spec = TrainSpec(variant)
    assert spec.early_step is True
    # what saved results and perf cases record
    assert dataclasses.asdict(spec)["early_step"] is True


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in STEPPED_EARLY])
def test_other_variants_step_after_backward_by_default(variant: str) -> None:
    assert TrainSpec(variant).early_step is False


@pytest.mark.parametrize("variant", VARIANTS)
def test_early_step_off_is_allowed_everywhere(variant: str) -> None:
    assert TrainSpec(variant, early_step=False).early_step is False


@pytest.mark.parametrize("variant", ["none", "bucketed", "fsdp"])
def test_early_step_on_where_it_exists(variant: str) -> None:
    assert TrainSpec(variant, early_step=True).early_step is True


@pytest.mark.parametrize("variant", ["torch_ddp", "naive", "flat", "individual",
                                     "torch_fsdp2"])
def test_early_step_on_elsewhere_is_refused(variant: str) -> None:
    with pytest.raises(ValueError, match="early_step is an option of 'none', 'bucketed'"):
        TrainSpec(variant, early_step=True)


@pytest.mark.parametrize("optimizer", ["sharded", "torch_zero"])
def test_optimizers_that_step_everything_at_once_keep_the_late_step(optimizer: str) -> None:
    assert TrainSpec("bucketed", optimizer=optimizer).early_step is False
    with pytest.raises(ValueError, match="early_step needs optimizer 'adamw'"):
        TrainSpec("bucketed", optimizer=optimizer, early_step=True)


@pytest.mark.parametrize(("argv", "parsed", "resolved"), [
    ([], None, True),
    (["--early-step"], True, True),
    (["--no-early-step"], False, False),
    (["--variant", "none"], None, False),
    (["--variant", "none", "--early-step"], True, True),
    (["--variant", "fsdp"], None, False),
    (["--variant", "fsdp", "--early-step"], True, True),
])
def test_dist_cli_early_step_flag(argv: list[str], parsed: bool | None, resolved: bool) -> None:
    args = build_parser().parse_args(["train", *argv])
    assert args.early_step is parsed
    assert TrainSpec(args.variant, early_step=args.early_step).early_step is resolved


def test_dist_cli_help_says_the_default() -> None:
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    text = " ".join(commands.choices["train"].format_help().split())
    assert "--no-early-step" in text and "default: on for bucketed with adamw" in text

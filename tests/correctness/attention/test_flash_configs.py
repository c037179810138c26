"""Tile configs follow the GPU: the measured tables on sm_90 with its 227 KiB per block,
small tiles where the measured ones do not fit, and the small-GPU switch makes any machine
pick what a small GPU would."""

from __future__ import annotations

import pytest
import torch

from systems.attention.flash_triton import configs
from systems.common import hardware
from systems.common.hardware import TARGETS

HALF, FP32 = (torch.bfloat16, torch.float16), torch.float32


def test_the_measured_gpu_takes_the_measured_tables():
    sm_90 = TARGETS["sm_90"]
    assert configs.config_for(128, torch.bfloat16, sm_90) == configs._HALF_CONFIGS[128]
    assert configs.config_for(80, torch.float16, sm_90) == configs._HALF_HEAD_DIM_CONFIGS[80]
    assert configs.config_for(64, FP32, sm_90) == configs._FP32_CONFIGS[64]


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_120"])
@pytest.mark.parametrize("d", [16, 64, 80, 96, 128])
def test_fp32_never_takes_the_measured_tiles_off_sm_90(arch, d):
    """fp32's dQ at d = 64 needs 168 KiB with them on sm_80 (Triton 3.6), over an A100's
    163 KiB, and more than the 99 KiB of every other target."""
    assert configs.config_for(d, FP32, TARGETS[arch]) not in configs._FP32_CONFIGS.values()


@pytest.mark.parametrize("d", [16, 64, 80, 128])
def test_an_rtx_5090_takes_small_half_precision_tiles(d):
    """sm_120 stages tiles through TMA buffers: bf16 at d = 128 needs 160 KiB with the
    measured tiles, over its 99 KiB."""
    picked = configs.config_for(d, torch.bfloat16, TARGETS["sm_120"])
    assert picked == configs._SMALL_HALF_CONFIGS[configs._next_power_of_2(d)]


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_pointer_lowered_targets_keep_the_measured_half_precision_tiles(arch):
    assert (configs.config_for(128, torch.bfloat16, TARGETS[arch])
            == configs._HALF_CONFIGS[128])


def test_few_programs_take_smaller_tiles_only_where_they_were_measured():
    """The few-program tiles (3 stages of 64-row tiles) were measured on sm_90; a GPU of
    another class keeps its own pick however few programs there are."""
    measured = hardware.GpuTarget((9, 0), TARGETS["sm_90"].shared_bytes, sm_count=132)
    few = configs.config_for(64, torch.bfloat16, measured, programs=10)
    assert few == configs._HALF_FEW_PROGRAM_CONFIG
    assert configs.config_for(64, torch.bfloat16, measured, programs=264) != few
    small = hardware.GpuTarget((12, 0), TARGETS["sm_120"].shared_bytes, sm_count=170)
    assert configs.config_for(64, torch.bfloat16, small, programs=10) \
        == configs.config_for(64, torch.bfloat16, small)


def test_a_gpu_below_every_target_takes_small_tiles():
    """An sm_90 part with less shared memory than an H100's is not the measured GPU."""
    cut = hardware.GpuTarget((9, 0), TARGETS["sm_86"].shared_bytes)
    assert configs.config_for(128, torch.bfloat16, cut) == configs._SMALL_HALF_CONFIGS[128]


@pytest.mark.parametrize(("arch", "expected"), [
    ("sm_89", configs._SMALL_FP32_CONFIGS[128]), ("sm_90", configs._FP32_CONFIGS[128])])
def test_the_switch_makes_the_default_config_a_small_gpus(arch, expected, monkeypatch):
    monkeypatch.setenv(hardware.GPU_LIMITS_ENV, arch)
    assert configs.default_config(128, FP32) == expected
    assert configs.default_config(128, FP32, device=torch.device("cpu")) == expected


def test_configs_for_lists_each_pick_once():
    picks = configs.configs_for(TARGETS["sm_90"], (64,), (torch.bfloat16, FP32))
    assert picks[(64, torch.bfloat16)] == [configs._HALF_CONFIGS[64],
                                            configs._HALF_FEW_PROGRAM_CONFIG]
    assert picks[(64, FP32)] == [configs._FP32_CONFIGS[64]]

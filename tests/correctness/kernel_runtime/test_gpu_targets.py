"""What configs are chosen by: the GPU models we know peaks of, the targets our users' GPUs
are, and the small-GPU switch that makes a big GPU choose as a small one would."""

from __future__ import annotations

import pytest
import torch

from systems.common import hardware

# Names CUDA reports (torch.cuda.get_device_name) for the cards users have.
REPORTED = {
    "NVIDIA A100-SXM4-40GB": "A100 40GB",
    "NVIDIA A100-PCIE-40GB": "A100 40GB",
    "NVIDIA A100-SXM4-80GB": "A100 80GB",
    "NVIDIA A100 80GB PCIe": "A100 80GB",
    "NVIDIA H100 80GB HBM3": "H100 SXM",
    "NVIDIA H100 PCIe": "H100 PCIe",
    "NVIDIA H100 NVL": "H100 NVL",
    "NVIDIA H200": "H200",
    "NVIDIA H800": "H800",
    "NVIDIA L40S": "L40S",
    "NVIDIA GeForce RTX 4090": "RTX 4090",
    "NVIDIA GeForce RTX 5090": "RTX 5090",
}


@pytest.mark.parametrize(("name", "model"), REPORTED.items())
def test_each_card_matches_its_own_model(name, model):
    assert hardware.gpu_model(name).model == model


@pytest.mark.parametrize("name", ["NVIDIA L40", "NVIDIA GeForce RTX 4090 D", "Tesla T4",
                                  "NVIDIA H100", "NVIDIA A100X", "cpu-x86_64"])
def test_cards_we_know_no_peak_of_say_so(name, monkeypatch):
    assert hardware.gpu_model(name) is None
    monkeypatch.setattr(hardware, "device_name", lambda device=None: name)
    assert hardware.peak_tflops("bf16") is None
    assert "no datasheet peak" in hardware.peak_note() and name in hardware.peak_note()


def test_no_card_takes_another_cards_peaks():
    """The PCIe and NVL parts of a chip run slower clocks and power than its SXM part."""
    bf16 = {name: hardware.gpu_model(name).peak("bf16") for name in REPORTED}
    assert bf16["NVIDIA H100 PCIe"] < bf16["NVIDIA H100 NVL"] < bf16["NVIDIA H100 80GB HBM3"]
    assert bf16["NVIDIA GeForce RTX 4090"] < bf16["NVIDIA GeForce RTX 5090"]
    for name in REPORTED:
        model = hardware.gpu_model(name)
        assert model.peak("fp16") == model.peak("bf16")
        assert model.peak("fp32") <= model.peak("tf32") <= model.peak("bf16")


def test_targets_name_themselves_and_order_their_shared_memory():
    assert set(hardware.TARGETS) == {"sm_80", "sm_86", "sm_89", "sm_90", "sm_120"}
    assert all(arch == target.arch for arch, target in hardware.TARGETS.items())
    shared = {arch: target.shared_bytes for arch, target in hardware.TARGETS.items()}
    assert shared["sm_86"] == shared["sm_89"] == shared["sm_120"] < shared["sm_80"] \
        < shared["sm_90"]


def test_without_the_switch_the_cpu_chooses_as_the_measured_gpu(monkeypatch):
    monkeypatch.delenv(hardware.GPU_LIMITS_ENV, raising=False)
    assert hardware.device_target(torch.device("cpu")) == hardware.MEASURED_TARGET
    assert hardware.capability("cpu") == (9, 0)


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_120"])
def test_the_switch_names_the_target_configs_are_chosen_for(arch, monkeypatch):
    monkeypatch.setenv(hardware.GPU_LIMITS_ENV, arch)
    assert hardware.device_target("cpu") == hardware.TARGETS[arch]
    assert hardware.shared_bytes_per_block("cpu") == hardware.TARGETS[arch].shared_bytes


def test_the_switch_refuses_a_target_it_does_not_know(monkeypatch):
    monkeypatch.setenv(hardware.GPU_LIMITS_ENV, "sm_75")
    with pytest.raises(ValueError, match="sm_89"):
        hardware.device_target("cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["sm_80", "sm_89"])
def test_on_a_gpu_the_switch_keeps_its_sm_count_and_never_grows_a_limit(arch, monkeypatch):
    monkeypatch.delenv(hardware.GPU_LIMITS_ENV, raising=False)
    own = hardware.device_target()
    assert own.capability == torch.cuda.get_device_capability()
    assert own.sm_count == torch.cuda.get_device_properties(0).multi_processor_count
    monkeypatch.setenv(hardware.GPU_LIMITS_ENV, arch)
    emulated = hardware.device_target()
    assert emulated.capability == hardware.TARGETS[arch].capability
    assert emulated.sm_count == own.sm_count
    assert emulated.shared_bytes == min(own.shared_bytes, hardware.TARGETS[arch].shared_bytes)

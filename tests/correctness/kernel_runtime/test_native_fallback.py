"""Eager attention where its C++ replay (`attention/host_path/replay.py`) cannot be built
or loaded: calls take the Python launch path with the same results, after one warning that
says why and how to fix it."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from native_cases import output_of, read_only_prefix

from systems.attention.host_path import replay
from systems.kernel_runtime.native_build import load_extension

FALLBACK = "stays on the Python launch path"


@pytest.fixture
def unloaded_replay(monkeypatch):
    """Replay as in a fresh process on a GPU machine: on, its extension not loaded yet."""
    monkeypatch.setattr(replay, "_enabled", True)
    monkeypatch.setattr(replay, "_module", None)
    monkeypatch.delenv("CXX", raising=False)


def _fallback_warnings(calls: int) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(calls):
            assert replay._load() is None
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_an_unusable_cache_folder_falls_back_with_one_warning(unloaded_replay, monkeypatch,
                                                               tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SYSTEMS_CACHE_DIR", str(tmp_path / "a-file"))
    messages = _fallback_warnings(3)
    assert len(messages) == 1, messages
    assert FALLBACK in messages[0] and "SYSTEMS_CACHE_DIR" in messages[0]
    assert "SYSTEMS_ATTENTION_REPLAY=0" in messages[0]


def test_a_failing_compiler_falls_back_with_one_warning(unloaded_replay, monkeypatch, tmp_path):
    monkeypatch.setenv("SYSTEMS_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    messages = _fallback_warnings(3)
    assert len(messages) == 1, messages
    assert FALLBACK in messages[0] and "exited with status 1" in messages[0]


# Eager causal attention, forward and backward, three calls of one layout (the first keeps
# its Programs, the others are replayed when replay is up); prints the fallback warnings,
# how many calls replay served and the worst error against the plain computation in fp32.
_ATTEND = """
import json, sys, warnings
import torch
from systems.attention import FlashAttentionTriton
from systems.attention.host_path import replay
from systems.attention.reference import reference_attention

torch.manual_seed(0)
q, k, v, do = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
               for _ in range(4))
leaves = [t.float().requires_grad_() for t in (q, k, v)]
expected_o = reference_attention(*leaves, is_causal=True)
expected = [expected_o, *torch.autograd.grad(expected_o, leaves, do.float())]
errors = []
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        ours = [t.detach().requires_grad_() for t in (q, k, v)]
        o = FlashAttentionTriton.apply(*ours, True)
        got = [o, *torch.autograd.grad(o, ours, do)]
        errors.append(max((a.float() - b).abs().max().item() for a, b in zip(got, expected)))
print(json.dumps({"warnings": [str(w.message) for w in caught if sys.argv[1] in str(w.message)],
                  "replays": replay.replays(), "error": max(errors)}))
"""


def _attend(cache: Path, prefix: tuple[str, ...] = ()) -> dict:
    return json.loads(output_of("-c", _ATTEND, FALLBACK, prefix=prefix,
                                env={"SYSTEMS_CACHE_DIR": str(cache)})[-1])


@pytest.fixture(scope="module")
def built_replay(tmp_path_factory) -> Path:
    """A cache in which the replay extension is built (copy it: tests damage theirs)."""
    cache = tmp_path_factory.mktemp("replay-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SYSTEMS_CACHE_DIR", str(cache))
        load_extension("attention_replay", replay._SOURCE)
    return cache


def _truncated_copy(built: Path, to: Path) -> Path:
    shutil.copytree(built, to)
    module = next(to.glob("extensions/attention_replay-*/attention_replay*.so"))
    module.write_bytes(module.read_bytes()[: module.stat().st_size // 2])
    return to


def _assert_fell_back(result: dict) -> None:
    assert len(result["warnings"]) == 1, result["warnings"]
    assert result["replays"] == 0
    assert result["error"] < 0.05, result


@pytest.mark.gpu
def test_eager_attention_with_the_cache_path_a_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    _assert_fell_back(_attend(tmp_path / "a-file"))


@pytest.mark.gpu
def test_eager_attention_with_a_read_only_cache_folder(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    _assert_fell_back(_attend(cache, prefix=read_only_prefix(cache)))


@pytest.mark.gpu
def test_eager_attention_with_a_truncated_module_in_a_read_only_cache(built_replay, tmp_path):
    cache = _truncated_copy(built_replay, tmp_path / "cache")
    _assert_fell_back(_attend(cache, prefix=read_only_prefix(cache)))


@pytest.mark.gpu
def test_eager_attention_rebuilds_a_truncated_module(built_replay, tmp_path):
    result = _attend(_truncated_copy(built_replay, tmp_path / "cache"))
    assert result["warnings"] == [] and result["replays"] > 0, result
    assert result["error"] < 0.05, result

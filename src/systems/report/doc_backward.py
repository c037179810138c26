"""Generated doc blocks quoted from the backward-pass experiment
(`scripts/attention_dq_reduce.py`: our two-pass backward, a fused backward whose dQ is
summed by TMA bulk reductions, and cuDNN's, each timed alone)."""

from __future__ import annotations

import json
from pathlib import Path

from systems.common.formatting import markdown_table


def _experiment(repo: Path, name: str) -> dict:
    try:
        data = json.loads((repo / name).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{name}: not a backward experiment ({error})") from error
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise ValueError(f"{name}: not a backward experiment (no rows)")
    return data


def _shape(row: dict) -> str:
    return f"{row['batch']}x{row['seq']}x{row['head_dim']}"


def _ms(row: dict, field: str) -> str:
    return f"{row[field]:.3f}" if field in row else "-"


def backward_passes(repo: Path, file: str) -> str:
    """Per shape: the forwards and backwards of ours and cuDNN, the fused variant's best
    tiles, and ratios; then every fused tile config with how far two of its runs' dQ
    differ (its reduction order is not fixed)."""
    data = _experiment(repo, file)
    of_kind = {kind: [r for r in data["rows"] if r.get("kind") == kind]
               for kind in ("two_pass", "fused_tma_reduce", "cudnn")}
    cudnn = {_shape(r): r for r in of_kind["cudnn"]}
    summary = []
    for ours in of_kind["two_pass"]:
        shape = _shape(ours)
        fused = [r for r in of_kind["fused_tma_reduce"]
                 if _shape(r) == shape and "backward_ms" in r]
        best = min(fused, key=lambda r: r["backward_ms"]) if fused else {}
        rival = cudnn.get(shape, {})
        summary.append([
            shape, _ms(ours, "forward_ms"), _ms(rival, "forward_ms"), _ms(ours, "backward_ms"),
            _ms(best, "backward_ms"), str(tuple(best["config"])) if best else "-",
            _ms(rival, "backward_ms"),
            f"{ours['backward_ms'] / rival['backward_ms']:.2f}" if "backward_ms" in rival
            else "-",
            f"{best['backward_ms'] / ours['backward_ms']:.2f}" if best else "-"])
    configs = [[_shape(r), str(tuple(r["config"])),
                f"failed: {r['error']}" if "error" in r else _ms(r, "backward_ms"),
                f"{r['dq_run_to_run']:.1e}" if "dq_run_to_run" in r else "-"]
               for r in of_kind["fused_tma_reduce"]]
    tables = [
        markdown_table(["b x seq x d", "ours forward ms", "cuDNN forward ms",
                        "ours backward (two passes) ms", "dQ by TMA reductions ms",
                        "its tiles (m, n, warps, stages)", "cuDNN backward ms",
                        "two passes / cuDNN", "TMA reductions / two passes"], summary),
        markdown_table(["b x seq x d", "tiles (m, n, warps, stages)", "backward ms",
                        "dQ max diff, two runs"], configs)]
    return ("\n\n".join(t for t in tables if t)
            + f"\n\nTime: device time (`triton.testing.do_bench` medians), each pass alone, "
            f"bf16, causal. From `{file}` ({data.get('device')}, torch {data.get('torch')}, "
            f"Triton {data.get('triton')}; kernels of commit {data.get('commit')}).\n")

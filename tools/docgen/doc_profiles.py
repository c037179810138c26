"""Generated doc blocks quoted from the attention host-path profiles
(`studies/attention_host_profile/study.py` writes them as JSON files of their own)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from systems.common.formatting import markdown_table
from tools.docgen.doc_attention import LABELS, OURS, short_dtype
from tools.docgen.doc_blocks import read_source


def _profile(repo: Path, name: str) -> dict:
    data = read_source(repo, name, "host profile")
    if not isinstance(data, dict) or "host_profile" not in data:
        raise ValueError(f"{name}: not a host profile (no host_profile)")
    return data


def _profile_source(names: Sequence[str], profiles: Sequence[dict], what: str) -> str:
    machines = sorted({f"{p.get('gpu')}, torch {p.get('torch')}" for p in profiles})
    commits = [p.get("commit") for p in profiles]
    if all(commits):
        recorded = "commits " + ", ".join(f"{c} ({p.get('label')})"
                                          for c, p in zip(commits, profiles, strict=True))
    else:
        recorded = "the files record no commit"
    files = ", ".join(f"`{n}`" for n in names)
    return (f"Time: eager, host included; {what}. From {files} "
            f"({'; '.join(machines)}; {recorded}).\n")


def _impl_profile(profile: dict, impl: str) -> dict:
    """One implementation's host profile; the script's first version profiled ours only
    and stored it unkeyed."""
    host = profile["host_profile"]
    if "enqueue_us_per_call" in host:
        return host if impl == OURS else {}
    return host.get(impl) or {}


def host_profile(repo: Path, impl: str, *files: str) -> str:
    """Per profile file (a column each): `impl`'s enqueue time per call and cProfile's own
    time per call by group, in us."""
    if not files:
        raise ValueError("name at least one host profile file")
    profiles = [_profile(repo, f) for f in files]
    per_file = [_impl_profile(p, impl) for p in profiles]
    groups = sorted({g for pf in per_file for g in pf.get("profiled_us_per_call_by_group", {})},
                    key=lambda g: -max(pf.get("profiled_us_per_call_by_group", {}).get(g, 0)
                                       for pf in per_file))

    def cell(value: object) -> str:
        return "-" if value is None else f"{float(value):.0f}"

    rows = [["enqueue per call (not profiled)",
             *(cell(pf.get("enqueue_us_per_call")) for pf in per_file)]]
    rows += [[group, *(cell(pf.get("profiled_us_per_call_by_group", {}).get(group))
                       for pf in per_file)] for group in groups]
    headers = ["where", *(f"{p.get('label', f)} us" for p, f in zip(profiles, files, strict=True))]
    return (markdown_table(headers, rows) + "\n\n"
            + _profile_source(files, profiles, f"{LABELS.get(impl, impl)}, per forward + "
                              "backward call: enqueue is perf_counter over back-to-back calls; "
                              "the other rows are cProfile's own time, inflated by the "
                              "profiler (compare rows with each other)"))


def host_timings(repo: Path, file: str) -> str:
    """The profile's interleaved eager rounds: every implementation per shape, ours / SDPA
    flash; and the model steps eager vs compiled, if recorded."""
    profile = _profile(repo, file)
    by_shape: dict[tuple, dict[str, float]] = {}
    host_by_shape: dict[tuple, dict[str, float]] = {}
    rounds = set()
    for t in profile.get("timings", []):
        if "median_ms" not in t:  # an implementation that could not run this shape
            continue
        key = ("x".join(map(str, t["shape"])), short_dtype(t["dtype"]))
        by_shape.setdefault(key, {})[t["impl"]] = t["median_ms"]
        if "host_median_ms" in t:  # recorded since the script timed the host's queueing
            host_by_shape.setdefault(key, {})[t["impl"]] = t["host_median_ms"]
        rounds.add(t.get("rounds"))
    impls = [i for i in ("triton", "triton_python_path", "sdpa_flash", "sdpa_cudnn", "sdpa",
                         "triton_compiled")
             if any(i in times for times in by_shape.values())]
    queued = [i for i in ("triton", "triton_python_path", "sdpa_flash")
              if any(i in times for times in host_by_shape.values())]
    rows = []
    for key, times in by_shape.items():
        host = host_by_shape.get(key, {})
        rows.append([*key, *(f"{times[i]:.3f}" if i in times else "-" for i in impls),
                     *(f"{host[i]:.3f}" if i in host else "-" for i in queued),
                     f"{times['triton'] / times['sdpa_flash']:.2f}"
                     if {"triton", "sdpa_flash"} <= times.keys() else "-"])
    parts = [markdown_table(["b x h x seq x d", "dtype", *(f"{LABELS[i]} ms" for i in impls),
                             *(f"{LABELS[i]}, host queueing ms" for i in queued),
                             "ours / SDPA flash"], rows)]
    models = profile.get("compiled_model", [])
    if models:
        parts.append(markdown_table(["model", "batch x seq", "mode", "ms"],
                                    [[m["model"], f"{m['batch']}x{m['seq']}", m["mode"],
                                      f"{m['median_ms']:.2f}"] for m in models]))
    what = (f"forward + backward, medians of {', '.join(map(str, sorted(rounds)))} interleaved "
            "rounds of back-to-back calls, in ms"
            + ("; host queueing: the host's time to queue the same calls, where close to the "
               "call's time the calls are host-bound" if queued else "")
            + "; the model rows are bf16 forward + backward steps")
    return "\n\n".join(parts) + "\n\n" + _profile_source([file], [profile], what)

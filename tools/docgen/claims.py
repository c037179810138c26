"""Claims "ours vs a rival": ratios formed only within one run (these machines move 5-10%
between runs) and naming each side's kind of time; of rounds taken in turn, their median."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from systems.common.formatting import markdown_table
from systems.runs import keys
from systems.runs.history import Result, load_run
from tools.docgen.timings import Timed, case_timings, ratio

# Attention: our kernel against PyTorch's best (SDPA backends, compiled flex_attention).
OUR_ATTENTION = ("triton", "triton_compiled")
RIVAL_ATTENTION = ("sdpa_flash", "sdpa_cudnn", "flex_compiled", "fa4")
# Training recipes: ours against the strongest PyTorch-only step.
OUR_RECIPE, RIVAL_RECIPE = "optimized", "pytorch_baseline"
# Data-parallel variants against PyTorch's own at the same world size and workload.
RIVAL_DDP = {"naive": "torch_ddp", "flat": "torch_ddp", "individual": "torch_ddp",
             "bucketed": "torch_ddp", "fsdp": "torch_fsdp2"}
# The names a reader knows the rivals by, in headlines.
RIVAL_LABELS = {"sdpa_cudnn": "cuDNN (SDPA)", "sdpa_flash": "SDPA flash",
                "flex_compiled": "compiled flex_attention", "fa4": "FlashAttention-4",
                "pytorch_baseline": "PyTorch compiled in one CUDA graph",
                "none": "no communication", "torch_ddp": "torch DDP",
                "torch_fsdp2": "torch FSDP2"}


@dataclass(frozen=True)
class Claim:
    """Ours against a rival, both timed in one run of history `file`: each side's `workload`
    is the claim's, its `what` the kind of time it measured."""

    ours: Timed
    rival: Timed
    file: str
    run: str
    recorded: str = ""  # when the run was recorded (ISO date and time)

    @property
    def ratio(self) -> float:
        """Of rounds taken in turn, the median of the rounds' ratios; else of medians."""
        return ratio(self.ours, self.rival)[0]


def _when(r: Result) -> tuple[str, str]:
    return r.datetime, r.file


def newest(results: Iterable[Result], key: Callable[[Result], tuple]) -> dict[tuple, Result]:
    """The newest result per key (a run may repeat a case: its last)."""
    return {key(r): r for r in sorted(results, key=_when)}


# A side's time in ms and what it measured, or None where not so timed.
def _median(r: Result) -> tuple[float, str] | None:
    return r.median * 1e3, r.time_kind


def _do_bench(r: Result) -> tuple[float, str] | None:
    ms = r.get(keys.DO_BENCH_MEDIAN_MS)
    return (ms, keys.DO_BENCH_TIME) if isinstance(ms, int | float) else None


def _attention_label(r: Result) -> str:
    return (f"attention {r.get(keys.BATCH_HEADS)}x{r.get(keys.SEQ_LEN)}x{r.get(keys.HEAD_DIM)}"
            f" {r.get(keys.DTYPE)}{' causal' if r.get(keys.CAUSAL) else ''}, {r.get(keys.PASS)}")


def ddp_name(r: Result, ranks: bool = False) -> str:
    """A DDP case's variant, with its world size (`ranks`), bucket and optimizer if set."""
    name = f"{r.get(keys.VARIANT)}{f', {r.get(keys.WORLD_SIZE)} ranks' if ranks else ''}"
    if r.get(keys.BUCKET_SIZE_MB) is not None:
        name += f"{',' if ranks else ''} {r.get(keys.BUCKET_SIZE_MB)} MB"
    if r.get(keys.OPTIMIZER) not in (None, "adamw"):
        name += f", {r.get(keys.OPTIMIZER)}"
    return name


class Pairing(NamedTuple):
    """Which cases of `kind` are one workload, who ran each, the claims' label (from ours) and
    each way the sides were timed."""

    kind: str
    workload: Callable[[Result], tuple]
    name: Callable[[Result], str]
    label: Callable[[Result], str]
    times: tuple[Callable[[Result], tuple[float, str] | None], ...] = (_median,)


# (batch, heads, seq, d) and (batch x heads, seq, d) are the same attention problem.
ATTENTION = Pairing("attention", lambda r: (
    r.name.split("[")[0], str(r.get(keys.PASS)), str(r.get(keys.DTYPE)), bool(r.get(keys.CAUSAL)),
    r.get(keys.BATCH_HEADS), r.get(keys.SEQ_LEN), r.get(keys.HEAD_DIM)),
    lambda r: str(r.get(keys.IMPLEMENTATION)), _attention_label, (_median, _do_bench))
RECIPE = Pairing("recipe", lambda r: (str(r.get(keys.SIZE)), r.get(keys.SEQ_LEN),
                                      str(r.get(keys.MODE))), lambda r: str(r.get(keys.RECIPE)),
                 lambda r: f"train step {r.get(keys.SIZE)}, ctx {r.get(keys.SEQ_LEN)}")
DDP = Pairing("ddp", lambda r: (r.get(keys.WORLD_SIZE), str(r.get(keys.SIZE)),
                                r.get("batch_per_rank"), r.get(keys.SEQ_LEN),
                                str(r.get(keys.BACKEND))), ddp_name,
              lambda r: (f"DDP {r.get(keys.SIZE)}, {r.get(keys.WORLD_SIZE)} ranks "
                         f"({r.get(keys.BACKEND)}), batch {r.get('batch_per_rank')}/rank, ctx "
                         f"{r.get(keys.SEQ_LEN)}"),
              (lambda r: (r.get(keys.STEP_S) * 1e3, keys.RANK_EVENT_TIME),))


def _paired(results: Sequence[Result], how: Pairing, ours: Sequence[str],
            rivals: Sequence[str]) -> list[Claim]:
    """Ours / each rival per workload, of the newest run that timed both, as each of
    `how.times` times the sides."""
    groups: dict[tuple, dict[str, Result]] = {}
    for r in results:
        if r.kind == how.kind:
            groups.setdefault((*r.measured_in, *how.workload(r)), {})[how.name(r)] = r
    latest: dict[tuple, tuple[Result, Result]] = {}
    for (group, found), our, rival in itertools.product(groups.items(), ours, rivals):
        key = (group[2:], our, rival)
        if {our, rival} <= found.keys() and our != rival and (
                key not in latest or _when(found[our]) > _when(latest[key][0])):
            latest[key] = found[our], found[rival]
    return [Claim(*(Timed(how.label(our), how.name(r), time_kind, (ms,))
                    for r, (ms, time_kind) in zip((our, rival), timed, strict=True)),
                  *our.measured_in, our.datetime)
            for (our, rival), time in itertools.product(latest.values(), how.times)
            if None not in (timed := [time(r) for r in (our, rival)])]


def in_turn_claims(results: Sequence[Result]) -> list[Claim]:
    """Of each case's newest run that took device-time rounds in turn: ours / each rival."""
    claims = []
    for r in newest((r for r in results if r.kind == "attention" and case_timings(r, "in_turn")),
                    lambda r: (r.name, r.get(keys.BATCH_HEADS), r.get(keys.SEQ_LEN),
                               r.get(keys.HEAD_DIM))).values():
        # The rounds as timings reads them: the case's own implementation is "ours".
        sides = {t.who: replace(t, workload=_attention_label(r), what=keys.IN_TURN_TIME)
                 for t in case_timings(r, "in_turn")}
        claims += [Claim(replace(sides["ours"], who=str(r.get(keys.IMPLEMENTATION))),
                         sides[rival], *r.measured_in, r.datetime)
                   for rival in RIVAL_ATTENTION if rival in sides]
    return claims


def all_claims(results: Sequence[Result],
               ddp_rivals: Iterable[tuple[str, str]] = RIVAL_DDP.items()) -> list[Claim]:
    """Every claim over `results` (all runs of one GPU: each pair from its newest run); a
    data-parallel variant's against each of its `ddp_rivals`, by slowest-rank median step."""
    steps = [r for r in results if isinstance(r.get(keys.STEP_S), int | float)]
    return [*_paired(results, ATTENTION, OUR_ATTENTION, RIVAL_ATTENTION), *in_turn_claims(results),
            *_paired(results, RECIPE, [OUR_RECIPE], [RIVAL_RECIPE]),
            *(c for variant, rival in ddp_rivals for c in _paired(steps, DDP, sorted(
                {ddp_name(r) for r in steps if r.get(keys.VARIANT) == variant}), [rival]))]


def topic(claim: Claim) -> str:
    """What a claim compares, without its workload: attention, train step or DDP."""
    return {"attention": "attention", "train": "train step", "DDP": "data parallel"}.get(
        claim.ours.workload.split()[0], claim.ours.workload)


def ratio_text(claims: Sequence[Claim]) -> str:
    """The claims' median ratio (lowest–highest), or the one ratio."""
    ratios = sorted(c.ratio for c in claims)
    return (f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f})"
            if len(ratios) > 1 else f"{ratios[0]:.2f}")


def summary_table(claims: Sequence[Claim]) -> str:
    """One row per topic, ours, rival and kind of time: where ours wins, and the ratios."""
    groups: dict[tuple[str, str, str, str], list[Claim]] = {}
    for c in claims:
        kinds = (c.ours.what if c.ours.what == c.rival.what
                 else f"ours: {c.ours.what}; rival: {c.rival.what}")
        groups.setdefault((topic(c), c.ours.who, c.rival.who, kinds), []).append(c)
    rows = [[*key, members[0].ours.workload if len(members) == 1 else f"{len(members)} workloads",
             sum(c.ratio < 1 for c in members), ratio_text(members),
             max(members, key=lambda c: (c.recorded, c.file)).file]
            for key, members in sorted(groups.items())]
    return markdown_table(["comparison", "ours", "rival", "time", "measured at",
                           "ours takes less time at", "ours / rival: median (lowest–highest)",
                           "newest history file"], rows)


def headline(repo: Path, history_name: str, ours: str, *rivals: str) -> str:
    """The `headline` block: ours / each rival in one history, under the commonest kind of
    time they share; a data-parallel rival is set against the variant `ours` starts with."""
    if not (repo / history_name).is_file():
        raise ValueError(f"{history_name}: no such history file")
    run = load_run(repo / history_name, (repo / history_name).parent)
    claims = all_claims(run.results, [*RIVAL_DDP.items(),
                                      *((ours.split()[0], rival) for rival in rivals)])
    by_rival = {rival: {(c.ours.workload, c.ours.what): c for c in claims
                        if (c.ours.who, c.rival.who) == (ours, rival)} for rival in rivals}
    if missing := [rival for rival, found in by_rival.items() if not found]:
        raise ValueError(f"{history_name}: no claim of {ours} against {', '.join(missing)}")
    kinds = Counter(what for found in by_rival.values() for _, what in found)
    kind = next((k for k, _ in kinds.most_common()
                 if all(any(what == k for _, what in found) for found in by_rival.values())), None)
    if kind is None:
        raise ValueError(f"{history_name}: no kind of time common to {ours}'s rivals")
    chosen = {rival: [c for (_, what), c in found.items() if what == kind]
              for rival, found in by_rival.items()}
    first, workloads = next(iter(chosen.values()))[0], max(map(len, chosen.values()))
    parts = ", / ".join(f"{RIVAL_LABELS.get(rival, rival)} {ratio_text(found)}"
                        for rival, found in chosen.items())
    return (f"- **{topic(first).capitalize()}** on {run.device}, {kind}: ours ({ours}) / "
            f"{parts} ({first.ours.workload if workloads == 1 else f'{workloads} workloads'}; "
            f"below 1 ours takes less time; `{history_name}`, {run.datetime[:10]}).\n")

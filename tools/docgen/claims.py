"""Claims "ours vs a rival": same-run ratios of medians, generated, never typed by hand.

A ratio is only formed between two results measured in one run of one history file (these
machines move 5-10% between runs), and only between times of the same kind (eager
end-to-end vs device time); each claim names both. Where ours took device-time rounds in
turn with its rivals (`keys.INTERLEAVED_DEVICE_MS`), the claim's ratio is the median of the
rounds' own ratios, each of two times taken moments apart.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from systems.common.formatting import markdown_table
from systems.runs import keys
from systems.runs.history import Result

# Attention: our kernel against PyTorch's best (SDPA backends, compiled flex_attention).
OUR_ATTENTION = ("triton", "triton_compiled")
RIVAL_ATTENTION = ("sdpa_flash", "sdpa_cudnn", "flex_compiled", "fa4")
# Training recipes: ours against the strongest PyTorch-only step.
OUR_RECIPE, RIVAL_RECIPE = "optimized", "pytorch_baseline"
# Data-parallel variants against PyTorch's own at the same world size and workload.
RIVAL_DDP = {"naive": "torch_ddp", "flat": "torch_ddp", "individual": "torch_ddp",
             "bucketed": "torch_ddp", "fsdp": "torch_fsdp2"}


def rounds_in_turn(r: Result) -> dict[str, list[float]] | None:
    """{implementation: ms per round} of a case that took device-time rounds in turn with
    its own implementation among them (`keys.INTERLEAVED_DEVICE_MS`); None otherwise."""
    rounds = r.get(keys.INTERLEAVED_DEVICE_MS)
    if not isinstance(rounds, dict) or str(r.get(keys.IMPLEMENTATION)) not in rounds:
        return None
    return {str(name): [float(ms) for ms in per_round] for name, per_round in rounds.items()}


def round_ratios(rounds: dict[str, list[float]], ours: str, rival: str) -> list[float]:
    """Ours / rival in each round taken in turn."""
    return [o / t for o, t in zip(rounds[ours], rounds[rival], strict=True)]


@dataclass(frozen=True)
class Side:
    """One side of a claim: a name, its median in seconds and what that time measures."""

    name: str
    seconds: float
    time_kind: str


@dataclass(frozen=True)
class Claim:
    group: str
    ours: Side
    rival: Side
    file: str
    run: str
    # Where the two were timed in rounds taken in turn: the median of the rounds' ratios.
    paired_ratio: float | None = None
    recorded: str = ""  # when the run was recorded (ISO date and time)

    @property
    def ratio(self) -> float:
        if self.paired_ratio is not None:
            return self.paired_ratio
        return self.ours.seconds / self.rival.seconds


def _pairs(results: Sequence[Result], kind: str, workload: Callable[[Result], tuple],
           name: Callable[[Result], str], ours: Sequence[str],
           rivals: Sequence[str]) -> list[tuple[tuple, Result, Result]]:
    """(file, run, *workload), ours, rival: for each workload and pair of names, from the
    newest run that measured both."""
    groups: dict[tuple, dict[str, Result]] = {}
    for r in results:
        if r.kind == kind:
            groups.setdefault((*r.measured_in, *workload(r)), {})[name(r)] = r
    newest: dict[tuple, tuple[tuple, Result, Result]] = {}
    for group, by_name in groups.items():
        for our_name in ours:
            for rival_name in rivals:
                if our_name in by_name and rival_name in by_name and our_name != rival_name:
                    pair = (group, by_name[our_name], by_name[rival_name])
                    key = (group[2:], our_name, rival_name)
                    if key not in newest or _when(pair) > _when(newest[key]):
                        newest[key] = pair
    return list(newest.values())


def _when(pair: tuple[tuple, Result, Result]) -> tuple[str, str]:
    return pair[1].datetime, pair[1].file


def _round_claim(label: str, group: tuple, ours: Result, rival: Result, our_name: str,
                 rival_name: str) -> Claim:
    """A claim from the pytest-benchmark rounds' medians."""
    return Claim(label, Side(our_name, ours.median, ours.time_kind),
                 Side(rival_name, rival.median, rival.time_kind), group[0], group[1],
                 recorded=ours.datetime)


def attention_claims(results: Sequence[Result]) -> list[Claim]:
    """Per shape, dtype, masking and pass: ours / each rival; where both recorded
    do_bench's median too (the leaderboard case), that device-time ratio as well."""
    def workload(r: Result) -> tuple:
        # (batch, heads, seq, d) and (batch x heads, seq, d) are the same problem.
        return (r.name.split("[")[0], str(r.get(keys.PASS)), str(r.get(keys.DTYPE)),
                bool(r.get(keys.CAUSAL)), r.get(keys.BATCH_HEADS), r.get(keys.SEQ_LEN),
                r.get(keys.HEAD_DIM))

    claims = []
    for group, ours, rival in _pairs(results, "attention", workload,
                                     lambda r: str(r.get(keys.IMPLEMENTATION)),
                                     OUR_ATTENTION, RIVAL_ATTENTION):
        label = _attention_label(ours)
        our_name, rival_name = (str(r.get(keys.IMPLEMENTATION)) for r in (ours, rival))
        claims.append(_round_claim(label, group, ours, rival, our_name, rival_name))
        device = [r.get(keys.DO_BENCH_MEDIAN_MS) for r in (ours, rival)]
        if all(isinstance(ms, int | float) for ms in device):
            claims.append(Claim(label, Side(our_name, device[0] / 1e3, keys.DO_BENCH_TIME),
                                Side(rival_name, device[1] / 1e3, keys.DO_BENCH_TIME),
                                *group[:2], recorded=ours.datetime))
    return claims


def _attention_label(r: Result) -> str:
    return (f"attention {r.get(keys.BATCH_HEADS)}x{r.get(keys.SEQ_LEN)}x{r.get(keys.HEAD_DIM)}"
            f" {r.get(keys.DTYPE)}{' causal' if r.get(keys.CAUSAL) else ''}, {r.get(keys.PASS)}")


def in_turn_claims(results: Sequence[Result]) -> list[Claim]:
    """Per case of ours that took device-time rounds in turn (any of our implementations),
    from its newest run: ours / each rival timed in those rounds."""
    newest: dict[tuple, Result] = {}
    for r in results:
        if r.kind != "attention" or rounds_in_turn(r) is None:
            continue
        key = (r.name, r.get(keys.BATCH_HEADS), r.get(keys.SEQ_LEN), r.get(keys.HEAD_DIM))
        if key not in newest or (r.datetime, r.file) > (newest[key].datetime,
                                                         newest[key].file):
            newest[key] = r
    claims = []
    for r in newest.values():
        impl, rounds = str(r.get(keys.IMPLEMENTATION)), rounds_in_turn(r)
        for rival in RIVAL_ATTENTION:
            if rival not in rounds:
                continue
            per_round = round_ratios(rounds, impl, rival)
            claims.append(Claim(
                _attention_label(r),
                Side(impl, statistics.median(rounds[impl]) / 1e3, keys.IN_TURN_TIME),
                Side(rival, statistics.median(rounds[rival]) / 1e3, keys.IN_TURN_TIME),
                *r.measured_in, paired_ratio=statistics.median(per_round),
                recorded=r.datetime))
    return claims


def recipe_claims(results: Sequence[Result]) -> list[Claim]:
    """Per model size and context: our recipe / the PyTorch-only baseline's train step."""
    def workload(r: Result) -> tuple:
        return str(r.get(keys.SIZE)), r.get(keys.SEQ_LEN), str(r.get(keys.MODE))

    return [_round_claim(f"train step {g[2]}, ctx {g[3]}", g, ours, rival, OUR_RECIPE,
                         RIVAL_RECIPE)
            for g, ours, rival in _pairs(results, "recipe", workload,
                                         lambda r: str(r.get(keys.RECIPE)),
                                         [OUR_RECIPE], [RIVAL_RECIPE])]


def _ddp_name(r: Result) -> str:
    name = str(r.get(keys.VARIANT))
    if r.get(keys.BUCKET_SIZE_MB) is not None:
        name += f" {r.get(keys.BUCKET_SIZE_MB)} MB"
    if r.get(keys.OPTIMIZER) not in (None, "adamw"):
        name += f", {r.get(keys.OPTIMIZER)}"
    return name


def ddp_claims(results: Sequence[Result],
               rivals: Mapping[str, str] = RIVAL_DDP) -> list[Claim]:
    """Per world size and workload: each of our variants' step / its rival's (by default
    PyTorch's DDP, or FSDP2 for our FSDP), from the slowest rank's median step (CUDA
    events)."""
    def workload(r: Result) -> tuple:
        return (r.get(keys.WORLD_SIZE), str(r.get(keys.SIZE)), r.get("batch_per_rank"),
                r.get(keys.SEQ_LEN), str(r.get(keys.BACKEND)))

    claims = []
    with_steps = [r for r in results if isinstance(r.get(keys.STEP_S), int | float)]
    for variant, rival_name in rivals.items():
        ours = sorted({_ddp_name(r) for r in with_steps if r.get(keys.VARIANT) == variant})
        for group, our, rival in _pairs(with_steps, "ddp", workload, _ddp_name, ours,
                                        [rival_name]):
            world, model, batch, context, backend = group[2:]
            label = f"DDP {model}, {world} ranks ({backend}), batch {batch}/rank, ctx {context}"
            claims.append(Claim(label, Side(_ddp_name(our), our.get(keys.STEP_S),
                                            keys.RANK_EVENT_TIME),
                                Side(rival_name, rival.get(keys.STEP_S), keys.RANK_EVENT_TIME),
                                *group[:2], recorded=our.datetime))
    return claims


def topic(claim: Claim) -> str:
    """What a claim compares, without its workload: attention, train step or DDP."""
    return {"attention": "attention", "train": "train step", "DDP": "data parallel"}.get(
        claim.group.split()[0], claim.group)


def summary_table(claims: Sequence[Claim]) -> str:
    """One row per comparison (topic, ours, rival, kind of time): how many workloads it
    was measured at, at how many ours took less time, the median of the claims' ratios
    with the lowest and highest, and the newest history file among them. A single claim
    shows its workload instead of a count."""
    groups: dict[tuple[str, str, str, str], list[Claim]] = {}
    for c in claims:
        kinds = (c.ours.time_kind if c.ours.time_kind == c.rival.time_kind
                 else f"ours: {c.ours.time_kind}; rival: {c.rival.time_kind}")
        groups.setdefault((topic(c), c.ours.name, c.rival.name, kinds), []).append(c)
    rows = []
    for (subject, ours, rival, kinds), members in sorted(groups.items()):
        ratios = sorted(c.ratio for c in members)
        spread = (f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f})"
                  if len(ratios) > 1 else f"{ratios[0]:.2f}")
        newest = max(members, key=lambda c: (c.recorded, c.file))
        where = members[0].group if len(members) == 1 else f"{len(members)} workloads"
        rows.append([subject, ours, rival, kinds, where,
                     sum(r < 1 for r in ratios), spread, newest.file])
    return markdown_table(["comparison", "ours", "rival", "time", "measured at",
                           "ours takes less time at", "ours / rival: median (lowest–highest)",
                           "newest history file"], rows)


def all_claims(results: Sequence[Result]) -> list[Claim]:
    """Every claim over `results` (all runs of one GPU: each pair from its newest run)."""
    return [*attention_claims(results), *in_turn_claims(results), *recipe_claims(results),
            *ddp_claims(results)]

"""Claims "ours vs a rival": ratios formed only within one run (these machines move 5-10%
between runs) and naming each side's kind of time; of rounds taken in turn, their median."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from systems.common.formatting import markdown_table
from systems.runs import keys
from systems.runs.history import Result, load_run

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


def _when(r: Result) -> tuple[str, str]:
    return r.datetime, r.file


def newest(results: Iterable[Result], key: Callable[[Result], tuple]) -> dict[tuple, Result]:
    """The newest result per key (a run may repeat a case: its last)."""
    return {key(r): r for r in sorted(results, key=_when)}


def _pairs(results: Sequence[Result], kind: str, workload: Callable[[Result], tuple],
           name: Callable[[Result], str], ours: Sequence[str],
           rivals: Sequence[str]) -> list[tuple[tuple, Result, Result]]:
    """(file, run, *workload), ours, rival: per workload and pair, of the newest run of both."""
    groups: dict[tuple, dict[str, Result]] = {}
    for r in results:
        if r.kind == kind:
            groups.setdefault((*r.measured_in, *workload(r)), {})[name(r)] = r
    newest: dict[tuple, tuple[tuple, Result, Result]] = {}
    for (group, found), (our, rival) in itertools.product(groups.items(),
                                                          itertools.product(ours, rivals)):
        key = (group[2:], our, rival)
        if our in found and rival in found and our != rival and (
                key not in newest or _when(found[our]) > _when(newest[key][1])):
            newest[key] = (group, found[our], found[rival])
    return list(newest.values())


def _claim(label: str, where: tuple, ours: Result, names: tuple[str, str],
           seconds: tuple[float, float], kinds: tuple[str, str],
           paired: float | None = None) -> Claim:
    return Claim(label, Side(names[0], seconds[0], kinds[0]),
                 Side(names[1], seconds[1], kinds[1]), where[0], where[1], paired, ours.datetime)


def _impl(r: Result) -> str:
    return str(r.get(keys.IMPLEMENTATION))


def _attention_label(r: Result) -> str:
    return (f"attention {r.get(keys.BATCH_HEADS)}x{r.get(keys.SEQ_LEN)}x{r.get(keys.HEAD_DIM)}"
            f" {r.get(keys.DTYPE)}{' causal' if r.get(keys.CAUSAL) else ''}, {r.get(keys.PASS)}")


def attention_claims(results: Sequence[Result]) -> list[Claim]:
    """Ours / each rival per workload, and of do_bench's medians where both recorded them."""
    def workload(r: Result) -> tuple:
        # (batch, heads, seq, d) and (batch x heads, seq, d) are the same problem.
        return (r.name.split("[")[0], str(r.get(keys.PASS)), str(r.get(keys.DTYPE)),
                bool(r.get(keys.CAUSAL)), r.get(keys.BATCH_HEADS), r.get(keys.SEQ_LEN),
                r.get(keys.HEAD_DIM))

    claims = []
    for group, ours, rival in _pairs(results, "attention", workload, _impl,
                                     OUR_ATTENTION, RIVAL_ATTENTION):
        label, names = _attention_label(ours), (_impl(ours), _impl(rival))
        claims.append(_claim(label, group, ours, names, (ours.median, rival.median),
                             (ours.time_kind, rival.time_kind)))
        device = [r.get(keys.DO_BENCH_MEDIAN_MS) for r in (ours, rival)]
        if all(isinstance(ms, int | float) for ms in device):
            claims.append(_claim(label, group, ours, names, (device[0] / 1e3, device[1] / 1e3),
                                 (keys.DO_BENCH_TIME,) * 2))
    return claims


def in_turn_claims(results: Sequence[Result]) -> list[Claim]:
    """Of each case's newest run that took device-time rounds in turn: ours / each rival."""
    def took_turns(r: Result) -> bool:
        rounds = r.get(keys.INTERLEAVED_DEVICE_MS)
        return r.kind == "attention" and isinstance(rounds, dict) and _impl(r) in rounds

    claims = []
    for r in newest(filter(took_turns, results), lambda r: (
            r.name, r.get(keys.BATCH_HEADS), r.get(keys.SEQ_LEN), r.get(keys.HEAD_DIM))).values():
        rounds = {str(name): [float(ms) for ms in per_round]
                  for name, per_round in r.get(keys.INTERLEAVED_DEVICE_MS).items()}
        ours = rounds[_impl(r)]
        for rival in (rival for rival in RIVAL_ATTENTION if rival in rounds):
            per_round = [o / t for o, t in zip(ours, rounds[rival], strict=True)]
            claims.append(_claim(
                _attention_label(r), r.measured_in, r, (_impl(r), rival),
                (statistics.median(ours) / 1e3, statistics.median(rounds[rival]) / 1e3),
                (keys.IN_TURN_TIME,) * 2, statistics.median(per_round)))
    return claims


def recipe_claims(results: Sequence[Result]) -> list[Claim]:
    """Per model size and context: our recipe / the PyTorch-only baseline's train step."""
    return [_claim(f"train step {g[2]}, ctx {g[3]}", g, ours, (OUR_RECIPE, RIVAL_RECIPE),
                   (ours.median, rival.median), (ours.time_kind, rival.time_kind))
            for g, ours, rival in _pairs(
                results, "recipe", lambda r: (str(r.get(keys.SIZE)), r.get(keys.SEQ_LEN),
                                              str(r.get(keys.MODE))),
                lambda r: str(r.get(keys.RECIPE)), [OUR_RECIPE], [RIVAL_RECIPE])]


def ddp_name(r: Result, ranks: bool = False) -> str:
    """A DDP case's variant, with its world size (`ranks`), bucket and optimizer if set."""
    name = f"{r.get(keys.VARIANT)}{f', {r.get(keys.WORLD_SIZE)} ranks' if ranks else ''}"
    if r.get(keys.BUCKET_SIZE_MB) is not None:
        name += f"{',' if ranks else ''} {r.get(keys.BUCKET_SIZE_MB)} MB"
    if r.get(keys.OPTIMIZER) not in (None, "adamw"):
        name += f", {r.get(keys.OPTIMIZER)}"
    return name


def ddp_claims(results: Sequence[Result],
               rivals: Mapping[str, str] = RIVAL_DDP) -> list[Claim]:
    """Each of our variants' slowest-rank median step / its rival's, per world size and workload."""
    claims = []
    with_steps = [r for r in results if isinstance(r.get(keys.STEP_S), int | float)]
    for variant, rival_name in rivals.items():
        ours = sorted({ddp_name(r) for r in with_steps if r.get(keys.VARIANT) == variant})
        for group, our, rival in _pairs(with_steps, "ddp", lambda r: (
                r.get(keys.WORLD_SIZE), str(r.get(keys.SIZE)), r.get("batch_per_rank"),
                r.get(keys.SEQ_LEN), str(r.get(keys.BACKEND))), ddp_name, ours, [rival_name]):
            world, model, batch, context, backend = group[2:]
            claims.append(_claim(
                f"DDP {model}, {world} ranks ({backend}), batch {batch}/rank, ctx {context}",
                group, our, (ddp_name(our), rival_name),
                (our.get(keys.STEP_S), rival.get(keys.STEP_S)), (keys.RANK_EVENT_TIME,) * 2))
    return claims


def all_claims(results: Sequence[Result]) -> list[Claim]:
    """Every claim over `results` (all runs of one GPU: each pair from its newest run)."""
    return [*attention_claims(results), *in_turn_claims(results), *recipe_claims(results),
            *ddp_claims(results)]


def topic(claim: Claim) -> str:
    """What a claim compares, without its workload: attention, train step or DDP."""
    return {"attention": "attention", "train": "train step", "DDP": "data parallel"}.get(
        claim.group.split()[0], claim.group)


def ratio_text(claims: Sequence[Claim]) -> str:
    """The claims' median ratio (lowest–highest), or the one ratio."""
    ratios = sorted(c.ratio for c in claims)
    return (f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f})"
            if len(ratios) > 1 else f"{ratios[0]:.2f}")


def summary_table(claims: Sequence[Claim]) -> str:
    """One row per topic, ours, rival and kind of time: where ours wins, and the ratios."""
    groups: dict[tuple[str, str, str, str], list[Claim]] = {}
    for c in claims:
        kinds = (c.ours.time_kind if c.ours.time_kind == c.rival.time_kind
                 else f"ours: {c.ours.time_kind}; rival: {c.rival.time_kind}")
        groups.setdefault((topic(c), c.ours.name, c.rival.name, kinds), []).append(c)
    rows = [[*key, members[0].group if len(members) == 1 else f"{len(members)} workloads",
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
    claims = [*all_claims(run.results),
              *(c for rival in rivals for c in ddp_claims(run.results, {ours.split()[0]: rival}))]
    by_rival = {rival: list({(c.group, c.ours.time_kind): c for c in claims
                             if c.ours.name == ours and c.rival.name == rival}.values())
                for rival in rivals}
    if missing := [rival for rival, found in by_rival.items() if not found]:
        raise ValueError(f"{history_name}: no claim of {ours} against {', '.join(missing)}")
    kinds = Counter(c.ours.time_kind for found in by_rival.values() for c in found)
    kind = next((k for k, _ in kinds.most_common() if all(
        any(c.ours.time_kind == k for c in found) for found in by_rival.values())), None)
    if kind is None:
        raise ValueError(f"{history_name}: no kind of time common to {ours}'s rivals")
    chosen = {rival: [c for c in found if c.ours.time_kind == kind]
              for rival, found in by_rival.items()}
    first, workloads = next(iter(chosen.values()))[0], max(map(len, chosen.values()))
    parts = ", / ".join(f"{RIVAL_LABELS.get(rival, rival)} {ratio_text(found)}"
                        for rival, found in chosen.items())
    return (f"- **{topic(first).capitalize()}** on {run.device}, {kind}: ours ({ours}) / "
            f"{parts} ({first.group if workloads == 1 else f'{workloads} workloads'}; below 1 "
            f"ours takes less time; `{history_name}`, {run.datetime[:10]}).\n")

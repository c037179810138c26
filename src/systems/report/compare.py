"""Compare two saved runs benchmark by benchmark, judged as the regression gate judges them
(`systems.runs.gate`: medians, a threshold from each case's own noise), so one pair of runs
gets one verdict whether it is read here or at the end of a gated perf session."""

from __future__ import annotations

from systems.common.formatting import markdown_table
from systems.runs import keys
from systems.runs.gate import CaseResult, Timing, Verdict, compare, describe
from systems.runs.history import Result, Run

# Verdicts a reader must not miss, in bold.
_HIGHLIGHTED = {Verdict.SLOWER: "**slower**", Verdict.FASTER: "**faster**"}


def _round_time(result: Result) -> str:
    """What a pytest-benchmark round of this benchmark measured (distributed cases: the
    parent's round, messaging to the ranks included, not the ranks' CUDA-event steps)."""
    if result.time_kind == keys.RANK_EVENT_TIME:
        return "eager end-to-end, with messaging to the ranks"
    return result.time_kind


def _timings(run: Run) -> dict[str, Timing]:
    return {r.fullname: Timing.from_saved(r.stats, r.info) for r in run.results}


def _ms(timing: Timing) -> str:
    return f"{timing.median * 1e3:.3f}"


def _row(case: CaseResult, result: Result) -> list[str]:
    assert case.baseline is not None and case.current is not None
    threshold = "-" if case.threshold is None else f"{case.threshold:.1%}"
    return [result.name, _ms(case.baseline), _ms(case.current), f"{case.change:+.1%}",
            threshold, _HIGHLIGHTED.get(case.verdict, describe(case)), _round_time(result)]


def compare_runs(old: Run, new: Run) -> str:
    """Markdown: one row per benchmark in both runs, then those found in only one.
    ValueError for runs of two GPU models or with no benchmark in common: such a compare
    says nothing."""
    if old.device != new.device:
        raise ValueError(f"{old.path} ran on {old.device}, {new.path} on {new.device}: runs "
                         "of different GPU models are never compared")
    after = {r.fullname: r for r in new.results}
    if not {r.fullname for r in old.results} & after.keys():
        raise ValueError(f"{old.path} and {new.path} have no benchmark in common "
                         "(a run with an injected slowdown has none): nothing to compare")
    cases = compare(_timings(old), _timings(new))
    rows = [_row(c, after[c.name]) for c in sorted(cases, key=lambda c: c.name)
            if c.baseline is not None and c.current is not None]
    lines = [f"# {old.path.name} -> {new.path.name}\n",
             f"Device: {new.device}. Judged as the perf gate judges: the "
             "change of the median against a threshold from the case's own noise (the spread "
             "of its rounds, its drift between pooled runs, a floor); host-bound and too "
             "noisy cases are not judged. The time column says what a round measured.\n"]
    lines.append(markdown_table(["benchmark", "old median ms", "new median ms", "change",
                                 "threshold", "verdict", "time"], rows))
    for title, verdict in (("Only in the old run", Verdict.NOT_RUN),
                           ("Only in the new run", Verdict.NEW)):
        names = sorted(c.name for c in cases if c.verdict is verdict)
        if names:
            lines += [f"\n{title}:\n", *(f"- {n}" for n in names)]
    return "\n".join(lines) + "\n"

"""Compare two saved runs benchmark by benchmark, highlighting changes beyond the noise."""

from __future__ import annotations

from systems.common.formatting import markdown_table
from systems.report.tables import mean_std_ms
from systems.runs import keys
from systems.runs.history import Result, Run

# A change counts when it exceeds both this fraction and the two runs' combined std.
MIN_RELATIVE_CHANGE = 0.05


def change_label(old_mean: float, old_std: float, new_mean: float, new_std: float) -> str:
    """'**slower**', '**faster**' or 'same' (within noise)."""
    delta = new_mean - old_mean
    if abs(delta) <= max(MIN_RELATIVE_CHANGE * old_mean, old_std + new_std):
        return "same"
    return "**slower**" if delta > 0 else "**faster**"


def _round_time(result: Result) -> str:
    """What a pytest-benchmark round of this benchmark measured (distributed cases: the
    parent's round, messaging to the ranks included, not the ranks' CUDA-event steps)."""
    if result.time_kind == keys.RANK_EVENT_TIME:
        return "eager end-to-end, with messaging to the ranks"
    return result.time_kind


def compare_runs(old: Run, new: Run) -> str:
    """Markdown: one row per benchmark in both runs, then those found in only one.
    ValueError for runs of two GPU models or with no benchmark in common: such a compare
    says nothing."""
    if old.device != new.device:
        raise ValueError(f"{old.path} ran on {old.device}, {new.path} on {new.device}: runs "
                         "of different GPU models are never compared")
    before = {r.fullname: r for r in old.results}
    after = {r.fullname: r for r in new.results}
    if not before.keys() & after.keys():
        raise ValueError(f"{old.path} and {new.path} have no benchmark in common "
                         "(a run with an injected slowdown has none): nothing to compare")
    rows = []
    for name in sorted(before.keys() & after.keys()):
        a, b = before[name], after[name]
        rows.append([b.name, mean_std_ms(a), mean_std_ms(b), f"{b.mean / a.mean - 1:+.1%}",
                     change_label(a.mean, a.stddev, b.mean, b.stddev), _round_time(b)])
    lines = [f"# {old.path.name} -> {new.path.name}\n",
             f"Device: {new.device}. A change is highlighted when it exceeds "
             f"{MIN_RELATIVE_CHANGE:.0%} and the sum of the two standard deviations. Times are "
             "pytest-benchmark round means; the time column says what a round measured.\n"]
    lines.append(markdown_table(["benchmark", "old ms", "new ms", "change", "verdict", "time"],
                                rows))
    for title, names in (("Only in the old run", before.keys() - after.keys()),
                         ("Only in the new run", after.keys() - before.keys())):
        if names:
            lines += [f"\n{title}:\n", *(f"- {n}" for n in sorted(names))]
    return "\n".join(lines) + "\n"

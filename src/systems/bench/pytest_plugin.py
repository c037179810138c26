"""Shared pytest fixtures and options: device choice, perf profiles, a synchronised benchmark,
where perf runs are saved and what they are compared with.

Perf profiles (`--perf-profile`): `smoke` runs tiny CPU-sized cases (the default without a
GPU), `quick` a few minutes of representative GPU cases (the default with one), `full` the
whole matrix. A perf test module opts in by taking a `perf_case` argument and defining
`perf_cases(profile) -> list` of dataclass cases with an `id` attribute; their fields are
saved as the benchmark's plain `params`.

Saving and comparing (docs/benchmarking.md): `--perf-baseline` records the quick profile as
this GPU's baseline, `--perf-study=NAME` saves a study beside it, `--benchmark-compare` with
no argument compares with the baseline, and `--perf-gate` fails the session when a case got
slower by more than its own noise allows.
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from systems.bench.metrics import (
    BenchmarkResult,
    allocated_memory_bytes,
    is_out_of_memory,
    out_of_memory_reason,
    peak_memory_bytes,
    reset_peak_memory,
    throughput_metrics,
    throughput_table,
)
from systems.bench.params import flatten_case
from systems.bench.timing import (
    DEVICE_CLOCK_ROUNDS,
    DEVICE_WORK_ENV,
    SLOWDOWN_ENV,
    RoundTimer,
    device_spin,
    device_time,
    injected_slowdowns,
)
from systems.common.hardware import device_name, device_slug, gpu_count, machine_description
from systems.common.host_speed import python_loop_ms
from systems.kernel_runtime import interpreter
from systems.runs import keys
from systems.runs.baseline import (
    RECORD_COMMAND,
    GateSource,
    JsonDestination,
    add_repeat,
    baseline_path,
    baseline_suite,
    describe_sources,
    gate_baseline,
    gating_baselines,
    host_speed_lines,
    json_destination_path,
    study_path,
)
from systems.runs.gate import (
    CaseResult,
    Timing,
    compare,
    gate_table,
    regressions,
)
from systems.runs.history import read_run
from systems.runs.validate import check_same_gpu, check_writable_folder

PERF_PROFILES = ("smoke", "quick", "full")
_DEFAULT_STORAGE = "file://./.benchmarks"


@dataclass
class PerfRun:
    """What this session saves and compares (decided at configure time) and what it saw."""

    storage: Path | None = None  # .benchmarks/<GPU>; None when not a folder storage
    baseline: Path | None = None  # this GPU's baseline, whether or not it exists yet
    baseline_draft: Path | None = None  # --perf-baseline writes here; moved once all passed
    # What --perf-gate compares with, read once, up front: each case's timings, and the
    # saved runs they come from (none: no gate).
    gate_baseline: dict[str, Timing] = field(default_factory=dict)
    gate_sources: list[GateSource] = field(default_factory=list)
    study: Path | None = None  # reserved (created empty) at configure time
    host_loop_ms: float | None = None  # systems.common.host_speed, when this run is kept
    slowdowns: dict[str, float] = field(default_factory=dict)  # host time (SLOWDOWN_ENV)
    device_work: dict[str, float] = field(default_factory=dict)  # added GPU work
    results: list[BenchmarkResult] = field(default_factory=list)
    gate: list[CaseResult] | None = None
    notes: list[str] = field(default_factory=list)  # printed at the end, whatever happens


_PERF_RUN = pytest.StashKey[PerfRun]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("systems")
    group.addoption("--perf-profile", choices=PERF_PROFILES, default=None,
                    help="perf case set: smoke (CPU-sized), quick, full "
                         "(default: quick with a GPU, smoke without)")
    group.addoption("--device", default=None,
                    help="torch device for tests (default: cuda if available, else cpu)")
    group.addoption("--perf-baseline", action="store_true",
                    help="record this run as this GPU's baseline "
                         "(.benchmarks/<GPU>/baseline_<N>gpu.json): the whole quick profile "
                         "of tests/perf, kept only if every test passes")
    group.addoption("--perf-baseline-repeat", action="store_true",
                    help="with --perf-baseline: pool this run into the existing baseline of "
                         "the same commit instead of replacing it (the gate reads each case's "
                         "drift between the runs)")
    group.addoption("--perf-study", metavar="NAME", default=None,
                    help="save this run as .benchmarks/<GPU>/studies/NNNN_NAME.json "
                         "(any profile or subset; never a compare target)")
    group.addoption("--perf-gate", action="store_true",
                    help="at the end, compare each case's median with the baseline (or "
                         "--benchmark-compare=FILE) against a threshold from its own noise; "
                         "fail on a regression")


def pytest_configure(config: pytest.Config) -> None:
    # Histories are kept per GPU model, so an H100 run is never compared with an H200 run.
    if getattr(config.option, "benchmark_storage", None) == _DEFAULT_STORAGE:
        storage = config.rootpath / ".benchmarks" / device_slug()
        config.option.benchmark_storage = f"file://{storage}"
    run = config.stash[_PERF_RUN] = PerfRun()
    if not hasattr(config.option, "benchmark_storage"):  # pytest-benchmark is not loaded
        return
    try:
        run.slowdowns = injected_slowdowns(os.environ.get(SLOWDOWN_ENV))
        run.device_work = injected_slowdowns(os.environ.get(DEVICE_WORK_ENV), DEVICE_WORK_ENV)
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    storage = config.option.benchmark_storage
    if storage.startswith("file://"):
        run.storage = Path(storage[len("file://"):])
        run.baseline = baseline_path(run.storage, gpu_count())
    _resolve_compare_target(config, run)
    if config.getoption("perf_baseline_repeat") and not config.getoption("perf_baseline"):
        raise pytest.UsageError("--perf-baseline-repeat adds a run to the baseline: give it "
                                "with --perf-baseline")
    if config.getoption("perf_baseline"):
        _plan_baseline(config, run)
    if config.getoption("perf_study"):
        _plan_study(config, run)
    _check_storage_writable(config, run)
    option = config.option
    timed = not (option.benchmark_disable or option.benchmark_skip)
    if timed and (option.benchmark_json or option.benchmark_save or option.benchmark_autosave
                  or run.gate_sources):
        # Measured once, here, rather than when pytest-benchmark saves at the end: the gate
        # prints it even when nothing is saved, the saved file and the printed line hold
        # the same value, and nothing of the suite's own (compile workers, rank processes)
        # runs beside it yet.
        run.host_loop_ms = python_loop_ms()


def _resolve_compare_target(config: pytest.Config, run: PerfRun) -> None:
    """`--benchmark-compare` with no argument means this GPU's baseline, never the newest
    saved file (which may be a study or a partial run); the gate's default is every
    baseline that gates this GPU count (on several GPUs the one-GPU baseline too, for the
    single-GPU suites)."""
    candidates = gating_baselines(run.storage, gpu_count()) if run.storage else []
    baselines = [path for path in candidates if path.is_file()]
    gate = config.getoption("perf_gate")
    default_asked = config.option.benchmark_compare is True
    if default_asked:
        config.option.benchmark_compare = str(baselines[0]) if baselines else []
    compare = config.option.benchmark_compare
    named = isinstance(compare, str) and not default_asked
    if gate and named and not Path(compare).is_file():
        raise pytest.UsageError(f"--perf-gate compares with one saved run: "
                                f"--benchmark-compare={compare} is not a file")
    if not gate and isinstance(compare, str) and Path(compare).is_file():
        _read_compare_target(Path(compare), "--benchmark-compare")  # refused now, not later
    targets = ([Path(compare)] if named else baselines) if gate else []
    # A bad target fails now, not after the run.
    saved = [(target, _read_compare_target(target, "--perf-gate")) for target in targets]
    try:
        run.gate_baseline, run.gate_sources = gate_baseline(saved)
    except ValueError as error:
        raise pytest.UsageError(f"--perf-gate: {error}") from None
    if (default_asked or gate) and not targets and not baselines:
        run.notes.append(f"nothing compared: no baseline for {device_slug()} with "
                         f"{gpu_count()} GPU(s) ({', '.join(map(str, candidates))}); "
                         f"record one with `{RECORD_COMMAND}`")


def _read_compare_target(path: Path, option: str) -> dict:
    """A compare target that the validator of saved runs accepts and that was measured on
    this GPU model; a UsageError (before any case runs) otherwise."""
    try:
        saved = read_run(path)
        check_same_gpu(saved, device_name(), str(path))
    except ValueError as error:  # MalformedRunError is one
        raise pytest.UsageError(f"{option}: {error}") from None
    return saved


def _plan_baseline(config: pytest.Config, run: PerfRun) -> None:
    """A baseline is the whole quick profile of the suite its GPU count gates (tests/perf
    on one GPU, the distributed suite on several), really timed, as it stands."""
    option = config.option
    invoked_in = config.invocation_params.dir
    suite = baseline_suite(gpu_count())
    checks = [
        (perf_profile(config) != "quick", f"the profile is {perf_profile(config)!r}"),
        (bool(option.keyword or option.markexpr or option.deselect
              or getattr(option, "lf", False)), "tests are selected (-k, -m, --deselect, --lf)"),
        ([(invoked_in / a).resolve() for a in config.args] != [config.rootpath / suite],
         f"the run covers {config.args}, not {suite} (what a baseline covers with "
         f"{gpu_count()} GPU(s))"),
        (bool(option.benchmark_disable or option.benchmark_skip), "timing is off"),
        (bool(run.slowdowns or run.device_work), f"{SLOWDOWN_ENV} or {DEVICE_WORK_ENV} is set"),
        (bool(config.getoption("perf_study") or option.benchmark_json),
         "--perf-study or --benchmark-json is given too"),
        (run.baseline is None, "the storage is not a folder"),
        (config.getoption("perf_baseline_repeat")
         and not (run.baseline is not None and run.baseline.is_file()),
         f"--perf-baseline-repeat needs a baseline at {run.baseline} to add to"),
    ]
    problems = [reason for failed, reason in checks if failed]
    if problems:
        raise pytest.UsageError("--perf-baseline records the complete quick profile of "
                                f"tests/perf (`{RECORD_COMMAND}`): " + "; ".join(problems))
    assert run.baseline is not None
    run.baseline_draft = run.baseline.with_name(f".{run.baseline.stem}.draft.json")
    option.benchmark_json = JsonDestination(run.baseline_draft)


def _plan_study(config: pytest.Config, run: PerfRun) -> None:
    if run.storage is None or config.option.benchmark_json:
        raise pytest.UsageError("--perf-study saves into a folder storage, and not together "
                                "with --benchmark-json")
    try:
        run.study = study_path(run.storage, config.getoption("perf_study"))
    except ValueError as error:
        raise pytest.UsageError(str(error)) from None
    except OSError as error:
        raise pytest.UsageError(f"--perf-study: no study can be saved under {run.storage}: "
                                f"{error.strerror or error}") from None
    config.option.benchmark_json = JsonDestination(run.study)


def _check_storage_writable(config: pytest.Config, run: PerfRun) -> None:
    """Fail before any case runs if the results could not be saved at the end."""
    option = config.option
    destination = json_destination_path(option.benchmark_json) if option.benchmark_json else None
    folders = [destination.parent] if destination is not None else []
    if (option.benchmark_save or option.benchmark_autosave) and run.storage is not None:
        folders.append(run.storage)
    try:
        for folder in folders:
            check_writable_folder(folder)
        if destination is not None and destination.exists() and not os.access(destination,
                                                                                os.W_OK):
            raise OSError(f"{destination} is not writable")
    except OSError as error:
        raise pytest.UsageError(
            f"benchmark results could not be saved: {error.strerror or error}; choose a "
            "writable place (--benchmark-storage, --benchmark-json)") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    run = config.stash.get(_PERF_RUN, None)
    return [_slowdown_banner(run)] if run is not None and _injects(run) else []


def _injects(run: PerfRun) -> bool:
    return bool(run.slowdowns or run.device_work)


def _slowdown_banner(run: PerfRun) -> str:
    added = ", ".join([*(f"{name} +{f:.0%} host time" for name, f in run.slowdowns.items()),
                       *(f"{name} +{f:.0%} GPU work" for name, f in run.device_work.items())])
    return (f"!!! {SLOWDOWN_ENV} / {DEVICE_WORK_ENV} set: an artificial slowdown is added to "
            f"timed rounds ({added}); these numbers are NOT real measurements !!!")


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    machine_info.update(machine_description())
    run = config.stash.get(_PERF_RUN, None)
    if run is not None and run.host_loop_ms is not None:
        machine_info[keys.HOST_PYTHON_LOOP_MS] = run.host_loop_ms


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_compare_machine_info(machine_info: dict, compared_benchmark: dict):
    """pytest-benchmark warns when a compared run's machine_info differs from this one's.
    The host speed probe is a measurement that differs every run, not a different machine:
    it is left out of that comparison and put back afterwards."""
    infos = (machine_info, compared_benchmark["machine_info"])
    probes = (keys.HOST_PYTHON_LOOP_MS, keys.HOST_PYTHON_LOOP_MS_RUNS)
    held = [{key: info.pop(key) for key in probes if key in info} for info in infos]
    try:
        return (yield)
    finally:
        for info, kept in zip(infos, held, strict=True):
            info.update(kept)


def pytest_benchmark_update_commit_info(config: pytest.Config, commit_info: dict) -> None:
    # A checkout copied without its .git (e.g. to a GPU box) can still name its commit;
    # naming it says the copy is exactly that commit (copy a clean tree only). The times
    # git gave, if any, are of whatever commit the copy's .git holds: dropped.
    commit = os.environ.get("SYSTEMS_COMMIT")
    if commit:
        commit_info.update(id=commit, dirty=False, error=None, time=None, author_time=None)


def perf_profile(config: pytest.Config) -> str:
    chosen = config.getoption("perf_profile")
    return chosen or ("quick" if torch.cuda.is_available() else "smoke")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "perf_case" not in metafunc.fixturenames:
        return
    factory = getattr(metafunc.function, "perf_cases", None) or metafunc.module.perf_cases
    cases = factory(perf_profile(metafunc.config))
    metafunc.parametrize("perf_case", cases, ids=[case.id for case in cases])


def pytest_runtest_setup(item: pytest.Item) -> None:
    gpus = gpu_count()
    if item.get_closest_marker("gpu") and gpus < 1:
        pytest.skip("needs a CUDA GPU")
    if item.get_closest_marker("multigpu") and gpus < 2:
        pytest.skip(f"needs 2+ CUDA GPUs, found {gpus}")
    if item.get_closest_marker("interpreter") and not interpreter.INTERPRETED:
        pytest.skip("runs Triton kernels on the CPU: needs Triton's interpreter (a CPU-only "
                    "torch, or TRITON_INTERPRET=1 for the whole run)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Plain params before the benchmark runs; its result collected once it has."""
    bench = getattr(item, "funcargs", {}).get("benchmark")
    case = getattr(getattr(item, "callspec", None), "params", {}).get("perf_case")
    if bench is not None and case is not None:
        bench.params = flatten_case(case)  # pytest-benchmark saves and groups by these
    try:
        return (yield)
    finally:
        if bench is not None and getattr(bench, "stats", None) is not None:
            item.config.stash[_PERF_RUN].results.append(BenchmarkResult.of(bench))


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    chosen = request.config.getoption("device")
    return torch.device(chosen or ("cuda" if torch.cuda.is_available() else "cpu"))


@pytest.fixture(scope="session")
def profile(request: pytest.FixtureRequest) -> str:
    return perf_profile(request.config)


class SynchronizedBenchmark:
    """pytest-benchmark's `benchmark`, timed by the timing core (systems.bench.timing).

    The core's rounds (host start -> step() -> device synchronize, warm-up rounds untimed,
    the garbage collector paused) are handed to `benchmark.pedantic`, so a perf case times
    a step as `python -m systems.bench` does; pytest-benchmark's clock brackets each round.
    `extra_info` gets the round's kind (`timing`), each round's enqueue time, on CUDA the
    device clock of DEVICE_CLOCK_ROUNDS more rounds (`keys.DEVICE_KERNEL_S`, the device's
    busy time, which host speed cannot move), peak memory and throughput; a CUDA
    out-of-memory error becomes a skip whose reason names the workload.
    `slowdown` and `device_work` are the test-only switches of `RoundTimer`.
    """

    def __init__(self, benchmark, device: torch.device, slowdown: float = 0.0,
                 device_work: float = 0.0) -> None:
        self.benchmark = benchmark
        self.device = device
        self.slowdown = slowdown
        self.device_work = device_work

    def __call__(
        self,
        step: Callable[[], object],
        *,
        warmup: int,
        rounds: int,
        precision: str,
        flops: float | None = None,
        tokens: int | None = None,
        info: dict[str, object] | None = None,
        cold_start: bool = False,
    ) -> None:
        """`cold_start`: time the very first call on its own (JIT, autotuning and
        compilation happen there) as `extra_info["cold_start_s"]`, before the warm-up and
        before peak memory is reset."""
        extra = self.benchmark.extra_info
        extra.update(info or {})
        extra.update({keys.PRECISION: precision, keys.WARMUP_ROUNDS: warmup,
                      keys.TORCH_DEVICE: str(self.device)})
        if self.slowdown:
            extra[keys.INJECTED_HOST] = self.slowdown
        if self.device_work:
            extra[keys.INJECTED_DEVICE] = self.device_work
        timer = RoundTimer(step, self.device, host_slowdown=self.slowdown,
                           device_work=self.device_work)
        try:
            if cold_start:
                extra["cold_start_s"] = timer.first_call()
            reset_peak_memory(self.device)
            # The peak includes what was allocated before timing (model, inputs, and anything
            # an earlier case left behind): record that baseline so a reader can tell them apart.
            extra["memory_allocated_before_bytes"] = allocated_memory_bytes(self.device)
            # --benchmark-disable: pedantic calls the step once, untimed; no warm-up then.
            timed = not self.benchmark.disabled
            stats = timer.measure(warmup=warmup if timed else 0, rounds=rounds,
                                  drive=self._pedantic,
                                  device_rounds=DEVICE_CLOCK_ROUNDS
                                  if timed and self.device.type == "cuda" else 0)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            release_device_memory()
            pytest.skip(out_of_memory_reason(error))
        extra["peak_memory_bytes"] = peak_memory_bytes(self.device)
        extra["peak_memory_gib"] = (
            None if extra["peak_memory_bytes"] is None else extra["peak_memory_bytes"] / 2**30
        )
        if self.benchmark.stats is None:  # --benchmark-disable: nothing was timed
            return
        extra[keys.TIMING] = stats.kind
        # Near the round's time, the device waited on the host (launch-bound) rather than
        # the other way round.
        extra[keys.HOST_ENQUEUE_S] = stats.host_median
        extra[keys.HOST_ENQUEUE_ROUNDS_S] = list(stats.host_times)
        if stats.device_busy and min(stats.device_busy) > 0:  # a round with no device work
            extra[keys.DEVICE_KERNEL_S] = list(stats.device_busy)  # has no device clock
        extra.update(throughput_metrics(seconds=self.benchmark.stats.stats.mean, flops=flops,
                                        tokens=tokens, precision=precision,
                                        device=self.device))

    def _pedantic(self, timed_round: Callable[[], float], rounds: int) -> None:
        self.benchmark.pedantic(timed_round, rounds=rounds, iterations=1)

    def record_device_time(self, fn: Callable[[], object], *, warmup_ms: int,
                           rep_ms: int) -> None:
        """do_bench's device time of `fn` (median, mean and IQR, ms) beside the rounds. The
        test-only `device_work` switch adds its share of GPU work to each call here too."""
        timed = fn
        if self.device_work:
            clean = device_time(fn, warmup_ms=warmup_ms, rep_ms=rep_ms).median
            added = device_spin(self.device_work * clean, self.device)

            def timed() -> None:
                fn()
                added()

        stats = device_time(timed, warmup_ms=warmup_ms, rep_ms=rep_ms)
        self.benchmark.extra_info.update({keys.DO_BENCH_MEDIAN_MS: stats.median * 1e3,
                                          keys.DO_BENCH_MEAN_MS: stats.mean * 1e3,
                                          keys.DO_BENCH_IQR_MS: stats.iqr * 1e3,
                                          keys.DO_BENCH_TIMING: stats.kind})


def release_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@pytest.fixture
def synced_benchmark(benchmark, device: torch.device, request: pytest.FixtureRequest):
    run, name = request.config.stash[_PERF_RUN], request.node.originalname
    yield SynchronizedBenchmark(benchmark, device, run.slowdowns.get(name, 0.0),
                                run.device_work.get(name, 0.0))
    release_device_memory()


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int):
    """pytest-benchmark saves its results inside this hook: a failure there becomes a note
    (the tables below still print); then the baseline draft is kept or dropped and the gate
    is evaluated."""
    run = session.config.stash.get(_PERF_RUN, None)
    try:
        result = yield
    except OSError as error:
        if run is None:
            raise
        run.notes.append(f"SAVING FAILED, results were not stored: {error}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        result = None
    if run is not None:
        _keep_or_drop_baseline(session, run)
        _evaluate_gate(session, run)
        if run.study is not None and run.study.is_file() and not run.study.stat().st_size:
            run.study.unlink()  # reserved, never written: the number is free again
    return result


def _keep_or_drop_baseline(session: pytest.Session, run: PerfRun) -> None:
    draft, baseline = run.baseline_draft, run.baseline
    if draft is None or baseline is None:
        return
    if session.exitstatus == pytest.ExitCode.OK and draft.is_file():
        if not session.config.getoption("perf_baseline_repeat"):
            draft.replace(baseline)
            run.notes.append(f"recorded the baseline {baseline} ({len(run.results)} cases); "
                             "commit it")
            return
        try:
            pooled = add_repeat(json.loads(baseline.read_text()), json.loads(draft.read_text()))
        except ValueError as error:
            run.notes.append(f"baseline NOT extended ({error}); {baseline} is unchanged")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        else:
            baseline.write_text(json.dumps(pooled, indent=4))
            runs = len(pooled["benchmarks"][0]["extra_info"][keys.RUN_MEDIANS])
            run.notes.append(f"added this run to the baseline {baseline} ({runs} runs); "
                             "commit it")
        draft.unlink()
    else:
        draft.unlink(missing_ok=True)
        run.notes.append(f"baseline NOT recorded (the run did not pass: exit status "
                         f"{int(session.exitstatus)}); {baseline} is unchanged")


def _evaluate_gate(session: pytest.Session, run: PerfRun) -> None:
    if not run.gate_sources:
        return
    current = {r.fullname: r.timing for r in run.results}
    if not current:
        run.notes.append("the gate compared nothing: no case was timed")
        return
    if not current.keys() & run.gate_baseline.keys():
        targets = ", ".join(str(source.path) for source in run.gate_sources)
        run.notes.append(f"the gate compared nothing: no case of this run is in "
                         f"{targets} ({len(current)} new, {len(run.gate_baseline)} "
                         "not run); unusable as a comparison")
        session.exitstatus = pytest.ExitCode.USAGE_ERROR
        return
    run.gate = compare(run.gate_baseline, current)
    if regressions(run.gate):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    run = config.stash.get(_PERF_RUN, None)
    if run is None:
        return
    if run.results:
        terminalreporter.write_sep("-", f"throughput ({device_slug()})")
        terminalreporter.write_line(throughput_table(run.results))
    for report in terminalreporter.stats.get("skipped", []):
        for outcome in ("out of memory", "out of resource"):
            if outcome in str(report.longrepr):
                terminalreporter.write_line(f"{report.nodeid}: {outcome} (recorded as skip)")
    if run.gate is not None:
        failed = regressions(run.gate)
        terminalreporter.write_sep("-", f"perf gate: vs {describe_sources(run.gate_sources)}",
                                   red=bool(failed), green=not failed)
        for line in host_speed_lines(run.host_loop_ms, run.gate_sources):
            terminalreporter.write_line(line)
        terminalreporter.write_line(gate_table(run.gate))
        if failed:
            terminalreporter.write_line(f"PERF GATE FAILED: {len(failed)} case(s) slower than "
                                        "their noise threshold", red=True, bold=True)
    if _injects(run):
        terminalreporter.write_line(_slowdown_banner(run), red=True, bold=True)
    for note in run.notes:
        terminalreporter.write_line(note, yellow=True)

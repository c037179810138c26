"""The kernels one replay of the 2.7b ctx 512 optimized step runs, by name: how many and
how long each, from torch.profiler's device records, and the host time of a replay.

Run it under this tree and under the tree before the moves, on one GPU; the docs block
`graph-kernels BEFORE AFTER` (tools/docgen) sets the two files side by side:

    PYTHONPATH=src python -m studies.house_move_check.graph_kernels --out after.json
    PYTHONPATH=.before/src python studies/house_move_check/graph_kernels.py --out before.json

It reads only what both trees export under the same names, or their old names.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

REPLAYS = 5


def _build_step(size: str, seq_len: int, batch: int):  # noqa: ANN202 (either tree's step)
    import torch

    from systems.bench.checkpoint_fit import fit_to_device
    from systems.model import get_config

    try:
        from systems.bench.workloads import build_recipe_workload
        from systems.model.recipes import get_recipe
    except ImportError:  # the tree before the moves
        from systems.bench.recipes import build_recipe_workload, get_recipe
    device = torch.device("cuda")
    config = get_config(size)
    recipe = fit_to_device(get_recipe("optimized"), config, batch, seq_len, device).recipe
    return build_recipe_workload(config, recipe, batch_size=batch, seq_len=seq_len,
                                 device=device).step


def profile(size: str, seq_len: int, batch: int) -> dict[str, object]:
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    step = _build_step(size, seq_len, batch)
    for _ in range(5):  # warm-up calls, the capture and first replays
        step()
    torch.cuda.synchronize()
    host = []
    for _ in range(REPLAYS):
        start = time.perf_counter()
        step()
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            step()
            torch.cuda.synchronize()
    kernels: dict[str, list[float]] = defaultdict(list)
    for event in prof.profiler.kineto_results.events():
        if event.device_type() == DeviceType.CUDA and not event.is_user_annotation():
            kernels[event.name()].append(event.duration_ns() / 1e3)
    return {"replays": REPLAYS, "host_us_median": statistics.median(host) * 1e6,
            "kernels": {name: {"per_replay": len(us) / REPLAYS, "us_per_replay": sum(us) / REPLAYS}
                        for name, us in kernels.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", default="2.7b")
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    result = profile(args.size, args.seq_len, args.batch)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{len(result['kernels'])} kernel names, host {result['host_us_median']:.0f} us")


if __name__ == "__main__":
    main()

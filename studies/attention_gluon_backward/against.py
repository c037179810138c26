"""The library's Gluon backward beside another tree's (an earlier commit's `src/`), device
time in rounds taken in turn, on one sm_90 GPU.

    PYTHONPATH=src:. python -m studies.attention_gluon_backward.against --other OLD/src \
        --out OUT/against.json --commit SHA --shape 16x16384x128 ...

A round runs one process per tree, the two in turn (which goes first alternates), each
timing the default (ordered) and the unordered backward at every shape (do_bench medians
of `gluon_backward` on the same seeded inputs, (B * H, S, D) rows) and hashing the
ordered dQ. A row gives each tree's median over the rounds, the median and range of the
per-round ratios (this tree / the other) and whether the two trees' ordered dQs are
bit-identical (the same reductions in the same order should give the same bits).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from studies.harness import attention_shape, run_record

ROUNDS = 3
MODES = ("ordered", "unordered")


def _child(shapes: list[tuple[int, ...]], out: Path) -> None:
    """Time this process's `systems` tree at every shape; write {shape: {mode: ms}, ...}."""
    import torch

    from studies.harness import bench_ms
    from systems.attention.flash_triton import tune
    from systems.attention.gluon.backward import gluon_backward

    found = {}
    for shape in shapes:
        batch, heads, seq, head_dim = shape
        torch.manual_seed(0)
        inputs = tune.make_inputs(batch * heads, seq, head_dim, torch.bfloat16, True)
        args = [inputs[name] for name in ("q", "k", "v", "o", "lse", "do")]
        row = {}
        for mode in MODES:
            backward = functools.partial(gluon_backward, *args, True,
                                         deterministic=mode == "ordered")
            dq = backward()[0]
            if mode == "ordered":
                row["dq_sha256"] = hashlib.sha256(dq.view(torch.int16).cpu().numpy()).hexdigest()
            row[f"{mode}_ms"] = bench_ms(backward)
        found["x".join(map(str, shape))] = row
        del inputs, args
        torch.cuda.empty_cache()
    out.write_text(json.dumps(found))


def _run_tree(src: Path, shapes: list[str], scratch: Path) -> dict[str, dict[str, object]]:
    out = scratch / "child.json"
    env = os.environ | {"PYTHONPATH": f"{src}{os.pathsep}{Path.cwd()}"}
    command = [sys.executable, "-m", "studies.attention_gluon_backward.against", "--child",
               str(out), *(arg for shape in shapes for arg in ("--shape", shape))]
    subprocess.run(command, env=env, check=True)
    return json.loads(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=attention_shape, action="append", required=True,
                        help="BxHxSxD (repeatable)")
    parser.add_argument("--other", type=Path, help="the other tree's src/ folder")
    parser.add_argument("--out", type=Path, help="write the rows here (JSON)")
    parser.add_argument("--commit", default="unknown", help="this tree's, recorded")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.shape, args.child)
        return 0
    if args.other is None or args.out is None:
        parser.error("--other and --out are needed")
    shapes = ["x".join(map(str, shape)) for shape in args.shape]
    trees = {"this": Path("src").resolve(), "other": args.other.resolve()}
    runs: dict[str, list[dict[str, dict[str, object]]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(ROUNDS):
            order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in order:
                runs[name].append(_run_tree(trees[name], shapes, Path(scratch)))
            print(f"[round {round_ + 1}/{ROUNDS}] done", flush=True)
    rows = []
    for shape in shapes:
        row: dict[str, object] = {"shape": shape, "other": str(args.other)}
        hashes = {run[shape]["dq_sha256"] for name in trees for run in runs[name]}
        row["ordered_dq_bit_identical"] = len(hashes) == 1
        for mode in MODES:
            this = [run[shape][f"{mode}_ms"] for run in runs["this"]]
            other = [run[shape][f"{mode}_ms"] for run in runs["other"]]
            ratios = [a / b for a, b in zip(this, other, strict=True)]
            row |= {f"{mode}_this_ms": statistics.median(this),
                    f"{mode}_other_ms": statistics.median(other),
                    f"{mode}_this_over_other": statistics.median(ratios),
                    f"{mode}_ratio_range": [min(ratios), max(ratios)]}
        rows.append(row)
        print(shape, " ".join(f"{mode} {row[f'{mode}_this_ms']:.3f} vs "
                              f"{row[f'{mode}_other_ms']:.3f} ms "
                              f"({row[f'{mode}_this_over_other']:.3f})" for mode in MODES),
              "dq bit-identical" if row["ordered_dq_bit_identical"] else "dq differs",
              flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(run_record(args.commit, ROUNDS, rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The library's Gluon backward config beside a variant of it, device time in rounds taken
in turn in one process, on one sm_90 GPU.

    PYTHONPATH=src:. python -m studies.attention_gluon_backward.configs_in_turn \
        --set schedule=shortest_first --set writers=2 --out OUT/configs.json --commit SHA \
        --shape 4x16x4096x128 ...

At each shape the config the library picks (`library_config`; ordered, or unordered with
--unordered) and the variant (its fields replaced by each --set) run on the same seeded
inputs, (B * H, S, D) rows. Both are first run with every buffer NaN-poisoned and checked
against the fp32 reference (max abs errors), and, ordered, a second poisoned call must give
the same dQ bits. Then each round times both, each captured in a CUDA graph, by do_bench of
its replay (device time), which goes first alternating. A row gives each one's median over
the rounds and the median and range of the per-round ratios (variant / library).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import typing
from pathlib import Path

import torch

from studies.harness import (
    attention_shape,
    bench_ms,
    errors,
    graphed,
    measure_shapes,
    reference_grads,
    run_record,
)
from systems.attention.flash_triton import tune
from systems.attention.gluon.backward import (
    GluonConfig,
    gluon_backward,
    gluon_head_dim,
    library_config,
    resident_sms,
)
from systems.attention.gluon.backward_kernel import BLOCK_N

ROUNDS = 5
# `ordered` follows --unordered: the variant adds dQ as the library's config does.
FIELDS = {name: kind for name, kind in typing.get_type_hints(GluonConfig).items()
          if name != "ordered"}


def setting(text: str) -> tuple[str, object]:
    """FIELD=VALUE of a GluonConfig field, the value read as that field's type: an argparse
    type."""
    name, sep, value = text.partition("=")
    if not sep or name not in FIELDS:
        raise argparse.ArgumentTypeError(
            f"expected FIELD=VALUE with FIELD one of {', '.join(FIELDS)}, got {text!r}")
    kind = FIELDS[name]
    if kind is bool:
        if value not in ("true", "false"):
            raise argparse.ArgumentTypeError(f"{name} takes true or false, got {value!r}")
        return name, value == "true"
    if kind is int:
        try:
            return name, int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} takes an int, got {value!r}") from None
    return name, value


def measure(shape: tuple[int, ...], settings: dict[str, object], ordered: bool
            ) -> dict[str, object]:
    batch, heads, seq, head_dim = shape
    torch.manual_seed(0)
    inputs = tune.make_inputs(batch * heads, seq, head_dim, torch.bfloat16, True)
    args = [inputs[name] for name in ("q", "k", "v", "o", "lse", "do")]
    library = library_config(gluon_head_dim(head_dim), ordered, seq // BLOCK_N, batch * heads,
                             resident_sms(args[0].device))
    configs = {"library": library, "variant": dataclasses.replace(library, **settings)}
    row: dict[str, object] = {"shape": "x".join(map(str, shape)),
                              **{f"{name}_config": dataclasses.asdict(config)
                                 for name, config in configs.items()}}
    expected = reference_grads(inputs, True)
    for name, config in configs.items():
        first = gluon_backward(*args, True, deterministic=ordered, config=config, poison=True)
        row |= errors(first, expected, f"{name}_vs_ref")
        if ordered:
            again = gluon_backward(*args, True, deterministic=True, config=config, poison=True)
            row[f"{name}_dq_bit_identical"] = torch.equal(first[0], again[0])
    # Graphs: with a config given the calls take the Python launch path, whose host cost
    # would otherwise hide the kernels' difference at short backwards.
    graphs = {name: graphed(lambda c=config: gluon_backward(*args, True, deterministic=ordered,
                                                            config=c))
              for name, config in configs.items()}
    times: dict[str, list[float]] = {name: [] for name in configs}
    for round_ in range(ROUNDS):
        for name in (list(configs) if round_ % 2 == 0 else list(reversed(configs))):
            times[name].append(bench_ms(graphs[name].replay))
    ratios = [a / b for a, b in zip(times["variant"], times["library"], strict=True)]
    return row | {"library_ms": statistics.median(times["library"]),
                  "variant_ms": statistics.median(times["variant"]),
                  "variant_over_library": statistics.median(ratios),
                  "ratio_range": [min(ratios), max(ratios)],
                  "rounds_ms": times}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=attention_shape, action="append", required=True,
                        help="BxHxSxD (repeatable)")
    parser.add_argument("--set", type=setting, action="append", required=True,
                        dest="settings", help="FIELD=VALUE of the variant (repeatable)")
    parser.add_argument("--unordered", action="store_true",
                        help="the unordered backward's config rather than the ordered one's")
    parser.add_argument("--out", type=Path, required=True, help="write the rows here (JSON)")
    parser.add_argument("--commit", default="unknown", help="recorded in the output")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU (sm_90: H100, H200)")
    settings = dict(args.settings)
    record = run_record(args.commit, ROUNDS, [])
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def summary(row: dict[str, object]) -> str:
        return (f"{row['shape']} library {row['library_ms']:.3f} ms, variant "
                f"{row['variant_ms']:.3f} ms ({row['variant_over_library']:.3f})")

    measure_shapes(args.shape, lambda shape: measure(shape, settings, not args.unordered),
                   record, args.out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The attention dispatch: the table `FlashAttentionTriton` picks kernels from
(`systems.attention.dispatch.TABLE`), and what a saved run of studies/attention_dispatch
measured at each shape."""

from __future__ import annotations

import json
from pathlib import Path

from systems.attention import dispatch
from tools.docgen.doc_attention import short_dtype

_FORWARDS = {dispatch.TRITON: "Triton", dispatch.GLUON: "Gluon"}
_BACKWARDS = {dispatch.TWO_PASS: "two passes", dispatch.GLUON_ORDERED: "Gluon, dQ in a fixed order",
              dispatch.GLUON_UNORDERED: "Gluon, dQ in arrival order"}
_CUDNN = "sdpa_cudnn"
_RIVALS = (_CUDNN, "sdpa_flash")  # the study's rows time these beside our pairs


def _pair(name: str) -> str:
    forward, backward = name.split("+")
    return f"{_FORWARDS[forward]} + {_BACKWARDS[backward]}"


def dispatch_table() -> str:
    """Every rule of `dispatch.TABLE`, in the order the dispatch tries them."""
    lines = ["| GPU | dtype | d | seq from | tokens from | forward | backward |",
             "|---|---|---:|---:|---:|---|---|"]
    for rule in dispatch.TABLE:
        major, minor = rule.capability
        dtype = short_dtype(str(rule.dtype).removeprefix("torch."))
        lines.append(f"| sm_{major}{minor} | {dtype} | {rule.head_dim} | {rule.min_seq} | "
                     f"{rule.min_tokens} | {_FORWARDS[rule.kernels.forward]} | "
                     f"{_BACKWARDS[rule.kernels.backward]} |")
    return ("\n".join(lines) + f"\n\nEverything else runs {_pair(dispatch.DEFAULT.name)}. "
            "(Rows of `systems.attention.dispatch.TABLE`.)\n")


def dispatch_study(repo: Path, run_file: str, tokens: str | None = None) -> str:
    """Per shape of a saved study run (those of `tokens` tokens, or of one matrix where it
    is "one-matrix", if given): the default pair's and cuDNN's times, the pair that beat
    the default by most where one beat it by `dispatch.WIN` (else the default), and its
    ratios to both."""
    run = json.loads((repo / run_file).read_text())
    lines = ["| d | seq | tokens | default ms | SDPA cuDNN ms | fastest pair | its ms | "
             "/ default | / SDPA cuDNN |", "|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    if tokens == "one-matrix":
        rows = [r for r in run["rows"] if r["matrices"] == 1]
    else:
        rows = [r for r in run["rows"] if tokens is None or r["tokens"] == int(tokens)]
    if not rows:
        raise ValueError(f"{run_file}: no shape of {tokens} tokens")
    for row in sorted(rows, key=lambda r: (r["head_dim"], r["seq"], r["tokens"])):
        ms, over = row["ms"], row["over_default"]
        pairs = {name: ratio for name, ratio in over.items() if name not in _RIVALS}
        best = min(pairs, key=pairs.get)
        if pairs[best] >= dispatch.WIN:
            best = dispatch.DEFAULT.name
        lines.append(f"| {row['head_dim']} | {row['seq']} | {row['tokens']} | "
                     f"{ms[dispatch.DEFAULT.name]:.3f} | {ms[_CUDNN]:.3f} | {_pair(best)} | "
                     f"{ms[best]:.3f} | {pairs[best]:.2f} | {ms[best] / ms[_CUDNN]:.2f} |")
    return ("\n".join(lines) + "\n\nTime: device time (do_bench), medians in ms over the "
            "study's rounds taken in turn; / default is the median of the per-round ratios, "
            "/ SDPA cuDNN a ratio of medians. tokens = batch x heads x seq; bf16, causal, "
            f"forward + backward. {run['device']}, torch {run['torch']}. From `{run_file}`.\n")

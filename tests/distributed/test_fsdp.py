"""FSDP against single-process training on the concatenated batch."""

from __future__ import annotations

import pytest
import torch
from distributed_cases import train_and_compare

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# Low-precision compute: the parameter updates must match fp32 training to within a few
# units of the compute dtype's rounding (fp16 has 11 significant bits, bf16 8).
TOLERANCE = {"fp32": {}, "fp16": {"update_rtol": 4e-3}, "bf16": {"update_rtol": 3e-2}}


@pytest.mark.parametrize("model_name", ["toy", "tiny_lm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_single_process(run_on_ranks, backend, dtype, model_name):
    results = run_on_ranks(train_and_compare, "fsdp", model_name, steps=3,
                           options={"compute_dtype": DTYPES[dtype]}, **TOLERANCE[dtype])
    assert all(r["compared"] > 0 for r in results)


@pytest.mark.parametrize("trial", range(3))  # repeated with fresh seeds to catch races
def test_bitwise_equal_when_the_math_is_exact(run_on_ranks, backend, trial):
    results = run_on_ranks(train_and_compare, "fsdp", "exact", steps=1, exact=True, seed=trial)
    assert all(r["compared"] > 0 for r in results)

"""Distributed training: process groups, data-parallel wrappers, FSDP."""

from systems.distributed.bucket_steps import BucketSteps
from systems.distributed.ddp import DDPBucketed, DDPIndividualParameters, FlatDDP, NaiveDDP
from systems.distributed.fsdp import FSDP
from systems.distributed.rank_pool import RankError, RankPool

__all__ = [
    "FSDP", "BucketSteps", "DDPBucketed", "DDPIndividualParameters", "FlatDDP", "NaiveDDP",
    "RankError", "RankPool",
]

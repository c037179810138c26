"""AdamW over fp32 master weights for a model that holds and computes in bf16/fp16."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from systems.kernel_runtime import interpreter
from systems.optim.adamw import AdamW
from systems.optim.adamw_kernel import launch_fused_adamw_
from systems.optim.split_master import join_master, split_master


class MixedPrecisionAdamW(AdamW):
    """AdamW whose updates happen on fp32 master copies; the parameters become
    `compute_dtype` copies that the model computes with directly (no autocast casts).

    At construction (and in `add_param_group`) each parameter's current values become its
    fp32 master, and the parameter itself is cast in place to `compute_dtype`. Each step
    runs one fused kernel launch over all parameters (`adamw_kernel.launch_fused_adamw_`)
    that updates the masters and the moments and writes the rounded masters back into the
    parameters. The update is `AdamW`'s, computed in fp32 from the low-precision gradient;
    `master(p)` gives the fp32 weights.

    For bf16 the master is not a second copy: it is the parameter plus the 16 bits its
    rounding dropped (`systems.optim.split_master`, state "master_low_bits"), exact, 2 bytes
    per weight less to keep and to move each step. The rounding then takes ties away from
    zero instead of to even. So the master of a bf16 parameter lives partly in the model:
    a checkpoint needs the model's state dict as well as this one's (as any checkpoint
    does), and a parameter changed outside the optimizer moves its master with it. Other
    dtypes keep an fp32 "master".

    The step can be captured in a CUDA graph (see `systems.model.cuda_graph`): step counts
    live on the device. Hyperparameters (lr, betas, ...) are read when a step is launched,
    so a replayed graph keeps those of its capture.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        compute_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        if not compute_dtype.is_floating_point:
            raise ValueError(f"compute_dtype must be a floating dtype, got {compute_dtype}")
        self.compute_dtype = compute_dtype  # add_param_group, called by __init__, needs it
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)
        for param in self.param_groups[-1]["params"]:
            self._adopt(param)

    @torch.no_grad()
    def _adopt(self, param: torch.Tensor) -> None:
        if not param.is_contiguous():
            raise ValueError("MixedPrecisionAdamW needs contiguous parameters")
        if param.device.type != "cuda" and not interpreter.INTERPRETED:
            raise ValueError(f"MixedPrecisionAdamW's kernel needs CUDA parameters, got "
                             f"{param.device} (set TRITON_INTERPRET=1 before importing systems "
                             "to run it on the CPU)")
        state = self.state[param]
        # On the device (float64, exact for any realistic count), so that a step captured
        # in a CUDA graph counts on at every replay.
        state["step"] = torch.zeros((), dtype=torch.float64, device=param.device)
        master = param.detach().to(torch.float32, copy=True)
        if self._splits_masters:
            param.data, state["master_low_bits"] = split_master(master)
        else:
            state["master"] = master
            param.data = param.data.to(self.compute_dtype)
        state["exp_avg"] = torch.zeros_like(master)
        state["exp_avg_sq"] = torch.zeros_like(master)

    @property
    def _splits_masters(self) -> bool:
        return self.compute_dtype == torch.bfloat16

    @property
    def _master_key(self) -> str:
        return "master_low_bits" if self._splits_masters else "master"

    @property
    def _state_dtypes(self) -> dict[str, torch.dtype]:
        """What each parameter's state holds, in which dtype."""
        return {"step": torch.float64,
                self._master_key: torch.int16 if self._splits_masters else torch.float32,
                "exp_avg": torch.float32, "exp_avg_sq": torch.float32}

    def master(self, param: torch.Tensor) -> torch.Tensor:
        """The fp32 master weights of `param` (a new tensor where the master is split)."""
        state = self.state[param]
        if self._splits_masters:
            return join_master(param.detach(), state["master_low_bits"])
        return state["master"]

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """`torch.optim.Optimizer.load_state_dict`, but each state tensor keeps its dtype,
        and a parameter's existing state is overwritten in place.

        Torch would cast every tensor in a floating-point parameter's state to the
        parameter's dtype (fp32 masters and moments to bf16, low bits to floats), and would
        replace the tensors: a step captured in a CUDA graph (`systems.model.cuda_graph`)
        keeps reading the old ones, so the loaded state would never reach its replays.
        Refuses a state of another layout (another `compute_dtype`)."""
        previous = dict(self.state)
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        if len(saved_ids) == len(params):  # else torch's load below says what is wrong
            for saved_id, param in zip(saved_ids, params, strict=True):
                if saved_id in state_dict["state"]:
                    self._check_saved(state_dict["state"][saved_id], param)
        super().load_state_dict({**state_dict, "state": {}})  # the groups, checked
        # Every parameter was given its state when it joined a group, with the keys and
        # dtypes `_check_saved` asks of a saved one: the saved values go into it.
        self.state.update(previous)
        for saved_id, param in zip(saved_ids, params, strict=True):
            for key, value in state_dict["state"].get(saved_id, {}).items():
                self.state[param][key].copy_(torch.as_tensor(value))

    def _check_saved(self, saved: dict[str, Any], param: torch.Tensor) -> None:
        wanted = self._state_dtypes
        if set(saved) != set(wanted):
            raise ValueError(f"a saved state holding {sorted(saved)} does not fit a "
                             f"MixedPrecisionAdamW for {self.compute_dtype}, which keeps "
                             f"{sorted(wanted)}")
        for key, dtype in wanted.items():
            value = torch.as_tensor(saved[key])
            shape = () if key == "step" else param.shape
            if value.dtype != dtype or value.shape != shape:
                raise ValueError(f"saved {key} is {value.dtype} {tuple(value.shape)}, this "
                                 f"parameter needs {dtype} {tuple(shape)}")

    def _step_group(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        # `AdamW.step` hands over the group's parameters that have gradients. A launch takes
        # one parameter and one gradient dtype; step counts may differ within it.
        launches: dict[tuple[torch.dtype, torch.dtype], list[torch.Tensor]] = {}
        for param in params:
            if param.grad.is_sparse:
                raise RuntimeError("MixedPrecisionAdamW does not support sparse gradients")
            launches.setdefault((param.dtype, param.grad.dtype), []).append(param)
        for same_kind in launches.values():
            self._launch(group, same_kind)

    def _launch(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        # Unchecked: the states were made from the parameters, autograd gives gradients the
        # parameter's shape and device, `_adopt` checked contiguity and the launches are
        # grouped by dtype.
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in params]
        step_counts = [s["step"] for s in states]
        torch._foreach_add_(step_counts, 1.0)
        launch_fused_adamw_(
            params, [p.grad.contiguous() for p in params],
            [s[self._master_key] for s in states],
            [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
            steps=torch.stack(step_counts), lr=group["lr"], beta1=beta1, beta2=beta2,
            eps=group["eps"], weight_decay=group["weight_decay"])

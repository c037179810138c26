"""One step of the model, ready to run: forward, forward+backward, or a train step (loss,
backward, optimizer), in the chosen precision, compiled or not, optionally replayed from a
CUDA graph. What training and every timed step of the suite build."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from systems.common.nvtx import nvtx_range
from systems.model.config import ModelConfig
from systems.model.cuda_graph import CapturedStep
from systems.model.loss import cross_entropy
from systems.model.transformer import TransformerLM
from systems.optim import OptimizerName, OverlappedUpdates, build_optimizer
from systems.optim.names import optimizer_name

MODES = ("forward", "forward_backward", "train_step")
COMPILE_SCOPES = ("model", "blocks")
# The optimizers a single-process step can build; the sharded ones need a data-parallel
# `wrap` (their state is split over the ranks).
STEP_OPTIMIZERS = (OptimizerName.ADAMW, OptimizerName.TORCH_ADAMW, OptimizerName.MIXED_PRECISION)
SHARDED_OPTIMIZERS = (OptimizerName.SHARDED, OptimizerName.TORCH_ZERO)
PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16}
# Ordinary steps before a step is captured (`StepOptions.cuda_graph`): compiled graphs and
# optimizer state settle in the first.
CUDA_GRAPH_WARMUP = 2
def check_choice(kind: str, value: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"unknown {kind} {value!r}; choose one of {sorted(choices)}")
    return value


def autocast_context(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    dtype = PRECISIONS[check_choice("precision", precision, PRECISIONS)]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


@dataclass(frozen=True)
class StepOptions:
    """How a step runs beyond attention, precision and compile; the defaults are the plain
    model's step.

    compile_scope: with `compiled`, "model" compiles the whole model's forward, "blocks"
    each Transformer block (short graphs, one compile shared by all blocks).
    compile_mode: passed to torch.compile (e.g. "max-autotune", or "reduce-overhead" for
    CUDA graphs). optimizer: "adamw" (`systems.optim.AdamW`), "torch_adamw"
    (`torch.optim.AdamW`, fused on CUDA, foreach elsewhere) or "mixed_precision"
    (`systems.optim.MixedPrecisionAdamW`: the parameters become copies in the step's
    precision over fp32 masters, so autocast casts nothing); with a data-parallel `wrap`
    also "sharded" or "torch_zero". fused_loss: LM head and cross-entropy in token chunks
    (`systems.model.loss`). checkpoint_every, checkpoint_blocks: see `TransformerLM`.
    cuda_graph: after `CUDA_GRAPH_WARMUP` ordinary steps, capture one step in a CUDA graph
    and replay it from then on (`systems.model.cuda_graph.CapturedStep`); CUDA only, with an
    optimizer that counts steps on the GPU ("mixed_precision" or "torch_adamw", which is then
    capturable). lr: the optimizer's learning rate (weight decay 0.01).
    overlap_optimizer: update each block's parameters as soon as backward has produced
    their gradients, beside the rest of backward (`systems.optim.OverlappedUpdates`); needs
    one of our optimizers and, when compiled, compile_scope="blocks" (a model compiled whole
    produces every gradient at the end of its one backward graph).
    """

    compile_scope: str = "model"
    compile_mode: str | None = None
    optimizer: OptimizerName = OptimizerName.ADAMW
    fused_loss: bool = False
    checkpoint_every: int = 0
    checkpoint_blocks: int = 0
    cuda_graph: bool = False
    lr: float = 1e-4
    overlap_optimizer: bool = False

    def __post_init__(self) -> None:
        check_choice("compile scope", self.compile_scope, COMPILE_SCOPES)
        # frozen: the validated name replaces the string it was given
        object.__setattr__(self, "optimizer",
                           optimizer_name(self.optimizer, STEP_OPTIMIZERS + SHARDED_OPTIMIZERS))
        if isinstance(self.lr, bool) or not isinstance(self.lr, int | float) or self.lr <= 0:
            raise ValueError(f"lr must be a number > 0, got {self.lr!r}")
        if self.cuda_graph and self.compile_mode == "reduce-overhead":
            raise ValueError("cuda_graph captures the whole step already; compile_mode="
                             "'reduce-overhead' would capture graphs inside it")
        if self.overlap_optimizer and self.optimizer == OptimizerName.TORCH_ADAMW:
            raise ValueError("overlap_optimizer needs optimizer='mixed_precision' or 'adamw' "
                             "(torch's AdamW cannot step some parameters alone)")


@dataclass
class ModelStep:
    """A model, a random batch and one step of the chosen mode, ready to run.

    `step()` queues the work and returns without synchronising (the loss tensor where there
    is one); callers synchronise. `phases` are the step's parts in order, for a timer that
    marks between them ("backward", "sync" and "optimizer" for a train step; "sync" waits
    for a data-parallel wrapper's gradients and is empty without one); they are the step
    itself, so they cannot be run apart from a step replayed from a CUDA graph.
    """

    config: ModelConfig
    batch_size: int
    seq_len: int
    mode: str
    precision: str
    compiled: bool
    attention: str
    device: torch.device
    options: StepOptions
    model: torch.nn.Module = field(repr=False)
    step: Callable[[], torch.Tensor | None] = field(repr=False)
    phases: tuple[tuple[str, Callable[[], object]], ...] = field(repr=False)
    optimizer: torch.optim.Optimizer | None = field(repr=False)
    inputs: torch.Tensor = field(repr=False)
    targets: torch.Tensor = field(repr=False)

    def load_batch(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        """Train the next steps on this batch: copied into the tensors the step reads, which
        is also how new data reaches a step replayed from a CUDA graph."""
        for name, new, current in (("inputs", inputs, self.inputs),
                                   ("targets", targets, self.targets)):
            if new.shape != current.shape or new.dtype != current.dtype:
                raise ValueError(f"{name} must be {current.dtype} of shape "
                                 f"{tuple(current.shape)}, got {new.dtype} of shape "
                                 f"{tuple(new.shape)}")
        self.inputs.copy_(inputs)
        self.targets.copy_(targets)

    def describe(self) -> dict[str, object]:
        return {
            "d_model": self.config.d_model, "d_ff": self.config.d_ff,
            "num_layers": self.config.num_layers, "num_heads": self.config.num_heads,
            "vocab_size": self.config.vocab_size, "batch_size": self.batch_size,
            "seq_len": self.seq_len, "mode": self.mode,
            "precision": self.precision, "compiled": self.compiled,
            "attention": self.attention, "parameters": self.config.num_parameters(),
            **asdict(self.options),
        }


def build_model_step(
    config: ModelConfig,
    *,
    batch_size: int = 4,
    seq_len: int = 512,
    mode: str = "train_step",
    precision: str = "fp32",
    compiled: bool = False,
    attention: str = "reference",
    device: torch.device | str = "cpu",
    seed: int = 0,
    options: StepOptions = StepOptions(),  # noqa: B008 - frozen, so sharing it is safe
    wrap: Callable[[TransformerLM], torch.nn.Module] | None = None,
) -> ModelStep:
    """Initialise a model with random weights and a random batch for one kind of step.

    `wrap` puts the model in a data-parallel wrapper (`systems.distributed`) before it is
    compiled and its optimizer built; the step then waits for its gradients before the
    update. Every step this project trains or times, single-process or data-parallel,
    is built here.
    """
    check_choice("mode", mode, MODES)
    check_choice("precision", precision, PRECISIONS)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 1 <= seq_len <= config.max_seq_len:
        raise ValueError(
            f"seq_len {seq_len} must lie in [1, {config.max_seq_len}] (the model's max_seq_len)"
        )
    device = torch.device(device)
    if options.cuda_graph and mode == "train_step" and options.optimizer == OptimizerName.ADAMW:
        raise ValueError("cuda_graph needs an optimizer that counts steps on the GPU: "
                         "optimizer='mixed_precision' or 'torch_adamw'")
    if options.optimizer in SHARDED_OPTIMIZERS and wrap is None:
        raise ValueError(f"optimizer {options.optimizer.value!r} shards its state over "
                         "data-parallel ranks: it needs a data-parallel wrap")
    if options.cuda_graph and device.type != "cuda":
        raise ValueError(f"cuda_graph needs a CUDA device, got {device} (turn it off with "
                         "cuda_graph=False)")
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    with device:  # initialise on the device: a CPU init of 2.7B parameters takes minutes
        model = TransformerLM(config, attention=attention,
                              checkpoint_every=options.checkpoint_every,
                              checkpoint_blocks=options.checkpoint_blocks)
    inputs, targets = torch.randint(
        config.vocab_size, (2, batch_size, seq_len), generator=generator
    ).to(device)
    if compiled and options.overlap_optimizer and options.compile_scope != "blocks":
        raise ValueError("overlap_optimizer with compiled=True needs compile_scope='blocks': "
                         "a model compiled whole produces every gradient when its single "
                         "backward graph ends, so nothing would overlap")
    trained = model if wrap is None else wrap(model)
    run_model = _compile(model, trained, options) if compiled else trained
    autocast = autocast_context(device, precision)

    def forward() -> None:
        with torch.no_grad(), autocast, nvtx_range("forward"):
            run_model(inputs)

    def forward_backward() -> torch.Tensor:
        trained.zero_grad(set_to_none=True)
        with nvtx_range("forward"), autocast:
            loss = (run_model(inputs, targets) if options.fused_loss
                    else cross_entropy(run_model(inputs), targets))
        with nvtx_range("backward"):
            loss.backward()
        return loss

    optimizer = None
    if mode == "train_step":
        optimizer = build_optimizer(
            options.optimizer, [p for p in trained.parameters() if p.requires_grad],
            lr=options.lr, device=device, compute_dtype=PRECISIONS[precision] or torch.float32,
            cuda_graph=options.cuda_graph)
        if options.overlap_optimizer:
            optimizer = OverlappedUpdates(optimizer, update_buckets(model))
    # Bucketed and flat DDP and FSDP finish their communication here; the others need not.
    synchronize_gradients = getattr(trained, "finish_gradient_synchronization", lambda: None)

    def optimizer_step() -> None:
        with nvtx_range("optimizer_step"):
            optimizer.step()

    def train_step() -> torch.Tensor:
        loss = forward_backward()
        synchronize_gradients()
        optimizer_step()
        return loss

    step, phases = {
        "forward": (forward, (("forward", forward),)),
        "forward_backward": (forward_backward, (("backward", forward_backward),)),
        "train_step": (train_step, (("backward", forward_backward),
                                    ("sync", synchronize_gradients),
                                    ("optimizer", optimizer_step))),
    }[mode]
    if options.cuda_graph:
        step = CapturedStep(step, warmup=CUDA_GRAPH_WARMUP,
                            before_capture=lambda: trained.zero_grad(set_to_none=True))
    return ModelStep(
        config=config, batch_size=batch_size, seq_len=seq_len, mode=mode,
        precision=precision, compiled=compiled, attention=attention, device=device,
        options=options, model=model, step=step, phases=phases, optimizer=optimizer,
        inputs=inputs, targets=targets,
    )


def _compile(model: TransformerLM, trained: torch.nn.Module,
             options: StepOptions) -> torch.nn.Module:
    """What the step calls: `trained` (the model, or its wrapper) compiled whole, or with
    each of the model's blocks compiled in place."""
    # Start from empty compile caches: an earlier model's graphs would otherwise count
    # against the recompile limit and make this model's cold start look cheaper.
    torch._dynamo.reset()
    if options.compile_scope == "model":
        return torch.compile(trained, mode=options.compile_mode)
    for block in model.layers:
        block.compile(mode=options.compile_mode)
    return trained


def update_buckets(model: TransformerLM) -> list[list[torch.nn.Parameter]]:
    """The parameters of each part whose gradients backward completes at once, in the order
    backward reaches them: LM head and final norm, each block from the last, the embedding."""
    parts = [model.lm_head, model.ln_final, *reversed(model.layers), model.token_embeddings]
    return [list(part.parameters()) for part in parts]


"""Host side of the FlashAttention-2 kernels: input checks and launches (tile configs:
`configs`)."""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import torch
import triton

from systems.attention.flash_triton.configs import (
    FlashConfig,
    TileConfig,
    _next_power_of_2,
    default_config,
)
from systems.attention.flash_triton.kernels import (
    flash_backward_dkdv_kernel,
    flash_backward_dq_kernel,
    flash_forward_kernel,
)
from systems.attention.host_path import replay
from systems.attention.shared.inputs import check_attention_inputs
from systems.attention.shared.tile_order import section_matrices
from systems.kernel_runtime.interpreter import INTERPRETED
from systems.kernel_runtime.launcher import DescriptorLayout, KernelLauncher, TensorSlot

MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# A plain-int helper (`configs._next_power_of_2` is another): triton.cdiv is a constexpr
# function whose host-side calls cost microseconds each, several times per attention call.
def _cdiv(n: int, block: int) -> int:
    return -(-n // block)


def check_triton_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Everything `check_attention_inputs` asks, plus what these kernels need. The checks
    that shapes, dtypes and devices decide run once per such signature."""
    signature = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
                 q.device, k.device, v.device)
    if signature not in _CHECKED_SIGNATURES:
        _check_signature(q, k, v)
        if len(_CHECKED_SIGNATURES) >= _MAX_CHECKED_SIGNATURES:
            _CHECKED_SIGNATURES.clear()
        _CHECKED_SIGNATURES.add(signature)


_CHECKED_SIGNATURES: set[tuple[object, ...]] = set()
_MAX_CHECKED_SIGNATURES = 4096


def _check_signature(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    check_attention_inputs(q, k, v)
    if q.device.type == "meta":
        raise ValueError("meta tensors hold no data for the Triton kernels to read: pass "
                         "CUDA tensors (or CPU ones under TRITON_INTERPRET=1)")
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"dtype {q.dtype} unsupported; use one of {SUPPORTED_DTYPES}")
    if INTERPRETED and q.dtype == torch.bfloat16:
        raise ValueError("bf16 is unsupported under TRITON_INTERPRET=1 (its interpreter "
                         "computes bf16 dots wrongly); run bf16 on a GPU")
    if not MIN_HEAD_DIM <= q.shape[-1] <= MAX_HEAD_DIM:
        raise ValueError(f"head dim {q.shape[-1]} unsupported; need "
                         f"{MIN_HEAD_DIM} <= d <= {MAX_HEAD_DIM}")
    if not INTERPRETED and q.device.type != "cuda":
        raise ValueError(f"the Triton kernels need CUDA tensors, got {q.device} (set "
                         "TRITON_INTERPRET=1 before importing systems to run them on the CPU)")


def dot_precision(dtype: torch.dtype) -> str:
    # fp32 runs each dot as three TF32 tensor-core products (hi*hi + hi*lo + lo*hi), which
    # keeps fp32-level error where one TF32 product would cost ~1e-3; FMA-unit ("ieee")
    # dots were 2-7x slower than PyTorch's fp32 reference at d >= 64.
    return "tf32x3" if dtype == torch.float32 else "tf32"


# Output buffers: every element is written by a kernel (tests poison them through these).
def _empty_like(t: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    return torch.empty_like(t, dtype=dtype)  # several times cheaper on the host than empty


def _new_empty(like: torch.Tensor, shape: tuple[int, ...],
               dtype: torch.dtype | None = None) -> torch.Tensor:
    return like.new_empty(shape, dtype=dtype)


def head_dim_tiles(head_dim: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_T): the kernels' tile widths along a head dim. A power of two is one
    tile. Otherwise the dim splits into the largest power of two below it and a tail tile
    (a power of two, at least 16 columns: a dot's least), where the two together are
    narrower than the next power of two: 80 = 64 + 16 and 96 = 64 + 32, but 112 pads to
    128 (64 + 64 would do the same work). BLOCK_T = 0: no split."""
    padded = _next_power_of_2(head_dim)
    if padded == head_dim:
        return head_dim, 0
    main = padded // 2
    tail = max(MIN_HEAD_DIM, _next_power_of_2(head_dim - main))
    return (main, tail) if main + tail < padded else (padded, 0)


def _tail(name: str) -> str:
    """The tail descriptor parameter of a descriptor parameter: k_tiles -> k_tail_tiles."""
    return name.removesuffix("_tiles") + "_tail_tiles"


def _descriptor_head_dim(d: int, dtype: torch.dtype) -> int:
    """d rounded up so that a row is a multiple of 16 bytes, as TMA descriptors need."""
    per_16_bytes = 16 // dtype.itemsize
    return -(-d // per_16_bytes) * per_16_bytes


MatrixStrides = tuple[int, int, int]  # (batch, head, seq) strides, in elements


def _matrix_dims(shape: torch.Size) -> tuple[int, int]:
    """(B, H): a (..., seq, d) shape's leading dims as batch x heads (outer ones merged)."""
    if len(shape) == 2:
        return 1, 1
    return math.prod(shape[:-3]), shape[-3]


@functools.lru_cache(maxsize=4096)
def _matrix_strides(shape: torch.Size, strides: tuple[int, ...], itemsize: int,
                    head_dim: int) -> MatrixStrides | None:
    """The (batch, head, seq) strides of a tensor of this shape and strides seen as
    (B, H, seq, head_dim) matrices (`_matrix_dims`), or None when the kernels cannot read
    or write it in place: rows must be head_dim unit-stride elements, the batch dims must
    merge into one, and every stride must be a positive multiple of 16 bytes (TMA's rule).
    A dim of size 1 takes its packed stride: no address uses it, but TMA checks it."""
    if shape[-1] != head_dim or strides[-1] != 1:
        return None
    seq, stride_s = shape[-2], strides[-2]
    heads, stride_h = (shape[-3], strides[-3]) if len(shape) > 2 else (1, 0)
    batch = [(n, step) for n, step in zip(shape[:-3], strides[:-3], strict=True)
             if n != 1]
    if any(outer != inner * n for (_, outer), (n, inner) in itertools.pairwise(batch)):
        return None
    stride_b = batch[-1][1] if batch else 0
    if seq == 1:
        stride_s = head_dim
    if heads == 1:
        stride_h = stride_s * seq
    if not batch:
        stride_b = stride_h * heads
    merged = (stride_b, stride_h, stride_s)
    per_16_bytes = 16 // itemsize
    if any(step <= 0 or step % per_16_bytes for step in merged):
        return None
    return merged


def _packed(like: torch.Tensor, head_dim: int, itemsize: int
            ) -> tuple[torch.Size, MatrixStrides]:
    """The shape and matrix strides of a packed tensor like `like` with head_dim columns:
    the zero-padded copy of an input, or the buffer of an output, the kernels cannot use
    in place."""
    shape = torch.Size((*like.shape[:-1], head_dim))
    packed = torch.empty(shape, device="meta")
    return shape, _matrix_strides(shape, packed.stride(), itemsize, head_dim)


def _padded_copy(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """A zero-padded packed copy of t with head_dim columns: pad columns add 0 to every
    score and produce output columns that are cut off."""
    padded = t.new_zeros(*t.shape[:-1], head_dim)
    padded[..., :t.shape[-1]] = t
    return padded


@dataclass(frozen=True)
class _Reading:
    """How the kernels read an input of one layout: in place, or from a padded packed copy
    (`copy_to`, its head dim); `strides` are those of what they read."""

    strides: MatrixStrides
    copy_to: int | None

    @classmethod
    def of(cls, t: torch.Tensor, aligned: bool, head_dim: int, itemsize: int) -> _Reading:
        """In place when the kernels can read t's layout and t starts 16-byte aligned
        (every pointer a launcher sees is aligned, see `KernelLauncher`)."""
        strides = _matrix_strides(t.shape, t.stride(), itemsize, head_dim)
        if strides is not None and aligned:
            return cls(strides, None)
        return cls(_packed(t, head_dim, itemsize)[1], head_dim)

    def read(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.copy_to is None else _padded_copy(t, self.copy_to)


def _in_place(readings: tuple[_Reading, ...], writings: tuple[_Writing, ...]) -> bool:
    """Whether the kernels read every input and write every output in place."""
    return (all(r.copy_to is None for r in readings)
            and all(w.buffer_shape is None for w in writings))


@dataclass(frozen=True)
class _Writing:
    """Where the kernels write an output shaped and laid out like an input of one layout
    (`torch.empty_like`, as the ops' fake versions promise): into it, or into a padded
    packed buffer of `buffer_shape` whose first d columns are then copied into it."""

    strides: MatrixStrides
    buffer_shape: torch.Size | None

    @classmethod
    def of(cls, like: torch.Tensor, head_dim: int, itemsize: int) -> _Writing:
        out = torch.empty_like(like, device="meta")
        strides = _matrix_strides(out.shape, out.stride(), itemsize, head_dim)
        if strides is not None:
            return cls(strides, None)
        shape, strides = _packed(like, head_dim, itemsize)
        return cls(strides, shape)

    def allocate(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the output, the buffer the kernel writes). Every element of the buffer is
        written by a kernel (tests poison them through `_empty_like` and `_new_empty`)."""
        out = _empty_like(like)
        return out, out if self.buffer_shape is None else _new_empty(like, self.buffer_shape)

    def finish(self, out: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
        if buffer is not out:
            out.copy_(buffer[..., :out.shape[-1]])
        return out


@dataclass(frozen=True)
class _Problem:
    """One attention problem. Shapes, dtype, device, mask and tiles fix most of what
    Triton specialises on; the tensors' strides fix the rest, so each kernel has one
    launcher per problem and strides (`KernelLauncher`: compiled once, launched directly)."""

    batch: int
    heads: int
    n_q: int
    n_k: int
    d: int
    dtype: torch.dtype
    device: torch.device
    is_causal: bool
    config: FlashConfig
    launchers: dict[tuple[object, ...], KernelLauncher] = field(
        default_factory=dict, compare=False, hash=False, repr=False)

    @functools.cached_property
    def head_dim(self) -> int:
        return _descriptor_head_dim(self.d, self.dtype)

    @functools.cached_property
    def split(self) -> bool:
        """Whether the kernels split the head dim into BLOCK_D columns and a BLOCK_T tail
        (`head_dim_tiles`) rather than padding it to a power of two."""
        return head_dim_tiles(self.head_dim)[1] > 0

    @functools.cached_property
    def block_d(self) -> int:
        return head_dim_tiles(self.head_dim)[0]

    @functools.cached_property
    def block_t(self) -> int:
        # Without a split the tail is a placeholder shape that nothing reads.
        return head_dim_tiles(self.head_dim)[1] or MIN_HEAD_DIM

    @functools.cached_property
    def group(self) -> int:
        """Matrices per section of the forward's tile order (`shared.tile_order`)."""
        return section_matrices(self.batch * self.heads, self.n_k, self.head_dim,
                                self.dtype.itemsize, self.device)

    @functools.cached_property
    def sizes(self) -> tuple[int, int, int]:
        """The kernels' trailing size arguments."""
        return self.heads, self.n_q, self.n_k

    def reading(self, t: torch.Tensor, aligned: bool) -> _Reading:
        return _Reading.of(t, aligned, self.head_dim, self.dtype.itemsize)

    def writing(self, like: torch.Tensor) -> _Writing:
        return _Writing.of(like, self.head_dim, self.dtype.itemsize)

    def tiles(self, name: str, strides: MatrixStrides, seq: int, block_rows: int
              ) -> dict[str, DescriptorLayout]:
        """The layouts of the descriptors `name` and, under a split, `name`'s tail
        (`<operand>_tail_tiles`), reading block_rows x BLOCK_D (BLOCK_T) tiles of one
        matrix of an operand with these strides."""
        shape = (self.batch, self.heads, seq, self.head_dim)
        layouts = {name: (shape, (*strides, 1), [1, 1, block_rows, self.block_d])}
        if self.split:
            layouts[_tail(name)] = (shape, (*strides, 1), [1, 1, block_rows, self.block_t])
        return layouts

    def launcher(self, kernel: triton.JITFunction, tiles: TileConfig, seq: int, block: int,
                 strides: tuple[MatrixStrides, ...], descriptors: dict[str, DescriptorLayout],
                 **constexprs: object) -> KernelLauncher:
        """The kernel over a (matrices, tiles of `block` rows of `seq`) grid, for tensors
        of these strides; `descriptors` are the layouts of its descriptor parameters, by
        name (calls pass those parameters' base tensors)."""
        key = (kernel, strides)
        launcher = self.launchers.get(key)
        if launcher is None:
            launcher = self.launchers[key] = KernelLauncher(
                kernel, (self.batch * self.heads, _cdiv(seq, block)),
                self.constexprs(tiles, **constexprs), num_warps=tiles.num_warps,
                num_stages=tiles.num_stages, device_index=self.device.index or 0,
                descriptors={kernel.arg_names.index(name): layout
                             for name, layout in descriptors.items()})
        return launcher

    def constexprs(self, tiles: TileConfig, **extra: object) -> dict[str, object]:
        """A kernel's compile-time arguments (its trailing parameters) for this problem and
        tiles; `extra` are the kernel's own (`dkdv_constexprs`)."""
        return {"SM_SCALE": self.d ** -0.5, "HEAD_DIM": self.head_dim, "BLOCK_D": self.block_d,
                "BLOCK_T": self.block_t, "SPLIT": self.split, "BLOCK_M": tiles.block_m,
                "BLOCK_N": tiles.block_n, "IS_CAUSAL": self.is_causal, **extra,
                "DOT_PRECISION": dot_precision(self.dtype)}

    def forward_constexprs(self) -> dict[str, object]:
        """The forward kernel's own: whether its tiles run in sections of matrices."""
        return {"SECTIONS": self.group < self.batch * self.heads}

    def dkdv_constexprs(self, tiles: TileConfig) -> dict[str, object]:
        """The dK/dV kernel's own: its programs walk key tiles, and the last query tile is
        partial unless block_m divides n_q."""
        return {"CHECK_Q_ROWS": self.n_q % tiles.block_m != 0}


@functools.lru_cache(maxsize=1024)
def _problem(batch: int, heads: int, n_q: int, n_k: int, d: int, dtype: torch.dtype,
             device: torch.device, is_causal: bool, config: FlashConfig | None) -> _Problem:
    config = config or default_config(d, dtype, batch * heads * _cdiv(n_q, 128), device)
    return _Problem(batch, heads, n_q, n_k, d, dtype, device, is_causal, config)


def _problem_of(q: torch.Tensor, k: torch.Tensor, is_causal: bool,
                config: FlashConfig | None) -> _Problem:
    shape = q.shape
    return _problem(*_matrix_dims(shape), shape[-2], k.shape[-2], shape[-1], q.dtype,
                    q.device, is_causal, config)


class _ForwardPlan:
    """The forward for inputs of one problem and layout (strides and alignment): what
    is read in place or copied, where o is written, the descriptors' layouts and the
    launcher are worked out once; a call allocates, launches and returns."""

    def __init__(self, problem: _Problem, tensors: tuple[torch.Tensor, ...],
                 aligned: tuple[bool, ...]) -> None:
        tiles = problem.config.forward
        self.q, self.k, self.v = (problem.reading(t, a) for t, a in zip(tensors, aligned,
                                                                         strict=True))
        self.o = problem.writing(tensors[0])
        self.launch = problem.launcher(
            flash_forward_kernel, tiles, problem.n_q, tiles.block_m,
            (self.q.strides, self.k.strides, self.v.strides, self.o.strides),
            {**problem.tiles("k_tiles", self.k.strides, problem.n_k, tiles.block_n),
             **problem.tiles("v_tiles", self.v.strides, problem.n_k, tiles.block_n)},
            **problem.forward_constexprs())
        self.lse_shape = tensors[0].shape[:-1]
        self.sizes = (*problem.sizes, problem.group)
        # A tail descriptor's argument: its operand under a split, None otherwise (the
        # kernels then compile the tails away).
        self.split = problem.split

    def _launch_args(self, q: object, k: object, v: object, o: object, lse: object
                     ) -> tuple[object, ...]:
        """The forward kernel's arguments, given the tensors it reads and writes (or the
        TensorSlots that stand for them)."""
        split = self.split
        return (q, *self.q.strides, k, v, k if split else None, v if split else None, o,
                *self.o.strides, lse, *self.sizes)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        o, buffer = self.o.allocate(q)
        lse = _new_empty(q, self.lse_shape, torch.float32)
        self.launch(*self._launch_args(self.q.read(q), self.k.read(k), self.v.read(v),
                                       buffer, lse))
        return self.o.finish(o, buffer), lse

    def replay_program(self) -> replay.Program | None:
        """This plan for replay (`replay.keep`), where it reads and writes in place:
        table (q, k, v, o, L)."""
        if not _in_place((self.q, self.k, self.v), (self.o,)):
            return None
        return replay.forward_program(
            self.launch.replay_launch(self._launch_args(*map(TensorSlot, range(5)))))


class _BackwardPlan:
    """The backward for tensors of one problem and layout, worked out once as
    `_ForwardPlan` is: a dQ pass over query tiles (it also writes D), then a dK/dV pass.
    Inputs are read (copied where needed) once for both."""

    def __init__(self, problem: _Problem, tensors: tuple[torch.Tensor, ...],
                 aligned: tuple[bool, ...]) -> None:
        q, k, v, _, _ = tensors
        self.readings = tuple(problem.reading(t, a) for t, a in zip(tensors, aligned,
                                                                    strict=True))
        rq, rk, rv, ro, rdo = (r.strides for r in self.readings)
        self.dq_out, self.dk_out, self.dv_out = (problem.writing(t) for t in (q, k, v))
        dq_tiles, dkdv_tiles = problem.config.backward_dq, problem.config.backward_dkdv
        self.dq_launch = problem.launcher(
            flash_backward_dq_kernel, dq_tiles, problem.n_q, dq_tiles.block_m,
            (rq, rk, rv, ro, rdo, self.dq_out.strides),
            {**problem.tiles("k_tiles", rk, problem.n_k, dq_tiles.block_n),
             **problem.tiles("v_tiles", rv, problem.n_k, dq_tiles.block_n)})
        self.dkdv_launch = problem.launcher(
            flash_backward_dkdv_kernel, dkdv_tiles, problem.n_k, dkdv_tiles.block_n,
            (rq, rk, rv, rdo, self.dk_out.strides, self.dv_out.strides),
            {**problem.tiles("q_tiles", rq, problem.n_q, dkdv_tiles.block_m),
             **problem.tiles("do_tiles", rdo, problem.n_q, dkdv_tiles.block_m)},
            **problem.dkdv_constexprs(dkdv_tiles))
        self.sizes = problem.sizes
        self.split = problem.split  # as in `_ForwardPlan`

    def read(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """(q, k, v, o, do) as the kernels read them."""
        return [r.read(t) for r, t in zip(self.readings, tensors, strict=True)]

    def _dq_args(self, q: object, k: object, v: object, o: object, do: object, lse: object,
                 delta: object, dq: object) -> tuple[object, ...]:
        """The dQ kernel's arguments, given the tensors it reads and writes (or the
        TensorSlots that stand for them)."""
        rq, _, _, ro, rdo = self.readings
        split = self.split
        return (q, *rq.strides, k, v, k if split else None, v if split else None, o,
                *ro.strides, do, *rdo.strides, lse, delta, dq, *self.dq_out.strides,
                *self.sizes)

    def _dkdv_args(self, q: object, k: object, v: object, do: object, lse: object,
                   delta: object, dk: object, dv: object) -> tuple[object, ...]:
        """The dK/dV kernel's arguments, as `_dq_args`."""
        _, rk, rv, _, _ = self.readings
        split = self.split
        return (q, k, *rk.strides, v, *rv.strides, do, q if split else None,
                do if split else None, lse, delta, dk, *self.dk_out.strides, dv,
                *self.dv_out.strides, *self.sizes)

    def dq(self, like_q: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           o: torch.Tensor, do: torch.Tensor, lse: torch.Tensor
           ) -> tuple[torch.Tensor, torch.Tensor]:
        """(dq laid out like `like_q`, D) from read inputs."""
        dq, buffer = self.dq_out.allocate(like_q)
        delta = _empty_like(lse)
        self.dq_launch(*self._dq_args(q, k, v, o, do, lse, delta, buffer))
        return self.dq_out.finish(dq, buffer), delta

    def dkdv(self, like_k: torch.Tensor, like_v: torch.Tensor, q: torch.Tensor,
             k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
             delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(dk, dv) laid out like `like_k` and `like_v`, from read inputs."""
        dk, dk_buffer = self.dk_out.allocate(like_k)
        dv, dv_buffer = self.dv_out.allocate(like_v)
        self.dkdv_launch(*self._dkdv_args(q, k, v, do, lse, delta, dk_buffer, dv_buffer))
        return self.dk_out.finish(dk, dk_buffer), self.dv_out.finish(dv, dv_buffer)

    def replay_program(self) -> replay.Program | None:
        """This plan for replay (`replay.keep`), where it reads and writes in place:
        table (q, k, v, o, L, do, then dq, D, dk, dv)."""
        if not _in_place(self.readings, (self.dq_out, self.dk_out, self.dv_out)):
            return None
        q, k, v, o, lse, do, dq, delta, dk, dv = map(TensorSlot, range(10))
        launches = [self.dq_launch.replay_launch(self._dq_args(q, k, v, o, do, lse, delta, dq)),
                    self.dkdv_launch.replay_launch(
                        self._dkdv_args(q, k, v, do, lse, delta, dk, dv))]
        # dq like q, D like L, dk like k, dv like v
        allocations = [replay.Allocation(like, replay.LIKE) for like in (0, 4, 1, 2)]
        return replay.program(allocations, launches, [6, 8, 9])

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                 lse: torch.Tensor, do: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q_in, k_in, v_in, o_in, do_in = self.read(q, k, v, o, do)
        dq, delta = self.dq(q, q_in, k_in, v_in, o_in, do_in, lse)
        dk, dv = self.dkdv(k, v, q_in, k_in, v_in, do_in, lse, delta)
        return dq, dk, dv


# Plans by everything they depend on; they hold layouts and launchers, no tensors.
_PLANS: dict[tuple[object, ...], _ForwardPlan | _BackwardPlan] = {}
_MAX_PLANS = 4096


def _plan(plan_type: type[_ForwardPlan] | type[_BackwardPlan], tensors: tuple[torch.Tensor, ...],
          is_causal: bool, config: FlashConfig | None) -> _ForwardPlan | _BackwardPlan:
    """The plan of this type for these tensors ((q, k, v) or (q, k, v, o, do)), made on
    first use: kept by the problem's shapes, dtype, device, mask and tiles, and each
    tensor's strides and start alignment."""
    q, k = tensors[0], tensors[1]
    aligned = tuple([t.data_ptr() % 16 == 0 for t in tensors])
    key = (plan_type, q.shape, k.shape, tuple([t.stride() for t in tensors]), q.dtype,
           q.device, is_causal, config, aligned)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = plan_type(_problem_of(q, k, is_causal, config), tensors, aligned)
    return plan


def forget_plans() -> None:
    """Drops every plan and problem made so far: the next calls work out their launches
    again (after a change to `shared.tile_order`'s constants, say). Replay keeps its own
    (`replay.forget`)."""
    _PLANS.clear()
    _problem.cache_clear()


def _replayed_or_planned(kernels: int, plan_class: type[_ForwardPlan] | type[_BackwardPlan],
                         read: tuple[torch.Tensor, ...], tensors: list[torch.Tensor],
                         is_causal: bool, config: FlashConfig | None
                         ) -> tuple[torch.Tensor, ...]:
    """The plan's outputs for `tensors` (its call's arguments; `read`, the inputs it plans
    for). With the default tiles, `replay.replayed_or_run`: replayed from C++ when a
    Program of this layout is kept, else planned and launched in Python, keeping the
    Program for the next call."""
    return replay.replayed_or_run(kernels, is_causal, tensors,
                                  lambda: _plan(plan_class, read, is_causal, config),
                                  replayable=config is None)


def flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
    config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(o, L) for checked inputs; o is laid out like q (`torch.empty_like`), L is the
    natural-log log-sum-exp, fp32, (..., n_queries), packed. With the default tiles a
    layout's calls after the first are replayed from C++ (`replay`)."""
    return _replayed_or_planned(replay.TRITON_FORWARD, _ForwardPlan, (q, k, v), [q, k, v],
                                is_causal, config)


def flash_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool = False, config: FlashConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv), each laid out like its input: a dQ pass over query tiles (it also
    writes D), then a dK/dV pass. lse must be flash_forward's (packed, freshly allocated,
    so 16-byte aligned); do may have any strides (autograd may hand over an expanded or
    transposed gradient). Replayed as `flash_forward` is."""
    return _replayed_or_planned(replay.TWO_PASS_BACKWARD, _BackwardPlan, (q, k, v, o, do),
                                [q, k, v, o, lse, do], is_causal, config)


def backward_dq(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool, tiles: TileConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dq, D) with `tiles`, where D = rowsum(o * do), fp32, shaped like L (for tuning)."""
    plan = _plan(_BackwardPlan, (q, k, v, o, do), is_causal, FlashConfig(tiles, tiles, tiles))
    return plan.dq(q, *plan.read(q, k, v, o, do), lse)


def backward_dkdv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor, lse: torch.Tensor,
    delta: torch.Tensor, is_causal: bool, tiles: TileConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dk, dv) with `tiles` (for tuning). The dK/dV pass does not read o: do stands in
    for it in the plan (it has o's shape)."""
    plan = _plan(_BackwardPlan, (q, k, v, do, do), is_causal, FlashConfig(tiles, tiles, tiles))
    q_in, k_in, v_in, _, do_in = plan.read(q, k, v, do, do)
    return plan.dkdv(k, v, q_in, k_in, v_in, do_in, lse, delta)

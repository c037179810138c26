"""Eager attention calls replayed from C++ (`host_path/replay.py`, `replay.cpp`).

A layout's first call plans and launches in Python and keeps its Program; later calls of
that layout are replayed. Replay runs the same kernels on the same inputs, so its outputs
must equal the Python path's bit for bit (dQ of the unordered Gluon backward aside), with
every output element written (outputs start as NaN here). Every kernel pair the dispatch
can pick, and the unordered variant's, is served so on an sm_90 GPU; what the Gluon plans
describe for replay is checked against what they launch on any machine.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from test_attention_dispatch import hopper

from systems.attention import dispatch, functions
from systems.attention.dispatch import (
    BACKWARDS,
    FORWARDS,
    GLUON,
    GLUON_ORDERED,
    GLUON_UNORDERED,
    HOPPER,
    TRITON,
    TWO_PASS,
    Kernels,
    Rule,
)
from systems.attention.functions import (
    FlashAttentionTriton,
    FlashAttentionTritonKernels,
    FlashAttentionTritonUnordered,
)
from systems.attention.gluon import backward as gluon_backward_module
from systems.attention.gluon import forward as gluon_forward_module
from systems.attention.gluon.backward import read_in_place
from systems.attention.host_path import replay
from systems.kernel_runtime.launcher import TensorSlot
from systems.kernel_runtime.native_build import load_extension

Tensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _projection_views(device: torch.device) -> Tensors:
    """(batch, heads, seq, d) views of (batch, seq, heads, d) tensors, as the model has."""
    return tuple(torch.randn(2, 40, 4, 16, device=device, dtype=torch.bfloat16).transpose(1, 2)
                 for _ in range(4))


def _random(*shapes: tuple[int, ...], dtype: torch.dtype) -> Callable[[torch.device], Tensors]:
    q_shape, kv_shape = shapes

    def make(device: torch.device) -> Tensors:
        return tuple(torch.randn(shape, device=device, dtype=dtype)
                     for shape in (q_shape, kv_shape, kv_shape, q_shape))

    return make


# name: (inputs q, k, v, do; causal). Packed and strided layouts, a split head dim (80),
# n_q != n_k with a split (48) in fp32, and a long sequence at d = 128.
LAYOUTS = {
    "packed-bf16-causal": (_random((2, 4, 256, 64), (2, 4, 256, 64), dtype=torch.bfloat16),
                           True),
    "projection-views-bf16": (_projection_views, True),
    "d80-fp16-full": (_random((2, 2, 96, 80), (2, 2, 96, 80), dtype=torch.float16), False),
    "cross-d48-fp32": (_random((1, 77, 48), (1, 130, 48), dtype=torch.float32), False),
    "long-d128-bf16": (_random((1, 1, 1024, 128), (1, 1, 1024, 128), dtype=torch.bfloat16),
                       True),
}


# What autograd calls the node of a call served whole in C++ (replay.attend).
CPP_NODE = "torch::autograd::CppNode<systems::FlashAttentionTriton>"


def _forward_backward(q, k, v, do, is_causal, attention=FlashAttentionTriton.apply
                      ) -> list[torch.Tensor]:
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = attention(q, k, v, is_causal)
    return [o, *torch.autograd.grad(o, (q, k, v), do)]


@pytest.fixture(autouse=True, scope="module")
def _replay_serves_on_this_gpu() -> None:
    """Replay passes what the kernels Triton builds for sm_90 take; built for another GPU
    (sm_80's pointer loads in place of descriptors, say) they may take more, and every call
    then runs in Python, by design. There these tests skip with the reason; on sm_90 a
    replay that serves nothing is a failure of the tests below."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() == (9, 0):
        return
    replay.forget()
    before = replay.replays()
    inputs = _random((1, 1, 128, 64), (1, 1, 128, 64), dtype=torch.float16)(
        torch.device("cuda"))
    for _ in range(2):
        _forward_backward(*inputs, True)
    if replay.replays() == before:
        pytest.skip(f"replay is off on {torch.cuda.get_device_name()}: its kernels' builds "
                    "take arguments replay does not pass (they run in Python)")


def _python_path(q, k, v, do, is_causal, attention=FlashAttentionTriton.apply
                 ) -> list[torch.Tensor]:
    replay.set_enabled(False)
    try:
        return _forward_backward(q, k, v, do, is_causal, attention)
    finally:
        replay.set_enabled(True)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_replay_serves_repeat_calls_with_the_python_paths_results(layout, device,
                                                                   poisoned_outputs):
    make, is_causal = LAYOUTS[layout]
    inputs = make(device)
    replay.forget()
    planned = _forward_backward(*inputs, is_causal)  # the Python path, which keeps Programs
    before = replay.replays()
    replayed = _forward_backward(*inputs, is_causal)
    assert replay.replays() - before == 2, "forward and backward were not both replayed"
    assert replayed[0].grad_fn.name() == CPP_NODE
    for name, ours, expected in zip(("o", "dq", "dk", "dv"), replayed, planned, strict=True):
        assert ours.shape == expected.shape and ours.stride() == expected.stride(), name
        assert torch.equal(ours, expected), f"{name}: replay differs from the Python path"


@pytest.mark.gpu
def test_replay_encodes_each_address_s_descriptors(device, poisoned_outputs):
    """Descriptors hold a base address: calls with new tensors of one layout, more of them
    than replay keeps encodings for, must each read their own tensors."""
    make, is_causal = LAYOUTS["packed-bf16-causal"]
    problems = [make(device) for _ in range(20)]
    _forward_backward(*problems[0], is_causal)  # keeps the Programs
    before = replay.replays()
    replayed = [_forward_backward(*inputs, is_causal) for inputs in problems]
    assert replay.replays() - before == 2 * len(problems)
    planned = [_python_path(*inputs, is_causal) for inputs in problems]
    for ours, expected in zip(replayed, planned, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(ours, expected, strict=True))


@pytest.mark.gpu
def test_replay_launches_on_the_current_stream(device):
    """Inputs written on a side stream after a long wait must be read after it: replay
    launches on the caller's current stream (PyTorch's streams do not wait for others)."""
    make, is_causal = LAYOUTS["long-d128-bf16"]
    q, k, v, do = make(device)
    expected = _forward_backward(q, k, v, do, is_causal)  # keeps the Programs
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        late_q = q * 1
        before = replay.replays()
        replayed = _forward_backward(late_q, k, v, do, is_causal)
    side.synchronize()
    assert replay.replays() - before == 2
    assert all(torch.equal(a, b) for a, b in zip(replayed, expected, strict=True))


@pytest.mark.gpu
def test_cpp_node_hands_backward_to_python_until_a_backward_program_is_kept(
        device, poisoned_outputs):
    """A layout first called without grad keeps only its forward Program: the C++ node's
    first backward runs in Python (which keeps the backward Program), later ones replay."""
    make, is_causal = LAYOUTS["packed-bf16-causal"]
    inputs = make(device)
    expected = _python_path(*inputs, is_causal)
    replay.forget()
    with torch.no_grad():
        FlashAttentionTriton.apply(*inputs[:3], is_causal)  # keeps the forward Program only
    served = []
    for _ in range(2):
        before = replay.replays()
        results = _forward_backward(*inputs, is_causal)
        served.append(replay.replays() - before)
        assert results[0].grad_fn.name() == CPP_NODE
        assert all(torch.equal(a, b) for a, b in zip(results, expected, strict=True))
    assert served == [1, 2], "backward: Python first, then replayed"


@pytest.mark.gpu
def test_cpp_node_gradients_follow_autograd_rules(device, poisoned_outputs):
    """The C++ node behaves as the Python Function: only inputs that require grad get
    gradients, retain_graph allows a second backward, a gradient of any layout works (an
    expanded one from .sum() is copied in Python), an input modified in place after the
    forward is refused, and so is a second derivative."""
    make, is_causal = LAYOUTS["projection-views-bf16"]
    q, k, v, do = make(device)
    expected = _python_path(q, k, v, do, is_causal)
    _forward_backward(q, k, v, do, is_causal)  # keeps the Programs

    frozen_kv_q = q.detach().requires_grad_()
    o = FlashAttentionTriton.apply(frozen_kv_q, k, v, is_causal)
    assert o.grad_fn.name() == CPP_NODE
    o.backward(do, retain_graph=True)
    first = frozen_kv_q.grad.clone()
    frozen_kv_q.grad = None
    o.backward(do)
    assert torch.equal(first, expected[1]) and torch.equal(frozen_kv_q.grad, expected[1])

    q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
    FlashAttentionTriton.apply(q_, k_, v_, is_causal).float().sum().backward()
    replay.set_enabled(False)
    try:
        q_ref, k_ref, v_ref = (t.detach().requires_grad_() for t in (q, k, v))
        FlashAttentionTriton.apply(q_ref, k_ref, v_ref, is_causal).float().sum().backward()
    finally:
        replay.set_enabled(True)
    for ours, reference in ((q_, q_ref), (k_, k_ref), (v_, v_ref)):
        assert torch.equal(ours.grad, reference.grad)

    changed = q.detach().clone().requires_grad_()
    leaf = changed * 1
    o = FlashAttentionTriton.apply(leaf, k, v, is_causal)
    assert o.grad_fn.name() == CPP_NODE
    leaf.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        o.backward(do)

    q_, k_, v_ = (t.detach().requires_grad_() for t in (q, k, v))
    o = FlashAttentionTriton.apply(q_, k_, v_, is_causal)
    assert o.grad_fn.name() == CPP_NODE
    grads = torch.autograd.grad(o, (q_, k_, v_), do, create_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected[1:], strict=True))
    with pytest.raises(RuntimeError, match="does not support double backward"):
        grads[0].float().sum().backward()


@pytest.mark.gpu
@pytest.mark.parametrize("kept", [True, False], ids=["programs-kept", "programs-kept-meanwhile"])
def test_attention_serves_new_threads_calling_at_once(device, kept):
    """Threads calling attention at once, each new (no CUDA context current until a call
    makes one): with Programs kept beforehand their first call is replayed from C++, else
    it takes the Python path while other threads keep Programs. Autograd's device thread
    runs the C++ nodes' backwards without the GIL meanwhile. Every call must give the
    Python path's results."""
    problems = [(make(device), is_causal) for make, is_causal in LAYOUTS.values()]
    expected = [_python_path(*inputs, is_causal) for inputs, is_causal in problems]
    replay.forget()
    if kept:
        for inputs, is_causal in problems:
            _forward_backward(*inputs, is_causal)
    before = replay.replays()
    failures: list[str] = []

    def work(index: int) -> None:
        inputs, is_causal = problems[index]
        try:
            for _ in range(10):
                got = _forward_backward(*inputs, is_causal)
                if not all(torch.equal(a, b) for a, b in zip(got, expected[index], strict=True)):
                    failures.append(f"layout {index}: results differ")
        except Exception as error:  # reported below: a thread's exception is otherwise lost
            failures.append(f"layout {index}: {error!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(problems))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert replay.replays() - before > 0


def test_replay_extension_builds_and_refuses_malformed_programs():
    """On any machine with a C++ compiler: the extension builds, finds no Program for
    tensors it was not given one for, and refuses a Program that points outside its table."""
    module = load_extension("attention_replay", Path(replay.__file__).with_name("replay.cpp"))
    t = torch.ones(4)
    assert module.replay(replay.TRITON_FORWARD, False, [t]) is None
    assert module.attend(t, t, t, False, replay.GLUON_FORWARD,
                         replay.GLUON_ORDERED_BACKWARD) is None
    every_kind = [replay.Allocation(0, replay.LIKE), replay.Allocation(0, replay.ROW_STATISTICS),
                  replay.Allocation(0, replay.FLOAT32_LIKE), replay.Allocation(0, replay.ZEROS, 3)]
    module.add_program(replay.GLUON_ORDERED_BACKWARD, True, [t], every_kind, [], [4])
    assert module.replay(replay.GLUON_ORDERED_BACKWARD, True, [t]) is None  # not on CUDA
    module.clear()
    with pytest.raises(ValueError, match="allocation like an unknown tensor"):
        module.add_program(0, False, [t], [replay.Allocation(3, replay.LIKE)], [], [])
    with pytest.raises(ValueError, match="unknown allocation kind"):
        module.add_program(0, False, [t], [replay.Allocation(0, 9)], [], [])
    with pytest.raises(ValueError, match="zeros need a positive number of elements"):
        module.add_program(0, False, [t], [replay.Allocation(0, replay.ZEROS)], [], [])
    with pytest.raises(ValueError, match="pointer to an unknown tensor"):
        module.add_program(0, False, [t], [], [(0, [1, 1, 1], 32, 0, [(0, 5, 0)], [])], [])
    with pytest.raises(ValueError, match="unknown output"):
        module.add_program(0, False, [t], [replay.Allocation(0, replay.LIKE)], [], [2])


# ---- every kernel pair ----------------------------------------------------------------

def _named(kernels: Kernels) -> Callable[..., torch.Tensor]:
    return lambda q, k, v, c: FlashAttentionTritonKernels.apply(q, k, v, c, kernels.forward,
                                                                kernels.backward)


def _public_with_table(kernels: Kernels, monkeypatch) -> Callable[..., torch.Tensor]:
    """FlashAttentionTriton.apply with a table that names `kernels` at every causal bf16
    shape of the head dims the Gluon backward runs natively."""
    monkeypatch.setattr(dispatch, "TABLE", tuple(
        Rule(HOPPER, torch.bfloat16, d, min_seq=0, min_tokens=0, kernels=kernels)
        for d in (64, 80, 96, 128)))
    return FlashAttentionTriton.apply


# name: (the kernels it runs at d = 128, how a caller reaches them). Every pair through
# FlashAttentionTritonKernels, the table's pairs through FlashAttentionTriton, and the
# unordered variant.
ENTRIES = {
    **{f"kernels-{f}+{b}": (Kernels(f, b), lambda mp, f=f, b=b: _named(Kernels(f, b)))
       for f, b in itertools.product(FORWARDS, BACKWARDS)},
    **{f"public-{f}+{GLUON_ORDERED}": (
        Kernels(f, GLUON_ORDERED),
        lambda mp, f=f: _public_with_table(Kernels(f, GLUON_ORDERED), mp)) for f in FORWARDS},
    "unordered-variant": (Kernels(GLUON, GLUON_UNORDERED),
                          lambda mp: FlashAttentionTritonUnordered.apply),
}


@hopper
@pytest.mark.parametrize("entry", list(ENTRIES))
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_replay_serves_every_kernel_pair_with_the_python_paths_results(
        entry, head_dim, device, monkeypatch, poisoned_outputs, poisoned_gluon_outputs):
    """A second call of a layout is replayed whole (forward and the pair's backward) under
    the C++ node, with the Python path's outputs: bit for bit, but for the unordered dQ
    (close: its shares add in arrival order). d = 64 has no Gluon forward (the unordered
    variant runs the Triton one there); at d = 80 the Gluon backward reads each tensor
    through a second descriptor, its tail's, and the Gluon forward, asked for by name,
    reads copies padded to 128, which are not replayed."""
    kernels, make = ENTRIES[entry]
    if entry == "unordered-variant":
        kernels = dispatch.with_gluon_backward(torch.empty(1, head_dim), GLUON_UNORDERED)
    if not dispatch.runnable(kernels, HOPPER, torch.bfloat16, head_dim, 256, True):
        pytest.skip(f"{kernels.name} does not take d = {head_dim}")
    attention = make(monkeypatch)
    inputs = _random((2, 3, 256, head_dim), (2, 3, 256, head_dim), dtype=torch.bfloat16)(device)
    expected = _python_path(*inputs, True, attention)
    replay.forget()
    _forward_backward(*inputs, True, attention)  # the Python path, which keeps Programs
    before = replay.replays()
    replayed = _forward_backward(*inputs, True, attention)
    padded_forward = (kernels.forward == GLUON
                      and gluon_forward_module.forward_head_dim(head_dim) != head_dim)
    expected_replays = 1 if padded_forward else 2
    assert replay.replays() - before == expected_replays, "not every kernel was replayed"
    # a replayed forward hands its backward to the C++ node; a Python one keeps its own
    assert (replayed[0].grad_fn.name() == CPP_NODE) != padded_forward
    for name, ours, reference in zip(("o", "dq", "dk", "dv"), replayed, expected, strict=True):
        assert ours.shape == reference.shape and ours.stride() == reference.stride(), name
        if name == "dq" and kernels.backward == GLUON_UNORDERED:
            torch.testing.assert_close(ours, reference)  # NaN (unwritten) fails too
        else:
            assert torch.equal(ours, reference), f"{name}: replay differs from the Python path"


@hopper
@pytest.mark.parametrize("backward", [TWO_PASS, GLUON_ORDERED])
def test_cpp_node_hands_backward_to_the_pairs_python_backward(backward, device,
                                                              poisoned_outputs):
    """A layout first called without grad keeps only its forward Program: the C++ node's
    first backward runs the pair's backward in Python, which keeps that backward's
    Program (another backward's would not serve the next call), and later ones replay."""
    attention = _named(Kernels(GLUON, backward))
    inputs = _random((2, 2, 256, 128), (2, 2, 256, 128), dtype=torch.bfloat16)(device)
    expected = _python_path(*inputs, True, attention)
    replay.forget()
    with torch.no_grad():
        attention(*inputs[:3], True)  # keeps the forward Program only
    served = []
    for _ in range(2):
        before = replay.replays()
        results = _forward_backward(*inputs, True, attention)
        served.append(replay.replays() - before)
        assert results[0].grad_fn.name() == CPP_NODE
        assert all(torch.equal(a, b) for a, b in zip(results, expected, strict=True))
    assert served == [1, 2], "backward: Python first, then replayed"


@hopper
def test_a_kept_triton_forward_does_not_skip_the_gluon_refusals(device):
    """The default pair's calls keep the Triton forward's Program for a layout the Gluon
    backward cannot take (fp16): FlashAttentionTritonKernels still refuses that pair there,
    before it tries replay."""
    q, k, v, do = _random((2, 2, 256, 64), (2, 2, 256, 64), dtype=torch.float16)(device)
    _forward_backward(q, k, v, do, True)
    _forward_backward(q, k, v, do, True)
    with pytest.raises(ValueError, match="gluon_ordered backward needs bf16"):
        _named(Kernels(TRITON, GLUON_ORDERED))(q, k, v, True)


def test_every_kernel_has_its_own_programs_and_python_backward():
    """replay.cpp keys Programs by the kernels they run: each forward and backward has a
    number of its own, and the C++ node's Python backward for a number is that kernel's."""
    forwards = [functions._FORWARD_PROGRAMS[name] for name in FORWARDS]
    backwards = [functions._BACKWARD_PROGRAMS[name] for name in BACKWARDS]
    assert len(set(forwards + backwards)) == len(FORWARDS) + len(BACKWARDS)
    for name, number in functions._BACKWARD_PROGRAMS.items():
        assert functions._BACKWARDS_BY_PROGRAM[number] is functions._BACKWARDS[name]


# ---- what the Gluon plans describe, on any machine ---------------------------------------

class _Recorder:
    """A launcher that records its calls, and describes its replayed launch as the
    arguments it is given (TensorSlots and constants)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def __call__(self, *args: object) -> None:
        self.calls.append(args)

    def replay_launch(self, args: tuple[object, ...]) -> list[object]:
        return list(args)


def _allocated(allocation: replay.Allocation, table: list[torch.Tensor]
               ) -> tuple[torch.dtype, int]:
    """(dtype, elements) of what replay.cpp allocates for `allocation`."""
    like = table[allocation.like]
    if allocation.kind == replay.ZEROS:
        return torch.int32, allocation.elements
    if allocation.kind == replay.ROW_STATISTICS:
        return torch.float32, like.numel() // like.shape[-1]
    if allocation.kind == replay.FLOAT32_LIKE:
        return torch.float32, like.numel() * max(1, allocation.elements)
    return like.dtype, like.numel()


def _assert_program_matches_launches(plan, launchers: list[_Recorder],
                                     inputs: list[torch.Tensor],
                                     outputs: tuple[torch.Tensor, ...]) -> None:
    """Each launch the plan's Program describes passes, at every position, what its Python
    call (through `launchers`, in order) passed: the same constant, or the tensor's slot
    in the table (inputs, then allocations), where an allocation is what replay.cpp
    allocates: the same dtype and size, and zero where the Python path zeroed it."""
    allocations, launches, output_slots = plan.replay_program()
    table = list(inputs)
    slots = {t.data_ptr(): i for i, t in enumerate(inputs)}
    slots |= {t.data_ptr(): i for i, t in zip(output_slots, outputs, strict=True)}
    calls = [call for launcher in launchers for call in launcher.calls]
    assert len(calls) == len(launches)
    for call, described in zip(calls, launches, strict=True):
        assert len(call) == len(described)
        for arg, slot in zip(call, described, strict=True):
            if not isinstance(arg, torch.Tensor):
                assert slot == arg
                continue
            assert isinstance(slot, TensorSlot)
            if arg.data_ptr() in slots:
                assert slot.index == slots[arg.data_ptr()]
                continue
            allocation = allocations[slot.index - len(inputs)]
            assert _allocated(allocation, table) == (arg.dtype, arg.numel())
            if allocation.kind == replay.ZEROS:
                assert not arg.any()


def _bf16(*shape: int) -> torch.Tensor:
    return torch.randn(shape, dtype=torch.bfloat16)


@pytest.mark.parametrize("chains", [1, 3])
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
def test_gluon_backward_program_describes_the_launches_it_makes(ordered, head_dim, chains):
    """The Gluon backward's Program against its Python call, with recording launchers
    (no kernel runs): D, the dQ accumulators (one per chain), dq, dk, dv and the ordered
    dQ's zeroed semaphores, each at its place in every launch (at d = 80 the tail
    descriptors' tensors too)."""
    launch = gluon_backward_module._BackwardLaunch(_Recorder(), _Recorder(), _Recorder(),
                                                   semaphores=8 * chains if ordered else 1,
                                                   chains=chains)
    plan = gluon_backward_module._BackwardPlan(launch, seq=256, d=head_dim,
                                               head_dim=head_dim, in_place=True, poison=False)
    q, k, v, o, do = (_bf16(2, 256, head_dim) for _ in range(5))
    lse = torch.randn(2, 256)
    inputs = [q, k, v, o, lse, do]
    _assert_program_matches_launches(plan, [launch.prepare, launch.backward, launch.finish],
                                     inputs, plan(*inputs))


def test_gluon_forward_program_describes_the_launch_it_makes():
    launch = _Recorder()
    plan = gluon_forward_module._ForwardPlan(launch, seq=256, n_matrices=2, group=1, d=128,
                                             head_dim=128, in_place=True, poison=False)
    inputs = [_bf16(2, 256, 128) for _ in range(3)]
    _assert_program_matches_launches(plan, [launch], inputs, plan(*inputs))


def test_gluon_plans_replay_only_what_they_read_in_place():
    """In place: packed, 16-byte aligned, the kernels' own head dim; else the Python path
    pads or copies, and replay (which neither pads nor copies) leaves the layout to it."""
    packed = _bf16(2, 3, 256, 64)
    assert read_in_place([packed, packed], 64)
    assert not read_in_place([packed, _bf16(2, 256, 3, 64).transpose(1, 2)], 64)
    assert not read_in_place([_bf16(2, 256, 80)], 128)  # zero-padded to 128
    assert not read_in_place([_bf16(1 + 256 * 64)[1:].view(256, 64)], 64)  # 2 bytes in
    # Contiguous to torch, but a new tensor like it (replay's) would differ in a stride.
    assert not read_in_place([_bf16(256, 64).as_strided((1, 256, 64), (7, 64, 1))], 64)

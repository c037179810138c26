// Replays the attention kernels' launches from C++: the host path of an eager call after
// the first one of its layout.
//
// The Python side (flash_triton/launch.py, gluon/forward.py, gluon/backward.py) plans each
// problem and layout once and launches through Triton. Once a plan's kernels are compiled,
// it hands this module a Program, kept apart by the kernels it runs: the tensors to
// allocate, and for each kernel its CUfunction, grid, block, shared memory and every kernel
// parameter as a constant or as a reference to a tensor (a pointer, or a TMA descriptor of
// a fixed layout). A later call with tensors of the same layout (shapes, strides, dtypes,
// devices, 16-byte alignment) finds its Program here and runs it without entering Python:
// allocate, encode descriptors (once per base address), launch.
//
// `attend` is an attention Function's eager call, with a forward and a backward kernel, of a
// layout whose forward Program is kept: the forward is replayed, and autograd records a C++
// node whose backward replays the backward kernel's Program, so neither direction runs
// Python. Its backward calls back into Python (the registered `python_backward`, told the
// backward kernel) when no backward Program is kept yet for the gradient's layout, when
// replay is turned off, and when a graph of the backward is asked for (create_graph), where
// Python hands back gradients that refuse a second derivative.
//
// Built by systems.kernel_runtime.native_build on first use; the CUDA driver is opened at the first launch,
// so the module also loads on machines without one.

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>

#include <dlfcn.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda.h"

namespace {

// ---- the CUDA driver, opened on first use ----------------------------------------------

using LaunchKernel = CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, unsigned, CUstream, void**, void**);
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                 const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                 const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                 CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
using ErrorString = CUresult (*)(CUresult, const char**);
using CtxGetCurrent = CUresult (*)(CUcontext*);
using CtxSetCurrent = CUresult (*)(CUcontext);
using DeviceGet = CUresult (*)(CUdevice*, int);
using PrimaryCtxRetain = CUresult (*)(CUcontext*, CUdevice);

struct Driver {
  LaunchKernel launch = nullptr;
  EncodeTiled encode = nullptr;
  ErrorString error_string = nullptr;
  CtxGetCurrent get_context = nullptr;
  CtxSetCurrent set_context = nullptr;
  DeviceGet get_device = nullptr;
  PrimaryCtxRetain retain_primary = nullptr;

  static const Driver& get() {
    static const Driver driver = open();
    return driver;
  }

  void check(CUresult result, const char* what) const {
    if (result == CUDA_SUCCESS) return;
    const char* text = nullptr;
    if (error_string != nullptr) error_string(result, &text);
    throw std::runtime_error(std::string("attention replay: ") + what + " failed: " +
                             (text != nullptr ? text : std::to_string(result)));
  }

  // Where the calling thread has no current context (one that has made no CUDA runtime
  // call yet: a new thread, at times autograd's), makes the device's primary context,
  // PyTorch's, current, as the runtime would on its first call.
  void make_primary_context_current(int device) const {
    CUcontext context = nullptr;
    check(get_context(&context), "cuCtxGetCurrent");
    if (context != nullptr) return;
    CUdevice handle = 0;
    check(get_device(&handle, device), "cuDeviceGet");
    check(retain_primary(&context, handle), "cuDevicePrimaryCtxRetain");
    check(set_context(context), "cuCtxSetCurrent");
  }

 private:
  static Driver open() {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) throw std::runtime_error("attention replay: cannot open libcuda.so.1");
    Driver driver;
    driver.launch = reinterpret_cast<LaunchKernel>(dlsym(library, "cuLaunchKernel"));
    driver.encode = reinterpret_cast<EncodeTiled>(dlsym(library, "cuTensorMapEncodeTiled"));
    driver.error_string = reinterpret_cast<ErrorString>(dlsym(library, "cuGetErrorString"));
    driver.get_context = reinterpret_cast<CtxGetCurrent>(dlsym(library, "cuCtxGetCurrent"));
    driver.set_context = reinterpret_cast<CtxSetCurrent>(dlsym(library, "cuCtxSetCurrent"));
    driver.get_device = reinterpret_cast<DeviceGet>(dlsym(library, "cuDeviceGet"));
    driver.retain_primary =
        reinterpret_cast<PrimaryCtxRetain>(dlsym(library, "cuDevicePrimaryCtxRetain"));
    if (driver.launch == nullptr || driver.encode == nullptr || driver.get_context == nullptr ||
        driver.set_context == nullptr || driver.get_device == nullptr ||
        driver.retain_primary == nullptr) {
      throw std::runtime_error("attention replay: libcuda.so.1 lacks a function it needs");
    }
    return driver;
  }
};

// ---- what a Program is made of -----------------------------------------------------------

enum ParamKind : int64_t { kPointer = 0, kInt32 = 1, kInt64 = 2, kTensorMap = 3 };

// One kernel parameter: a tensor's address, an integer, or a tensor map (`map` indexes the
// launch's maps).
struct Param {
  ParamKind kind;
  int64_t tensor;  // kPointer: the tensor's index in the call's table
  int64_t value;   // kInt32, kInt64: the value; kTensorMap: the map's index
};

constexpr size_t kMaxRank = 5;
constexpr size_t kMapsPerAddress = 16;  // encodings kept per map, by base address

// A TMA descriptor of one tensor, in cuTensorMapEncodeTiled's terms (innermost dim first,
// byte strides of all but the innermost): only the base address changes between calls.
struct TensorMapSpec {
  int64_t tensor;
  CUtensorMapDataType dtype;
  cuuint32_t rank;
  std::array<cuuint64_t, kMaxRank> dims{};
  std::array<cuuint64_t, kMaxRank> byte_strides{};
  std::array<cuuint32_t, kMaxRank> box{};
  CUtensorMapSwizzle swizzle;
  CUtensorMapFloatOOBfill fill;

  struct Encoded {
    void* address;
    CUtensorMap map;
  };
  std::vector<std::unique_ptr<Encoded>> encoded;  // unique_ptr: CUtensorMap is 64-byte aligned

  const CUtensorMap* at(void* address) {
    for (const auto& entry : encoded) {
      if (entry->address == address) return &entry->map;
    }
    if (encoded.size() >= kMapsPerAddress) encoded.clear();
    auto entry = std::make_unique<Encoded>();
    entry->address = address;
    const std::array<cuuint32_t, kMaxRank> element_strides{1, 1, 1, 1, 1};
    const Driver& driver = Driver::get();
    driver.check(driver.encode(&entry->map, dtype, rank, address, dims.data(),
                               byte_strides.data(), box.data(), element_strides.data(),
                               CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_128B, fill),
                 "cuTensorMapEncodeTiled");
    encoded.push_back(std::move(entry));
    return &encoded.back()->map;
  }
};

constexpr size_t kMaxParams = 128;

struct Launch {
  CUfunction function;
  std::array<unsigned, 3> grid;
  unsigned threads;
  unsigned shared_bytes;
  std::vector<Param> params;
  std::vector<TensorMapSpec> maps;

  void run(const std::vector<at::Tensor>& tensors, CUstream stream) {
    if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0) return;
    union Slot {
      int32_t i32;
      int64_t i64;
      uint64_t address;
    };
    std::array<Slot, kMaxParams> slots;
    // Two more: the null scratch pointers every Triton kernel takes last.
    std::array<void*, kMaxParams + 2> pointers;
    for (size_t i = 0; i < params.size(); ++i) {
      const Param& param = params[i];
      switch (param.kind) {
        case kPointer:
          slots[i].address = reinterpret_cast<uint64_t>(tensors[param.tensor].data_ptr());
          pointers[i] = &slots[i];
          break;
        case kInt32:
          slots[i].i32 = static_cast<int32_t>(param.value);
          pointers[i] = &slots[i];
          break;
        case kInt64:
          slots[i].i64 = param.value;
          pointers[i] = &slots[i];
          break;
        case kTensorMap: {
          TensorMapSpec& spec = maps[param.value];
          pointers[i] = const_cast<CUtensorMap*>(spec.at(tensors[spec.tensor].data_ptr()));
          break;
        }
      }
    }
    uint64_t no_scratch = 0;
    pointers[params.size()] = &no_scratch;
    pointers[params.size() + 1] = &no_scratch;
    const Driver& driver = Driver::get();
    driver.check(driver.launch(function, grid[0], grid[1], grid[2], threads, 1, 1, shared_bytes,
                               stream, pointers.data(), nullptr),
                 "cuLaunchKernel");
  }
};

// replay.py's LIKE, ROW_STATISTICS, FLOAT32_LIKE, ZEROS.
enum AllocationKind : int64_t { kLike = 0, kRowStatistics = 1, kFloat32Like = 2, kZeros = 3 };

// A tensor a call allocates: empty_like(tensors[like]); (kRowStatistics) an fp32 tensor of
// its shape without the last dim, packed; (kFloat32Like) empty_like it in fp32, or where
// `elements` > 1 that many packed copies of its shape stacked; or (kZeros) `elements`
// int32 zeros on its device.
struct Allocation {
  int64_t like;
  AllocationKind kind;
  int64_t elements;
};

struct Program {
  std::vector<Allocation> allocations;
  std::vector<Launch> launches;
  std::vector<int64_t> outputs;  // indices into the call's table: inputs, then allocations
};

// ---- programs by layout ------------------------------------------------------------------

using Key = std::vector<int64_t>;

struct KeyHash {
  size_t operator()(const Key& key) const {
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t word : key) {
      hash = (hash ^ static_cast<uint64_t>(word)) * 1099511628211ull;
    }
    return static_cast<size_t>(hash);
  }
};

// What a Program depends on: the kernels it runs (replay.py's TRITON_FORWARD, ...), the
// mask, and each tensor's dtype, device, alignment, shape and strides.
Key key_of(int64_t kernels, bool is_causal, const std::vector<at::Tensor>& tensors) {
  Key key{kernels, is_causal ? 1 : 0};
  for (const at::Tensor& t : tensors) {
    key.push_back(static_cast<int64_t>(t.scalar_type()));
    key.push_back(t.is_cuda() ? t.get_device() : -1);
    key.push_back(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
    key.push_back(t.dim());
    for (int64_t size : t.sizes()) key.push_back(size);
    for (int64_t stride : t.strides()) key.push_back(stride);
  }
  return key;
}

constexpr size_t kMaxPrograms = 4096;

// Programs are read by callers holding the GIL and by autograd's threads running backward
// nodes without it, so every use of the state holds `mutex` (python_backward aside).
struct State {
  std::mutex mutex;
  std::unordered_map<Key, Program, KeyHash> programs;
  bool enabled = true;
  bool poison = false;
  int64_t replays = 0;
  PyObject* python_backward = nullptr;  // owned; set and read under the GIL, not `mutex`
};

State& state() {
  static State s;
  return s;
}

Program* find_program(State& s, int64_t kernels, bool is_causal,
                      const std::vector<at::Tensor>& tensors) {
  if (!s.enabled || tensors.empty() || !tensors[0].is_cuda()) return nullptr;
  auto found = s.programs.find(key_of(kernels, is_causal, tensors));
  return found == s.programs.end() ? nullptr : &found->second;
}

// Zeros go on the current stream, as every allocation's first use does.
at::Tensor allocate(const at::Tensor& like, const Allocation& allocation, bool poison) {
  at::Tensor out;
  switch (allocation.kind) {
    case kLike:
      out = at::empty_like(like);
      break;
    case kRowStatistics: {
      auto sizes = like.sizes();
      out = at::empty(sizes.slice(0, sizes.size() - 1), like.options().dtype(at::kFloat));
      break;
    }
    case kFloat32Like:
      if (allocation.elements > 1) {
        std::vector<int64_t> sizes{allocation.elements};
        sizes.insert(sizes.end(), like.sizes().begin(), like.sizes().end());
        out = at::empty(sizes, like.options().dtype(at::kFloat));
      } else {
        out = at::empty_like(like, like.options().dtype(at::kFloat));
      }
      break;
    case kZeros:  // counters the kernels read before writing: never poisoned
      return at::zeros({allocation.elements}, like.options().dtype(at::kInt));
  }
  if (poison) out.fill_(NAN);
  return out;
}

// Runs `program` on these tensors (the call's inputs): its outputs. The caller holds the
// state's mutex.
std::vector<at::Tensor> run_program(State& s, Program& program, std::vector<at::Tensor> tensors) {
  const c10::Device device = tensors[0].device();
  c10::DeviceGuard guard(device);
  Driver::get().make_primary_context_current(device.index());
  const auto* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  auto stream = static_cast<CUstream>(cuda->getStreamNativeHandle(cuda->getStream(device)));
  for (const Allocation& allocation : program.allocations) {
    tensors.push_back(allocate(tensors[allocation.like], allocation, s.poison));
  }
  for (Launch& launch : program.launches) launch.run(tensors, stream);
  ++s.replays;
  std::vector<at::Tensor> outputs;
  outputs.reserve(program.outputs.size());
  for (int64_t index : program.outputs) outputs.push_back(tensors[index]);
  return outputs;
}

// The outputs of the kernels' Program for these tensors, or None when there is none yet.
std::optional<std::vector<at::Tensor>> replay(int64_t kernels, bool is_causal,
                                              std::vector<at::Tensor> tensors) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  Program* program = find_program(s, kernels, is_causal, tensors);
  if (program == nullptr) return std::nullopt;
  return run_program(s, *program, std::move(tensors));
}

// (dq, dk, dv) from Python's backward with these kernels, for the calls replay does not
// serve.
std::vector<at::Tensor> python_backward(const std::vector<at::Tensor>& tensors, bool is_causal,
                                        int64_t kernels) {
  pybind11::gil_scoped_acquire gil;
  PyObject* callback = state().python_backward;  // set and read under the GIL only
  if (callback == nullptr) {
    throw std::runtime_error("attention replay: no Python backward registered");
  }
  try {
    // The borrowed handle holds a reference for the call: set_python_backward may replace
    // the callback while Python code in it has released the GIL.
    pybind11::object grads = pybind11::reinterpret_borrow<pybind11::function>(callback)(
        tensors[0], tensors[1], tensors[2], tensors[3], tensors[4], tensors[5], is_causal,
        kernels);
    return grads.cast<std::vector<at::Tensor>>();
  } catch (pybind11::error_already_set& error) {
    // Rethrown as a C++ error so that the Python exception is released under the GIL.
    throw std::runtime_error(error.what());
  }
}

}  // namespace

namespace systems {

// The autograd node of a replayed attention call; its name is what autograd reports.
struct FlashAttentionTriton : public torch::autograd::Function<FlashAttentionTriton> {
  // o for (q, k, v) from `forward_program`; saves what the backward reads, and which
  // kernels it runs (`backward_kernels`).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v, bool is_causal,
                            Program* forward_program, int64_t backward_kernels) {
    std::vector<at::Tensor> o_lse;
    {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mutex);
      o_lse = run_program(s, *forward_program, {q, k, v});
    }
    ctx->save_for_backward({q, k, v, o_lse[0], o_lse[1]});
    ctx->saved_data["is_causal"] = is_causal;
    ctx->saved_data["backward_kernels"] = backward_kernels;
    return o_lse[0];
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    std::vector<at::Tensor> tensors = ctx->get_saved_variables();  // q, k, v, o, L
    tensors.push_back(grads[0]);
    const bool is_causal = ctx->saved_data["is_causal"].toBool();
    const int64_t kernels = ctx->saved_data["backward_kernels"].toInt();
    std::optional<std::vector<at::Tensor>> dq_dk_dv;
    // Grad mode on in a backward means create_graph: Python refuses second derivatives.
    if (!at::GradMode::is_enabled()) dq_dk_dv = replay(kernels, is_causal, tensors);
    if (!dq_dk_dv) dq_dk_dv = python_backward(tensors, is_causal, kernels);
    auto& g = *dq_dk_dv;
    return {g.at(0), g.at(1), g.at(2), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace systems

namespace {

// An attention call with the `forward` and `backward` kernels replayed with its autograd, or
// None when no forward Program is kept for this layout or replay is off. (replay.py leaves
// calls under functorch transforms, which refuse C++ autograd Functions, to the Python
// Function.)
std::optional<at::Tensor> attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 bool is_causal, int64_t forward, int64_t backward) {
  Program* program = nullptr;
  {
    // Not held through apply, which may run Python (saved-tensor hooks). The Program stays
    // valid until forward runs it: only Python callers, holding the GIL as this one does,
    // drop Programs.
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    program = find_program(s, forward, is_causal, {q, k, v});
  }
  if (program == nullptr) return std::nullopt;
  return systems::FlashAttentionTriton::apply(q, k, v, is_causal, program, backward);
}

// ---- building Programs from Python's description -----------------------------------------

// (tensor, dtype, dims, byte strides, box, swizzle, fill), innermost dim first.
using MapDescription = std::tuple<int64_t, int64_t, std::vector<int64_t>, std::vector<int64_t>,
                                  std::vector<int64_t>, int64_t, int64_t>;
// (function, grid, threads, shared bytes, params as (kind, tensor, value), maps)
using LaunchDescription =
    std::tuple<uint64_t, std::vector<int64_t>, int64_t, int64_t,
               std::vector<std::tuple<int64_t, int64_t, int64_t>>, std::vector<MapDescription>>;

void require(bool condition, const std::string& message) {
  if (!condition) throw std::invalid_argument("attention replay: " + message);
}

TensorMapSpec map_of(const MapDescription& description, size_t n_tensors) {
  const auto& [tensor, dtype, dims, byte_strides, box, swizzle, fill] = description;
  require(0 <= tensor && static_cast<size_t>(tensor) < n_tensors, "map of an unknown tensor");
  require(!dims.empty() && dims.size() <= kMaxRank && box.size() == dims.size() &&
              byte_strides.size() + 1 == dims.size(),
          "a map needs rank dims and box sizes, and rank - 1 strides");
  TensorMapSpec spec;
  spec.tensor = tensor;
  spec.dtype = static_cast<CUtensorMapDataType>(dtype);
  spec.rank = static_cast<cuuint32_t>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    spec.dims[i] = static_cast<cuuint64_t>(dims[i]);
    spec.box[i] = static_cast<cuuint32_t>(box[i]);
  }
  for (size_t i = 0; i < byte_strides.size(); ++i) {
    spec.byte_strides[i] = static_cast<cuuint64_t>(byte_strides[i]);
  }
  spec.swizzle = static_cast<CUtensorMapSwizzle>(swizzle);
  spec.fill = static_cast<CUtensorMapFloatOOBfill>(fill);
  return spec;
}

Launch launch_of(const LaunchDescription& description, size_t n_tensors) {
  const auto& [function, grid, threads, shared_bytes, params, maps] = description;
  require(grid.size() == 3, "a grid has three dims");
  require(params.size() <= kMaxParams, "too many kernel parameters");
  Launch launch;
  launch.function = reinterpret_cast<CUfunction>(function);
  launch.grid = {static_cast<unsigned>(grid[0]), static_cast<unsigned>(grid[1]),
                 static_cast<unsigned>(grid[2])};
  launch.threads = static_cast<unsigned>(threads);
  launch.shared_bytes = static_cast<unsigned>(shared_bytes);
  for (const MapDescription& map : maps) launch.maps.push_back(map_of(map, n_tensors));
  for (const auto& [kind, tensor, value] : params) {
    require(kPointer <= kind && kind <= kTensorMap, "unknown parameter kind");
    if (kind == kPointer) {
      require(0 <= tensor && static_cast<size_t>(tensor) < n_tensors,
              "pointer to an unknown tensor");
    }
    if (kind == kTensorMap) {
      require(0 <= value && static_cast<size_t>(value) < launch.maps.size(), "unknown map");
    }
    launch.params.push_back({static_cast<ParamKind>(kind), tensor, value});
  }
  return launch;
}

// (like, kind, elements): replay.py's Allocation.
using AllocationDescription = std::tuple<int64_t, int64_t, int64_t>;

// Keeps the Program described, running these kernels, for calls with tensors laid out as
// these ones.
void add_program(int64_t kernels, bool is_causal, const std::vector<at::Tensor>& tensors,
                 const std::vector<AllocationDescription>& allocations,
                 const std::vector<LaunchDescription>& launches,
                 const std::vector<int64_t>& outputs) {
  const size_t n_inputs = tensors.size();
  Program program;
  for (const auto& [like, kind, elements] : allocations) {
    require(0 <= like && static_cast<size_t>(like) < n_inputs + program.allocations.size(),
            "allocation like an unknown tensor");
    require(kLike <= kind && kind <= kZeros, "unknown allocation kind");
    require(kind != kZeros || elements > 0, "zeros need a positive number of elements");
    program.allocations.push_back({like, static_cast<AllocationKind>(kind), elements});
  }
  const size_t n_tensors = n_inputs + allocations.size();
  for (const LaunchDescription& launch : launches) {
    program.launches.push_back(launch_of(launch, n_tensors));
  }
  for (int64_t index : outputs) {
    require(0 <= index && static_cast<size_t>(index) < n_tensors, "unknown output");
  }
  program.outputs = outputs;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.programs.size() >= kMaxPrograms) s.programs.clear();
  s.programs.insert_or_assign(key_of(kernels, is_causal, tensors), std::move(program));
}

// Runs `change` on the state with its mutex held.
template <typename Change>
void with_state(Change change) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  change(s);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Replays planned attention kernel launches from C++.";
  m.def("replay", &replay, "The outputs of the kernels' Program for these tensors, or None.");
  m.def("attend", &attend, "o of an attention call replayed with a C++ autograd node, or None.");
  m.def("add_program", &add_program, "Keep a Program for tensors of these ones' layout.");
  m.def("clear", [] { with_state([](State& s) { s.programs.clear(); }); },
        "Forget every Program.");
  m.def("set_enabled", [](bool enabled) { with_state([=](State& s) { s.enabled = enabled; }); },
        "Serve calls (on) or leave every call to Python (off).");
  m.def("set_poison", [](bool poison) { with_state([=](State& s) { s.poison = poison; }); },
        "Fill every output with NaN before the kernels write it (tests).");
  m.def("set_python_backward", [](pybind11::function backward) {
          // Under the GIL, as python_backward reads it.
          Py_XDECREF(std::exchange(state().python_backward, backward.release().ptr()));
        },
        "(q, k, v, o, L, do, is_causal, kernels) -> [dq, dk, dv] for backwards replay does "
        "not serve.");
  m.def("replays", [] {
          int64_t replays = 0;
          with_state([&](State& s) { replays = s.replays; });
          return replays;
        },
        "Calls served so far.");
}

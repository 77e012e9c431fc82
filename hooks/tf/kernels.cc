// The tensors TensorFlow hands to Horovod, recorded in Horovod's op kernels.
//
// Where: every Horovod op kernel (horovod/tensorflow/mpi_ops.cc, v0.28.1)
// reads its input through tensorflow::OpKernelContext::input(int), exported by
// libtensorflow_framework, in ComputeAsync, just before it hands the tensor to
// Horovod's queue (EnqueueTensorAllreduce and its siblings, which are not
// reachable: Horovod's library binds its own calls).  That call is made once
// per tensor per run of the kernel, in eager mode and inside tf.function
// alike, so this library defines the function, calls TensorFlow's, and writes
// one APP_TENSOR record (hvprof_record_op_tensor) when the caller is a
// Horovod data kernel.  Grouped kernels read each input twice (once to
// allocate the outputs, once to enqueue): the first pass is recorded.
//
// The name is Horovod's: the kernel's node name, cut to its last component
// when the op's ignore_name_scope is set, and "<name>_<i>of<n>" for the
// tensors of a grouped op.  Ids come from libhvprof (hvprof_tensor_name_id:
// one id space with the PyTorch hooks).
//
// Its definition of OpKernelContext::SetStatus, which Horovod's callback
// calls when the collective is done, ends the run's pending entry: the hang
// watchdog's view of a tensor one rank never submits.
//
// Between two takes (hvprof_tf_take_window, called by the step hooks as a
// step ends), the last tensor handed over and the last one handed back: the
// step's wait for Horovod, its "sync" row (profiler.collect.tf_hooks), as
// hvd.DistributedOptimizer's synchronize is PyTorch's.
//
// Built against the installed TensorFlow's headers (setup.py), loaded global
// at the profiler's activation, before TensorFlow (whose libraries are global
// too: the first definition wins), and armed only under the TensorFlow it was
// built for (profiler.collect.tf_kernels): the kernel's layout is read
// through the headers' inline accessors.  Until armed, and for every kernel
// that is not Horovod's, it only calls TensorFlow's function.  It changes
// nothing the application sees: TensorFlow's function is always called, its
// result returned untouched; nothing here throws.

#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensorflow/core/framework/op_kernel.h"

#define HVPROF_TF_EXPORT __attribute__((visibility("default")))

namespace {

using InputFn = const tensorflow::Tensor& (*)(const tensorflow::OpKernelContext*, int);
constexpr const char* kInputSymbol = "_ZNK10tensorflow15OpKernelContext5inputEi";

using NameIdFn = int64_t (*)(const char*, size_t);
using RecordFn = int (*)(uint64_t, uint64_t, uint64_t, uint32_t, int32_t, uint32_t, uint32_t,
                         uint32_t, int32_t, uint32_t, uint64_t);
using NowFn = uint64_t (*)();
using RankFn = int (*)();
using DataFn = void* (*)(const tensorflow::Tensor*);
constexpr const char* kDataSymbol = "_ZNK10tensorflow6Tensor4dataEv";

std::atomic<InputFn> real_input{nullptr};
std::atomic<bool> armed{false};
// Armed once: the pending runs are ended even while disarmed again (a run
// queued while armed may end after), or the watchdog would see it forever.
std::atomic<bool> tracking{false};
NameIdFn name_id_fn = nullptr;
RecordFn record_fn = nullptr;
NowFn now_fn = nullptr;
RankFn rank_fn = nullptr;
DataFn data_fn = nullptr;
std::atomic<uint64_t> recorded{0};
std::atomic<uint64_t> cost_ns{0};  // observe()'s own time, on Horovod's kernels

// The step window since the last take (records' clock; 0: none yet): kernels
// run on several of TensorFlow's threads, so each is a running maximum.
std::atomic<uint64_t> win_runs{0};
std::atomic<uint64_t> win_last_in{0};
std::atomic<uint64_t> win_last_out{0};

void store_max(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

// hvprof_format.h HVPROF_TENSOR_OP_*
enum : uint32_t { kAllreduce = 1, kAllgather = 2, kBroadcast = 3, kAlltoall = 4,
                  kReducescatter = 5 };

struct Kind {
  uint32_t op;  // 0: not a data kernel
  bool grouped;
};

Kind kind_of(absl::string_view type) {
  if (type == "HorovodAllreduce") return {kAllreduce, false};
  if (type == "HorovodGroupedAllreduce") return {kAllreduce, true};
  if (type == "HorovodAllgather") return {kAllgather, false};
  if (type == "HorovodGroupedAllgather") return {kAllgather, true};
  if (type == "HorovodBroadcast") return {kBroadcast, false};
  if (type == "HorovodAlltoall") return {kAlltoall, false};
  if (type == "HorovodReducescatter") return {kReducescatter, false};
  if (type == "HorovodGroupedReducescatter") return {kReducescatter, true};
  return {0, false};
}

// TensorFlow DataType -> (the format's dtype code: NCCL's, bytes per element)
// for the types Horovod's kernels accept.
bool dtype_of(tensorflow::DataType t, uint32_t* code, uint32_t* size) {
  switch (t) {
    case tensorflow::DT_INT8: *code = 64; *size = 1; return true;
    case tensorflow::DT_UINT8: *code = 65; *size = 1; return true;
    case tensorflow::DT_BOOL: *code = 65; *size = 1; return true;
    case tensorflow::DT_INT32: *code = 66; *size = 4; return true;
    case tensorflow::DT_INT64: *code = 68; *size = 8; return true;
    case tensorflow::DT_HALF: *code = 70; *size = 2; return true;
    case tensorflow::DT_FLOAT: *code = 71; *size = 4; return true;
    case tensorflow::DT_DOUBLE: *code = 72; *size = 8; return true;
    case tensorflow::DT_BFLOAT16: *code = 73; *size = 2; return true;
    default: *code = 0; *size = 0; return false;
  }
}

// Horovod ReduceOp (Average 0, Sum 1, Adasum 2, Min 3, Max 4, Product 5) ->
// hvprof redop code (profiler.collect.tensors.REDUCE_OPS)
uint32_t redop_of(int64_t op) {
  switch (op) {
    case 0: return 15;
    case 1: return 1;
    case 2: return 255;
    case 3: return 3;
    case 4: return 4;
    case 5: return 2;
    default: return 0;
  }
}

// What one kernel object's records share, found once per kernel.  The node
// name's storage identifies the kernel with the pointer (a kernel freed and
// another made at its address gets a new Info; an Info is never changed or
// freed, so a pointer to it read by another thread stays good).
struct Info {
  const char* name_data;
  size_t name_len;
  Kind kind;
  int32_t root;
  uint32_t redop;
  int32_t process_set;
  std::vector<int64_t> ids;  // per input (grouped) or one
};

std::mutex cache_lock;
std::unordered_map<const void*, const Info*>* cache = nullptr;

// The kernel's attributes, read through TensorFlow's own exported functions
// (resolved in hvprof_tf_arm): the headers' inline map lookups would tie this
// library to the protobuf and Abseil symbols of one build.
using AttrSliceCtor = void (*)(tensorflow::AttrSlice*, const tensorflow::NodeDef&);
using TryIntFn = bool (*)(const tensorflow::AttrSlice&, std::string_view, int64_t*);
using TryBoolFn = bool (*)(const tensorflow::AttrSlice&, std::string_view, bool*);
constexpr const char* kAttrSliceCtor = "_ZN10tensorflow9AttrSliceC1ERKNS_7NodeDefE";
constexpr const char* kTryInt =
    "_ZN10tensorflow14TryGetNodeAttrERKNS_9AttrSliceESt17basic_string_viewIcSt11char_traitsIcEEPl";
constexpr const char* kTryBool =
    "_ZN10tensorflow14TryGetNodeAttrERKNS_9AttrSliceESt17basic_string_viewIcSt11char_traitsIcEEPb";
AttrSliceCtor attr_slice_ctor = nullptr;
TryIntFn try_int = nullptr;
TryBoolFn try_bool = nullptr;

struct Attrs {
  alignas(tensorflow::AttrSlice) unsigned char storage[sizeof(tensorflow::AttrSlice)];
  explicit Attrs(const tensorflow::NodeDef& def) {
    attr_slice_ctor(reinterpret_cast<tensorflow::AttrSlice*>(storage), def);
  }
  const tensorflow::AttrSlice& slice() const {
    return *reinterpret_cast<const tensorflow::AttrSlice*>(storage);
  }
  int64_t get_int(const char* key, int64_t dflt) const {
    int64_t v = dflt;
    return try_int(slice(), key, &v) ? v : dflt;
  }
  bool get_bool(const char* key) const {
    bool v = false;
    return try_bool(slice(), key, &v) && v;
  }
};

// The kernel's Info, made on its first run (names registered then).
const Info* info_locked(const tensorflow::OpKernel& k, Kind kind, int ninputs);

// In front of it, per thread: a few kernels' Infos, no lock (an Info is
// never freed or moved: the map's nodes stay put).
struct Seen {
  const void* kernel;
  const char* name_data;
  size_t name_len;
  const Info* info;
};
constexpr size_t kSeen = 64;
thread_local Seen seen[kSeen];

const Info* info_of(const tensorflow::OpKernel& k, Kind kind, int ninputs) {
  absl::string_view name = k.name_view();
  Seen& e = seen[(reinterpret_cast<uintptr_t>(&k) >> 4) % kSeen];
  if (e.kernel == &k && e.name_data == name.data() && e.name_len == name.size() &&
      (!kind.grouped || e.info->ids.size() == static_cast<size_t>(ninputs)))
    return e.info;
  const Info* info = info_locked(k, kind, ninputs);
  if (info != nullptr) e = Seen{&k, name.data(), name.size(), info};
  return info;
}

const Info* info_locked(const tensorflow::OpKernel& k, Kind kind, int ninputs) {
  absl::string_view name = k.name_view();
  std::lock_guard<std::mutex> guard(cache_lock);
  if (cache == nullptr) cache = new std::unordered_map<const void*, const Info*>();
  auto it = cache->find(&k);
  if (it != cache->end() && it->second->name_data == name.data() &&
      it->second->name_len == name.size() &&
      (!kind.grouped || it->second->ids.size() == static_cast<size_t>(ninputs)))
    return it->second;
  Attrs attrs(k.def());
  auto info = std::make_unique<Info>(Info{name.data(), name.size(), kind, -1, 0, 0, {}});
  std::string base(name);
  if (attrs.get_bool("ignore_name_scope")) {
    size_t pos = base.find_last_of('/');
    if (pos != std::string::npos) base = base.substr(pos + 1);
  }
  if (kind.op == kBroadcast) info->root = static_cast<int32_t>(attrs.get_int("root_rank", -1));
  if (kind.op == kAllreduce || kind.op == kReducescatter)
    info->redop = redop_of(attrs.get_int("reduce_op", -1));
  info->process_set = static_cast<int32_t>(attrs.get_int("process_set_id", 0));
  int n = kind.grouped ? ninputs : 1;
  for (int i = 0; i < n; i++) {
    std::string full = kind.grouped
        ? base + "_" + std::to_string(i + 1) + "of" + std::to_string(ninputs) : base;
    int64_t id = name_id_fn(full.data(), full.size());
    if (id < 0) return nullptr;  // no raw file open yet: asked again next time
    info->ids.push_back(id);
  }
  const Info* kept = info.release();  // never freed: see Info
  (*cache)[&k] = kept;
  return kept;
}

// The kernel runs handed to Horovod and not handed back (their context's
// SetStatus, which Horovod's callback calls when the collective is done, not
// seen yet): for the hang watchdog, which cannot see a tensor one rank never
// submits in the MPI calls (they all complete).  A context's address is
// reused only after its run ended.
// No lock and no allocation per run: a fixed table, each context in one of
// kProbe slots from its hash (claimed by compare-and-swap, published after
// its fields); a run whose slots are all taken goes untracked (the watchdog
// misses it; it never reports one that ended).
constexpr size_t kSlots = 2048;  // a power of two; tensors in flight: hundreds
constexpr size_t kProbe = 8;
const void* const kClaimed = reinterpret_cast<const void*>(1);
struct Slot {
  std::atomic<const void*> ctx;  // nullptr: free; kClaimed: being written
  std::atomic<int64_t> since_ns;  // steady clock
  std::atomic<int64_t> name_id;
};
Slot slots[kSlots];

size_t slot_of(const void* ctx, size_t i) {
  uintptr_t h = reinterpret_cast<uintptr_t>(ctx) >> 4;
  return ((h ^ (h >> 11) ^ (h >> 23)) + i) & (kSlots - 1);
}

int64_t ns_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

void pending_add(const void* ctx, std::chrono::steady_clock::time_point since,
                 int64_t name_id) {
  for (size_t i = 0; i < kProbe; i++) {
    Slot& s = slots[slot_of(ctx, i)];
    if (s.ctx.load(std::memory_order_acquire) == ctx) {  // its last end unseen: replaced
      s.since_ns.store(ns_of(since), std::memory_order_relaxed);
      s.name_id.store(name_id, std::memory_order_relaxed);
      return;
    }
  }
  for (size_t i = 0; i < kProbe; i++) {
    Slot& s = slots[slot_of(ctx, i)];
    const void* expected = nullptr;
    if (s.ctx.compare_exchange_strong(expected, kClaimed, std::memory_order_acq_rel)) {
      s.since_ns.store(ns_of(since), std::memory_order_relaxed);
      s.name_id.store(name_id, std::memory_order_relaxed);
      s.ctx.store(ctx, std::memory_order_release);
      return;
    }
  }
}

void pending_done(const tensorflow::OpKernelContext* ctx) {
  absl::string_view type = ctx->op_kernel().type_string_view();
  if (type.size() < 8 || std::memcmp(type.data(), "Horovod", 7) != 0) return;
  if (kind_of(type).op == 0) return;
  if (armed.load(std::memory_order_relaxed)) store_max(win_last_out, now_fn());
  for (size_t i = 0; i < kProbe; i++) {
    Slot& s = slots[slot_of(ctx, i)];
    if (s.ctx.load(std::memory_order_acquire) == ctx) {
      s.ctx.store(nullptr, std::memory_order_release);
      return;
    }
  }
}

// A grouped kernel's two passes over its inputs on this thread: the first is
// recorded.  ComputeAsync reads them synchronously, on one thread.
thread_local const void* pass_ctx = nullptr;
thread_local int pass_calls = 0;

void observe(const tensorflow::OpKernelContext* ctx, int index, const tensorflow::Tensor& t) {
  const tensorflow::OpKernel& k = ctx->op_kernel();
  absl::string_view type = k.type_string_view();
  if (type.size() < 8 || std::memcmp(type.data(), "Horovod", 7) != 0) return;
  Kind kind = kind_of(type);
  if (kind.op == 0) return;
  int ninputs = ctx->num_inputs();
  if (kind.grouped) {
    if (pass_ctx != ctx || pass_calls >= 2 * ninputs) {
      pass_ctx = ctx;
      pass_calls = 0;
    }
    if (pass_calls++ >= ninputs) return;  // the second pass
  } else if (index != 0) {
    return;  // alltoall's splits
  }
  if (kind.grouped && (index < 0 || index >= ninputs)) return;
  auto began = std::chrono::steady_clock::now();
  uint64_t now = now_fn();
  uint32_t code, size;
  dtype_of(t.dtype(), &code, &size);
  const Info* info = info_of(k, kind, ninputs);
  if (info == nullptr) return;
  int64_t id = info->ids[kind.grouped ? index : 0];
  uint64_t count = static_cast<uint64_t>(t.NumElements());
  // The root of a broadcast sends from its input (MPIBroadcast::Execute): the
  // call's buffer names the tensor, as an output's does for PyTorch's.
  uint64_t buffer = 0;
  if (kind.op == kBroadcast && info->root >= 0 && info->root == rank_fn())
    buffer = reinterpret_cast<uint64_t>(data_fn(&t));
  if (record_fn(now, count * size, count, static_cast<uint32_t>(id), info->root, code, size,
                info->redop, info->process_set, kind.op, buffer) == 0)
    recorded.fetch_add(1, std::memory_order_relaxed);
  if (!kind.grouped || index == 0) {
    pending_add(ctx, began, id);
    win_runs.fetch_add(1, std::memory_order_relaxed);
    store_max(win_last_in, now);
  }
  cost_ns.fetch_add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now() - began).count()),
                    std::memory_order_relaxed);
}

// TensorFlow's own symbol: the next definition after this library (TensorFlow
// loads its libraries global), else the one in libtensorflow_framework.
void* tf_symbol(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (p != nullptr) return p;
  void* h = dlopen("libtensorflow_framework.so.2", RTLD_NOLOAD | RTLD_LAZY);
  return h != nullptr ? dlsym(h, name) : nullptr;
}

// TensorFlow's SetStatus, found by this library's own definition's name (its
// mangled name carries Abseil's inline namespace, which changes by release).
using SetStatusFn = void (*)(tensorflow::OpKernelContext*, const absl::Status&);
std::atomic<SetStatusFn> real_set_status{nullptr};

SetStatusFn resolve_set_status() {
  SetStatusFn fn = real_set_status.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  auto own = &tensorflow::OpKernelContext::SetStatus;
  void* addr = nullptr;
  std::memcpy(&addr, &own, sizeof addr);  // Itanium ABI: a non-virtual one's address
  Dl_info info;
  if (dladdr(addr, &info) != 0 && info.dli_sname != nullptr)
    fn = reinterpret_cast<SetStatusFn>(tf_symbol(info.dli_sname));
  if (fn != nullptr) real_set_status.store(fn, std::memory_order_release);
  return fn;
}

InputFn resolve_input() {
  InputFn fn = real_input.load(std::memory_order_acquire);
  if (fn != nullptr) return fn;
  fn = reinterpret_cast<InputFn>(tf_symbol(kInputSymbol));
  if (fn != nullptr) real_input.store(fn, std::memory_order_release);
  return fn;
}

}  // namespace

namespace tensorflow {

HVPROF_TF_EXPORT const Tensor& OpKernelContext::input(int index) const {
  InputFn fn = resolve_input();
  if (fn == nullptr) std::abort();  // unreachable: a kernel runs, so TensorFlow is loaded
  const Tensor& t = fn(this, index);
  if (armed.load(std::memory_order_relaxed)) {
    try {
      observe(this, index, t);
    } catch (...) {  // a name that could not be allocated: that record is lost
    }
  }
  return t;
}

HVPROF_TF_EXPORT void OpKernelContext::SetStatus(const absl::Status& status) {
  SetStatusFn fn = resolve_set_status();
  if (fn == nullptr) std::abort();  // unreachable: a kernel runs, so TensorFlow is loaded
  if (tracking.load(std::memory_order_relaxed)) {
    try {
      pending_done(this);  // before the call: Horovod's done() follows it
    } catch (...) {
    }
  }
  fn(this, status);
}

}  // namespace tensorflow

extern "C" {

// The TensorFlow version whose headers this was built with (setup.py passes
// it; the headers do not carry it).
#ifndef HVPROF_TF_VERSION
#error "HVPROF_TF_VERSION: the TensorFlow version of the headers, as a string"
#endif
HVPROF_TF_EXPORT const char* hvprof_tf_built_for(void) { return HVPROF_TF_VERSION; }

// At the profiler's start-up, before TensorFlow is loaded (this library must
// come before TensorFlow's in the global scope to take the place of its
// function): libhvprof's exports.  Recording stays off until armed.  0 when
// ready, else -1.
HVPROF_TF_EXPORT int hvprof_tf_init(void) {
  name_id_fn = reinterpret_cast<NameIdFn>(dlsym(RTLD_DEFAULT, "hvprof_tensor_name_id"));
  record_fn = reinterpret_cast<RecordFn>(dlsym(RTLD_DEFAULT, "hvprof_record_op_tensor"));
  now_fn = reinterpret_cast<NowFn>(dlsym(RTLD_DEFAULT, "hvprof_now"));
  rank_fn = reinterpret_cast<RankFn>(dlsym(RTLD_DEFAULT, "hvprof_rank"));
  return name_id_fn != nullptr && record_fn != nullptr && now_fn != nullptr &&
      rank_fn != nullptr ? 0 : -1;
}

// Recording on (once TensorFlow is loaded and its version checked: the
// kernel's layout is read through these headers' inline accessors) or off.
// 0 when on, -1 when TensorFlow's functions were not found (then off).
HVPROF_TF_EXPORT int hvprof_tf_arm(int on) {
  if (!on) {
    armed.store(false, std::memory_order_release);
    return 0;
  }
  attr_slice_ctor = reinterpret_cast<AttrSliceCtor>(tf_symbol(kAttrSliceCtor));
  try_int = reinterpret_cast<TryIntFn>(tf_symbol(kTryInt));
  try_bool = reinterpret_cast<TryBoolFn>(tf_symbol(kTryBool));
  data_fn = reinterpret_cast<DataFn>(tf_symbol(kDataSymbol));
  if (resolve_input() == nullptr || resolve_set_status() == nullptr ||
      attr_slice_ctor == nullptr || try_int == nullptr || try_bool == nullptr ||
      data_fn == nullptr || name_id_fn == nullptr || record_fn == nullptr ||
      now_fn == nullptr || rank_fn == nullptr)
    return -1;
  tracking.store(true, std::memory_order_release);
  armed.store(true, std::memory_order_release);
  return 0;
}

// The oldest kernel run handed to Horovod and not handed back: 1 with its
// age and its (first) tensor's name id, else 0.
HVPROF_TF_EXPORT int hvprof_tf_oldest_pending(int64_t* age_ns, int64_t* name_id) {
  int64_t oldest = 0, id = 0;
  bool any = false;
  for (Slot& s : slots) {
    const void* c = s.ctx.load(std::memory_order_acquire);
    if (c == nullptr || c == kClaimed) continue;
    int64_t since = s.since_ns.load(std::memory_order_relaxed);
    if (!any || since < oldest) {
      oldest = since;
      id = s.name_id.load(std::memory_order_relaxed);
      any = true;
    }
  }
  if (!any) return 0;
  *age_ns = ns_of(std::chrono::steady_clock::now()) - oldest;
  *name_id = id;
  return 1;
}

// The window since the last take: the number of Horovod kernel runs handed
// over, the last hand-over and the last hand-back (records' clock); resets it.
HVPROF_TF_EXPORT uint64_t hvprof_tf_take_window(uint64_t* last_in, uint64_t* last_out) {
  uint64_t runs = win_runs.exchange(0, std::memory_order_relaxed);
  *last_in = win_last_in.exchange(0, std::memory_order_relaxed);
  *last_out = win_last_out.exchange(0, std::memory_order_relaxed);
  return runs;
}

// APP_TENSOR records written (tests, the trace's limits).
HVPROF_TF_EXPORT uint64_t hvprof_tf_recorded(void) { return recorded.load(); }

// The time spent recording them, from after the filter to after the record
// (the rank's self-cost): its name, attributes and record.
HVPROF_TF_EXPORT uint64_t hvprof_tf_cost_ns(void) { return cost_ns.load(); }

}  // extern "C"

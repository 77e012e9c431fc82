/*
 * torch_fields.cc -- libhvprof_torch.so: a tensor's element count, scalar
 * type and data address read through PyTorch's own inline accessors, for the
 * C tensor hook (profiler/_ext/fastrec_hook.c).
 *
 * Why: inside a training step the hook's three Python calls (numel(), dtype,
 * output.data_ptr()) cost about half of its time: each enters torch's
 * Python bindings with cold caches.  Read from the at::Tensor behind the
 * Python object they cost a few loads.
 *
 * Built by setup.py against the installed PyTorch's headers, for that
 * version only (hvprof_torch_built_for); no PyTorch library is linked but
 * c10, which PyTorch has loaded before this is.  It is an optimisation and
 * never the definition: profiler.collect.tensors checks it against the
 * Python calls on probe tensors before the hook may use it, and the hook
 * gives it only objects whose type is exactly torch.Tensor or
 * torch.nn.Parameter (a subclass may define its own numel or data_ptr).
 * Anything it cannot answer (an exception, a tensor without storage) is -1,
 * and the hook asks Python instead.
 */
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

#ifndef HVPROF_TORCH_VERSION
#error "HVPROF_TORCH_VERSION: the PyTorch version these headers are from"
#endif

#define EXPORT extern "C" __attribute__((visibility("default")))

/* The PyTorch version this was built against (torch.__version__). */
EXPORT const char *hvprof_torch_built_for(void) noexcept { return HVPROF_TORCH_VERSION; }

/* numel, the c10::ScalarType as an int, and the data address (0 for no
 * elements) of a tensor object; 0, or -1 when not answered.  The caller holds
 * the GIL and has checked the object's exact type. */
EXPORT int hvprof_torch_fields(PyObject *obj, int64_t *numel, int32_t *scalar_type,
                               uint64_t *data) noexcept
{
    try {
        const at::Tensor &t = THPVariable_Unpack(obj);
        if (!t.defined() || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) return -1;
        *numel = t.numel();
        *scalar_type = static_cast<int32_t>(t.scalar_type());
        /* const: never materialises a copy-on-write storage (Python's
         * data_ptr() would); the same address otherwise */
        *data = t.has_storage() ? static_cast<uint64_t>(
                                      reinterpret_cast<uintptr_t>(t.const_data_ptr()))
                                : 0;
        return 0;
    } catch (...) {
        return -1;
    }
}

/*
 * cuda_driver_standin.c -- a STAND-IN for the CUDA driver library, for tests
 * only.  Built by tests/test_nccl_standin.py as libcuda.so.1 (soname
 * libcuda.so.1).  It implements nothing: a process that loads it looks, to
 * the profiler, like a process that initialised CUDA (the profiler takes a
 * loaded libcuda.so as "this job used GPUs").
 */
__attribute__((visibility("default"))) int standin_cuda_driver(void) { return 1; }

// MFU denominators (DESIGN.md §8): the dense BF16 peak of a GPU, looked up
// by the name CUDA gives the device, and on CPU an SGEMM rate measured once
// per machine and kept in a cache file, so that CPU MFU is comparable from
// run to run. device.peak_tflops, when set, overrides both (train_report.c).
#pragma once
#include <stddef.h>

// The dense BF16 tensor-core peak of the GPU called device_name, TFLOP/s
// per device, and in entry (when not NULL) the table row that matched; 0
// (entry NULL) for a GPU the table does not know.
double mfu_gpu_peak_tflops(const char *device_name, const char **entry);

// The CPU's denominator, TFLOP/s: the entry of this machine in cache_path
// (keyed by CPU model, logical CPUs and BLAS threads), else a new
// measurement (the best of 10 single-precision 1024^3 products through
// OpenBLAS) written there. how says which and where; a cache that cannot be
// read or written is said there too, and the measurement is used uncached
// (cache_path NULL: measure, cache nothing).
double mfu_cpu_peak_tflops(const char *cache_path, char *how, size_t howlen);

// The cache file: $XDG_CACHE_HOME/moecore/cpu-peak.json, else
// $HOME/.cache/moecore/cpu-peak.json. -1 when neither variable is set.
int mfu_cpu_cache_path(char *buf, size_t n);

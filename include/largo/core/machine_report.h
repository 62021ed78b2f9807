// What the machine does with Largo's tensors, said once at start-up: which BLAS serves
// float32 matrix multiplies (every Linear layer, attention), which instruction set oneDNN
// (convolutions, bfloat16 matmuls) and ATen's own kernels use, how many intra-op threads run
// per process and on how many cores, and whether the CPU has the AVX-512 / bfloat16 / AMX
// units. Two settings cost an order of magnitude without any error, so they become warnings
// that say how to fix them:
//   - a reference (netlib) BLAS: a libtorch linked against the system's libblas.so.3 (as
//     Debian's own libtorch was) sends float32 GEMMs to whatever that alternative points to,
//     and on a fresh machine that is the reference BLAS (20-40x slower than OpenBLAS on the
//     2-core dev machine, docs/performance.md). PyTorch's wheels carry MKL inside
//     libtorch_cpu.so instead;
//   - more threads than cores (intra-op threads x ranks on this machine, or a pthreads
//     OpenBLAS that keeps its own pool beside OpenMP's): every parallel region then waits for
//     a descheduled thread.
// The BLAS is found by asking the dynamic linker which object defines sgemm_ (the symbol
// libtorch calls), so it is the library actually loaded, whatever the alternatives say.
// No collectives; cheap (no timing, no allocation of tensors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace largo {

enum class BlasKind {
  kNotFound,  // no shared object defines sgemm_ (a BLAS linked statically into libtorch)
  kReference, // none of the optimised BLAS below: the reference (netlib) BLAS
  kOpenBlas,
  kBlis,
  kMkl,
  kOther, // another optimised BLAS recognised by its path (ATLAS, Arm PL, AOCL)
};

struct BlasInfo {
  BlasKind kind = BlasKind::kNotFound;
  std::string library_path; // the object that defines sgemm_, symlinks resolved
  std::string description;  // e.g. "OpenBLAS 0.3.21 (OpenMP, SkylakeX kernels)"
  // How the BLAS threads: "OpenMP" (follows at::set_num_threads), "pthreads" (its own pool),
  // "sequential", or "" when unknown.
  std::string threading;
  int64_t own_threads = 0; // the pool size of a pthreads OpenBLAS; 0 when not applicable
};

// Usable instruction-set extensions: the CPU has them and the OS saves their registers.
struct CpuFeatures {
  bool avx2 = false;
  bool avx512 = false;      // AVX512F
  bool avx512_bf16 = false; // bfloat16 dot products (vdpbf16ps): Cooper Lake, Zen 4, ...
  bool amx = false;         // AMX tiles with bfloat16 (Sapphire Rapids and later)
};

struct MachineReportOptions {
  // Processes of this job on this machine (LOCAL_WORLD_SIZE), each running the current
  // intra-op thread count: their product is compared with the cores.
  int64_t local_ranks = 1;
};

struct MachineReport {
  BlasInfo blas;
  std::string onednn;          // e.g. "oneDNN 2.6.3 avx512_core_bf16"; "" if not loaded
  std::string aten_capability; // ATen's vectorised kernels: "AVX2", "AVX512", "DEFAULT"
  int64_t intra_op_threads = 1;
  int64_t local_ranks = 1;
  int64_t cores = 1; // CPUs this process may run on (its affinity mask)
  CpuFeatures cpu;
  std::vector<std::string> warnings; // each says what is wrong and how to fix it

  // One line for the log, e.g. "BLAS OpenBLAS 0.3.21 (OpenMP, SkylakeX kernels) ...;
  // oneDNN 2.6.3 avx512_core_bf16; ATen AVX2; 2 intra-op threads x 1 local rank on 2 cores;
  // CPU AVX-512 yes, AVX512_BF16 yes, AMX no".
  std::string summary() const;
};

// Inspects this process: call it after at::set_num_threads, on the thread that trains.
MachineReport describe_machine(const MachineReportOptions& options = {});

// Logs report.summary() at info level and each warning at warning level (spdlog).
void log_machine_report(const MachineReport& report);

// The parts of describe_machine that depend only on their inputs (tested directly).
BlasInfo describe_blas();
CpuFeatures detect_cpu_features();
// Classifies a BLAS from the path of the object that defines sgemm_ when it exports none
// of the version functions of OpenBLAS or MKL (Debian's BLIS and netlib export none).
BlasKind classify_blas_path(const std::string& library_path);
// The warnings for a report whose other fields are filled.
std::vector<std::string> machine_warnings(const MachineReport& report);

} // namespace largo

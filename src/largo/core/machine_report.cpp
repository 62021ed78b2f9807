#include <largo/core/machine_report.h>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace largo {
namespace {

// Looks a function up in `handle` (and the objects it depends on), or in every object loaded
// at start-up for RTLD_DEFAULT: the optimised BLAS libraries are recognised by their own
// query functions, called only when present.
template <typename Function>
Function find_function(void* handle, const char* name) {
  return reinterpret_cast<Function>(dlsym(handle, name));
}

void describe_openblas(void* handle, BlasInfo& info) {
  using Query = char* (*)();
  using IntQuery = int (*)();
  info.kind = BlasKind::kOpenBlas;
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY SkylakeX MAX_THREADS=64": keep the version.
  std::string config = find_function<Query>(handle, "openblas_get_config")();
  const size_t version_end = config.find(' ', config.find(' ') + 1);
  std::string name = config.substr(0, version_end);
  const auto parallel = find_function<IntQuery>(handle, "openblas_get_parallel");
  const int mode = parallel ? parallel() : -1; // 0 sequential, 1 pthreads, 2 OpenMP
  info.threading = mode == 0 ? "sequential" : mode == 1 ? "pthreads" : mode == 2 ? "OpenMP" : "";
  if (mode == 1) {
    if (const auto threads = find_function<IntQuery>(handle, "openblas_get_num_threads")) {
      info.own_threads = threads();
    }
  }
  const auto core = find_function<Query>(handle, "openblas_get_corename");
  info.description = fmt::format(
      "{} ({}{})",
      name,
      info.threading.empty() ? "unknown threading" : info.threading,
      core ? fmt::format(", {} kernels", core()) : "");
}

std::string isa_name(std::string isa) {
  const std::string prefix = "cpu_isa_";
  return isa.rfind(prefix, 0) == 0 ? isa.substr(prefix.size()) : isa;
}

// The text after `key` on its line of at::show_config() ("" when absent), e.g. the version
// of a library linked into libtorch_cpu.so.
std::string show_config_value(const std::string& key) {
  const std::string config = at::show_config();
  const size_t start = config.find(key);
  if (start == std::string::npos) {
    return "";
  }
  const size_t begin = start + key.size();
  return config.substr(begin, config.find_first_of(" \n", begin) - begin);
}

// oneDNN: a libtorch linked against a shared libdnnl.so (Debian's) exports its C API, which
// says which instruction set its kernels were generated for (capped by ONEDNN_MAX_CPU_ISA);
// PyTorch's wheels link it into libtorch_cpu.so, hidden, and at::show_config() gives its
// version.
std::string describe_onednn() {
  struct Version { // dnnl_version_t
    int major, minor, patch;
    const char* hash;
    unsigned cpu_runtime, gpu_runtime;
  };
  const auto version = find_function<const Version* (*)()>(RTLD_DEFAULT, "dnnl_version");
  const auto effective_isa = find_function<int (*)()>(RTLD_DEFAULT, "dnnl_get_effective_cpu_isa");
  const auto isa_to_string = find_function<const char* (*)(int)>(RTLD_DEFAULT, "dnnl_cpu_isa2str");
  if (version == nullptr || effective_isa == nullptr) {
    const std::string linked = show_config_value("MKL-DNN v");
    return linked.empty() ? "" : fmt::format("oneDNN {} (in libtorch_cpu.so)", linked);
  }
  const Version* v = version();
  const int isa = effective_isa();
  return fmt::format(
      "oneDNN {}.{}.{} {}",
      v->major,
      v->minor,
      v->patch,
      isa_to_string ? isa_name(isa_to_string(isa)) : fmt::format("isa {:#x}", isa));
}

// ATen's vectorised kernels (elementwise ops, norms, softmax) run the capability printed by
// at::show_config() (AVX512 on AVX-512 CPUs with PyTorch 2.x; ATEN_CPU_CAPABILITY can cap
// it).
std::string aten_capability() {
  return show_config_value("CPU capability usage: ");
}

int64_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

std::string yes_no(bool value) {
  return value ? "yes" : "no";
}

} // namespace

BlasKind classify_blas_path(const std::string& library_path) {
  std::string path = library_path;
  std::transform(path.begin(), path.end(), path.begin(), [](unsigned char c) {
    return static_cast<char>(std::tolower(c));
  });
  if (path.find("openblas") != std::string::npos) {
    return BlasKind::kOpenBlas;
  }
  if (path.find("blis") != std::string::npos) {
    return BlasKind::kBlis; // Debian's blis-openmp/ and blis-pthread/, AMD's AOCL-BLIS
  }
  if (path.find("mkl") != std::string::npos) {
    return BlasKind::kMkl;
  }
  for (const char* other : {"atlas", "armpl", "accelerate", "aocl"}) {
    if (path.find(other) != std::string::npos) {
      return BlasKind::kOther;
    }
  }
  return BlasKind::kReference;
}

BlasInfo describe_blas() {
  BlasInfo info;
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info object{};
  if (sgemm == nullptr || dladdr(sgemm, &object) == 0 || object.dli_fname == nullptr) {
    info.description = "no shared BLAS library defines sgemm_ (linked into libtorch?)";
    return info;
  }
  std::error_code error;
  const std::filesystem::path resolved = std::filesystem::canonical(object.dli_fname, error);
  info.library_path = error ? std::string(object.dli_fname) : resolved.string();
  // Already loaded: RTLD_NOLOAD only returns a handle to it (and takes a reference).
  void* handle = dlopen(object.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (handle != nullptr && find_function<char* (*)()>(handle, "openblas_get_config") != nullptr) {
    describe_openblas(handle, info);
  } else if (
      handle != nullptr &&
      (find_function<void* (*)()>(handle, "mkl_get_version_string") != nullptr ||
       find_function<void* (*)()>(handle, "mkl_serv_get_version_string") != nullptr)) {
    // PyTorch's x86 wheels link MKL into libtorch_cpu.so, built on GNU OpenMP: its GEMMs run
    // on libtorch's own threads.
    info.kind = BlasKind::kMkl;
    info.threading = "OpenMP";
    const std::string version = show_config_value("Math Kernel Library Version ");
    info.description = fmt::format(
        "Intel MKL{} (in {})",
        version.empty() ? "" : " " + version.substr(0, version.find('-')),
        std::filesystem::path(info.library_path).filename().string());
  } else {
    info.kind = classify_blas_path(info.library_path);
    const std::string directory = resolved.parent_path().filename().string();
    switch (info.kind) {
    case BlasKind::kBlis:
      // Debian's BLIS directories say how it threads (blis-openmp, blis-pthread).
      info.threading = directory.find("openmp") != std::string::npos    ? "OpenMP"
                       : directory.find("pthread") != std::string::npos ? "pthreads"
                                                                        : "";
      info.description = info.threading.empty() ? "BLIS" : fmt::format("BLIS ({})", info.threading);
      break;
    case BlasKind::kOpenBlas:
      info.description = "OpenBLAS";
      break;
    case BlasKind::kMkl:
      info.description = "Intel MKL";
      break;
    case BlasKind::kOther:
      info.description = fmt::format("optimised BLAS ({})", directory);
      break;
    default:
      info.description = "reference BLAS (netlib)";
      info.threading = "sequential";
    }
  }
  if (handle != nullptr) {
    dlclose(handle); // drops the reference RTLD_NOLOAD took; the library stays loaded
  }
  return info;
}

CpuFeatures detect_cpu_features() {
  CpuFeatures features;
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) {
    return features; // no XSAVE: the OS saves no vector state beyond SSE
  }
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  const bool os_avx = (xcr0_low & 0x6) == 0x6;         // XMM and YMM state
  const bool os_avx512 = (xcr0_low & 0xe6) == 0xe6;    // + opmask, ZMM upper halves, ZMM16-31
  const bool os_amx = (xcr0_low & 0x60000) == 0x60000; // XTILECFG and XTILEDATA
  unsigned max_leaf = __get_cpuid_max(0, nullptr);
  if (max_leaf < 7) {
    return features;
  }
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  features.avx2 = os_avx && (ebx & (1u << 5)) != 0;
  features.avx512 = os_avx512 && (ebx & (1u << 16)) != 0;
  features.amx = os_amx && (edx & (1u << 22)) != 0 && (edx & (1u << 24)) != 0; // AMX-BF16, tiles
  const unsigned max_subleaf = eax;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, eax, ebx, ecx, edx);
    features.avx512_bf16 = features.avx512 && (eax & (1u << 5)) != 0;
  }
#endif
  return features;
}

std::vector<std::string> machine_warnings(const MachineReport& report) {
  std::vector<std::string> warnings;
  if (report.blas.kind == BlasKind::kReference) {
    warnings.push_back(fmt::format(
        "float32 matrix multiplies (Linear layers, attention) run on the reference BLAS {}, "
        "20-40x slower than an optimised one: build against PyTorch's libtorch, which carries "
        "MKL (`bash scripts/install_deps.sh`), or install OpenBLAS (`apt-get install "
        "libopenblas0-openmp`) and select it with `update-alternatives --set "
        "libblas.so.3-x86_64-linux-gnu "
        "/usr/lib/x86_64-linux-gnu/openblas-openmp/libblas.so.3`",
        report.blas.library_path));
  }
  const int64_t threads = report.intra_op_threads * report.local_ranks;
  if (threads > report.cores) {
    warnings.push_back(fmt::format(
        "{} intra-op threads x {} local rank(s) = {} threads on {} cores: oversubscribed, every "
        "parallel region waits for descheduled threads; set the intra-op threads "
        "(MACHINE.NUM_THREADS, at::set_num_threads) to {} or fewer, or 0 to share the cores "
        "among the ranks",
        report.intra_op_threads,
        report.local_ranks,
        threads,
        report.cores,
        std::max<int64_t>(1, report.cores / std::max<int64_t>(1, report.local_ranks))));
  }
  if (report.blas.threading == "pthreads" && report.blas.own_threads > 1) {
    warnings.push_back(fmt::format(
        "{} keeps its own pool of {} threads, which at::set_num_threads does not govern, "
        "beside {} intra-op thread(s) x {} local rank(s): install the OpenMP build "
        "(libopenblas0-openmp, scripts/install_deps.sh) or set OPENBLAS_NUM_THREADS={}",
        report.blas.description,
        report.blas.own_threads,
        report.intra_op_threads,
        report.local_ranks,
        report.intra_op_threads));
  }
  return warnings;
}

std::string MachineReport::summary() const {
  std::string blas_text = blas.description;
  if (!blas.library_path.empty()) {
    blas_text += " [" + blas.library_path + "]";
  }
  return fmt::format(
      "BLAS {}; {}; ATen {}; {} intra-op thread(s) x {} local rank(s) on {} cores; "
      "CPU AVX-512 {}, AVX512_BF16 {}, AMX {}",
      blas_text,
      onednn.empty() ? "oneDNN not loaded" : onednn,
      aten_capability.empty() ? "capability unknown" : aten_capability,
      intra_op_threads,
      local_ranks,
      cores,
      yes_no(cpu.avx512),
      yes_no(cpu.avx512_bf16),
      yes_no(cpu.amx));
}

MachineReport describe_machine(const MachineReportOptions& options) {
  MachineReport report;
  report.blas = describe_blas();
  report.onednn = describe_onednn();
  report.aten_capability = aten_capability();
  report.intra_op_threads = at::get_num_threads();
  report.local_ranks = std::max<int64_t>(1, options.local_ranks);
  report.cores = usable_cores();
  report.cpu = detect_cpu_features();
  report.warnings = machine_warnings(report);
  return report;
}

void log_machine_report(const MachineReport& report) {
  spdlog::info("machine: {}", report.summary());
  for (const std::string& warning : report.warnings) {
    spdlog::warn("{}", warning);
  }
}

} // namespace largo

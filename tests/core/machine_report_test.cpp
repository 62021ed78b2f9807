// The machine report: the BLAS it names is the object mapped into this process that defines
// sgemm_; the CPU features agree with the kernel's /proc/cpuinfo; the thread count follows
// at::set_num_threads; the warnings fire on a reference BLAS and on oversubscription, each
// with its fix.
#include <largo/core/machine_report.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace largo::machine_report_test {
namespace {

namespace fs = std::filesystem;

// Canonical paths of the files mapped into this process (read independently of dladdr).
std::set<std::string> mapped_files() {
  std::set<std::string> files;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash != std::string::npos) {
      std::error_code error;
      const fs::path path = fs::canonical(line.substr(slash), error);
      if (!error) {
        files.insert(path.string());
      }
    }
  }
  return files;
}

std::set<std::string> cpuinfo_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      return {std::istream_iterator<std::string>(words), std::istream_iterator<std::string>()};
    }
  }
  return {};
}

bool mentions(const std::vector<std::string>& warnings, const std::string& text) {
  for (const auto& warning : warnings) {
    if (warning.find(text) != std::string::npos) {
      return true;
    }
  }
  return false;
}

TEST(MachineReportTest, NamesTheMappedObjectThatDefinesSgemm) {
  torch::mm(torch::ones({64, 64}), torch::ones({64, 64})); // a float32 GEMM has run
  const BlasInfo blas = describe_blas();
  ASSERT_NE(blas.kind, BlasKind::kNotFound) << blas.description;
  EXPECT_TRUE(mapped_files().count(blas.library_path)) << blas.library_path << " is not mapped";
  const std::string file = fs::path(blas.library_path).filename().string();
  if (file.rfind("libtorch_cpu.so", 0) == 0) {
    // PyTorch's wheels: MKL linked into libtorch_cpu.so, threading on libtorch's OpenMP.
    EXPECT_EQ(blas.kind, BlasKind::kMkl) << blas.description;
    EXPECT_EQ(blas.description.rfind("Intel MKL 20", 0), 0u) << blas.description; // its version
    EXPECT_NE(blas.description.find("(in libtorch_cpu.so)"), std::string::npos) << blas.description;
    EXPECT_EQ(blas.threading, "OpenMP");
  } else {
    // A libtorch linked against the system's BLAS (Debian's) calls libblas.so.3.
    EXPECT_EQ(file.rfind("libblas.so", 0), 0u) << blas.library_path;
  }
  if (blas.kind == BlasKind::kOpenBlas) {
    EXPECT_EQ(blas.description.rfind("OpenBLAS 0.", 0), 0u) << blas.description;
    EXPECT_FALSE(blas.threading.empty());
  }
}

TEST(MachineReportTest, ClassifiesBlasPaths) {
  EXPECT_EQ(
      classify_blas_path("/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0"), BlasKind::kReference);
  EXPECT_EQ(
      classify_blas_path("/usr/lib/x86_64-linux-gnu/blis-openmp/libblas.so.3"), BlasKind::kBlis);
  EXPECT_EQ(
      classify_blas_path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"),
      BlasKind::kOpenBlas);
  EXPECT_EQ(classify_blas_path("/opt/intel/mkl/lib/libmkl_rt.so.2"), BlasKind::kMkl);
  EXPECT_EQ(classify_blas_path("/usr/lib/x86_64-linux-gnu/atlas/libblas.so.3"), BlasKind::kOther);
}

TEST(MachineReportTest, CpuFeaturesAgreeWithTheKernel) {
  const std::set<std::string> flags = cpuinfo_flags();
  if (flags.empty()) {
    GTEST_SKIP() << "no flags line in /proc/cpuinfo (not x86 Linux)";
  }
  const CpuFeatures cpu = detect_cpu_features();
  EXPECT_EQ(cpu.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(cpu.avx512, flags.count("avx512f") == 1);
  EXPECT_EQ(cpu.avx512_bf16, flags.count("avx512_bf16") == 1);
  EXPECT_EQ(cpu.amx, flags.count("amx_bf16") == 1 && flags.count("amx_tile") == 1);
}

TEST(MachineReportTest, FollowsTheIntraOpThreadCount) {
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  MachineReport report = describe_machine({.local_ranks = 3});
  EXPECT_EQ(report.intra_op_threads, 1);
  EXPECT_EQ(report.local_ranks, 3);
  EXPECT_GE(report.cores, 1);
  EXPECT_EQ(report.onednn.rfind("oneDNN ", 0), 0u) << report.onednn; // loaded with libtorch
  EXPECT_FALSE(report.aten_capability.empty());
  const std::string line = report.summary();
  EXPECT_NE(line.find("1 intra-op thread(s) x 3 local rank(s)"), std::string::npos) << line;
  EXPECT_NE(line.find(report.blas.library_path), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line";
  at::set_num_threads(before);
}

TEST(MachineReportTest, WarnsAboutAReferenceBlasWithTheFix) {
  MachineReport report;
  report.blas.kind = BlasKind::kReference;
  report.blas.library_path = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0";
  const auto warnings = machine_warnings(report);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(mentions(warnings, "reference BLAS /usr/lib/x86_64-linux-gnu/blas/libblas.so"));
  EXPECT_TRUE(mentions(warnings, "libopenblas0-openmp"));
  report.blas.kind = BlasKind::kOpenBlas;
  EXPECT_TRUE(machine_warnings(report).empty());
}

TEST(MachineReportTest, WarnsWhenThreadsTimesRanksExceedTheCores) {
  MachineReport report;
  report.blas.kind = BlasKind::kOpenBlas;
  report.cores = 2;
  report.intra_op_threads = 1;
  report.local_ranks = 2;
  EXPECT_TRUE(machine_warnings(report).empty()); // 2 ranks x 1 thread on 2 cores
  report.intra_op_threads = 2;
  const auto warnings = machine_warnings(report);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(mentions(warnings, "2 intra-op threads x 2 local rank(s) = 4 threads on 2 cores"));
  EXPECT_TRUE(mentions(warnings, "MACHINE.NUM_THREADS"));
  EXPECT_TRUE(mentions(warnings, "to 1 or fewer"));
}

TEST(MachineReportTest, WarnsAboutAPthreadsBlasPool) {
  MachineReport report;
  report.blas = {
      BlasKind::kOpenBlas,
      "/x/openblas-pthread/libblas.so.3",
      "OpenBLAS 0.3.21 (pthreads)",
      "pthreads",
      2};
  report.cores = 2;
  report.intra_op_threads = 2;
  const auto warnings = machine_warnings(report);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_TRUE(mentions(warnings, "OPENBLAS_NUM_THREADS=2"));
  report.blas.own_threads = 1; // OPENBLAS_NUM_THREADS=1: no second pool
  EXPECT_TRUE(machine_warnings(report).empty());
}

} // namespace
} // namespace largo::machine_report_test

// A seeded fuzz suite over the inputs a careless or hostile user gives Largo: mutated configs
// and command-line overrides, damaged idx dataset files, damaged checkpoints. Each case runs
// in a child process (forked, or the real `largo config` program for a sample of the config
// cases) and must end within a time bound, never by a signal, and either run or fail with an
// error that names a config key or the file. Failures print the seed and case number, which
// replay one case:
//
//   LARGO_FUZZ_SEED=19 LARGO_FUZZ_ONLY_CASE=123 ./build/tests/largo_apps_tests
//   --gtest_filter='Fuzz*'
//
// LARGO_FUZZ_CASES (per family, default 300) or LARGO_FUZZ_SECONDS (per family) set how long
// it runs; CI uses the defaults (well under two minutes on 2 cores).
#include "apps/program_runner.h"

#include <largo/checkpoint/checkpoint_file.h>
#include <largo/checkpoint/zip_archive.h>
#include <largo/core/config.h>
#include <largo/core/error.h>
#include <largo/core/error_report.h>
#include <largo/data/idx_dataset.h>
#include <largo/train/resume_policy.h>
#include <largo/train/trainer_config.h>
#include <largo/train/worker_launch.h>

#include <caffe2/serialize/inline_container.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <poll.h>

#include <functional>
#include <random>
#include <regex>

namespace largo::testing::fuzz_test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

uint64_t env_number(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  return text == nullptr || *text == '\0' ? fallback : std::strtoull(text, nullptr, 10);
}

// How one case ended, as its child process reported it.
enum class Verdict { kRan, kCleanError, kUnclearError, kTimedOut, kSignal };

struct Outcome {
  Verdict verdict = Verdict::kRan;
  std::string detail;
};

// Runs `body` in a forked child, which reports "R" (ran), "C<message>" (an error naming a key
// or file) or "U<message>" (any other ending) through a pipe. The parent enforces `bound`.
Outcome run_isolated(const std::function<std::string()>& body, std::chrono::seconds bound) {
  int channel[2];
  if (::pipe(channel) != 0) {
    return {Verdict::kUnclearError, "pipe failed"};
  }
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(channel[0]);
    at::set_num_threads(1); // no thread pool after fork
    std::string report;
    try {
      report = body();
    } catch (...) {
      report = "U" + report_error(std::current_exception()).message;
    }
    for (size_t done = 0; done < report.size();) {
      const ssize_t n = ::write(channel[1], report.data() + done, report.size() - done);
      done += n > 0 ? static_cast<size_t>(n) : report.size();
    }
    ::_exit(0);
  }
  ::close(channel[1]);
  std::string report;
  const auto deadline = Clock::now() + bound;
  bool timed_out = false;
  while (true) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd fd{channel[0], POLLIN, 0};
    if (::poll(&fd, 1, static_cast<int>(left.count())) <= 0) {
      continue;
    }
    char buffer[4096];
    const ssize_t n = ::read(channel[0], buffer, sizeof buffer);
    if (n <= 0) {
      break; // the child closed its end: it is done
    }
    report.append(buffer, static_cast<size_t>(n));
  }
  ::close(channel[0]);
  int status = 0;
  if (timed_out) {
    ::kill(child, SIGKILL);
  }
  ::waitpid(child, &status, 0);
  if (timed_out) {
    return {Verdict::kTimedOut, fmt::format("did not end within {} s", bound.count())};
  }
  if (WIFSIGNALED(status)) {
    return {Verdict::kSignal, fmt::format("killed by signal {}", WTERMSIG(status))};
  }
  if (report.empty() || report[0] == 'U') {
    return {Verdict::kUnclearError, report.empty() ? "no report" : report.substr(1)};
  }
  return {report[0] == 'R' ? Verdict::kRan : Verdict::kCleanError, report.substr(1)};
}

// Counts per family, and the first failures with what reproduces them.
struct Tally {
  explicit Tally(std::string name) : family(std::move(name)) {}
  std::string family;
  int cases = 0;
  int ran = 0;
  int clean_errors = 0;
  std::vector<std::string> failures;

  void add(uint64_t case_number, const std::string& description, const Outcome& outcome) {
    ++cases;
    if (outcome.verdict == Verdict::kRan) {
      ++ran;
    } else if (outcome.verdict == Verdict::kCleanError) {
      ++clean_errors;
    } else if (failures.size() < 10) {
      failures.push_back(fmt::format(
          "case {} ({}): {}", case_number, description, abbreviate(outcome.detail, 400)));
    }
  }
  void report(uint64_t seed) const {
    std::printf(
        "fuzz %s: %d cases (seed %llu): %d ran, %d refused with a clear error, %zu "
        "failed\n",
        family.c_str(),
        cases,
        static_cast<unsigned long long>(seed),
        ran,
        clean_errors,
        failures.size());
    for (const auto& failure : failures) {
      ADD_FAILURE() << "fuzz " << family << " (LARGO_FUZZ_SEED=" << seed << "): " << failure;
    }
  }
};

// Runs cases 0, 1, ... of a family until the case count or the time budget is spent.
void run_family(Tally& tally, const std::function<void(uint64_t, std::mt19937_64&)>& one_case) {
  const uint64_t seed = env_number("LARGO_FUZZ_SEED", 19);
  const uint64_t only = env_number("LARGO_FUZZ_ONLY_CASE", UINT64_MAX);
  const uint64_t cases = env_number("LARGO_FUZZ_CASES", 300);
  const uint64_t seconds = env_number("LARGO_FUZZ_SECONDS", 0);
  const auto deadline = Clock::now() + std::chrono::seconds(seconds);
  for (uint64_t i = only == UINT64_MAX ? 0 : only;; ++i) {
    if (only != UINT64_MAX ? i > only : seconds > 0 ? Clock::now() > deadline : i >= cases) {
      break;
    }
    std::mt19937_64 random(seed * 1000003u + i);
    one_case(i, random);
  }
  tally.report(seed);
}

size_t pick(std::mt19937_64& random, size_t n) {
  return std::uniform_int_distribution<size_t>(0, n - 1)(random);
}

std::string random_bytes(std::mt19937_64& random, size_t n) {
  std::string bytes(n, '\0');
  for (char& c : bytes) {
    c = static_cast<char>(random() & 0xff);
  }
  return bytes;
}

// Damage `bytes` once: flip bits, overwrite a stretch, cut, insert or repeat a piece.
void damage(std::string& bytes, std::mt19937_64& random) {
  if (bytes.empty()) {
    bytes = random_bytes(random, 1 + pick(random, 64));
    return;
  }
  const size_t at = pick(random, bytes.size());
  switch (pick(random, 5)) {
  case 0:
    bytes[at] = static_cast<char>(bytes[at] ^ (1 << pick(random, 8)));
    break;
  case 1:
    bytes.replace(
        at,
        std::min<size_t>(bytes.size() - at, 1 + pick(random, 8)),
        random_bytes(random, 1 + pick(random, 8)));
    break;
  case 2:
    bytes.resize(at);
    break;
  case 3:
    bytes.insert(at, random_bytes(random, 1 + pick(random, 16)));
    break;
  default:
    bytes.insert(at, bytes.substr(pick(random, bytes.size()), 1 + pick(random, 32)));
  }
}

// ---- configs and overrides -----------------------------------------------------------

// A small valid job: every section the trainer reads, a composite schedule, transforms.
const char* kBaseConfig = R"(# @package _global_
config:
  DATA:
    NUM_DATALOADER_WORKERS: 1
    TRAIN:
      DATA_SOURCES: [synthetic]
      SYNTHETIC:
        NUM_SAMPLES: 64
        IMAGE_SHAPE: [1, 8, 8]
        NUM_CLASSES: 4
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS:
        - {name: RandomCrop, size: [8], padding: [1]}
        - {name: ToTensor}
    TEST:
      DATA_SOURCES: [synthetic]
      SYNTHETIC: {NUM_SAMPLES: 32, IMAGE_SHAPE: [1, 8, 8], NUM_CLASSES: 4}
      BATCHSIZE_PER_REPLICA: 16
      TRANSFORMS: [{name: ToTensor}]
  MODEL:
    TRUNK:
      NAME: mlp
      MLP: {HIDDEN_DIMS: [16]}
  OPTIMIZER:
    name: sgd
    num_epochs: 1
    param_schedulers:
      lr:
        name: composite
        schedulers:
          - {name: linear, start_value: 0.0, end_value: 0.1}
          - {name: cosine, start_value: 0.1, end_value: 0.0}
        lengths: [0.5, 0.5]
        update_interval: step
  MACHINE: {DEVICE: cpu, NUM_THREADS: 1}
  CHECKPOINT: {DIR: /tmp/largo_fuzz_run}
)";

// Values that have broken config parsers: sizes, signs, types, nesting, encodings.
const std::vector<std::string>& nasty_values() {
  static const std::vector<std::string> values = {
      "0",
      "-1",
      "1",
      "2147483648",
      "-9223372036854775809",
      "100000000000000000000000000000",
      std::string(40000, '7'),
      "1e308",
      "-1e999",
      "nan",
      ".inf",
      "''",
      "\"\"",
      "[]",
      "{}",
      "[0, 0, 0]",
      "[1000000000000]",
      "[-1]",
      "[1, 2, 3, 4]",
      "null",
      "~",
      "True",
      "yes",
      std::string(20000, 'x'),
      "'\u00e9\u20ac\U0001F600'",
      "[[[[[[[[]]]]]]]]",
      "{a: {b: {c: 1}}}",
      "*undefined",
      "!!binary AAAA",
      "1:2",
      "[1, [2, [3]]]",
      std::string(3000, '[') + std::string(3000, ']'),
      "{name: Nope}",
      "[{name: RandomCrop, size: [64]}]",
      "[{name: Normalize, mean: [0.5], std: [0]}]",
      "{name: composite, schedulers: [{name: cosine, start_vaule: 1}], lengths: [1]}",
      "{name: multistep, values: [0.1], milestones: [5, 3]}",
      "100000",
      "65536"};
  return values;
}

// Every dotted key of the defaults (the keys a user can set).
std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  std::vector<std::pair<std::string, YAML::Node>> pending = {{"", Config::defaults().root()}};
  while (!pending.empty()) {
    auto [path, node] = pending.back();
    pending.pop_back();
    for (const auto& entry : node) {
      const std::string key =
          path.empty() ? entry.first.Scalar() : path + "." + entry.first.Scalar();
      keys.push_back(key);
      if (entry.second.IsMap()) {
        pending.emplace_back(key, entry.second);
      }
    }
  }
  return keys;
}

struct ConfigCase {
  std::string yaml = kBaseConfig;
  std::vector<std::string> overrides;
  std::string description;
};

void mutate_config(ConfigCase& c, std::mt19937_64& random) {
  static const std::vector<std::string> keys = config_keys();
  const std::string& value = nasty_values()[pick(random, nasty_values().size())];
  std::string key = keys[pick(random, keys.size())];
  std::vector<std::string> lines;
  std::istringstream in(c.yaml);
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
  }
  while (lines.size() < 3) { // an earlier mutation cut the file short: lines to pick from
    lines.push_back("  SEED_VALUE: 1");
  }
  const size_t line = 2 + pick(random, lines.size() - 2);
  const auto join_lines = [&] {
    std::string text;
    for (const auto& l : lines) {
      text += l + "\n";
    }
    return text;
  };
  switch (pick(random, 9)) {
  case 0:
    c.overrides.push_back(key + "=" + value);
    c.description += " override " + abbreviate(key + "=" + value, 60);
    return;
  case 1:
    key[pick(random, key.size())] = static_cast<char>('a' + pick(random, 26));
    c.overrides.push_back((pick(random, 4) == 0 ? "config." : "") + key + "=1");
    c.description += " typo override " + key;
    return;
  case 2:
    if (const size_t colon = lines[line].find(": "); colon != std::string::npos) {
      lines[line] = lines[line].substr(0, colon + 2) + value;
    }
    c.description += fmt::format(" value of line {} = {}", line + 1, abbreviate(value, 40));
    break;
  case 3:
    lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(line), std::string(lines[line]));
    c.description += fmt::format(" line {} twice", line + 1);
    break;
  case 4:
    lines.push_back("---");
    lines.push_back("config: {SEED_VALUE: 3}");
    c.description += " second document";
    break;
  case 5:
    lines.insert(lines.begin() + 2, "  [1, 2]: 3");
    c.description += " list as a key";
    break;
  case 6:
    c.yaml = join_lines();
    damage(c.yaml, random);
    c.description += " damaged bytes";
    return;
  case 7:
    lines.push_back("  SEED_VALUE: [" + std::string(300000, '0') + "]");
    c.description += " 300 KB line";
    break;
  default:
    lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(line));
    c.description += fmt::format(" line {} deleted", line + 1);
  }
  c.yaml = join_lines();
}

// An error names what it concerns: a config key, an override, or the file.
bool names_key_or_file(const std::string& message, const std::string& file) {
  static const std::regex key(R"(config key|command-line override|[A-Z][A-Z_]+\.[A-Za-z_])");
  return message.find(file) != std::string::npos || std::regex_search(message, key);
}

std::string validate_config_case(const fs::path& file, const std::vector<std::string>& overrides) {
  try {
    Config config = Config::defaults();
    config.merge_file(file);
    for (const auto& assignment : overrides) {
      config.apply_override(assignment);
    }
    train::trainer_options_from_config(config);
    train::validate_launch_config(config);
    return "R";
  } catch (const Error& e) {
    return (names_key_or_file(e.what(), file.string()) ? "C" : "U") + std::string(e.what());
  }
}

// The real program on the same case: the error boundary, its exit codes, no stack frames.
Outcome run_config_program(const fs::path& file, const std::vector<std::string>& overrides) {
  std::vector<std::string> argv = {largo_program(), "config", file.string()};
  argv.insert(argv.end(), overrides.begin(), overrides.end());
  const ProgramResult run = run_program(argv, {}, std::chrono::seconds(30));
  if (run.timed_out) {
    return {Verdict::kTimedOut, "largo config did not end within 30 s"};
  }
  if (!WIFEXITED(run.wait_status)) {
    return {Verdict::kSignal, run.status()};
  }
  const int code = WEXITSTATUS(run.wait_status);
  const bool traced = run.output.find("frame #") != std::string::npos ||
                      run.output.find("Exception raised from") != std::string::npos;
  if (code == 0 && !traced) {
    return {Verdict::kRan, ""};
  }
  const bool clean =
      !traced && (code == 2 || code == 5) && names_key_or_file(run.output, file.string());
  return {
      clean ? Verdict::kCleanError : Verdict::kUnclearError,
      fmt::format("largo config: exit {}: {}", code, abbreviate(run.output, 300))};
}

TEST(FuzzTest, ConfigsAndOverrides) {
  TestDir dir;
  const fs::path file = dir / "fuzz.yaml";
  Tally tally{"configs and overrides"};
  Tally program{"configs through the largo program"};
  const uint64_t program_every = env_number("LARGO_FUZZ_PROGRAM_EVERY", 12);
  run_family(tally, [&](uint64_t i, std::mt19937_64& random) {
    ConfigCase c;
    for (size_t m = 0, n = 1 + pick(random, 3); m < n; ++m) {
      mutate_config(c, random);
    }
    std::ofstream(file, std::ios::binary) << c.yaml;
    tally.add(
        i,
        c.description,
        run_isolated(
            [&] { return validate_config_case(file, c.overrides); }, std::chrono::seconds(10)));
    if (program_every > 0 && i % program_every == 0) {
      program.add(i, c.description, run_config_program(file, c.overrides));
    }
  });
  program.report(env_number("LARGO_FUZZ_SEED", 19));
}

// ---- idx dataset files ------------------------------------------------------------------

std::string big_endian(uint32_t value) {
  return {
      static_cast<char>(value >> 24),
      static_cast<char>(value >> 16),
      static_cast<char>(value >> 8),
      static_cast<char>(value)};
}

// A valid pair: 12 images of 5x5 and their labels (0-9).
std::pair<std::string, std::string> idx_pair() {
  std::string images =
      big_endian(data::IdxDataset::kImagesMagic) + big_endian(12) + big_endian(5) + big_endian(5);
  std::string labels = big_endian(data::IdxDataset::kLabelsMagic) + big_endian(12);
  for (int n = 0; n < 12; ++n) {
    images += std::string(25, static_cast<char>(n * 17));
    labels += static_cast<char>(n % 10);
  }
  return {images, labels};
}

std::string gzipped(const std::string& bytes) {
  uLongf size = compressBound(bytes.size()) + 64;
  std::string out(size, '\0');
  z_stream stream{};
  deflateInit2(&stream, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  deflate(&stream, Z_FINISH);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

TEST(FuzzTest, IdxDatasetFiles) {
  TestDir dir;
  Tally tally{"idx dataset files"};
  run_family(tally, [&](uint64_t i, std::mt19937_64& random) {
    auto [images, labels] = idx_pair();
    std::string description;
    for (std::string* file : {&images, &labels}) {
      if (pick(random, 2) == 0) {
        continue;
      }
      if (pick(random, 3) == 0) { // a header field set to an extreme count or size
        static const uint32_t extremes[] = {0, 1, 0x7fffffff, 0x80000000, 0xffffffff, 60000};
        const size_t field = 4 * (1 + pick(random, file == &images ? 3 : 1));
        file->replace(field, 4, big_endian(extremes[pick(random, std::size(extremes))]));
        description += fmt::format(" header field at {} set", field);
      } else {
        for (size_t m = 0, n = 1 + pick(random, 3); m < n; ++m) {
          damage(*file, random);
        }
        description += " damaged";
      }
    }
    const bool gz = pick(random, 3) == 0;
    for (const auto& name : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte"}) {
      fs::remove(dir / name);
      fs::remove(dir / (std::string(name) + ".gz"));
    }
    std::ofstream(
        dir / (gz ? "train-images-idx3-ubyte.gz" : "train-images-idx3-ubyte"), std::ios::binary)
        << (gz ? gzipped(images) : images);
    std::ofstream(
        dir / (gz ? "train-labels-idx1-ubyte.gz" : "train-labels-idx1-ubyte"), std::ios::binary)
        << (gz ? gzipped(labels) : labels);
    tally.add(
        i,
        description + (gz ? " (gzip)" : ""),
        run_isolated(
            [&] {
              try {
                data::IdxDataset::load(dir.path(), data::Split::kTrain);
                return std::string("R");
              } catch (const Error& e) {
                const bool named =
                    std::string(e.what()).find(dir.path().string()) != std::string::npos;
                return (named ? "C" : "U") + std::string(e.what());
              }
            },
            std::chrono::seconds(10)));
  });
}

// ---- checkpoints -------------------------------------------------------------------------

// What the trainer writes, in miniature: tensors of several dtypes, nested dicts, typed lists.
checkpoint::StateDict training_checkpoint() {
  checkpoint::StateDict state = checkpoint::make_state_dict();
  checkpoint::StateDict model(c10::StringType::get(), c10::TensorType::get());
  model.insert("trunk.0.weight", torch::arange(12, torch::kFloat).reshape({3, 4}));
  model.insert("trunk.0.bias", torch::ones({3}, torch::kDouble));
  model.insert("bn.num_batches_tracked", torch::tensor(int64_t{7}));
  state.insert("model", model);
  checkpoint::StateDict optimizer = checkpoint::make_state_dict();
  optimizer.insert("type", std::string("sgd"));
  checkpoint::StateDict group = checkpoint::make_state_dict();
  group.insert("params", c10::List<std::string>({"trunk.0.weight", "trunk.0.bias"}));
  group.insert("lr", 0.1);
  c10::impl::GenericList groups(c10::AnyType::get());
  groups.push_back(group);
  optimizer.insert("param_groups", groups);
  state.insert("optimizer", optimizer);
  for (const char* key : {"epoch", "iteration_in_epoch", "iteration", "iterations_per_epoch"}) {
    state.insert(key, int64_t{3});
  }
  state.insert("complete", false);
  state.insert("rng_state", torch::zeros({32}, torch::kUInt8));
  state.insert("pieces", c10::List<int64_t>({0, 12}));
  state.insert("top1", c10::IValue());
  return state;
}

// The archive's records with one of them damaged, written again as a valid zip (so the CRCs
// pass and the damage reaches the pickle reader and the tensor checks).
std::string rezipped_with_damage(const fs::path& base, std::mt19937_64& random, std::string& what) {
  checkpoint::ZipArchive archive(base);
  std::vector<std::pair<std::string, std::string>> records;
  for (const auto& entry : archive.entries()) {
    const std::string name = entry.name.substr(entry.name.find('/') + 1);
    if (name != "version") {
      records.emplace_back(name, archive.read(entry));
    }
  }
  auto& [name, bytes] =
      records[pick(random, 3) == 0 ? pick(random, records.size()) : records.size() - 1]; // data.pkl
                                                                                         // is last
  for (size_t m = 0, n = 1 + pick(random, 3); m < n; ++m) {
    damage(bytes, random);
  }
  what = "re-zipped with " + name + " damaged";
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const auto& [record, content] : records) {
    writer.writeRecord(record, content.data(), content.size());
  }
  writer.writeEndOfFile();
  return out;
}

TEST(FuzzTest, Checkpoints) {
  TestDir dir;
  const fs::path base = dir / "base.torch";
  checkpoint::save_checkpoint(base, training_checkpoint());
  std::string base_bytes;
  {
    std::ifstream in(base, std::ios::binary);
    base_bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const fs::path path = dir / "model_phase3.torch";
  Tally tally{"checkpoints"};
  run_family(tally, [&](uint64_t i, std::mt19937_64& random) {
    std::string description;
    std::string bytes;
    if (pick(random, 2) == 0) {
      bytes = rezipped_with_damage(base, random, description);
    } else {
      bytes = base_bytes;
      for (size_t m = 0, n = 1 + pick(random, 3); m < n; ++m) {
        damage(bytes, random);
      }
      description = "file bytes damaged";
    }
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    tally.add(
        i,
        description,
        run_isolated(
            [&] {
              try {
                train::load_intact_checkpoint(path);
                return std::string("R");
              } catch (const Error& e) {
                const bool named = std::string(e.what()).find(path.string()) != std::string::npos;
                return (named ? "C" : "U") + std::string(e.what());
              }
            },
            std::chrono::seconds(10)));
  });
}

} // namespace
} // namespace largo::testing::fuzz_test

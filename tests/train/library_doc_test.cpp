// docs/library.md quotes what ParallelModel::describe() prints: the quotes are compared with
// what the code prints for the same layout (DDP and FSDP over 2 ranks, float32), so the page
// cannot drift from the code. A "..." in a quote stands for any text (sizes, unit lists).
#include <largo/optim/sgd.h>
#include <largo/parallel/parallelize.h>

#include "comm/distributed_test_util.h"
#include "test_paths.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace largo::train::library_doc_test {
namespace {

struct NetImpl : torch::nn::Module {
  torch::nn::Sequential blocks{torch::nn::Linear(4, 8), torch::nn::Linear(8, 2)};
  NetImpl() {
    register_module("blocks", blocks);
  }
  at::Tensor forward(const at::Tensor& x) {
    return blocks->forward(x);
  }
};
TORCH_MODULE(Net);

// The page's text with every run of whitespace (its line breaks) made one space.
std::string page_text(const std::string& page) {
  std::ifstream in(std::string(largo::test_paths::data_dir()) + "/../docs/" + page);
  std::stringstream text;
  text << in.rdbuf();
  return std::regex_replace(text.str(), std::regex(R"(\s+)"), " ");
}

// The quoted texts of the sentence that begins with `describe()` says what runs.
std::vector<std::string> describe_quotes() {
  const std::string text = page_text("library.md");
  const std::string start = "`describe()` says what runs";
  const size_t begin = text.find(start);
  if (begin == std::string::npos) {
    return {};
  }
  const size_t end = text.find("`memory_report", begin);
  const std::string sentence = text.substr(begin, end - begin);
  std::vector<std::string> quotes;
  const std::regex quoted(R"re("([^"]+)")re");
  for (std::sregex_iterator it(sentence.begin(), sentence.end(), quoted), last; it != last; ++it) {
    quotes.push_back((*it)[1].str());
  }
  return quotes;
}

// Whether `text` is `quote`, with each "..." of the quote standing for any text.
bool matches_quote(const std::string& quote, const std::string& text) {
  std::vector<std::string> parts;
  for (size_t from = 0;;) {
    const size_t dots = quote.find("...", from);
    parts.push_back(quote.substr(from, dots == std::string::npos ? dots : dots - from));
    if (dots == std::string::npos) {
      break;
    }
    from = dots + 3;
  }
  if (text.compare(0, parts.front().size(), parts.front()) != 0) {
    return false;
  }
  size_t at = parts.front().size();
  for (size_t i = 1; i < parts.size(); ++i) {
    const size_t found = text.find(parts[i], at);
    if (found == std::string::npos) {
      return false;
    }
    at = found + parts[i].size();
  }
  return parts.size() > 1 ? (parts.back().empty() || at == text.size()) : at == text.size();
}

std::string describe_over_two_ranks(comm::ProcessGroup& group, parallel::DataParallelism mode) {
  Net net;
  optim::ParamGroup params;
  for (const auto& parameter : net->named_parameters()) {
    params.params.push_back(parameter.value());
    params.names.push_back(parameter.key());
  }
  parallel::ParallelOptions options;
  options.data_parallelism = mode;
  auto model = parallel::parallelize(
      torch::nn::AnyModule(net),
      {params},
      [](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
        return std::make_unique<optim::SGD>(std::move(groups));
      },
      std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {}),
      options);
  return model->describe();
}

TEST(LibraryDocTest, DescribeIsQuotedAsTheCodePrintsIt) {
  const std::vector<std::string> quotes = describe_quotes();
  ASSERT_EQ(quotes.size(), 2u) << "docs/library.md: the describe() sentence with a DDP and an "
                                  "FSDP example";
  largo::testing::run_on_ranks(2, [&](comm::ProcessGroup& group) {
    const std::string ddp = describe_over_two_ranks(group, parallel::DataParallelism::kDdp);
    EXPECT_TRUE(matches_quote(quotes[0], ddp))
        << "docs/library.md: \"" << quotes[0] << "\"\nthe code:         \"" << ddp << "\"";
    const std::string fsdp = describe_over_two_ranks(group, parallel::DataParallelism::kFsdp);
    EXPECT_TRUE(matches_quote(quotes[1], fsdp))
        << "docs/library.md: \"" << quotes[1] << "\"\nthe code:         \"" << fsdp << "\"";
  });
}

} // namespace
} // namespace largo::train::library_doc_test

// Brace and glob expansion of a WebDataset shard list.
#include "largo/data/shard_list.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "largo/core/error.h"

namespace largo::data {
namespace {

bool is_integer(const std::string& text) {
  const size_t start = !text.empty() && text[0] == '-' ? 1 : 0;
  return text.size() > start &&
         std::all_of(text.begin() + static_cast<std::ptrdiff_t>(start), text.end(), ::isdigit);
}

// The words of one brace's body: "a..b" a numeric range, "x,y,z" alternatives.
std::vector<std::string> brace_words(const std::string& body, const std::string& pattern) {
  const size_t dots = body.find("..");
  if (dots != std::string::npos && body.find(',') == std::string::npos) {
    const std::string first = body.substr(0, dots);
    const std::string last = body.substr(dots + 2);
    if (!is_integer(first) || !is_integer(last)) {
      throw DataError(fmt::format(
          "shard list {}: {{{}}} is not a numeric range; write {{000000..000099}}", pattern, body));
    }
    const int64_t from = std::stoll(first);
    const int64_t to = std::stoll(last);
    const int64_t step = from <= to ? 1 : -1;
    // braceexpand pads to the wider bound when either is written with a leading zero.
    const auto zero_padded = [](const std::string& b) { return b.size() > 1 && b[0] == '0'; };
    const size_t width =
        zero_padded(first) || zero_padded(last) ? std::max(first.size(), last.size()) : 0;
    std::vector<std::string> words;
    for (int64_t i = from;; i += step) {
      words.push_back(fmt::format("{:0{}}", i, width));
      if (i == to) {
        break;
      }
    }
    return words;
  }
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t comma; (comma = body.find(',', start)) != std::string::npos; start = comma + 1) {
    words.push_back(body.substr(start, comma - start));
  }
  words.push_back(body.substr(start));
  return words;
}

bool has_glob(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos;
}

std::vector<std::string> glob_matches(const std::string& path, const std::string& pattern) {
  glob_t found{};
  const int status = ::glob(path.c_str(), 0, nullptr, &found);
  std::vector<std::string> matches(found.gl_pathv, found.gl_pathv + found.gl_pathc);
  globfree(&found);
  if (status != 0 || matches.empty()) {
    throw DataError(fmt::format("shard list {}: {} matches no file", pattern, path));
  }
  std::sort(matches.begin(), matches.end());
  return matches;
}

} // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    return {pattern};
  }
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos) {
    throw DataError(fmt::format("shard list {}: a '{{' without its '}}'", pattern));
  }
  const std::string head = pattern.substr(0, open);
  const std::vector<std::string> tails = expand_braces(pattern.substr(close + 1));
  std::vector<std::string> expanded;
  for (const std::string& word : brace_words(pattern.substr(open + 1, close - open - 1), pattern)) {
    for (const std::string& tail : tails) {
      expanded.push_back(head + word + tail);
    }
  }
  return expanded;
}

std::vector<std::string> expand_shard_list(const std::string& pattern) {
  std::vector<std::string> shards;
  for (const std::string& path : expand_braces(pattern)) {
    if (has_glob(path)) {
      const std::vector<std::string> matches = glob_matches(path, pattern);
      shards.insert(shards.end(), matches.begin(), matches.end());
    } else if (std::filesystem::exists(path)) {
      shards.push_back(path);
    } else {
      throw DataError(fmt::format("shard list {}: {} does not exist", pattern, path));
    }
  }
  if (shards.empty()) {
    throw DataError(fmt::format("shard list {} names no file", pattern));
  }
  return shards;
}

} // namespace largo::data

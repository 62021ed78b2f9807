// Shard lists: webdataset's brace expansion (braceexpand's padding) and globs.
#include <gtest/gtest.h>

#include "data/tar_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"
#include "largo/data/shard_list.h"

namespace largo::data::shard_list_test {
namespace {

using Strings = std::vector<std::string>;

TEST(ShardList, BraceRangesAndAlternativesExpandLikeBraceexpand) {
  EXPECT_EQ(
      expand_braces("train-{000000..000002}.tar"),
      (Strings{"train-000000.tar", "train-000001.tar", "train-000002.tar"}));
  EXPECT_EQ(expand_braces("s{8..11}"), (Strings{"s8", "s9", "s10", "s11"}));
  EXPECT_EQ(expand_braces("s{08..10}"), (Strings{"s08", "s09", "s10"}));
  EXPECT_EQ(expand_braces("s{3..1}"), (Strings{"s3", "s2", "s1"}));
  EXPECT_EQ(
      expand_braces("{a,b}-{0..1}.tar"), (Strings{"a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar"}));
  EXPECT_EQ(expand_braces("plain.tar"), (Strings{"plain.tar"}));
  EXPECT_THROW(expand_braces("s{0..2.tar"), DataError);
  EXPECT_THROW(expand_braces("s{a..c}.tar"), DataError);
}

TEST(ShardList, GlobsAreSortedAndAMissingShardIsNamed) {
  testing::TempDir dir;
  for (const char* name : {"b-1.tar", "a-2.tar", "a-10.tar", "other.txt"}) {
    testing::write_bytes(dir.path() / name, {});
  }
  const std::string root = dir.path().string() + "/";
  EXPECT_EQ(
      expand_shard_list(root + "*.tar"),
      (Strings{root + "a-10.tar", root + "a-2.tar", root + "b-1.tar"}));
  EXPECT_EQ(expand_shard_list(root + "{b,a}-?.tar"), (Strings{root + "b-1.tar", root + "a-2.tar"}));
  try {
    expand_shard_list(root + "a-{1..2}.tar");
    FAIL() << "a-1.tar does not exist";
  } catch (const DataError& error) {
    EXPECT_NE(std::string(error.what()).find(root + "a-1.tar does not exist"), std::string::npos)
        << error.what();
  }
  EXPECT_THROW(expand_shard_list(root + "*.tgz"), DataError);
}

} // namespace
} // namespace largo::data::shard_list_test

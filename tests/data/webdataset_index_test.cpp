// WebDataset shards indexed from their headers: samples grouped by key, labels from .cls,
// images read back from the tars; bad samples named by shard and member, or skipped.
#include <functional>

#include <gtest/gtest.h>

#include "data/tar_test_util.h"
#include "data/temp_dir.h"
#include "largo/core/error.h"
#include "largo/data/dataset_factory.h"
#include "largo/data/image_dataset.h"
#include "largo/data/webdataset_index.h"

namespace largo::data::webdataset_index_test {
namespace {

using testing::TarEntry;
using testing::TempDir;

void expect_contains(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

std::vector<TarEntry> operator+(std::vector<TarEntry> a, const std::vector<TarEntry>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(WebDatasetIndex, GroupsMembersByKeyAndReadsImagesBackFromTheTars) {
  TempDir dir;
  const auto shard = dir.path() / "s-0.tar";
  const std::vector<uint8_t> jpeg = testing::encode_jpeg(testing::pattern_image(16, 12, 3));
  // Fields in any order, upper-case extensions, extra fields ignored, keys with folders.
  testing::write_tar(
      shard,
      {{"a/x.cls", testing::text_bytes("4\n")},
       {"a/x.json", testing::text_bytes("{}")},
       {"a/x.PNG", testing::tiny_png(1)},
       {"b.jpg", jpeg},
       {"b.cls", testing::text_bytes("2")}});
  auto shards = index_webdataset((dir.path() / "s-{0..0}.tar").string(), false);
  EXPECT_EQ(shards->shard_sizes, (std::vector<int64_t>{2}));
  EXPECT_EQ(shards->list.labels, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(shards->list.paths[0], shard.string() + ":a/x.PNG");
  EXPECT_EQ(shards->list.num_classes(), 5);
  std::vector<uint8_t> bytes;
  shards->list.bytes_source->read(1, bytes);
  EXPECT_EQ(bytes, jpeg);
  shards->list.bytes_source->read(0, bytes);
  EXPECT_EQ(bytes, testing::tiny_png(1));
}

TEST(WebDatasetIndex, AMissingLabelOrImageNamesTheShardAndSampleOrIsSkipped) {
  TempDir dir;
  const auto shard = dir.path() / "s.tar";
  testing::write_tar(
      shard,
      testing::sample_entries("k0", 0, 0) +
          std::vector<TarEntry>{{"k1.png", testing::tiny_png(1)}} +
          testing::sample_entries("k2", 2, 2) +
          std::vector<TarEntry>{{"k3.cls", testing::text_bytes("3")}} +
          std::vector<TarEntry>{
              {"k4.png", testing::tiny_png(4)}, {"k4.cls", testing::text_bytes("-1")}});
  const std::string missing_label =
      testing::data_error_of([&] { index_webdataset(shard.string(), false); });
  expect_contains(
      missing_label, shard.string() + ": sample k1 (k1.png) has no label member k1.cls");

  auto skipped = index_webdataset(shard.string(), true);
  EXPECT_EQ(skipped->list.labels, (std::vector<int64_t>{0, 2})) << "k1, k3 and k4 dropped";
  EXPECT_EQ(skipped->num_bad_samples, 3);
  EXPECT_EQ(skipped->shard_sizes, (std::vector<int64_t>{2}));

  testing::write_tar(
      shard,
      testing::sample_entries("k0", 0, 0) +
          std::vector<TarEntry>{{"k3.cls", testing::text_bytes("3")}});
  expect_contains(
      testing::data_error_of([&] { index_webdataset(shard.string(), false); }),
      "sample k3 has no image member");
  testing::write_tar(
      shard,
      std::vector<TarEntry>{
          {"k4.png", testing::tiny_png(4)}, {"k4.cls", testing::text_bytes("-1")}});
  expect_contains(
      testing::data_error_of([&] { index_webdataset(shard.string(), false); }),
      "member k4.cls holds '-1', not a class index");
}

TEST(WebDatasetIndex, ATruncatedShardIsNamedOrKeepsTheSamplesBeforeTheDamage) {
  TempDir dir;
  const auto shard = dir.path() / "cut.tar";
  std::vector<uint8_t> bytes = testing::tar_bytes(
      testing::sample_entries("k0", 0, 0) + testing::sample_entries("k1", 1, 1) +
      testing::sample_entries("k2", 2, 2));
  // Cut inside k2.png's data (k0 and k1 take 4 members, each 1 data block at most).
  const size_t k2_png_data = 4 * 1024 + 512;
  bytes.resize(k2_png_data + 20);
  testing::write_bytes(shard, bytes);
  const std::string message =
      testing::data_error_of([&] { index_webdataset(shard.string(), false); });
  expect_contains(message, shard.string());
  expect_contains(message, "truncated");
  expect_contains(message, "k2.png");
  auto kept = index_webdataset(shard.string(), true);
  EXPECT_EQ(kept->list.labels, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(kept->num_bad_samples, 1);
}

TEST(WebDatasetIndex, AnUndecodableImageNamesShardAndMemberOrIsReplaced) {
  TempDir dir;
  const auto shard = dir.path() / "s.tar";
  testing::write_tar(
      shard,
      testing::sample_entries("k0", 0, 0) +
          std::vector<TarEntry>{
              {"k1.png", testing::text_bytes("not a png")}, {"k1.cls", testing::text_bytes("1")}} +
          testing::sample_entries("k2", 2, 2));
  DataSourceOptions source;
  source.source = "webdataset";
  source.path = shard;
  source.transforms = {{"CenterCrop", {{"size", {4}}}}, {"ToTensor", {}}};
  OpenedDataset opened = open_dataset(source, Split::kTrain, 0);
  EXPECT_EQ(opened.shard_sizes, (std::vector<int64_t>{3}));
  const std::string message = testing::data_error_of([&] { opened.dataset->get_batch({1}); });
  expect_contains(message, shard.string() + ":k1.png");

  source.images.skip_bad_samples = true;
  OpenedDataset skipping = open_dataset(source, Split::kTrain, 0);
  const Batch batch = skipping.dataset->get_batch({0, 1, 2});
  EXPECT_EQ(batch.num_bad_samples, 1);
  EXPECT_TRUE(batch.labels.equal(at::tensor({0, 2, 2}, at::kLong))) << "k1 replaced by k2";
}

} // namespace
} // namespace largo::data::webdataset_index_test

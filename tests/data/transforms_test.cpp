// Batch transforms: exact values for the deterministic ones, geometric invariants for the
// random ones, and the spec factory.
#include "largo/data/transforms.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "largo/core/error.h"

namespace largo::data::transforms_test {
namespace {

at::Generator seeded(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// [batch, channels, h, w] uint8 with every pixel distinct and non-zero within an image,
// so a zero can only be padding and a value pins down its source position.
at::Tensor distinct_batch(int64_t batch, int64_t channels, int64_t h, int64_t w) {
  return (at::arange(batch * channels * h * w, at::kLong).remainder(channels * h * w) + 1)
      .view({batch, channels, h, w})
      .to(at::kInt);
}

TEST(ToFloat, ScalesBytesToUnitRangeAndPassesFloatsThrough) {
  at::Generator gen = seeded(0);
  const at::Tensor bytes = at::tensor({0, 51, 255, 128}, at::kByte).view({1, 1, 2, 2});
  const at::Tensor out = ToFloat().apply(bytes, gen);
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_TRUE(out.equal(at::tensor({0.0F, 0.2F, 1.0F, 128.0F / 255.0F}).view({1, 1, 2, 2})));
  const at::Tensor floats = at::rand({2, 1, 2, 2});
  EXPECT_TRUE(ToFloat().apply(floats, gen).equal(floats));
}

TEST(Normalize, SubtractsMeanAndDividesByStdPerChannel) {
  at::Generator gen = seeded(0);
  const at::Tensor batch = at::tensor({1.0F, 2.0F, 3.0F, 4.0F}).view({1, 2, 1, 2});
  const at::Tensor out = Normalize({1.0, 2.0}, {2.0, 0.5}).apply(batch, gen);
  EXPECT_TRUE(out.equal(at::tensor({0.0F, 0.5F, 2.0F, 4.0F}).view({1, 2, 1, 2})));
  // One value applies to every channel.
  EXPECT_TRUE(Normalize({1.0}, {2.0})
                  .apply(batch, gen)
                  .equal(at::tensor({0.0F, 0.5F, 1.0F, 1.5F}).view({1, 2, 1, 2})));
}

TEST(Normalize, RejectsBadArgumentsAndInputs) {
  at::Generator gen = seeded(0);
  EXPECT_THROW(Normalize({}, {}), ConfigError);
  EXPECT_THROW(Normalize({0.5, 0.5}, {0.5}), ConfigError);
  EXPECT_THROW(Normalize({0.5}, {0.0}), ConfigError);
  EXPECT_THROW(Normalize({0.1, 0.2}, {1.0, 1.0}).apply(at::zeros({1, 3, 2, 2}), gen), ConfigError);
  // The same before any data: a pipeline's shape over 3-channel samples.
  EXPECT_THROW(Normalize({0.1, 0.2}, {1.0, 1.0}).output_shape({3, 2, 2}), ConfigError);
  EXPECT_EQ(Normalize({0.1, 0.2}, {1.0, 1.0}).output_shape({2, 5, 4}),
            (std::vector<int64_t>{2, 5, 4}));
  EXPECT_THROW(Normalize({0.1}, {1.0}).apply(at::zeros({1, 1, 2, 2}, at::kByte), gen), ConfigError);
}

TEST(RandomCrop, PaddedCropIsTheImageShiftedWithZeroFill) {
  constexpr int64_t kBatch = 64;
  constexpr int64_t kSize = 6;
  constexpr int64_t kPadding = 2;
  const at::Tensor batch = distinct_batch(kBatch, 2, kSize, kSize);
  at::Generator gen = seeded(3);
  const at::Tensor out = RandomCrop(kSize, kSize, kPadding).apply(batch, gen);
  ASSERT_EQ(out.sizes().vec(), (std::vector<int64_t>{kBatch, 2, kSize, kSize}));

  std::set<int64_t> row_shifts;
  std::set<int64_t> col_shifts;
  for (int64_t b = 0; b < kBatch; ++b) {
    // Pixel (0, 0) of the input has value 1; where it lands (if inside) gives the shift.
    // Otherwise recover the shift from any non-zero output pixel.
    const at::Tensor sample = out[b][0];
    const at::Tensor nonzero = sample.nonzero();
    ASSERT_GT(nonzero.size(0), 0);
    const int64_t i = nonzero[0][0].item<int64_t>();
    const int64_t j = nonzero[0][1].item<int64_t>();
    const int64_t value = sample[i][j].item<int64_t>() - 1; // = src_row * kSize + src_col
    const int64_t dy = value / kSize - i;                   // out(i, j) = in(i + dy, j + dx)
    const int64_t dx = value % kSize - j;
    ASSERT_LE(std::abs(dy), kPadding);
    ASSERT_LE(std::abs(dx), kPadding);
    row_shifts.insert(dy);
    col_shifts.insert(dx);
    // Build the expected shifted image with zero fill and compare every channel.
    at::Tensor expected = at::zeros({2, kSize, kSize}, at::kInt);
    for (int64_t y = 0; y < kSize; ++y) {
      for (int64_t x = 0; x < kSize; ++x) {
        const int64_t sy = y + dy;
        const int64_t sx = x + dx;
        if (sy >= 0 && sy < kSize && sx >= 0 && sx < kSize) {
          expected.select(1, y).select(1, x).copy_(batch[b].select(1, sy).select(1, sx));
        }
      }
    }
    ASSERT_TRUE(out[b].equal(expected)) << "sample " << b << " shift " << dy << "," << dx;
  }
  // The same draws crop a float copy (and a non-contiguous view) identically.
  at::Generator same_gen = seeded(3);
  const at::Tensor as_float = batch.to(at::kFloat).permute({0, 1, 3, 2}).transpose(2, 3);
  EXPECT_TRUE(
      RandomCrop(kSize, kSize, kPadding).apply(as_float, same_gen).equal(out.to(at::kFloat)));
  // 64 draws from 5 shifts per axis: every shift shows up (a miss has probability ~1e-6).
  EXPECT_EQ(row_shifts.size(), 2 * kPadding + 1);
  EXPECT_EQ(col_shifts.size(), 2 * kPadding + 1);
}

TEST(RandomCrop, SmallerCropIsAWindowAndDependsOnlyOnTheGeneratorSeed) {
  const at::Tensor batch = distinct_batch(16, 1, 8, 8);
  at::Generator gen_a = seeded(5);
  at::Generator gen_b = seeded(5);
  at::Generator gen_c = seeded(6);
  const RandomCrop crop(3, 4);
  const at::Tensor a = crop.apply(batch, gen_a);
  ASSERT_EQ(a.sizes().vec(), (std::vector<int64_t>{16, 1, 3, 4}));
  EXPECT_TRUE(a.equal(crop.apply(batch, gen_b)));
  EXPECT_FALSE(a.equal(crop.apply(batch, gen_c)));
  for (int64_t b = 0; b < 16; ++b) {
    const int64_t top_left = a[b][0][0][0].item<int64_t>() - 1;
    const at::Tensor window = batch[b].narrow(1, top_left / 8, 3).narrow(2, top_left % 8, 4);
    EXPECT_TRUE(a[b].equal(window)) << "sample " << b;
  }
  at::Generator gen = seeded(0);
  EXPECT_THROW(RandomCrop(9, 9).apply(batch, gen), ConfigError);
  EXPECT_THROW(RandomCrop(0, 3), ConfigError);
}

TEST(RandomHorizontalFlip, FlipsEachSampleOrLeavesIt) {
  const at::Tensor batch = distinct_batch(200, 2, 3, 4);
  const at::Tensor mirrored = batch.flip({3});
  at::Generator gen = seeded(1);
  EXPECT_TRUE(RandomHorizontalFlip(1.0).apply(batch, gen).equal(mirrored));
  EXPECT_TRUE(RandomHorizontalFlip(0.0).apply(batch, gen).equal(batch));

  const at::Tensor out = RandomHorizontalFlip(0.5).apply(batch, gen);
  int64_t num_flipped = 0;
  for (int64_t b = 0; b < 200; ++b) {
    const bool flipped = out[b].equal(mirrored[b]);
    ASSERT_TRUE(flipped || out[b].equal(batch[b])) << "sample " << b;
    num_flipped += flipped ? 1 : 0;
  }
  // Binomial(200, 0.5): mean 100, standard deviation ~7.
  EXPECT_GT(num_flipped, 60);
  EXPECT_LT(num_flipped, 140);
  EXPECT_THROW(RandomHorizontalFlip(1.5), ConfigError);
}

TEST(TransformPipeline, AppliesInOrderAndIsDeterministicPerSeed) {
  const TransformPipeline pipeline = make_pipeline({
      {"RandomCrop", {{"size", {4}}, {"padding", {1}}}},
      {"RandomHorizontalFlip", {}},
      {"ToTensor", {}},
      {"Normalize", {{"mean", {0.5}}, {"std", {0.25}}}},
  });
  ASSERT_EQ(pipeline.transforms().size(), 4U);
  EXPECT_EQ(pipeline.transforms()[0]->name(), "RandomCrop");
  EXPECT_EQ(pipeline.transforms()[2]->name(), "ToTensor");
  const at::Tensor batch = at::randint(0, 256, {8, 3, 4, 4}, at::kByte);
  at::Generator gen_a = seeded(9);
  at::Generator gen_b = seeded(9);
  const at::Tensor a = pipeline.apply(batch, gen_a);
  EXPECT_EQ(a.scalar_type(), at::kFloat);
  EXPECT_EQ(a.sizes().vec(), (std::vector<int64_t>{8, 3, 4, 4}));
  EXPECT_TRUE(a.equal(pipeline.apply(batch, gen_b)));
  // Zero padding becomes (0 - 0.5) / 0.25 = -2; nothing can go below it.
  EXPECT_GE(a.min().item<float>(), -2.0F);
  EXPECT_LE(a.max().item<float>(), 2.0F);
  EXPECT_TRUE(TransformPipeline().empty());
}

TEST(MakeTransform, BuildsFromSpecsAndRejectsBadOnes) {
  EXPECT_NE(
      dynamic_cast<const RandomCrop*>(make_transform({"RandomCrop", {{"size", {32, 28}}}}).get()),
      nullptr);
  EXPECT_NE(dynamic_cast<const ToFloat*>(make_transform({"ToTensor", {}}).get()), nullptr);
  try {
    make_transform({"ColorJitter", {}});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("ColorJitter"), std::string::npos) << message;
    for (const char* name : {"RandomCrop", "RandomHorizontalFlip", "ToTensor", "Normalize"}) {
      EXPECT_NE(message.find(name), std::string::npos) << message;
    }
  }
  EXPECT_THROW(make_transform({"RandomCrop", {}}), ConfigError);                // no size
  EXPECT_THROW(make_transform({"RandomCrop", {{"size", {3.5}}}}), ConfigError); // not an int
  EXPECT_THROW(make_transform({"RandomCrop", {{"size", {32}}, {"pad", {4}}}}), ConfigError);
  EXPECT_THROW(make_transform({"RandomHorizontalFlip", {{"p", {0.5, 0.5}}}}), ConfigError);
  EXPECT_THROW(make_transform({"Normalize", {{"mean", {0.5}}}}), ConfigError); // no std
  EXPECT_THROW(make_transform({"ToTensor", {{"scale", {1}}}}), ConfigError);
}

} // namespace
} // namespace largo::data::transforms_test

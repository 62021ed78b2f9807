// models/attention_backend.h: preferring a backend puts it first in ATen's priority order with
// the others after it in ATen's own order, kAuto restores that order, the names round-trip and
// an unknown one is refused; attention on the CPU gives the same values whatever is preferred
// (the CPU's kernel choice ignores the order, as the header says).
#include <largo/models/attention_backend.h>

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

namespace largo::models::attention_backend_test {
namespace {

TEST(AttentionBackendTest, PreferringMovesOneBackendFirstAndAutoRestores) {
  prefer_attention_backend(AttentionBackend::kAuto);
  const auto original = at::globalContext().sDPPriorityOrder();
  EXPECT_EQ(preferred_attention_backend(), AttentionBackend::kAuto);
  const std::pair<AttentionBackend, at::SDPBackend> cases[] = {
      {AttentionBackend::kFlash, at::SDPBackend::flash_attention},
      {AttentionBackend::kMemoryEfficient, at::SDPBackend::efficient_attention},
      {AttentionBackend::kCudnn, at::SDPBackend::cudnn_attention},
      {AttentionBackend::kMath, at::SDPBackend::math}};
  for (const auto& [backend, aten] : cases) {
    prefer_attention_backend(backend);
    const auto order = at::globalContext().sDPPriorityOrder();
    EXPECT_EQ(order.front(), aten);
    // The rest: ATen's order without the preferred one.
    std::vector<at::SDPBackend> rest(original.begin(), original.end());
    rest.erase(std::find(rest.begin(), rest.end(), aten));
    EXPECT_TRUE(std::equal(rest.begin(), rest.end(), order.begin() + 1));
    if (order != original) { // flash leads ATen's own order: preferring it changes nothing
      EXPECT_EQ(preferred_attention_backend(), backend);
    }
  }
  prefer_attention_backend(AttentionBackend::kAuto);
  EXPECT_EQ(at::globalContext().sDPPriorityOrder(), original);
}

TEST(AttentionBackendTest, NamesRoundTripAndAnUnknownOneIsRefused) {
  const auto names = attention_backend_names();
  ASSERT_EQ(names.size(), 5u);
  EXPECT_EQ(attention_backend_from_name("auto"), AttentionBackend::kAuto);
  EXPECT_EQ(attention_backend_from_name("flash"), AttentionBackend::kFlash);
  EXPECT_EQ(attention_backend_from_name("efficient"), AttentionBackend::kMemoryEfficient);
  EXPECT_EQ(attention_backend_from_name("cudnn"), AttentionBackend::kCudnn);
  EXPECT_EQ(attention_backend_from_name("math"), AttentionBackend::kMath);
  EXPECT_THROW(attention_backend_from_name("flash3"), std::invalid_argument);
}

TEST(AttentionBackendTest, CpuAttentionIsTheSameWhateverIsPreferred) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor q = at::randn({2, 3, 7, 8}, generator);
  const at::Tensor k = at::randn({2, 3, 7, 8}, generator);
  const at::Tensor v = at::randn({2, 3, 7, 8}, generator);
  prefer_attention_backend(AttentionBackend::kAuto);
  const at::Tensor reference = at::scaled_dot_product_attention(q, k, v);
  prefer_attention_backend(AttentionBackend::kCudnn);
  EXPECT_TRUE(at::scaled_dot_product_attention(q, k, v).equal(reference));
  prefer_attention_backend(AttentionBackend::kAuto);
}

} // namespace
} // namespace largo::models::attention_backend_test

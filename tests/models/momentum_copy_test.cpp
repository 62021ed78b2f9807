// momentum_copy_sources: what DINO's teacher and MoCo's momentum encoder are built and updated
// from: the model's own tensors (no copy), or whole values by name where the model holds
// shards; a model whose storage FSDP freed is refused instead of read.
#include <largo/core/error.h>
#include <largo/models/momentum_copy.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::models {
namespace {

TEST(MomentumCopySourcesTest, AreTheModelsOwnTensorsOrTheWholeValuesByName) {
  torch::nn::Linear model(3, 2);
  torch::nn::Linear copy(3, 2);
  const std::vector<at::Tensor> own = momentum_copy_sources(*model, *copy, nullptr, "copy");
  ASSERT_EQ(own.size(), 2u);
  EXPECT_TRUE(own[0].is_same(model->weight)) << "no copy where the model's tensors are whole";
  EXPECT_TRUE(own[1].is_same(model->bias));

  // Given in another order: taken by name, in the copy's order.
  const WholeParameters whole = {{"bias", torch::ones({2})}, {"weight", torch::zeros({2, 3})}};
  const std::vector<at::Tensor> gathered = momentum_copy_sources(*model, *copy, &whole, "copy");
  ASSERT_EQ(gathered.size(), 2u);
  EXPECT_TRUE(gathered[0].is_same(whole[1].second));
  EXPECT_TRUE(gathered[1].is_same(whole[0].second));

  const WholeParameters missing = {{"weight", torch::zeros({2, 3})}};
  EXPECT_THROW(momentum_copy_sources(*model, *copy, &missing, "copy"), Error);
}

TEST(MomentumCopySourcesTest, RefuseAModelWhoseStorageWasFreed) {
  torch::nn::Linear model(3, 2);
  torch::nn::Linear copy(3, 2);
  // FSDP frees a unit between its uses by resizing the storage to 0 bytes, shape kept.
  model->weight.storage().set_nbytes(0);
  try {
    momentum_copy_sources(*model, *copy, nullptr, "the DINO teacher");
    FAIL() << "a freed parameter was read";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("the DINO teacher"), std::string::npos) << message;
    EXPECT_NE(message.find("weight"), std::string::npos) << message;
    EXPECT_NE(message.find("full_parameters()"), std::string::npos) << message;
  }
}

} // namespace
} // namespace largo::models

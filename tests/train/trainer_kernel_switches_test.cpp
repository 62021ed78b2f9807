// The run sets the process-wide kernel switches its config names when it starts (as
// apply_kernel_switches does): TF32 for matmuls and cuDNN (MACHINE.ALLOW_TF32_MATMUL / _CUDNN)
// and the attention backend tried first (MACHINE.ATTENTION_BACKEND); an unknown backend is
// refused naming the key. (The switches themselves: Tf32 and AttentionBackendTest.)
#include <largo/core/error.h>
#include <largo/core/torch_compat.h>
#include <largo/models/attention_backend.h>
#include <largo/train/trainer.h>
#include <largo/train/trainer_config.h>

#include "train/trainer_test_util.h"

#include <gtest/gtest.h>

namespace largo::train::trainer_kernel_switches_test {
namespace {

TEST(TrainerKernelSwitchesTest, TheRunSetsTf32AndTheAttentionBackend) {
  const auto start = [](std::vector<std::string> overrides) {
    Trainer trainer(trainer_options_from_config(
        synthetic_job_config(test_dir_for("kernel_switches"), std::move(overrides))));
  };
  start(
      {"MACHINE.ALLOW_TF32_MATMUL=True",
       "MACHINE.ALLOW_TF32_CUDNN=False",
       "MACHINE.ATTENTION_BACKEND=cudnn"});
  EXPECT_TRUE(compat::allow_tf32_matmul());
  EXPECT_FALSE(compat::allow_tf32_cudnn());
  EXPECT_EQ(models::preferred_attention_backend(), models::AttentionBackend::kCudnn);

  start({}); // the defaults: PyTorch's TF32 switches, ATen's attention order
  EXPECT_FALSE(compat::allow_tf32_matmul());
  EXPECT_TRUE(compat::allow_tf32_cudnn());
  EXPECT_EQ(models::preferred_attention_backend(), models::AttentionBackend::kAuto);
}

TEST(TrainerKernelSwitchesTest, AnUnknownAttentionBackendIsRefusedNamingTheKey) {
  try {
    trainer_options_from_config(synthetic_job_config(
        test_dir_for("kernel_switches"), {"MACHINE.ATTENTION_BACKEND=flash3"}));
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("MACHINE.ATTENTION_BACKEND"), std::string::npos) << message;
    EXPECT_NE(message.find("cudnn"), std::string::npos) << message;
  }
}

} // namespace
} // namespace largo::train::trainer_kernel_switches_test

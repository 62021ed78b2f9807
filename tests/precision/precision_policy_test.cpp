// The precision policy: Apex's opt-level table, the AMP_ARGS overrides, PyTorch AMP, and
// errors that name the key.
#include <largo/core/error.h>
#include <largo/precision/precision_policy.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace largo::precision::precision_policy_test {
namespace {

PrecisionPolicyOptions apex(const std::string& level, const std::string& dtype = "float16") {
  PrecisionPolicyOptions options;
  options.use_amp = true;
  options.amp_type = "apex";
  options.opt_level = level;
  options.dtype = dtype;
  return options;
}

std::string config_error_of(const PrecisionPolicyOptions& options) {
  try {
    resolve_precision_policy(options);
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(PrecisionPolicy, AmpOffIsFloat32) {
  PrecisionPolicyOptions options;
  options.opt_level = "O2"; // ignored while USE_AMP is off
  auto policy = resolve_precision_policy(options);
  EXPECT_FALSE(policy.enabled);
  EXPECT_EQ(policy.model_dtype(), at::kFloat);
  EXPECT_EQ(policy.loss_scaling, LossScaling::kNone);
}

TEST(PrecisionPolicy, ApexOptLevelsFollowApexTable) {
  auto o0 = resolve_precision_policy(apex("O0"));
  EXPECT_FALSE(o0.enabled);

  auto o1 = resolve_precision_policy(apex("O1"));
  EXPECT_TRUE(o1.enabled);
  EXPECT_TRUE(o1.autocast);
  EXPECT_FALSE(o1.cast_model);
  EXPECT_FALSE(o1.master_weights);
  EXPECT_EQ(o1.model_dtype(), at::kFloat);
  EXPECT_EQ(o1.loss_scaling, LossScaling::kDynamic);

  auto o2 = resolve_precision_policy(apex("O2"));
  EXPECT_FALSE(o2.autocast);
  EXPECT_TRUE(o2.cast_model);
  EXPECT_TRUE(o2.keep_batchnorm_fp32);
  EXPECT_TRUE(o2.master_weights);
  EXPECT_EQ(o2.model_dtype(), at::kHalf);
  EXPECT_EQ(o2.loss_scaling, LossScaling::kDynamic);

  auto o3 = resolve_precision_policy(apex("O3"));
  EXPECT_FALSE(o3.autocast);
  EXPECT_TRUE(o3.cast_model);
  EXPECT_FALSE(o3.keep_batchnorm_fp32);
  EXPECT_FALSE(o3.master_weights);
  EXPECT_EQ(o3.loss_scaling, LossScaling::kStatic);
  EXPECT_EQ(o3.static_loss_scale, 1.0);
}

TEST(PrecisionPolicy, VisslsRecommendedO3SettingBehavesLikeO2) {
  auto options = apex("O3");
  options.keep_batchnorm_fp32 = true;
  options.master_weights = true;
  options.loss_scale = "dynamic";
  auto policy = resolve_precision_policy(options);
  EXPECT_TRUE(policy.cast_model);
  EXPECT_TRUE(policy.keep_batchnorm_fp32);
  EXPECT_TRUE(policy.master_weights);
  EXPECT_EQ(policy.loss_scaling, LossScaling::kDynamic);
}

TEST(PrecisionPolicy, NumericLossScaleIsStatic) {
  auto options = apex("O2");
  options.loss_scale = "128.0";
  auto policy = resolve_precision_policy(options);
  EXPECT_EQ(policy.loss_scaling, LossScaling::kStatic);
  EXPECT_EQ(policy.static_loss_scale, 128.0);
}

TEST(PrecisionPolicy, Bfloat16NeedsNoLossScalingUnlessAskedFor) {
  for (const char* level : {"O1", "O2", "O3"}) {
    auto policy = resolve_precision_policy(apex(level, "bfloat16"));
    EXPECT_EQ(policy.low_precision, at::kBFloat16) << level;
    EXPECT_EQ(policy.loss_scaling, LossScaling::kNone) << level;
  }
  auto options = apex("O2", "bfloat16");
  options.loss_scale = "dynamic";
  EXPECT_EQ(resolve_precision_policy(options).loss_scaling, LossScaling::kDynamic);
}

TEST(PrecisionPolicy, PyTorchAmpIsAutocastWithAGradScaler) {
  PrecisionPolicyOptions options;
  options.use_amp = true;
  options.amp_type = "pytorch";
  options.opt_level = "O3"; // AMP_ARGS are ignored for pytorch, as in VISSL
  auto policy = resolve_precision_policy(options);
  EXPECT_TRUE(policy.autocast);
  EXPECT_FALSE(policy.cast_model);
  EXPECT_EQ(policy.loss_scaling, LossScaling::kDynamic);
  options.dtype = "bfloat16";
  EXPECT_EQ(resolve_precision_policy(options).loss_scaling, LossScaling::kNone);
}

TEST(PrecisionPolicy, KeepBatchnormOverride) {
  auto options = apex("O3");
  options.keep_batchnorm_fp32 = true;
  EXPECT_TRUE(resolve_precision_policy(options).keep_batchnorm_fp32);
  options = apex("O2");
  options.keep_batchnorm_fp32 = false;
  EXPECT_FALSE(resolve_precision_policy(options).keep_batchnorm_fp32);
}

TEST(PrecisionPolicy, BadValuesNameTheKey) {
  auto options = apex("o2");
  EXPECT_NE(
      config_error_of(options).find("PrecisionPolicyOptions::opt_level = o2"), std::string::npos)
      << config_error_of(options);
  options = apex("O1");
  options.amp_type = "deepspeed";
  EXPECT_NE(
      config_error_of(options).find("PrecisionPolicyOptions::amp_type = deepspeed"),
      std::string::npos);
  options = apex("O1", "float8");
  EXPECT_NE(
      config_error_of(options).find("PrecisionPolicyOptions::dtype = float8"), std::string::npos);
  options = apex("O1");
  options.loss_scale = "-4";
  EXPECT_NE(config_error_of(options).find("loss_scale = -4"), std::string::npos);
  options.loss_scale = "dynamc";
  EXPECT_NE(config_error_of(options).find("loss_scale = dynamc"), std::string::npos);
  // Checked even with USE_AMP off.
  options = apex("O4");
  options.use_amp = false;
  EXPECT_NE(config_error_of(options).find("opt_level = O4"), std::string::npos);
}

TEST(PrecisionPolicy, DescribeSaysWhatRuns) {
  EXPECT_EQ(resolve_precision_policy(apex("O2", "bfloat16")).describe(),
            "O2 bfloat16, model cast (BatchNorm float32), float32 master weights, no loss "
            "scaling");
}

TEST(PrecisionPolicy, CpuAndCudaRunBothDtypesAndOtherDevicesAreRefused) {
  for (const char* dtype : {"bfloat16", "float16"}) {
    for (const char* level : {"O1", "O2", "O3"}) {
      const PrecisionPolicy policy = resolve_precision_policy(apex(level, dtype));
      EXPECT_NO_THROW(check_policy_supported_on(policy, c10::Device(c10::kCPU)));
      EXPECT_NO_THROW(check_policy_supported_on(policy, c10::Device(c10::kCUDA, 0)));
      try {
        check_policy_supported_on(policy, c10::Device(c10::kMPS));
        ADD_FAILURE() << "expected a ConfigError for mps";
      } catch (const ConfigError& error) {
        EXPECT_NE(std::string(error.what()).find("got device mps"), std::string::npos)
            << error.what();
      }
    }
  }
}

} // namespace
} // namespace largo::precision::precision_policy_test

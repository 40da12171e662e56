// The public header compiles on its own and reads like Transformers.
#include <trl/trl.h>

#include <gtest/gtest.h>

#include "test_util.h"

namespace trl {
namespace {

TEST(PublicApi, FromPretrainedLikeTransformers) {
  test::TempDir dir;
  InitOptions o;
  o.preset = "tiny";
  init_model(o, dir.path());
  CausalLM model = AutoModelForCausalLM::from_pretrained(dir.path(), {.dtype = BF16, .device = "auto"});
  EXPECT_EQ(model.dtype(), BF16);
  EXPECT_EQ(model.device(), "cpu");
  EXPECT_EQ(AutoConfig::from_pretrained(dir.path()).hidden_size, 64);
  EXPECT_THROW(AutoModelForCausalLM::from_pretrained(dir.path(), {.device = "neuron"}), Error);  // no silent CPU fallback
  auto backend = make_reference_backend();
  Batch batch{.input_ids = Tensor::from_i32(std::vector<int32_t>{1, 2, 3}, {1, 3})};
  EXPECT_EQ(model.forward(batch, *backend).shape(), (Shape{1, 3, 151936}));
}

}  // namespace
}  // namespace trl

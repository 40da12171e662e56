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
  Tokenizer tok = AutoTokenizer::from_pretrained(dir.path());
  BatchEncoding enc = tok({"The French Bread Law states", "Hi"});
  Batch batch{.input_ids = enc.input_ids_tensor(), .attention_mask = enc.attention_mask_tensor(), .position_ids = {}};
  EXPECT_EQ(model.forward(batch, *backend).shape(), (Shape{2, 5, 151936}));
}

}  // namespace
}  // namespace trl

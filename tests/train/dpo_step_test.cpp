// One DPO micro-batch end to end on the tiny model: policy and frozen reference on backends of their own, the loss
// through the two-stage program. The first sigmoid loss is log 2, the gradient matches central differences of the
// DPO loss through the whole model, and the order of the pairs does not change the loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/dpo_step.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"

namespace trl {
namespace {

std::vector<PreferenceExample> examples() {
  return {PreferenceExample{{11, 12, 13}, {21, 22, 23}, {31, 32}, "pair 1", std::nullopt}, PreferenceExample{{14, 15}, {24, 25}, {34, 35, 36, 37}, "pair 2", std::nullopt}};
}

std::vector<const PreferenceExample*> ptrs(const std::vector<PreferenceExample>& v) {
  std::vector<const PreferenceExample*> out;
  for (const auto& e : v) out.push_back(&e);
  return out;
}

TEST(DpoStep, FirstLossIsLog2AndTheGradientMatchesFiniteDifferences) {
  const test::TinyModel tiny;
  const CausalLM reference = CausalLM::from_weights(tiny.model.config(), tiny.model.weights(), "reference");  // a frozen copy
  auto policy_backend = make_backend("cpu"), ref_backend = make_backend("cpu");
  ProgramCache policy_programs(*policy_backend), ref_programs(*ref_backend);
  const auto ex = examples();
  DpoStepOptions o;
  o.loss.beta = 0.5;
  const std::vector<RefLogps> ref = dpo_reference_logps(reference, ref_programs, ptrs(ex), o);
  const DpoStepResult r = dpo_step(tiny.model, tiny.model.weights(), policy_programs, ptrs(ex), ref, o);
  EXPECT_NEAR(r.loss.loss, std::log(2.0), 1e-6);  // policy = reference: every pair's margin is 0
  ASSERT_EQ(r.pairs.size(), 2u);
  EXPECT_EQ(r.pairs[0].chosen_tokens, 3);
  EXPECT_EQ(r.pairs[1].rejected_tokens, 4);
  EXPECT_NEAR(r.pairs[0].chosen, ref[0].chosen, 1e-5);
  ASSERT_EQ(r.grads.size(), parameter_shapes(tiny.model.config()).size());
  // Central differences of the DPO loss through the model, the reference fixed.
  const std::string probe = "model.layers.1.mlp.down_proj.weight";
  const Tensor grad = r.grads.at("grad." + probe).clone();
  const Tensor& w = tiny.model.weights().at(probe);
  double largest = 0;
  for (int64_t k : {int64_t{3}, w.numel() / 2, w.numel() - 5}) {
    auto loss_at = [&](double delta) {
      TensorMap moved = tiny.model.weights();
      Tensor p = w.clone();
      store_element(p.mutable_data(), p.dtype(), k, load_element(w.data(), w.dtype(), k) + delta);
      moved[probe] = p;
      return dpo_step(tiny.model, moved, policy_programs, ptrs(ex), ref, o).loss.loss;
    };
    const double eps = 1e-2, fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    const double got = load_element(grad.data(), grad.dtype(), k);
    ASSERT_TRUE(std::isfinite(fd) && std::isfinite(got));
    EXPECT_NEAR(got, fd, 3e-2 * std::fabs(fd) + 1e-5) << probe << "[" << k << "]";
    largest = std::max(largest, std::fabs(fd));
  }
  EXPECT_GT(largest, 1e-4) << "the probed gradient is ~0: the check would prove nothing";
  EXPECT_EQ(policy_programs.stats().compilations, 1);  // every step above ran the same program
}

TEST(DpoStep, PairOrderDoesNotChangeTheLoss) {
  const test::TinyModel tiny;
  auto backend = make_backend("cpu"), ref_backend = make_backend("cpu");
  ProgramCache programs(*backend), ref_programs(*ref_backend);
  auto ex = examples();
  DpoStepOptions o;
  o.loss.loss_type = {"sigmoid", "ipo"};
  // A reference that differs from the policy, so the margins are not 0.
  std::vector<RefLogps> ref = dpo_reference_logps(tiny.model, ref_programs, ptrs(ex), o);
  ref[0].chosen -= 0.5, ref[1].rejected += 0.25;
  const double a = dpo_step(tiny.model, tiny.model.weights(), programs, ptrs(ex), ref, o).loss.loss;
  std::reverse(ex.begin(), ex.end());
  std::reverse(ref.begin(), ref.end());
  const double b = dpo_step(tiny.model, tiny.model.weights(), programs, ptrs(ex), ref, o).loss.loss;
  EXPECT_NEAR(a, b, 1e-6 * std::fabs(a));
  EXPECT_THROW(dpo_step(tiny.model, tiny.model.weights(), programs, ptrs(ex), {}, o), Error);
}

}  // namespace
}  // namespace trl

// GRPOTrainer and RLOOTrainer end to end on the tiny model: generation reads the live weights, the programs an
// epoch compiles, an exact resume in the middle of a generation round, learning within CI time (a format reward
// and a length reward, the exec: reward equal to the built-in), and the errors of bad options, data and rewards.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"
#include "trl/core/error.h"
#include "trl/data/sft.h"
#include "trl/models/init.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/grpo_trainer.h"
#include "trl/train/sft_trainer.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

using test::kSanitized;

Dataset prompt_rows(const std::vector<std::string>& prompts) {
  Dataset d;
  for (const std::string& p : prompts) {
    d.rows.push_back(ojson{{"prompt", p}, {"solution", "4"}});
    d.where.push_back("prompts.jsonl:" + std::to_string(d.rows.size()));
  }
  return d;
}

template <class Config>
Config small_config(const std::string& out) {
  Config c;
  c.output_dir = out;
  c.bf16 = false;
  c.per_device_train_batch_size = 4;
  c.num_generations = 4;
  c.max_completion_length = 8;
  c.max_steps = 2;
  c.logging_steps = 1;
  c.save_steps = 1000;
  c.report = false;
  c.progress = false;
  c.pad_to_multiple_of = "32";
  return c;
}

std::vector<NamedRewardFunction> rewards(const std::vector<std::string>& specs) {
  std::vector<NamedRewardFunction> out;
  for (const auto& s : specs) out.push_back(reward_function(s));
  return out;
}

// Two runs from the same weights and seed: with learning_rate 0 and with a large one. Round 1 is the same; round 2
// differs only if generation read the weights the first optimizer step changed (the generator holds no copy).
TEST(GrpoTrainer, GenerationReadsTheLiveWeights) {
  const test::TinyModel m(test::kCutVocab);
  std::vector<std::vector<std::string>> completions[2];
  ProgramCacheStats gen_stats;
  for (int run = 0; run < 2; ++run) {
    test::TempDir out;
    GRPOConfig c = small_config<GRPOConfig>(out.path());
    c.learning_rate = run == 0 ? 0.0 : 0.05;
    c.shuffle_dataset = false;
    GRPOTrainer t(m.model, test::cut_tokenizer(), rewards({"length:20"}), prompt_rows({"Say a word.", "Say a word."}), c);
    t.on_rollout = [&](const RolloutRecord& r) { completions[run].push_back(r.completions); };
    t.train();
    gen_stats = t.generation_program_stats();
  }
  ASSERT_EQ(completions[0].size(), 2u);
  ASSERT_EQ(completions[1].size(), 2u);
  EXPECT_EQ(completions[0][0], completions[1][0]);  // the same weights and seed: the same samples
  EXPECT_NE(completions[0][1], completions[1][1]);  // the step changed the weights the generator reads
  // One prefill and one decode program, compiled once and reused by the second round (and every decode step).
  EXPECT_EQ(gen_stats.compilations, 2);
  EXPECT_GT(gen_stats.hits, 8);
}

// Conversational prompts go through the chat template with the generation prompt and chat_template_kwargs: with
// enable_thinking false Qwen3's template appends an empty think block, so each prompt is that many tokens longer
// (num_tokens counts the prompt and completion tokens of every row; the completions are max_completion_length
// long, as the random model emits no EOS), and a bf16 model trains as an f32 one does.
TEST(GrpoTrainer, ChatPromptsUseTheTemplateAndItsKwargs) {
  const test::TinyModel m;
  const Tokenizer& tok = test::qwen3_tokenizer();
  const ojson conversation = ojson::array({ojson{{"role", "user"}, {"content", "Name a colour."}}});
  Dataset d;
  d.rows = {ojson{{"prompt", conversation}}};
  d.where = {"chat.jsonl:1"};
  int64_t tokens[2];
  for (int thinking = 0; thinking < 2; ++thinking) {
    test::TempDir out;
    GRPOConfig c = small_config<GRPOConfig>(out.path());
    c.max_steps = 1;
    c.bf16 = true;
    if (thinking == 0) c.chat_template_kwargs = ojson{{"enable_thinking", false}};
    GRPOTrainer t(m.model, tok, rewards({"length:20"}), d, c);
    int64_t completion_tokens = 0;
    std::vector<std::string> completions;
    t.on_rollout = [&](const RolloutRecord& r) { completions = r.completions; };
    const TrainOutput o = t.train();
    ASSERT_EQ(completions.size(), 4u);
    completion_tokens = 4 * c.max_completion_length;
    EXPECT_EQ(o.log_history[0]["completions/mean_length"].get<double>(), static_cast<double>(c.max_completion_length));
    EXPECT_TRUE(std::isfinite(o.log_history[0]["grad_norm"].get<double>()));
    tokens[thinking] = o.log_history[0]["num_tokens"].get<int64_t>() - completion_tokens;
  }
  ChatTemplateOptions plain, no_thinking;
  plain.add_generation_prompt = no_thinking.add_generation_prompt = true;
  no_thinking.extra["enable_thinking"] = false;
  const int64_t p_plain = static_cast<int64_t>(apply_chat_template_ids(tok, conversation, plain).input_ids.size());
  const int64_t p_off = static_cast<int64_t>(apply_chat_template_ids(tok, conversation, no_thinking).input_ids.size());
  ASSERT_GT(p_off, p_plain);
  EXPECT_EQ(tokens[1], 4 * p_plain);
  EXPECT_EQ(tokens[0], 4 * p_off);
}

// Prompts of 2 to ~90 tokens over a whole epoch: programs are compiled per bucket, not per length.
TEST(GrpoTrainer, AnEpochCompilesAProgramPerBucket) {
  const test::TinyModel m(test::kCutVocab);
  std::vector<std::string> prompts;
  std::set<int64_t> buckets;
  for (int k = 0; k < 10; ++k) {
    std::string p = "Count";
    for (int w = 0; w < k * k; ++w) p += " w";
    prompts.push_back(p);
    const int64_t n = static_cast<int64_t>(test::cut_tokenizer().encode(p, false).size());
    buckets.insert((n + 31) / 32 * 32);
  }
  ASSERT_GE(buckets.size(), 3u);
  test::TempDir out;
  GRPOConfig c = small_config<GRPOConfig>(out.path());
  c.max_steps = -1;
  c.num_train_epochs = 1;
  c.learning_rate = 0;
  GRPOTrainer t(m.model, test::cut_tokenizer(), rewards({"length:20"}), prompt_rows(prompts), c);
  const TrainOutput o = t.train();
  EXPECT_EQ(o.global_step, 10);  // one prompt × 4 generations per step
  // Training: one program per prompt bucket (every completion fits one bucket of 32). Generation: a prefill per
  // prompt bucket and a decode per cache length (prompt bucket + 32).
  EXPECT_EQ(o.programs.compilations, static_cast<int64_t>(buckets.size()));
  EXPECT_EQ(t.generation_program_stats().compilations, 2 * static_cast<int64_t>(buckets.size()));
}

// A generation round that spans two optimizer steps (num_iterations 2, so the old log-probs are computed): a run
// resumed from the checkpoint between them (the round is in the checkpoint) logs what the uninterrupted run logs.
TEST(GrpoTrainer, ResumeInTheMiddleOfARoundIsExact) {
  const test::TinyModel m(test::kCutVocab);
  test::TempDir out;
  auto config = [&](const std::string& dir) {
    GRPOConfig c = small_config<GRPOConfig>(dir);
    c.max_steps = 4;
    c.num_iterations = 2;
    c.save_steps = 1;
    c.learning_rate = 0.02;
    c.beta = 0.05;
    c.log_completions = true;
    return c;
  };
  const Dataset d = prompt_rows({"One", "Two", "Three", "Four"});
  GRPOTrainer full(m.model, test::cut_tokenizer(), rewards({"length:20"}), d, config(out.file("full")));
  const TrainOutput a = full.train();
  ASSERT_TRUE(std::filesystem::exists(out.file("full/checkpoint-1/rollout.json")));
  const std::string completions = test::read_file(out.file("full/completions.jsonl"));
  GRPOConfig rc = config(out.file("full"));
  rc.resume_from_checkpoint = out.file("full/checkpoint-1");
  GRPOTrainer resumed(m.model, test::cut_tokenizer(), rewards({"length:20"}), d, rc);
  const TrainOutput b = resumed.train();
  // completions.jsonl keeps the rows of the steps up to the checkpoint and gets the redone round once (issue 37,
  // defect 6): the uninterrupted run's file again, no row repeated.
  EXPECT_NE(completions.find("\"step\":3"), std::string::npos);
  EXPECT_EQ(test::read_file(out.file("full/completions.jsonl")), completions);
  ASSERT_EQ(a.log_history.size(), 4u);
  ASSERT_EQ(b.log_history.size(), 4u);
  // Steps 2 and 4 train on the round generated at steps 1 and 3 (their logs have no reward metrics, as TRL's).
  EXPECT_FALSE(a.log_history[1].contains("reward"));
  ASSERT_TRUE(a.log_history[2].contains("reward"));
  const std::set<std::string> timing = {"step_time", "time/generation", "time/rewards", "time/training", "train_tokens_per_s", "step_seconds",
                                        "data_seconds"};
  for (size_t s = 1; s < 4; ++s) {
    EXPECT_EQ(a.log_history[s].size(), b.log_history[s].size()) << "step " << s + 1;
    for (const auto& [key, value] : a.log_history[s].items()) {
      if (timing.count(key)) continue;
      ASSERT_TRUE(b.log_history[s].contains(key)) << "step " << s + 1 << " " << key;
      EXPECT_EQ(value, b.log_history[s][key]) << "step " << s + 1 << " " << key;
    }
  }
  EXPECT_GT(a.log_history[3]["kl"].get<double>(), 0.0);  // the policy moved away from its reference

  // A round whose saved log-probs lack a row is refused at load, naming the file, not at the first micro-batch.
  nlohmann::json round = nlohmann::json::parse(test::read_file(out.file("full/checkpoint-1/rollout.json")));
  round["old_logp"].erase(round["old_logp"].size() - 1);
  test::write_file(out.file("full/checkpoint-1/rollout.json"), round.dump());
  const std::string e = test::error_of([&] { GRPOTrainer(m.model, test::cut_tokenizer(), rewards({"length:20"}), d, rc).train(); });
  EXPECT_NE(e.find("rollout.json is not a valid generation round"), std::string::npos) << e;
  EXPECT_NE(e.find("rows of log-probs for a round of"), std::string::npos) << e;
  // Lists of other lengths, an order that is no permutation, ids beyond the vocabulary: named, never read past
  // their ends (issue 37's sweep: a vector range error and a segmentation fault).
  const nlohmann::json good = nlohmann::json::parse(test::read_file(out.file("full/checkpoint-3/rollout.json")));
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> damaged = {
      {[](nlohmann::json& j) { j["advantages"] = {1.0}; }, "field 'advantages' has 1 entries for a round of"},
      {[](nlohmann::json& j) { j["order"] = nlohmann::json::array(); }, "field 'order' has 0 entries"},
      {[](nlohmann::json& j) { j["order"][0] = j["order"][1]; }, "field 'order' must hold each of the"},
      {[](nlohmann::json& j) { j["completions"][0][0] = 99999999; }, "token id 99999999 is outside the model's vocabulary"},
      {[](nlohmann::json& j) { j["P"] = -5; }, "fields 'P' and 'C' (the buckets) must be in [1,"},
  };
  for (const auto& [damage, want] : damaged) {
    nlohmann::json j = good;
    damage(j);
    test::write_file(out.file("full/checkpoint-3/rollout.json"), j.dump());
    GRPOConfig c3 = config(out.file("full"));
    c3.resume_from_checkpoint = out.file("full/checkpoint-3");
    const std::string msg = test::error_of([&] { GRPOTrainer(m.model, test::cut_tokenizer(), rewards({"length:20"}), d, c3).train(); });
    EXPECT_NE(msg.find(want), std::string::npos) << want << " -> " << msg;
  }
}

// The tiny model, after a short SFT on " one two ... <k>" completions (k random), learns under GRPO to answer
// exactly " one two three" (a format reward), and moves its completion length toward a target; RLOO learns the
// format too; an exec: reward in Python gives the same rewards as the built-in length:N.
TEST(GrpoTrainer, TinyModelLearnsAFormatAndALength) {
  if (kSanitized) GTEST_SKIP() << "long: runs in the Release pass";
  const Tokenizer& tok = test::cut_tokenizer();
  test::TempDir dir;
  const test::TinyModel base(test::kCutVocab);
  const std::vector<std::string> words = {"one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"};
  Dataset sft;
  uint64_t x = 12345;
  for (int i = 0; i < 64; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const size_t k = 1 + (x >> 33) % words.size();
    std::string c;
    for (size_t w = 0; w < k; ++w) c += " " + words[w];
    sft.rows.push_back(ojson{{"prompt", "Count:"}, {"completion", c}});
    sft.where.push_back("count.jsonl:" + std::to_string(i + 1));
  }
  SFTConfig sc;
  sc.output_dir = dir.file("sft");
  sc.learning_rate = 1e-2;
  sc.per_device_train_batch_size = 8;
  sc.max_steps = 40;
  sc.logging_steps = 10;
  sc.save_steps = 1000;
  sc.report = false, sc.progress = false, sc.bf16 = false;
  SFTTrainer(base.model, tok, sft, sc).train();
  const CausalLM tuned = CausalLM::from_pretrained(dir.file("sft"));
  const Dataset prompts = prompt_rows(std::vector<std::string>(64, "Count:"));

  auto config = [&](auto c, const std::string& out, int64_t steps) {
    c.output_dir = dir.file(out);
    c.bf16 = false;
    c.per_device_train_batch_size = 8;
    c.num_generations = 8;
    c.max_completion_length = 24;
    c.max_steps = steps;
    c.logging_steps = 3;
    c.learning_rate = 5e-3;
    c.save_steps = 1000;
    c.report = false, c.progress = false;
    c.pad_to_multiple_of = "32";
    return c;
  };
  auto mean_of = [](const TrainOutput& o, const char* key, size_t from, size_t to) {
    double s = 0;
    for (size_t i = from; i < to; ++i) s += o.log_history.at(i)[key].get<double>();
    return s / static_cast<double>(to - from);
  };
  // Format: 1 for exactly " one two three".
  {
    GRPOTrainer t(tuned, tok, rewards({"regex:^ one two three$"}), prompts, config(GRPOConfig{}, "format", 24));
    const TrainOutput o = t.train();
    const double first = o.log_history.front()["reward"].get<double>(), last = mean_of(o, "reward", 6, 8);
    std::printf("[ learning ] grpo regex: reward %.3f -> %.3f\n", first, last);
    EXPECT_GT(last, 0.8);
    EXPECT_GT(last, first + 0.2);
  }
  {
    RLOOConfig rc = config(RLOOConfig{}, "rloo", 24);
    rc.num_generations = 4;
    RLOOTrainer t(tuned, tok, rewards({"regex:^ one two three$"}), prompts, rc);
    const TrainOutput o = t.train();
    const double first = o.log_history.front()["reward"].get<double>(), last = mean_of(o, "reward", 6, 8);
    std::printf("[ learning ] rloo regex: reward %.3f -> %.3f\n", first, last);
    EXPECT_GT(last, 0.8);
    EXPECT_GT(last, first + 0.2);
  }
  // Length: completions of 40 characters (" one two ... eight" is 39).
  std::vector<std::vector<double>> builtin_rewards;
  int rounds = 0;
  {
    GRPOTrainer t(tuned, tok, rewards({"length:40"}), prompts, config(GRPOConfig{}, "length", 18));
    t.on_rollout = [&](const RolloutRecord& r) {
      if (rounds++ < 2)
        for (const auto& row : r.rewards) builtin_rewards.push_back(row);
    };
    const TrainOutput o = t.train();
    const double r0 = o.log_history.front()["reward"].get<double>(), r1 = mean_of(o, "reward", 4, 6);
    const double l0 = o.log_history.front()["completions/mean_length"].get<double>(), l1 = mean_of(o, "completions/mean_length", 4, 6);
    std::printf("[ learning ] grpo length:40: reward %.3f -> %.3f, mean length %.2f -> %.2f tokens\n", r0, r1, l0, l1);
    // The reward is -|40 - characters| / 100 (best 0): the gap to the best at least halves. Measured with the cut
    // vocabulary on an AVX2 EPYC: -0.109 -> -0.039 (with the whole vocabulary it started at -0.088 on AVX-512 but at
    // -0.035 on AVX2, too near the best for the property to show).
    EXPECT_GT(r1, r0);
    EXPECT_LT(-r1, 0.5 * -r0);
    // The lengths end near those of " one two ... eight" + EOS, 40 characters (other texts of 40 characters take a
    // token more or less): the reward, in characters, is what must improve ("closer than at the start" was a coin
    // toss: 8.71 -> 9.48 tokens with the reward -0.082 -> -0.032 after a change of exp's last bits).
    const double want = static_cast<double>(tok.encode(" one two three four five six seven eight", false).size() + 1);
    EXPECT_LT(std::fabs(l1 - want), 1.0) << "mean length " << l1 << ", " << want << " tokens for 40 characters";
  }
  // The same run's first two rounds with the Python script: the same rewards.
  {
    const std::string script = std::string(TRL_TEST_DATA_DIR) + "/grpo/reward_len.py";
    GRPOTrainer t(tuned, tok, rewards({"exec:python3 " + script + " 40"}), prompts, config(GRPOConfig{}, "exec", 2));
    std::vector<std::vector<double>> got;
    t.on_rollout = [&](const RolloutRecord& r) {
      for (const auto& row : r.rewards) got.push_back(row);
    };
    t.train();
    ASSERT_EQ(got.size(), builtin_rewards.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_DOUBLE_EQ(got[i].at(0), builtin_rewards[i].at(0)) << "completion " << i;
  }
}

using test::error_of;

TEST(GrpoTrainer, BadOptionsAndDataAreClearErrors) {
  const test::TinyModel m;
  test::TempDir out;
  const Dataset d = prompt_rows({"a", "b"});
  auto grpo = [&](const std::function<void(GRPOConfig&)>& edit, const Dataset& data = Dataset{}, std::vector<std::string> r = {"length:5"}) {
    GRPOConfig c = small_config<GRPOConfig>(out.path());
    edit(c);
    return error_of([&] { GRPOTrainer(m.model, test::qwen3_tokenizer(), rewards(r), data.rows.empty() ? d : data, c); });
  };
  EXPECT_NE(grpo([](GRPOConfig& c) { c.num_generations = 1; }).find("num_generations must be >= 2"), std::string::npos);
  EXPECT_NE(grpo([](GRPOConfig& c) { c.num_generations = 3; }).find("must be a multiple of num_generations (3)"), std::string::npos);
  EXPECT_NE(grpo([](GRPOConfig& c) { c.loss_type = "ppo"; }).find("loss_type 'ppo'"), std::string::npos);
  EXPECT_NE(grpo([](GRPOConfig& c) { c.scale_rewards = "yes"; }).find("scale_rewards 'yes'"), std::string::npos);
  EXPECT_NE(grpo([](GRPOConfig& c) { c.reward_weights = {1, 2}; }).find("reward_weights has 2 values for 1 reward functions"), std::string::npos);
  EXPECT_NE(grpo([](GRPOConfig& c) { c.generation_batch_size = 8, c.steps_per_generation = 2; }).find("not both"), std::string::npos);
  EXPECT_NE(grpo([](GRPOConfig& c) { c.delta = 1.1; }).find("delta (1.1) must be greater than 1 + epsilon_high"), std::string::npos);
  EXPECT_NE(grpo([](GRPOConfig&) {}, Dataset{}, {}).find("no reward function"), std::string::npos);
  Dataset bad;
  bad.rows = {ojson{{"question", "x"}}};
  bad.where = {"bad.jsonl:1"};
  const std::string e = grpo([](GRPOConfig&) {}, bad);
  EXPECT_NE(e.find("bad.jsonl:1: a row needs a \"prompt\""), std::string::npos) << e;
  EXPECT_NE(e.find("question"), std::string::npos) << e;
  // More completions per round than the dataset has prompts for.
  EXPECT_NE(grpo([](GRPOConfig& c) { c.per_device_train_batch_size = 12; }).find("a generation round needs 3 prompts"), std::string::npos);
}

// A reward process that fails at the third round: the error names it and the batch, and the checkpoints saved
// before it stay complete.
TEST(GrpoTrainer, AFailingRewardStopsTheRunWithItsCheckpointsIntact) {
  const test::TinyModel m(test::kCutVocab);
  test::TempDir out;
  GRPOConfig c = small_config<GRPOConfig>(out.path());
  c.max_steps = 4;
  c.save_steps = 1;
  const std::string script = "n=0; while read -r l; do n=$((n+1)); if [ $n -eq 3 ]; then exit 7; fi; echo '[0, 0.5, 1, 0]'; done";
  GRPOTrainer t(m.model, test::cut_tokenizer(), rewards({"exec:" + script}), prompt_rows({"a", "b", "c", "d"}), c);
  const std::string e = error_of([&] { t.train(); });
  EXPECT_NE(e.find("batch 3"), std::string::npos) << e;
  EXPECT_NE(e.find("exited with status 7"), std::string::npos) << e;
  for (const char* ck : {"checkpoint-1", "checkpoint-2"}) {
    EXPECT_TRUE(std::filesystem::exists(out.file(std::string(ck) + "/optimizer.safetensors"))) << ck;
    EXPECT_TRUE(std::filesystem::exists(out.file(std::string(ck) + "/trainer_state.json"))) << ck;
  }
  EXPECT_FALSE(std::filesystem::exists(out.file("checkpoint-3")));
}

}  // namespace
}  // namespace trl

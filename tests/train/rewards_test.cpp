// The reward functions of GRPO and RLOO: the built-ins by name, and exec:COMMAND's protocol and its failures
// (a clear error naming the command and the batch, never a hang or a crash).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <string>
#include <thread>

#include "test_util.h"
#include "trl/backend/registry.h"
#include "trl/core/error.h"
#include "trl/models/init.h"
#include "trl/models/reward_model.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"
#include "trl/train/rewards.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

RewardInputs inputs(const std::vector<std::string>& texts) {
  RewardInputs in;
  in.batch = 1;
  for (const std::string& t : texts) {
    in.prompts.push_back("p");
    in.completions.push_back(t);
    in.completion_ids.push_back(std::vector<int32_t>(t.size(), 7));
  }
  return in;
}

std::vector<double> values(const std::vector<std::optional<double>>& r) {
  std::vector<double> out;
  for (const auto& x : r) out.push_back(x ? *x : -999.0);
  return out;
}

using test::error_of;

TEST(Rewards, LengthCountsCharactersAsPythonDoes) {
  const auto f = reward_function("length:5");
  EXPECT_EQ(f.name, "reward_len");
  // "héllo" is 5 code points (6 bytes); a conversational completion is scored on its content.
  RewardInputs in = inputs({"héllo", "", "abcdefghij"});
  in.completions.push_back(ojson::array({ojson{{"role", "assistant"}, {"content", "abc"}}}));
  in.prompts.push_back("p"), in.completion_ids.push_back({1});
  EXPECT_EQ(values(f.fn(in)), (std::vector<double>{0.0, -0.05, -0.05, -0.02}));
  EXPECT_NE(error_of([] { reward_function("length:abc"); }).find("whole number"), std::string::npos);
  EXPECT_NE(error_of([] { reward_function("length"); }).find("needs an argument"), std::string::npos);
  EXPECT_NE(error_of([] { reward_function("length:-5"); }).find("must be >= 0, got -5"), std::string::npos);  // issue 37, defect 11
}

TEST(Rewards, ThinkFormatFollowsTrlsPattern) {
  const auto f = reward_function("think_format_reward");
  EXPECT_EQ(values(f.fn(inputs({"<think>\nreasoning\n</think>\nanswer", "<think>no end", "answer <think>x</think>", "<think>a<think>b</think>"}))),
            (std::vector<double>{1, 0, 0, 0}));
}

TEST(Rewards, SoftOverlongPunishmentRampsOverTheCache) {
  const auto f = reward_function("soft_overlong_punishment:100:20");
  RewardInputs in = inputs({"a", "b", "c", "d"});
  in.completion_ids = {std::vector<int32_t>(80, 1), std::vector<int32_t>(90, 1), std::vector<int32_t>(100, 1), std::vector<int32_t>(101, 1)};
  EXPECT_EQ(values(f.fn(in)), (std::vector<double>{0.0, -0.5, -1.0, -1.0}));  // TRL's docstring: 90 of 100 with cache 20 is -0.5
  EXPECT_NE(error_of([] { reward_function("soft_overlong_punishment:10:20"); }).find("CACHE <= MAX"), std::string::npos);
}

TEST(Rewards, RegexSearchesTheCompletion) {
  const auto f = reward_function("regex:^\\d+ apples$");
  EXPECT_EQ(values(f.fn(inputs({"12 apples", "twelve apples", "12 apples and pears"}))), (std::vector<double>{1, 0, 0}));
  EXPECT_EQ(values(reward_function("regex:apple").fn(inputs({"an apple a day", "pear"}))), (std::vector<double>{1, 0}));
  EXPECT_NE(error_of([] { reward_function("regex:(unclosed"); }).find("cannot compile"), std::string::npos);
}

TEST(Rewards, AccuracyComparesFinalAnswersWithTheSolution) {
  const auto f = reward_function("accuracy_reward");
  RewardInputs in = inputs({"so the answer is \\boxed{\\dfrac{1}{3}}", "I think it is 42.", "The total is 1,000", "\\boxed{7}", "anything"});
  in.columns.push_back({"solution", {"\\frac{1}{3}", "42", "1000", "$8$", ""}});
  // The last entry's solution holds no answer: None (left out of the means), as TRL.
  EXPECT_EQ(values(f.fn(in)), (std::vector<double>{1, 1, 1, 0, -999}));
  in.columns.clear();
  EXPECT_NE(error_of([&] { f.fn(in); }).find("no 'solution' column"), std::string::npos);
}

TEST(Rewards, UnknownNamesListTheBuiltIns) {
  const std::string e = error_of([] { reward_function("reward_length"); });
  EXPECT_NE(e.find("unknown reward function 'reward_length'"), std::string::npos) << e;
  EXPECT_NE(e.find("exec:COMMAND"), std::string::npos) << e;
}

TEST(Rewards, ExecSpeaksJsonLinesAndPassesEveryColumn) {
  // A shell reward that answers [1, null] only when the batch carries the dataset's solution column, else [0, 0].
  const std::string script = "while read -r line; do case \"$line\" in *'\"solution\":[\"x\",\"y\"]'*) echo '[1, null]';; *) echo '[0, 0]';; esac; done";
  const auto f = reward_function("exec:" + script);
  RewardInputs in = inputs({"a", "b"});
  in.columns.push_back({"solution", {"x", "y"}});
  EXPECT_EQ(values(f.fn(in)), (std::vector<double>{1, -999}));
  EXPECT_EQ(values(f.fn(in)), (std::vector<double>{1, -999}));  // the same process answers every batch
}

TEST(Rewards, ExecFailuresNameTheCommandAndTheBatch) {
  const RewardInputs in = inputs({"a", "b"});
  const auto died = error_of([&] { reward_function("exec:exit 3").fn(in); });
  EXPECT_NE(died.find("reward function 'exec:exit 3' (batch 1)"), std::string::npos) << died;
  EXPECT_NE(died.find("exited with status 3"), std::string::npos) << died;
  const auto missing = error_of([&] { reward_function("exec:no-such-reward-program-here").fn(in); });
  EXPECT_NE(missing.find("did not find the command"), std::string::npos) << missing;
  const auto count = error_of([&] { reward_function("exec:while read -r l; do echo '[1]'; done").fn(in); });
  EXPECT_NE(count.find("an array of 2 numbers or nulls"), std::string::npos) << count;
  const auto nan = error_of([&] { reward_function("exec:while read -r l; do echo '[\"a\", 1]'; done").fn(in); });
  EXPECT_NE(nan.find("reward 0 of its answer is \"a\""), std::string::npos) << nan;
  const auto text = error_of([&] { reward_function("exec:while read -r l; do echo hello; done").fn(in); });
  EXPECT_NE(text.find("not JSON"), std::string::npos) << text;
  // A reward process that never answers is stopped after the timeout instead of hanging the run.
  const auto t0 = std::chrono::steady_clock::now();
  const auto hang = error_of([&] { reward_function("exec:sleep 30", RewardFunctionOptions{0.5}).fn(in); });
  EXPECT_NE(hang.find("no answer within 0.5 s"), std::string::npos) << hang;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);  // not a timing assertion: a hang guard
  // The whole command is stopped: here a shell waiting for a `sleep` it started, which used to live on after the
  // shell was killed (holding the test's output open for 30 s).
  {
    test::TempDir d;
    const std::string pidfile = d.file("pid");
    const auto waited = error_of([&] { reward_function("exec:sleep 30 & echo $! > " + pidfile + "; wait", RewardFunctionOptions{0.5}).fn(in); });
    EXPECT_NE(waited.find("no answer within 0.5 s"), std::string::npos) << waited;
    const std::string child = "/proc/" + std::to_string(std::stoi(test::read_file(pidfile)));
    auto running = [&] {  // gone, or a zombie waiting for its new parent to reap it, is stopped
      std::ifstream stat(child + "/stat");
      std::string pid, name, state;
      return stat >> pid >> name >> state && state != "Z";
    };
    for (int i = 0; i < 200 && running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_FALSE(running()) << "the command's child " << child << " outlived it";
  }
  // Once failed, the function refuses later batches instead of restarting silently.
  const auto f = reward_function("exec:exit 1");
  error_of([&] { f.fn(in); });
  EXPECT_NE(error_of([&] { f.fn(in); }).find("failed on an earlier batch"), std::string::npos);
}

}  // namespace
}  // namespace trl

namespace trl {
namespace {

// A reward model folder in reward_funcs scores the text prompt + completion (and a conversation rendered with
// the chat template) as reward_scores does on the same tokens.
TEST(Rewards, ARewardModelFolderScoresPromptAndCompletion) {
  const test::TinyModel m;
  const Tokenizer& tok = test::qwen3_tokenizer();
  const RewardModel rm{m.model, new_score_head(m.model.config(), DType::F32, 7), *tok.pad_token_id(), true};
  test::TempDir dir;
  TensorMap w = m.model.weights();
  w["score.weight"] = rm.score;
  save_reward_model(dir.file("rm"), m.model.config(), w, rm.pad_token_id, DType::F32);
  write_tokenizer_files(dir.file("rm"));
  const NamedRewardFunction f = reward_from_spec(dir.file("rm"));
  EXPECT_EQ(f.name, "rm");
  RewardInputs in = inputs({" a", " b c"});
  in.prompts[1] = ojson::array({ojson{{"role", "user"}, {"content", "Hi"}}});
  in.completions[1] = ojson::array({ojson{{"role", "assistant"}, {"content", "Hello"}}});
  const auto got = f.fn(in);
  ojson conversation = in.prompts[1];
  conversation.push_back(ojson{{"role", "assistant"}, {"content", "Hello"}});
  auto backend = make_backend("cpu");
  const std::vector<double> want =
      reward_scores(rm, {tok.encode("p a", false), apply_chat_template_ids(tok, conversation).input_ids}, *backend);
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(got[i] && std::fabs(*got[i] - want[i]) <= 1e-6 * std::max(1.0, std::fabs(want[i]))) << i;
  EXPECT_NE(*got[0], *got[1]);
}

}  // namespace
}  // namespace trl

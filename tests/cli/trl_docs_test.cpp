// Issue 38: TRL's own documented command lines and YAML configs (tests/data/trl_docs/command_lines.txt, copied from
// TRL's docs and example scripts, each with its source) run unchanged against a Hugging Face cache of stand-ins: the tiny model
// under every model id they name, and a few rows of every dataset id in the columns TRL reads from it. Only
// --max_steps 1 and a short completion length are added. Lines TRL's docs give that trl.cpp refuses (QLoRA, an old
// option name) must be refused with the project's message and exit 2.
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace trl {
namespace {

namespace stdfs = std::filesystem;
using json = nlohmann::json;

const std::string kTrl = TRL_BINARY;

// `rows` rows made by `row(i)`, as JSON lines.
template <class Row>
std::string jsonl(int rows, const Row& row) {
  std::string out;
  for (int i = 0; i < rows; ++i) out += row(i).dump() + "\n";
  return out;
}

json turn(const std::string& role, const std::string& content) { return {{"role", role}, {"content", content}}; }

// The columns each dataset id of the command lines has on the Hub (as TRL's docs and the datasets' cards describe
// them), a few rows of each; every dataset gets a train and a test split.
std::map<std::string, std::string> dataset_rows() {
  const auto question = [](int i) { return fmt::format("What is {} plus {}?", i, i); };
  const auto answer = [](int i) { return fmt::format("The answer is {}.", 2 * i); };
  const std::string messages = jsonl(8, [&](int i) { return json{{"messages", {turn("user", question(i)), turn("assistant", answer(i))}}}; });
  const std::string preference = jsonl(8, [&](int i) {
    return json{{"chosen", {turn("user", question(i)), turn("assistant", answer(i))}},
                {"rejected", {turn("user", question(i)), turn("assistant", "I do not know.")}}};
  });
  const std::string math = jsonl(32, [&](int i) {  // a generation round of 4 ranks takes 16 prompts
    return json{{"prompt", {turn("user", fmt::format("What is {} plus {}? Put the answer in \\boxed{{}}.", i, i))}}, {"solution", fmt::format("${}$", 2 * i)}};
  });
  return {
      {"trl-lib/Capybara", messages},
      {"open-thoughts/OpenThoughts-114k", messages},
      {"stanfordnlp/imdb", jsonl(8, [&](int i) { return json{{"text", fmt::format("A film review number {}.", i)}, {"label", i % 2}}; })},
      {"anthropic/hh-rlhf", jsonl(8, [&](int i) {
         return json{{"chosen", fmt::format("\n\nHuman: {}\n\nAssistant: {}", question(i), answer(i))},
                     {"rejected", fmt::format("\n\nHuman: {}\n\nAssistant: No.", question(i))}};
       })},
      {"trl-lib/ultrafeedback_binarized", preference},
      {"argilla/Capybara-Preferences", preference},
      {"trl-lib/kto-mix-14k", jsonl(8, [&](int i) {
         return json{{"prompt", {turn("user", question(i))}}, {"completion", {turn("assistant", answer(i))}}, {"label", i % 2 == 0}};
       })},
      {"HuggingFaceH4/Polaris-Dataset-53K", math},
      {"HuggingFaceH4/OpenR1-Math-220k-default-verified", math},
      {"trl-lib/gsm8k", math},
      {"trl-lib/math-reasoning", math},
      {"trl-lib/DeepMath-103K", math},
      {"roneneldan/TinyStories", jsonl(8, [&](int i) { return json{{"text", fmt::format("Once upon a time there were {} cats.", i)}}; })},
      {"BAAI/Infinity-Preference", preference},
      {"trl-lib/tldr-preference", jsonl(8, [&](int i) {
         return json{{"prompt", fmt::format("SUBREDDIT: r/cats\nPOST: story {}\nTL;DR:", i)}, {"chosen", " A short summary."}, {"rejected", " No."}};
       })},
      {"trl-lib/lm-human-preferences-sentiment", jsonl(8, [&](int i) {
         return json{{"prompt", fmt::format("The film number {} was", i)}, {"chosen", " wonderful."}, {"rejected", " dull."}};
       })},
      {"trl-lib/chatbot_arena_completions", jsonl(8, [&](int i) {
         return json{{"prompt", {turn("user", question(i))}}, {"completion", {turn("assistant", answer(i))}}};
       })},
  };
}

// models--Org--Name/snapshots/<commit>/ and refs/main, as huggingface_hub lays a repository out.
std::string snapshot(const std::string& hub, const std::string& kind, const std::string& id) {
  std::string folder = kind + "--" + id;
  for (size_t at = folder.find('/'); at != std::string::npos; at = folder.find('/')) folder.replace(at, 1, "--");
  const stdfs::path repo = stdfs::path(hub) / folder;
  stdfs::create_directories(repo / "refs");
  test::write_file((repo / "refs" / "main").string(), "0123abcd");
  stdfs::create_directories(repo / "snapshots" / "0123abcd");
  return (repo / "snapshots" / "0123abcd").string();
}

struct Line {
  std::string source, expect_refusal, text;
  std::string file_name, file_text;  // a YAML config the line reads (--config), written beside it
};

std::vector<Line> command_lines() {
  std::ifstream in(std::string(TRL_TEST_DATA_DIR) + "/trl_docs/command_lines.txt");
  std::vector<Line> lines;
  Line next;
  for (std::string l; std::getline(in, l);) {
    const std::string refusal = "# expect exit 2: ", file = "# file ", file_line = "#|";
    if (l.rfind(refusal, 0) == 0) next.expect_refusal = l.substr(refusal.size());
    else if (l.rfind(file, 0) == 0) next.file_name = l.substr(file.size());
    else if (l.rfind(file_line, 0) == 0) next.file_text += (l.size() > 3 ? l.substr(3) : std::string()) + "\n";
    else if (l.rfind("# ", 0) == 0) next.source = l.substr(2);
    else if (l.rfind("trl ", 0) == 0) {
      next.text = l;
      lines.push_back(next);
      next = Line{};
    }
  }
  return lines;
}

TEST(TrlDocs, DocumentedCommandLinesTrainUnchanged) {
  test::TempDir dir;
  const std::string hub = dir.file("hub"), model = dir.file("tiny"), work = dir.file("work");
  std::string out;
  ASSERT_EQ(test::run_command(fmt::format("{} init-model --preset tiny --vocab_size {} --out {} 2>&1", kTrl, test::kCutVocab, model), &out), 0) << out;
  stdfs::create_directories(work);
  const std::vector<Line> lines = command_lines();
  ASSERT_GE(lines.size(), 70u);
  // Every model id the lines name is the tiny model (its files linked, as the cache links blobs).
  for (const Line& line : lines)
    for (const std::string flag : {"--model_name_or_path", "--teacher_model_name_or_path", "model_name_or_path:"}) {
      const std::string& where = flag.back() == ':' ? line.file_text : line.text;
      const size_t at = where.find(flag);
      if (at == std::string::npos) continue;
      std::string id = where.substr(at + flag.size() + 1);
      id = id.substr(0, id.find_first_of(" \n"));
      const std::string snap = snapshot(hub, "models", id);
      for (const auto& f : stdfs::directory_iterator(model)) {
        std::error_code ec;
        stdfs::create_symlink(f.path(), stdfs::path(snap) / f.path().filename(), ec);
      }
    }
  for (const auto& [id, rows] : dataset_rows()) {
    const std::string snap = snapshot(hub, "datasets", id);
    test::write_file(snap + "/train.jsonl", rows);
    test::write_file(snap + "/test.jsonl", rows);
  }
  // Under the sanitizers every 10th line (8 runs, not 80: the whole file takes 460 s there, 28 s in Release).
  const size_t stride = test::kSanitized ? 10 : 1;
  int trained = 0, refused = 0;
  for (size_t k = 0; k < lines.size(); k += stride) {
    const Line& line = lines[k];
    SCOPED_TRACE(line.source + ": " + line.text);
    if (!line.file_name.empty()) test::write_file(work + "/" + line.file_name, line.file_text);
    std::string trl_word, command;
    std::istringstream(line.text) >> trl_word >> command;
    std::string added = " --max_steps 1";
    if (command == "grpo" || command == "rloo") added += " --max_completion_length 8";
    if (command == "gkd") added += " --max_new_tokens 8";
    const int rc = test::run_command("cd " + work + " && HOME=" + work + " HF_HUB_CACHE=" + hub + " " + test::mpirun_env() + kTrl + line.text.substr(3) +
                                         added + " 2>&1",
                                     &out);
    if (!line.expect_refusal.empty()) {
      EXPECT_EQ(rc, 2) << out;
      EXPECT_NE(out.find(line.expect_refusal), std::string::npos) << out;
      ++refused;
    } else {
      EXPECT_EQ(rc, 0) << out;
      EXPECT_NE(out.find("\"global_step\": 1"), std::string::npos) << out;
      ++trained;
    }
  }
  if (stride == 1) {
    EXPECT_EQ(trained, 73);
    EXPECT_EQ(refused, 7);
  }
}

}  // namespace
}  // namespace trl

// Preference data as TRL's DPOTrainer prepares it, on the real Qwen3 tokenizer: explicit and implicit prompts,
// standard and conversational rows, eos handling, dropping, truncation, the [chosen; rejected] batch rows, and the
// errors bad rows get.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/preference.h"
#include "test_util.h"
#include "trl/core/error.h"
#include "trl/tokenizer/chat_template.h"

namespace trl {
namespace {

using ojson = nlohmann::ordered_json;

Dataset rows(std::vector<ojson> r) {
  Dataset d;
  for (size_t i = 0; i < r.size(); ++i) {
    d.rows.push_back(std::move(r[i]));
    d.where.push_back("prefs.jsonl:" + std::to_string(i + 1));
  }
  return d;
}

std::vector<int32_t> tail(const std::vector<int32_t>& all, size_t from) { return {all.begin() + static_cast<std::ptrdiff_t>(from), all.end()}; }

TEST(PreferenceData, StandardRowsExplicitAndImplicit) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  const std::string eos = tok.eos_token();
  ASSERT_FALSE(eos.empty());
  const auto ex = prepare_preference_dataset(
      rows({ojson{{"prompt", "The sky is"}, {"chosen", " blue."}, {"rejected", " green." + eos}},
            ojson{{"chosen", "The sky is blue."}, {"rejected", "The sky is green."}}}),
      tok, {});
  ASSERT_EQ(ex.size(), 2u);
  const std::vector<int32_t> prompt = tok.encode("The sky is");
  for (const PreferenceExample& e : ex) {
    EXPECT_EQ(e.prompt_ids, prompt) << e.where;  // the implicit prompt gives its final space back to the completions
    EXPECT_EQ(e.chosen_ids, tail(tok.encode("The sky is blue." + eos), prompt.size())) << e.where;
    EXPECT_EQ(e.rejected_ids, tail(tok.encode("The sky is green." + eos), prompt.size())) << e.where;  // eos not doubled
  }
  EXPECT_EQ(ex[1].where, "prefs.jsonl:2");
}

TEST(PreferenceData, ConversationalRowsUseTheChatTemplate) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  const ojson user = {{"role", "user"}, {"content", "What color is the sky?"}};
  const ojson blue = {{"role", "assistant"}, {"content", "It is blue."}}, green = {{"role", "assistant"}, {"content", "It is green."}};
  const auto ex = prepare_preference_dataset(
      rows({ojson{{"chosen", ojson::array({user, blue})}, {"rejected", ojson::array({user, green})}},
            ojson{{"prompt", ojson::array({user})}, {"chosen", ojson::array({blue})}, {"rejected", ojson::array({green})}}}),
      tok, {});
  ASSERT_EQ(ex.size(), 2u);
  ChatTemplateOptions gen;
  gen.add_generation_prompt = true;
  const std::vector<int32_t> prompt = apply_chat_template_ids(tok, ojson::array({user}), gen).input_ids;
  for (const PreferenceExample& e : ex) {
    EXPECT_EQ(e.prompt_ids, prompt);
    EXPECT_EQ(e.chosen_ids, tail(apply_chat_template_ids(tok, ojson::array({user, blue})).input_ids, prompt.size()));
    EXPECT_EQ(e.rejected_ids, tail(apply_chat_template_ids(tok, ojson::array({user, green})).input_ids, prompt.size()));
    EXPECT_EQ(e.chosen_ids.back(), tok.encode("\n").back());  // Qwen3's template ends a turn with <|im_end|>\n
  }
}

TEST(PreferenceData, RowsWhosePromptFillsMaxLengthAreDroppedUnderKeepStart) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  const Dataset d = rows({ojson{{"prompt", "one two three four five six seven"}, {"chosen", " yes"}, {"rejected", " no"}},
                          ojson{{"prompt", "hi"}, {"chosen", " yes"}, {"rejected", " no"}}});
  PreferenceDataOptions o;
  o.max_length = 4;
  PreferenceDataStats st;
  EXPECT_EQ(prepare_preference_dataset(d, tok, o, &st).size(), 1u);
  EXPECT_EQ(st.dropped, 1);
  o.truncation_mode = "keep_end";  // keeps the completion's end: nothing to drop
  EXPECT_EQ(prepare_preference_dataset(d, tok, o, &st).size(), 2u);
  EXPECT_EQ(st.dropped, 0);
  o.truncation_mode = "keep_middle";
  EXPECT_THROW(prepare_preference_dataset(d, tok, o), Error);
}

TEST(PreferenceData, BatchRowsAreChosenThenRejectedAndTruncatedPerSequence) {
  PreferenceExample a{{1, 2, 3}, {4, 5}, {6}, "a", std::nullopt}, b{{7}, {8, 9, 10, 11}, {12, 13}, "b", std::nullopt};
  PreferenceDataOptions o;
  o.max_length = 4;
  const auto r = preference_rows({&a, &b}, o);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].input_ids, (std::vector<int32_t>{1, 2, 3, 4}));  // a chosen, keep_start
  EXPECT_EQ(r[0].labels_mask, (std::vector<uint8_t>{0, 0, 0, 1}));
  EXPECT_EQ(r[1].input_ids, (std::vector<int32_t>{7, 8, 9, 10}));  // b chosen
  EXPECT_EQ(r[2].input_ids, (std::vector<int32_t>{1, 2, 3, 6}));  // a rejected
  EXPECT_EQ(r[3].input_ids, (std::vector<int32_t>{7, 12, 13}));
  EXPECT_EQ(r[3].labels_mask, (std::vector<uint8_t>{0, 1, 1}));
  o.truncation_mode = "keep_end";
  const auto e = preference_rows({&b}, o);
  EXPECT_EQ(e[0].input_ids, (std::vector<int32_t>{8, 9, 10, 11}));
  EXPECT_EQ(e[0].labels_mask, (std::vector<uint8_t>{1, 1, 1, 1}));
  // Collated: weight 1 where position t predicts a completion token t + 1.
  const SFTBatch batch = collate_padded({&r[2], &r[3]}, 0, 0, 0);
  EXPECT_EQ(batch.weights.to_f32_vector(), (std::vector<float>{0, 0, 1, 0, 1, 1, 0, 0}));
}

TEST(PreferenceData, BadRowsNameTheRowAndTheField) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  auto message = [&](ojson row) -> std::string {
    try {
      prepare_preference_dataset(rows({ojson{{"prompt", "a"}, {"chosen", " b"}, {"rejected", " c"}}, std::move(row)}), tok, {});
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  };
  const std::string missing = message(ojson{{"prompt", "a"}, {"chosen", " b"}});
  EXPECT_NE(missing.find("prefs.jsonl:2: preference row has no \"rejected\" (keys: prompt, chosen)"), std::string::npos) << missing;
  EXPECT_NE(message(ojson{{"prompt", "a"}, {"chosen", ""}, {"rejected", " c"}}).find("prefs.jsonl:2: \"chosen\" is empty"), std::string::npos);
  EXPECT_NE(message(ojson{{"prompt", "a"}, {"chosen", ojson::array()}, {"rejected", " c"}}).find("\"chosen\" is an empty list of messages"),
            std::string::npos);
  const std::string mixed = message(ojson{{"prompt", "a"}, {"chosen", ojson::array({{{"role", "assistant"}, {"content", "b"}}})}, {"rejected", " c"}});
  EXPECT_NE(mixed.find("must all be strings or all be lists of messages"), std::string::npos) << mixed;
  EXPECT_NE(message(ojson{{"prompt", "a"}, {"chosen", 3}, {"rejected", " c"}}).find("\"chosen\" must be a string or a list of messages, not number"),
            std::string::npos);
}

// Paired rows given to an unpaired trainer (KTO unpairs them as TRL does) are checked the same way: a text
// "chosen" beside a "rejected" list of messages, with the prompt left implicit, is an error naming the row, not a
// raw JSON type error (a fuzz finding, fuzz/corpus/dataset).
TEST(PreferenceData, MixedKindsInRowsToUnpairAreAnErrorNamingTheRow) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  const ojson turns = ojson::array({{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "c"}}});
  const std::string e = test::error_of([&] { prepare_unpaired_dataset(rows({ojson{{"chosen", " blue"}, {"rejected", turns}}}), tok, {}); });
  EXPECT_NE(e.find("prefs.jsonl:1: \"prompt\", \"chosen\" and \"rejected\" must all be strings or all be lists of messages (got text / text / messages)"),
            std::string::npos)
      << e;
  const std::string p = test::error_of([&] { prepare_unpaired_dataset(rows({ojson{{"prompt", turns}, {"chosen", " b"}, {"rejected", " c"}}}), tok, {}); });
  EXPECT_NE(p.find("prefs.jsonl:1: \"prompt\", \"chosen\" and \"rejected\" must all be"), std::string::npos) << p;
  // Rows of one kind still unpair: two rows per pair, the implicit prompt split off.
  EXPECT_EQ(prepare_unpaired_dataset(rows({ojson{{"chosen", "The sky is blue"}, {"rejected", "The sky is green"}}}), tok, {}).size(), 2u);
}

// A token id outside the model's vocabulary is named with its row, field and position when the data is read, for
// pre-tokenized rows and tokenized text alike (issue 37, defect 8), in paired and unpaired data.
TEST(PreferenceData, TokenIdsOutsideTheVocabularyAreNamedWhenRead) {
  const Tokenizer& tok = test::qwen3_tokenizer();
  PreferenceDataOptions o;
  o.vocab_size = 1000;
  const ojson ids{{"prompt_ids", {1, 2}}, {"chosen_ids", {3, 4}}, {"rejected_ids", {5, 1000}}};
  const std::string e = test::error_of([&] { prepare_preference_dataset(rows({ojson{{"prompt_ids", {1}}, {"chosen_ids", {2}}, {"rejected_ids", {3}}}, ids}), tok, o); });
  EXPECT_NE(e.find("prefs.jsonl:2: \"rejected_ids\" position 1 is token id 1000, outside the model's vocabulary of 1000 ids (0 to 999)"),
            std::string::npos)
      << e;
  const std::string text = test::error_of([&] { prepare_preference_dataset(rows({ojson{{"prompt", "Hello"}, {"chosen", " world"}, {"rejected", " there"}}}), tok, o); });
  EXPECT_NE(text.find("prefs.jsonl:1: \"prompt + chosen (tokenized)\" position"), std::string::npos) << text;
  const std::string unpaired =
      test::error_of([&] { prepare_unpaired_dataset(rows({ojson{{"prompt_ids", {1}}, {"completion_ids", {2, 4096}}, {"label", true}}}), tok, o); });
  EXPECT_NE(unpaired.find("prefs.jsonl:1: \"completion_ids\" position 1 is token id 4096"), std::string::npos) << unpaired;
  o.vocab_size = 0;  // unchecked
  EXPECT_EQ(prepare_preference_dataset(rows({ids}), tok, o).size(), 1u);
}

}  // namespace
}  // namespace trl

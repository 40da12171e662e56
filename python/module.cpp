// trl_cpp._core: the engine as the Python package (python/trl_cpp) sees it. The package speaks TRL's and
// Transformers' Python API; this module gives it four things, each a thin layer over the C++ library:
//   - the option tables of the `trl` commands (a Config class's fields, kinds and defaults) and prepare(), which
//     parses a command line in-process and returns the command's trainer (src/cli/embed.h);
//   - the tokenizer, chat templates and generate() of a loaded model;
//   - the datasets (load_dataset's rows) and the host's description (`trl env`);
//   - engine errors as Python exceptions: usage and config errors ValueError, missing files FileNotFoundError, others
//     trl_cpp.EngineError (a RuntimeError). A Python exception raised in a callback or reward function passes
//     through the engine unchanged, traceback included.
// The GIL is released while the engine works; callbacks and reward functions take it back for their call.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <signal.h>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cli/cli_util.h"
#include "cli/embed.h"
#include "cli/options.h"
#include "trl/core/error.h"
#include "trl/data/dataset.h"
#include "trl/generation/generate.h"
#include "trl/models/causal_lm.h"
#include "trl/runtime/runtime.h"
#include "trl/tokenizer/chat_template.h"
#include "trl/tokenizer/tokenizer.h"
#include "version.h"

namespace py = pybind11;
using ojson = nlohmann::ordered_json;

namespace trl::python {

// ---- JSON values <-> Python objects -------------------------------------------------------------------------------

py::object to_py(const ojson& j) {
  switch (j.type()) {
    case ojson::value_t::null: return py::none();
    case ojson::value_t::boolean: return py::bool_(j.get<bool>());
    case ojson::value_t::number_integer: return py::int_(j.get<int64_t>());
    case ojson::value_t::number_unsigned: return py::int_(j.get<uint64_t>());
    case ojson::value_t::number_float: return py::float_(j.get<double>());
    case ojson::value_t::string: return py::str(j.get_ref<const std::string&>());
    case ojson::value_t::array: {
      py::list out;
      for (const ojson& x : j) out.append(to_py(x));
      return out;
    }
    case ojson::value_t::object: {
      py::dict out;
      for (auto it = j.begin(); it != j.end(); ++it) out[py::str(it.key())] = to_py(it.value());
      return out;
    }
    default: return py::none();  // binary and discarded values never come out of the engine's JSON
  }
}

// `where` names the value in errors: "messages[2]['content']".
ojson from_py(py::handle h, const std::string& where) {
  if (h.is_none()) return nullptr;
  if (py::isinstance<py::bool_>(h)) return h.cast<bool>();
  if (py::isinstance<py::int_>(h)) {
    try {
      return h.cast<int64_t>();
    } catch (const py::cast_error&) {
      throw py::value_error(where + ": the integer " + py::str(h).cast<std::string>() + " does not fit in 64 bits");
    }
  }
  if (py::isinstance<py::float_>(h)) return h.cast<double>();
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  if (py::isinstance<py::dict>(h)) {
    ojson out = ojson::object();
    for (auto item : h.cast<py::dict>()) {
      if (!py::isinstance<py::str>(item.first)) throw py::type_error(where + ": dictionary keys must be str, got " + py::repr(item.first).cast<std::string>());
      const std::string key = item.first.cast<std::string>();
      out[key] = from_py(item.second, where + "['" + key + "']");
    }
    return out;
  }
  if (py::isinstance<py::list>(h) || py::isinstance<py::tuple>(h)) {
    ojson out = ojson::array();
    size_t i = 0;
    for (auto x : h) out.push_back(from_py(x, where + "[" + std::to_string(i++) + "]"));
    return out;
  }
  // NumPy scalars and arrays, and anything else that says what it is as a number or a list.
  if (py::hasattr(h, "tolist")) return from_py(h.attr("tolist")(), where);
  const py::object o = py::reinterpret_borrow<py::object>(h);
  if (py::hasattr(h, "__index__")) return from_py(py::int_(o), where);
  if (py::hasattr(h, "__float__")) return from_py(py::float_(o), where);
  throw py::type_error(where + ": a " + py::str(h.get_type().attr("__name__")).cast<std::string>() +
                       " cannot be passed to the engine (use str, int, float, bool, None, list or dict)");
}

// ---- The option tables ----------------------------------------------------------------------------------------------

const char* kind_name(cli::OptionSpec::Kind k) {
  switch (k) {
    case cli::OptionSpec::Kind::Bool: return "bool";
    case cli::OptionSpec::Kind::Int: return "int";
    case cli::OptionSpec::Kind::Float: return "float";
    case cli::OptionSpec::Kind::Text: return "str";
  }
  return "str";
}

// Every option of `command` ("sft", "grpo", ...): its names, kind, default and help, as the Config classes read them.
py::list command_options(const std::string& command) {
  std::vector<cli::CommandOptions> tables;
  cli::option_collector() = &tables;
  std::unique_ptr<CLI::App> app;
  try {
    app = cli::make_app();
  } catch (...) {
    cli::option_collector() = nullptr;
    throw;
  }
  cli::option_collector() = nullptr;
  py::list out;
  for (const cli::CommandOptions& t : tables) {
    if (t.command != command) continue;
    for (const cli::OptionSpec& s : *t.specs) {
      py::dict d;
      d["name"] = s.name;
      d["aliases"] = s.aliases;
      d["kind"] = kind_name(s.kind);
      d["optional"] = s.optional;
      d["list"] = s.list;
      d["json"] = s.json || s.json_list;
      d["value"] = s.shown_default ? s.shown_default() : std::string();
      d["shown"] = s.default_override;
      d["choices"] = s.choices;
      d["help"] = s.help;
      out.append(d);
    }
    return out;
  }
  throw py::value_error("trl_cpp: no command named '" + command + "'");
}

// ---- Trainers -----------------------------------------------------------------------------------------------------

// A Python object the engine holds (a callback, a reward function): its last holder may let go of it on a thread
// without the GIL (the engine's copies of a std::function), so the deleter takes the GIL.
std::shared_ptr<py::object> hold(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// One call at a time on a trainer or a model: a callback that calls trainer.evaluate() in the middle of a step, or a
// second thread calling generate() on a model that is generating, gets an error instead of a half-made state.
class Busy {
 public:
  Busy(bool& flag, const char* what) : flag_(flag) {
    if (flag_) throw py::value_error(std::string(what) + " was called while this object is still working (from a callback or another thread)");
    flag_ = true;
  }
  ~Busy() { flag_ = false; }
  Busy(const Busy&) = delete;
  Busy& operator=(const Busy&) = delete;

 private:
  bool& flag_;
};

// Ctrl-C while the engine trains: the trainer's own handler (src/train/trainer.cpp) saves a checkpoint and stops.
// The result says interrupted; the package raises KeyboardInterrupt.
class TrainerHandle {
 public:
  explicit TrainerHandle(std::unique_ptr<cli::PreparedTrainer> p) : p_(std::move(p)) {}

  py::dict train() {
    TrainOutput out;
    {
      const Busy busy(busy_, "train()");
      py::gil_scoped_release release;
      out = p_->trainer->train();
    }
    py::dict d;
    d["global_step"] = out.global_step;
    d["training_loss"] = out.training_loss;
    d["interrupted"] = out.interrupted;
    py::list history;
    for (const ojson& e : out.log_history) history.append(to_py(e));
    d["log_history"] = history;
    d["programs_compiled"] = out.programs.compilations;
    d["cache_hits"] = out.programs.hits;
    d["compile_seconds"] = out.programs.compile_seconds;
    if (p_->generation_stats) {
      const ProgramCacheStats* g = p_->generation_stats();
      d["generation_programs_compiled"] = g->compilations;
      d["generation_cache_hits"] = g->hits;
    }
    return d;
  }

  py::object evaluate() {
    ojson m;
    {
      const Busy busy(busy_, "evaluate()");
      py::gil_scoped_release release;
      m = p_->trainer->evaluate_metrics();
    }
    return to_py(m);
  }

  void save_model(const std::string& dir) {
    const Busy busy(busy_, "save_model()");
    py::gil_scoped_release release;
    p_->trainer->save_model(dir);
  }

  // on_log(entry: dict), on_step(entry: dict), should_stop() -> bool: called from the loop with the GIL held; None
  // clears one (the package clears them after each train(), so that no cycle through the engine keeps a trainer).
  void set_callbacks(py::object on_log, py::object on_step, py::object should_stop) {
    p_->trainer->on_log = wrap(std::move(on_log));
    p_->trainer->on_step = wrap(std::move(on_step));
    if (should_stop.is_none()) {
      p_->trainer->stop_requested = nullptr;
    } else {
      auto held = hold(std::move(should_stop));
      p_->trainer->stop_requested = [held] {
        py::gil_scoped_acquire gil;
        return py::bool_((*held)()).cast<bool>();
      };
    }
  }

  const std::string& command() const { return p_->command; }
  const std::string& output_dir() const { return p_->output_dir; }

 private:
  static std::function<void(const ojson&)> wrap(py::object fn) {
    if (fn.is_none()) return nullptr;
    auto held = hold(std::move(fn));
    return [held](const ojson& e) {
      py::gil_scoped_acquire gil;
      (*held)(to_py(e));
    };
  }
  std::unique_ptr<cli::PreparedTrainer> p_;
  bool busy_ = false;  // read and written with the GIL held
};

// A Python callable as a reward function: called with the batch as TRL calls one (prompts, completions,
// completion_ids and each extra column, by keyword); a number or None per completion.
NamedRewardFunction python_reward(const std::string& name, py::object fn) {
  auto held = hold(std::move(fn));
  NamedRewardFunction r;
  r.name = name;
  r.fn = [held, name](const RewardInputs& in) {
    py::gil_scoped_acquire gil;
    py::list prompts, completions, ids;
    for (const ojson& p : in.prompts) prompts.append(to_py(p));
    for (const ojson& c : in.completions) completions.append(to_py(c));
    for (const auto& row : in.completion_ids) ids.append(py::cast(row));
    py::dict kwargs;
    kwargs["prompts"] = prompts;
    kwargs["completions"] = completions;
    kwargs["completion_ids"] = ids;
    for (const auto& [column, values] : in.columns) {
      py::list l;
      for (const ojson& v : values) l.append(to_py(v));
      kwargs[py::str(column)] = l;
    }
    const py::object result = (*held)(**kwargs);
    std::vector<std::optional<double>> out;
    if (py::isinstance<py::str>(result) || !py::isinstance<py::sequence>(result))
      throw py::type_error("reward function '" + name + "' must return a list with a number or None per completion, got " +
                           py::str(result.get_type().attr("__name__")).cast<std::string>());
    size_t i = 0;
    for (auto v : result.cast<py::sequence>()) {
      if (v.is_none()) {
        out.emplace_back(std::nullopt);
      } else if (py::isinstance<py::str>(v) || !py::hasattr(v, "__float__")) {
        throw py::type_error("reward function '" + name + "' returned " + py::repr(v).cast<std::string>() + " for completion " + std::to_string(i) +
                             " of batch " + std::to_string(in.batch) + ": a reward is a number or None");
      } else {
        // A bool counts as 1 or 0 and NaN as None ("no reward"), as TRL reads them through a float tensor.
        const double x = py::float_(py::reinterpret_borrow<py::object>(v)).cast<double>();
        out.emplace_back(std::isnan(x) ? std::nullopt : std::optional<double>(x));
      }
      ++i;
    }
    return out;
  };
  return r;
}

// Parses `args` (["grpo", "--model_name_or_path", ...]) as the trl binary does and returns the command's trainer,
// with `rewards` ((name, callable) pairs) as the reward functions "python:0", "python:1", ...; with load_eval_split,
// the test split is loaded even when eval_strategy is no (the script passed an eval_dataset to call evaluate() on).
std::unique_ptr<TrainerHandle> prepare(const std::vector<std::string>& args, const std::vector<std::pair<std::string, py::object>>& rewards,
                                       bool load_eval_split) {
  static const char* const kTraining[] = {"sft", "dpo", "kto", "reward", "grpo", "rloo", "gkd", "distill"};
  if (args.empty() || std::find(std::begin(kTraining), std::end(kTraining), args[0]) == std::end(kTraining))
    throw cli::UsageError("'" + (args.empty() ? std::string() : args[0]) + "' is not a training command (sft, dpo, kto, reward, grpo, rloo, gkd, distill)");
  cli::EmbeddedCall call;
  call.load_eval_split = load_eval_split;
  for (const auto& [name, fn] : rewards) call.python_rewards.push_back(python_reward(name, fn));
  std::vector<std::string> argv{"trl"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::unique_ptr<CLI::App> app = cli::make_app();
  {
    py::gil_scoped_release release;
    cli::embedded_call() = &call;
    try {
      std::vector<const char*> ptrs;
      for (const std::string& a : argv) ptrs.push_back(a.c_str());
      app->parse(static_cast<int>(ptrs.size()), ptrs.data());
    } catch (const CLI::ParseError& e) {
      cli::embedded_call() = nullptr;
      throw cli::UsageError(cli::parse_error_message(*app, e));
    } catch (...) {
      cli::embedded_call() = nullptr;
      throw;
    }
    cli::embedded_call() = nullptr;
  }
  if (!call.prepared) throw trl::Error("'" + args[0] + "' made no trainer");
  return std::make_unique<TrainerHandle>(std::move(call.prepared));
}

// ---- Tokenizer, model, generate ---------------------------------------------------------------------------------

struct PyTokenizer {
  std::shared_ptr<Tokenizer> tok;
  std::string source;
};

PyTokenizer tokenizer_from_pretrained(const std::string& name, const std::string& revision) {
  py::gil_scoped_release release;
  const std::string where = cli::tokenizer_source(name);
  return PyTokenizer{std::make_shared<Tokenizer>(Tokenizer::from_pretrained(where, revision)), where};
}

std::string render_chat(const PyTokenizer& t, py::object messages, bool add_generation_prompt, bool continue_final_message, py::object tools,
                        py::object documents, py::object chat_template, py::dict extra) {
  ChatTemplateOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.continue_final_message = continue_final_message;
  o.tools = from_py(tools, "tools");
  o.documents = from_py(documents, "documents");
  if (!chat_template.is_none()) o.chat_template = chat_template.cast<std::string>();
  o.extra = from_py(extra, "chat template variables");
  const ojson m = from_py(messages, "conversation");
  py::gil_scoped_release release;
  return apply_chat_template(*t.tok, m, o).text;
}

struct PyModel {
  std::shared_ptr<CausalLM> model;
  std::shared_ptr<Generator> generator;
  std::string source;
  std::shared_ptr<bool> busy = std::make_shared<bool>(false);
};

PyModel model_from_pretrained(const std::string& name, const std::string& dtype, const std::string& device, const std::string& revision,
                              const std::string& adapter) {
  LoadOptions lo;
  lo.revision = revision;
  lo.device = device;
  if (dtype == "bfloat16" || dtype == "bf16") lo.dtype = DType::BF16;
  else if (dtype == "float32" || dtype == "f32") lo.dtype = DType::F32;
  else if (dtype != "auto") throw cli::UsageError("dtype='" + dtype + "': trl.cpp loads models as 'auto' (the checkpoint's), 'bfloat16' or 'float32'");
  py::gil_scoped_release release;
  auto m = std::make_shared<CausalLM>(cli::load_inference_model(name, adapter, lo, /*merge=*/!adapter.empty()));
  auto g = std::make_shared<Generator>(*m);
  return PyModel{m, g, name};
}

// generate()'s options by name, each read as the kind Transformers gives it; a value of another kind is a TypeError
// that names the option.
struct GenerateOption {
  const char* name;
  enum Kind { Bool, Int, Number, Text, Ids, Texts } kind;
  std::function<void(GenerationConfig&, const ojson&)> set;
};

const std::vector<GenerateOption>& generate_options() {
  using G = GenerationConfig;
  static const std::vector<GenerateOption> table = {
      {"max_new_tokens", GenerateOption::Int, [](G& c, const ojson& v) { c.max_new_tokens = v.get<int64_t>(); }},
      {"max_length", GenerateOption::Int, [](G& c, const ojson& v) { c.max_length = v.get<int64_t>(); }},
      {"do_sample", GenerateOption::Bool, [](G& c, const ojson& v) { c.do_sample = v.get<bool>(); }},
      {"temperature", GenerateOption::Number, [](G& c, const ojson& v) { c.temperature = v.get<float>(); }},
      {"top_k", GenerateOption::Int, [](G& c, const ojson& v) { c.top_k = v.get<int64_t>(); }},
      {"top_p", GenerateOption::Number, [](G& c, const ojson& v) { c.top_p = v.get<float>(); }},
      {"min_p", GenerateOption::Number, [](G& c, const ojson& v) { c.min_p = v.get<float>(); }},
      {"repetition_penalty", GenerateOption::Number, [](G& c, const ojson& v) { c.repetition_penalty = v.get<float>(); }},
      {"seed", GenerateOption::Int, [](G& c, const ojson& v) {
         if (v.get<int64_t>() < 0) throw py::value_error("generate(): seed must be at least 0");
         c.seed = v.get<uint64_t>();
       }},
      {"num_return_sequences", GenerateOption::Int, [](G& c, const ojson& v) { c.num_return_sequences = v.get<int64_t>(); }},
      {"pad_token_id", GenerateOption::Int, [](G& c, const ojson& v) { c.pad_token_id = static_cast<int32_t>(v.get<int64_t>()); }},
      {"eos_token_id", GenerateOption::Ids, [](G& c, const ojson& v) { c.eos_token_id = cli::token_ids_from_json(v, "generate(): eos_token_id"); }},
      {"stop_strings", GenerateOption::Texts, [](G& c, const ojson& v) {
         for (const ojson& x : v) c.stop_strings.push_back(x.get<std::string>());
       }},
      {"cache_implementation", GenerateOption::Text, [](G& c, const ojson& v) { c.cache_implementation = v.get<std::string>(); }},
      {"disable_compile", GenerateOption::Bool, [](G& c, const ojson& v) { c.disable_compile = v.get<bool>(); }},
      {"pad_to_multiple_of", GenerateOption::Int, [](G& c, const ojson& v) { c.pad_to_multiple_of = v.get<int64_t>(); }},
  };
  return table;
}

GenerationConfig generation_config(const ojson& options) {
  GenerationConfig c;
  for (auto it = options.begin(); it != options.end(); ++it) {
    const auto& table = generate_options();
    const auto opt = std::find_if(table.begin(), table.end(), [&](const GenerateOption& o) { return it.key() == o.name; });
    if (opt == table.end()) throw py::type_error("generate() got an unexpected keyword argument '" + it.key() + "'");
    ojson v = it.value();
    if (v.is_null()) continue;  // None: the model's generation_config.json, else Transformers' default
    if ((opt->kind == GenerateOption::Ids || opt->kind == GenerateOption::Texts) && !v.is_array()) v = ojson::array({v});  // one or a list
    bool ok = false;
    switch (opt->kind) {
      case GenerateOption::Bool: ok = v.is_boolean(); break;
      case GenerateOption::Int: ok = v.is_number_integer(); break;
      case GenerateOption::Number: ok = v.is_number(); break;
      case GenerateOption::Text: ok = v.is_string(); break;
      case GenerateOption::Ids: ok = std::all_of(v.begin(), v.end(), [](const ojson& x) { return x.is_number_integer(); }); break;
      case GenerateOption::Texts: ok = std::all_of(v.begin(), v.end(), [](const ojson& x) { return x.is_string(); }); break;
    }
    static const char* const kWhat[] = {"True or False", "an int", "a number", "a str", "an int or a list of ints", "a str or a list of str"};
    if (!ok) throw py::type_error(std::string("generate(): ") + opt->name + " must be " + kWhat[opt->kind] + ", got " + it.value().dump());
    opt->set(c, v);
  }
  return c;
}

// Ctrl-C during generate(): a flag the decode loop reads between tokens (no GIL needed), the interpreter's handler
// put back afterwards with its flags.
std::atomic<bool> g_generate_interrupted{false};
extern "C" void on_generate_sigint(int) { g_generate_interrupted = true; }

// generate(): prompts as rows of ids (already without padding), GenerationConfig fields by name; the new tokens.
std::vector<std::vector<int32_t>> generate(PyModel& m, const std::vector<std::vector<int32_t>>& prompts, py::dict options, py::object tokenizer) {
  GenerationConfig c = generation_config(from_py(options, "generate()"));
  const Tokenizer* tok = tokenizer.is_none() ? nullptr : tokenizer.cast<PyTokenizer&>().tok.get();
  c.interrupted = [] { return g_generate_interrupted.load(); };
  GenerationOutput out;
  {
    const Busy busy(*m.busy, "generate()");
    g_generate_interrupted = false;
    struct sigaction now {}, old {};
    now.sa_handler = on_generate_sigint;
    sigemptyset(&now.sa_mask);
    sigaction(SIGINT, &now, &old);
    struct Restore {
      struct sigaction* old;
      ~Restore() { sigaction(SIGINT, old, nullptr); }
    } restore{&old};
    py::gil_scoped_release release;
    out = m.generator->generate(prompts, c, tok);
  }
  if (g_generate_interrupted) {
    PyErr_SetNone(PyExc_KeyboardInterrupt);
    throw py::error_already_set();
  }
  return out.generated;
}

// ---- Datasets -----------------------------------------------------------------------------------------------------

py::list dataset_rows(const std::string& name, const std::string& split, const std::string& config, const std::string& revision) {
  Dataset d;
  {
    py::gil_scoped_release release;
    d = load_dataset(name, split, config, revision);
  }
  py::list rows;
  for (size_t i = 0; i < d.size(); ++i) rows.append(to_py(d.row(i)));
  return rows;
}

}  // namespace trl::python

PYBIND11_MODULE(_core, m) {
  using namespace trl::python;
  namespace cli = trl::cli;
  m.doc() = "trl.cpp's engine for the trl_cpp package (use trl_cpp, not this module)";
  m.attr("__version__") = TRL_VERSION;
  trl::apply_num_threads();

  static py::exception<trl::Error> engine_error(m, "EngineError", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const cli::UsageError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const trl::ConfigError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const trl::NotFoundError& e) {
      PyErr_SetString(PyExc_FileNotFoundError, e.what());
    } catch (const trl::Error& e) {
      engine_error(e.what());
    } catch (const nlohmann::json::exception& e) {  // a value of the wrong kind that no check caught: never the library's words alone
      PyErr_SetString(PyExc_TypeError, (std::string("a value of the wrong type reached the engine: ") + e.what()).c_str());
    }
  });

  m.def("options", &command_options, py::arg("command"));
  py::class_<TrainerHandle>(m, "Trainer")
      .def("train", &TrainerHandle::train)
      .def("evaluate", &TrainerHandle::evaluate)
      .def("save_model", &TrainerHandle::save_model, py::arg("output_dir"))
      .def("set_callbacks", &TrainerHandle::set_callbacks, py::arg("on_log"), py::arg("on_step"), py::arg("should_stop"))
      .def_property_readonly("command", &TrainerHandle::command)
      .def_property_readonly("output_dir", &TrainerHandle::output_dir);
  m.def("prepare", &prepare, py::arg("args"), py::arg("rewards") = std::vector<std::pair<std::string, py::object>>{},
        py::arg("load_eval_split") = false);

  py::class_<PyTokenizer>(m, "Tokenizer")
      .def_static("from_pretrained", &tokenizer_from_pretrained, py::arg("name"), py::arg("revision") = "main")
      .def("encode", [](const PyTokenizer& t, const std::string& text, bool special) { return t.tok->encode(text, special); }, py::arg("text"),
           py::arg("add_special_tokens") = true)
      .def("decode",
           [](const PyTokenizer& t, const std::vector<int32_t>& ids, bool skip) {
             return t.tok->decode(ids, skip);
           },
           py::arg("ids"), py::arg("skip_special_tokens") = false)
      .def("render_chat", &render_chat)
      .def("token_to_id", [](const PyTokenizer& t, const std::string& s) { return t.tok->token_to_id(s); })
      .def("id_to_token", [](const PyTokenizer& t, int32_t id) { return t.tok->id_to_token(id); })
      .def("is_special", [](const PyTokenizer& t, int32_t id) { return t.tok->is_special(id); })
      .def_property_readonly("vocab_size", [](const PyTokenizer& t) { return t.tok->vocab_size(); })
      .def_property_readonly("eos_token", [](const PyTokenizer& t) { return t.tok->eos_token(); })
      .def_property_readonly("pad_token", [](const PyTokenizer& t) { return t.tok->pad_token(); })
      .def_property_readonly("bos_token", [](const PyTokenizer& t) { return t.tok->bos_token(); })
      .def_property_readonly("eos_token_id", [](const PyTokenizer& t) { return t.tok->eos_token_id(); })
      .def_property_readonly("pad_token_id", [](const PyTokenizer& t) { return t.tok->pad_token_id(); })
      .def_property_readonly("bos_token_id", [](const PyTokenizer& t) { return t.tok->bos_token_id(); })
      .def_property_readonly("chat_template", [](const PyTokenizer& t) { return t.tok->chat_template(); })
      .def_property_readonly("source", [](const PyTokenizer& t) { return t.source; });

  py::class_<PyModel>(m, "Model")
      .def_static("from_pretrained", &model_from_pretrained, py::arg("name"), py::arg("dtype") = "auto", py::arg("device") = "auto",
                  py::arg("revision") = "main", py::arg("adapter") = "")
      .def("generate", &generate, py::arg("prompts"), py::arg("options"), py::arg("tokenizer") = py::none())
      .def_property_readonly("config", [](const PyModel& p) { return to_py(ojson(p.model->config().to_json())); })
      .def_property_readonly("dtype", [](const PyModel& p) { return std::string(p.model->dtype() == trl::DType::BF16 ? "bfloat16" : "float32"); })
      .def_property_readonly("device", [](const PyModel& p) { return p.model->device(); })
      .def_property_readonly("source", [](const PyModel& p) { return p.source; });

  m.def("has_split", [](const std::string& name, const std::string& split, const std::string& config, const std::string& revision) {
    py::gil_scoped_release release;
    return trl::has_split(name, split, config, revision);
  }, py::arg("name"), py::arg("split"), py::arg("config") = "", py::arg("revision") = "main");
  m.def("dataset_rows", &dataset_rows, py::arg("name"), py::arg("split") = "train", py::arg("config") = "", py::arg("revision") = "main");
}

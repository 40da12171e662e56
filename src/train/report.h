// training_report.html: a self-contained page (inline SVG, no scripts) with a run summary and the loss,
// learning-rate, gradient-norm and token-accuracy curves of a trainer's log_history.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "trl/backend/program_cache.h"

namespace trl {

// "Nice" axis ticks as plotting libraries place them: a step of 1, 2 or 5 × 10^k chosen so that [lo, hi] spans
// about `max_intervals` intervals, the first tick at or below lo and the last at or above hi (the axis then runs
// from the first tick to the last). `min_step` bounds the step from below (1 for an axis of whole steps). A single
// value (lo == hi) gets an axis around it; non-finite input gives the axis [0, 1]. Never returns NaN or an empty list.
struct AxisTicks {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> values;  // lo, lo + step, ..., hi
};
AxisTicks nice_ticks(double lo, double hi, int max_intervals = 5, double min_step = 0);

// A tick label: the shortest decimal that shows the tick at the axis' precision ("5.5", "0.0002", "100").
std::string tick_label(double value, double step);

// What the summary table of the report shows; the curves come from the log.
struct RunSummary {
  std::string title;
  std::string model;    // name or folder of the starting model
  std::string dataset;  // the training data's name or file ("" = unknown)
  std::string output_dir;
  int64_t steps_done = 0, total_steps = 0;
  double epochs = 0;
  int64_t tokens = 0;         // tokens seen (padding included), from the start of training
  double train_seconds = 0;   // wall time of this run (after a resume: since the resume)
  ProgramCacheStats programs;
  // log_completions (GRPO, RLOO): sample rows {"step", "prompt", "completion", "rewards": {name: value}, "advantage"}.
  std::vector<nlohmann::ordered_json> completions;
};

// A duration as the progress line and the report show it: "05:07", or "1:02:03" from an hour on.
std::string fmt_duration(double seconds);

std::string training_report_html(const std::vector<nlohmann::ordered_json>& log_history, const RunSummary& summary);

}  // namespace trl

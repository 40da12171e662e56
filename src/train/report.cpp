#include "train/report.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace trl {

namespace {

using ojson = nlohmann::ordered_json;

// The smallest 1, 2, 5 or 10 × 10^k that is >= x (x > 0).
double nice_step_at_least(double x) {
  const double mag = std::pow(10.0, std::floor(std::log10(x)));
  const double norm = x / mag;
  // A little slack: 0.2/0.1 may land a hair above 2 in floating point.
  const double nice = norm <= 1 + 1e-9 ? 1 : norm <= 2 + 1e-9 ? 2 : norm <= 5 + 1e-9 ? 5 : 10;
  return nice * mag;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

using Points = std::vector<std::pair<double, double>>;

// The (step, value) pairs of the log entries that have `key` with a finite number.
Points series(const std::vector<ojson>& log, const char* key) {
  Points out;
  for (const auto& e : log) {
    if (!e.contains(key) || !e.contains("step") || !e[key].is_number() || !e["step"].is_number()) continue;
    const double x = e["step"].get<double>(), y = e[key].get<double>();
    if (std::isfinite(x) && std::isfinite(y)) out.emplace_back(x, y);
  }
  return out;
}

struct Line {
  Points points;
  std::string color, label;
};

// One chart: a frame, grid lines at nice ticks, both axes named, one polyline per series and a legend that lists
// only the series that have data.
std::string chart(const std::string& title, const std::string& y_name, const std::vector<Line>& lines) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const Line& l : lines)
    for (auto [x, y] : l.points) x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
  if (!(x0 <= x1)) return fmt::format("<h2>{}</h2><p>no data</p>\n", html_escape(title));
  const AxisTicks xt = nice_ticks(x0, x1, 6, 1), yt = nice_ticks(y0, y1, 5);
  const double W = 640, H = 260, L = 80, T = 10, B = 50;
  auto px = [&](double x) { return L + (x - xt.lo) / (xt.hi - xt.lo) * W; };
  auto py = [&](double y) { return T + H - (y - yt.lo) / (yt.hi - yt.lo) * H; };
  std::string svg = fmt::format("<h2>{}</h2>\n<svg width=\"{}\" height=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" font-size=\"11\">", html_escape(title),
                                L + W + 20, T + H + B);
  for (double y : yt.values) {
    svg += fmt::format("<line x1=\"{}\" x2=\"{}\" y1=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#e4e4e4\"/>", L, L + W, py(y), py(y));
    svg += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>", L - 5, py(y) + 4, tick_label(y, yt.step));
  }
  for (double x : xt.values) {
    svg += fmt::format("<line x1=\"{:.1f}\" x2=\"{:.1f}\" y1=\"{}\" y2=\"{}\" stroke=\"#e4e4e4\"/>", px(x), px(x), T, T + H);
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>", px(x), T + H + 16, tick_label(x, xt.step));
  }
  svg += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#888\"/>", L, T, W, H);
  svg += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">step</text>", L + W / 2, T + H + 38);
  svg += fmt::format("<text transform=\"translate({},{}) rotate(-90)\" text-anchor=\"middle\" font-size=\"12\">{}</text>", 16, T + H / 2,
                     html_escape(y_name));
  std::string legend;
  for (const Line& l : lines) {
    if (l.points.empty()) continue;
    std::string pts;
    for (auto [x, y] : l.points) pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    svg += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"1.5\" points=\"{}\"/>", l.color, pts);
    if (l.points.size() == 1) svg += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>", px(l.points[0].first), py(l.points[0].second), l.color);
    legend += fmt::format("<span class=\"key\"><span class=\"swatch\" style=\"background:{}\"></span>{}</span>", l.color, html_escape(l.label));
  }
  return svg + "</svg>\n<p class=\"legend\">" + legend + "</p>\n";
}

// The last value of `key` in the log and the smallest one, if any entry has it.
struct LastBest {
  bool any = false;
  double last = 0, best = 0;
  int64_t best_step = 0;
};
LastBest last_and_best(const std::vector<ojson>& log, const char* key) {
  LastBest r;
  for (const auto& [x, y] : series(log, key)) {
    if (!r.any || y < r.best) r.best = y, r.best_step = static_cast<int64_t>(x);
    r.last = y, r.any = true;
  }
  return r;
}

std::string summary_table(const std::vector<ojson>& log, const RunSummary& s) {
  std::vector<std::pair<std::string, std::string>> rows;
  rows.emplace_back("model", s.model.empty() ? "(built in memory)" : s.model);
  rows.emplace_back("dataset", s.dataset.empty() ? "(not named)" : s.dataset);
  rows.emplace_back("output_dir", s.output_dir);
  rows.emplace_back("steps", fmt::format("{} / {}", s.steps_done, s.total_steps));
  rows.emplace_back("epochs", fmt::format("{:.3g}", s.epochs));
  const LastBest loss = last_and_best(log, "loss"), eval = last_and_best(log, "eval_loss");
  rows.emplace_back("final training loss", loss.any ? fmt::format("{:.4f}", loss.last) : "(not logged)");
  if (eval.any) {
    rows.emplace_back("best eval loss", fmt::format("{:.4f} (step {})", eval.best, eval.best_step));
    rows.emplace_back("last eval loss", fmt::format("{:.4f}", eval.last));
  }
  rows.emplace_back("train time", fmt::format("{} ({:.1f} s)", fmt_duration(s.train_seconds), s.train_seconds));
  rows.emplace_back("tokens", fmt::format("{} ({:.0f} tokens/s)", s.tokens, s.train_seconds > 0 ? static_cast<double>(s.tokens) / s.train_seconds : 0.0));
  rows.emplace_back("programs compiled", fmt::format("{} ({:.2f} s compiling)", s.programs.compilations, s.programs.compile_seconds));
  rows.emplace_back("program cache hits", fmt::format("{}", s.programs.hits));
  std::string html = "<h2>Run summary</h2>\n<table class=\"summary\">\n";
  for (const auto& [k, v] : rows) html += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", html_escape(k), html_escape(v));
  return html + "</table>\n";
}

}  // namespace

AxisTicks nice_ticks(double lo, double hi, int max_intervals, double min_step) {
  AxisTicks t;
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (lo > hi) std::swap(lo, hi);
  max_intervals = std::max(1, max_intervals);
  if (!(min_step > 0) || !std::isfinite(min_step)) min_step = 0;
  if (hi - lo <= 1e-12 * std::max(std::fabs(lo), std::fabs(hi))) {  // one value: an axis around it
    const double pad = std::max(lo != 0 ? 0.1 * std::fabs(lo) : 1.0, min_step);
    lo -= pad, hi += pad;
  }
  t.step = std::max(nice_step_at_least((hi - lo) / max_intervals), min_step);
  const double first = std::floor(lo / t.step + 1e-9), last = std::ceil(hi / t.step - 1e-9);
  for (double k = first; k <= last + 0.5; k += 1) {
    const double v = k * t.step;
    t.values.push_back(v == 0 ? 0.0 : v);  // no "-0"
  }
  t.lo = t.values.front(), t.hi = t.values.back();
  if (t.values.size() == 1) t.hi = t.lo + t.step, t.values.push_back(t.hi);
  return t;
}

std::string tick_label(double value, double step) {
  double v = step > 0 ? std::round(value / step) * step : value;
  if (std::fabs(v) < 1e-12 * std::max(1.0, std::fabs(step))) v = 0;
  return fmt::format("{:.6g}", v);
}

std::string training_report_html(const std::vector<ojson>& log, const RunSummary& s) {
  const std::string title = html_escape(s.title);
  std::string html = "<!doctype html><html><head><meta charset=\"utf-8\"><title>" + title +
                     "</title><style>body{font-family:sans-serif;margin:2em;max-width:760px}"
                     "table.summary{border-collapse:collapse}table.summary th{text-align:left;padding:2px 16px 2px 0;font-weight:normal;color:#555}"
                     "table.summary td{padding:2px 0}.legend{margin:0 0 1.5em 80px}.key{margin-right:1.5em}.swatch{display:inline-block;width:14px;height:3px;"
                     "vertical-align:middle;margin-right:5px}</style></head><body><h1>" +
                     title + "</h1>\n";
  html += summary_table(log, s);
  const char *blue = "#1f77b4", *orange = "#ff7f0e";
  html += chart("Loss", "loss (nats/token)", {{series(log, "loss"), blue, "training loss"}, {series(log, "eval_loss"), orange, "evaluation loss"}});
  html += chart("Learning rate", "learning rate", {{series(log, "learning_rate"), "#2ca02c", "learning rate (used by the step)"}});
  html += chart("Gradient norm", "gradient norm", {{series(log, "grad_norm"), "#d62728", "gradient norm (before clipping)"}});
  html += chart("Mean token accuracy", "accuracy",
                {{series(log, "mean_token_accuracy"), blue, "training (label = argmax)"},
                 {series(log, "eval_mean_token_accuracy"), orange, "evaluation (label = argmax)"}});
  if (!series(log, "reward").empty()) {  // online RL
    html += chart("Reward", "reward", {{series(log, "reward"), blue, "mean reward of the round (weighted sum)"}});
    html += chart("Completion length", "tokens", {{series(log, "completions/mean_length"), "#9467bd", "mean completion length"}});
  }
  if (!s.completions.empty()) {
    html += "<h2>Completions</h2>\n<table class=\"summary\"><tr><th>step</th><th>prompt</th><th>completion</th><th>rewards</th><th>advantage</th></tr>";
    for (const ojson& c : s.completions) {
      const ojson& p = c.value("prompt", ojson());
      html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3f}</td></tr>", c.value("step", 0),
                          html_escape((p.is_string() ? p.get<std::string>() : p.dump()).substr(0, 300)),
                          html_escape(c.value("completion", std::string()).substr(0, 600)), html_escape(c.value("rewards", ojson::object()).dump()),
                          c.value("advantage", 0.0));
    }
    html += "</table>\n";
  }
  return html + "</body></html>\n";
}

std::string fmt_duration(double s) {
  const int64_t t = static_cast<int64_t>(s);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

}  // namespace trl

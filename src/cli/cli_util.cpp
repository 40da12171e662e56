#include "cli/cli_util.h"

namespace trl::cli {

std::string flag(const std::string& name) {
  std::string dashed = name;
  for (char& c : dashed) {
    if (c == '_') c = '-';
  }
  return dashed == name ? "--" + name : "--" + name + ",--" + dashed;
}

}  // namespace trl::cli

#!/usr/bin/env bash
# Installs a built tree into a temporary prefix and proves the installed library stands on its own:
#   1. every installed header compiles by itself against the prefix (no internal header is reachable);
#   2. examples/consumer builds with find_package(trl) and runs;
#   3. the same program builds with pkg-config (static link) and runs.
# Usage: scripts/check-install.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

echo "== install into $prefix"
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name libtrl.a | head -1)")
for f in "$prefix/bin/trl" "$libdir/libtrl.a" "$libdir/cmake/trl/trlConfig.cmake" "$libdir/pkgconfig/trl.pc"; do
  test -e "$f" || { echo "install: $f is missing" >&2; exit 1; }
done

echo "== every installed header compiles on its own"
count=0
while IFS= read -r h; do
  rel=${h#"$prefix/include/"}
  echo "#include <$rel>" | c++ -std=c++20 -fsyntax-only -I"$prefix/include" -x c++ - || { echo "installed header $rel does not compile on its own" >&2; exit 1; }
  count=$((count + 1))
done < <(find "$prefix/include/trl" -name '*.h' | sort)
echo "   $count headers"

echo "== examples/consumer with find_package(trl)"
cmake -S examples/consumer -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/consumer" >/dev/null
(cd "$work" && ./consumer/consumer model-cmake)

echo "== the same program with pkg-config"
# shellcheck disable=SC2046
c++ -std=c++20 -O1 examples/consumer/main.cpp -o "$work/consumer-pc" $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --static --cflags --libs trl)
(cd "$work" && ./consumer-pc model-pkgconfig)
echo "== install check passed"

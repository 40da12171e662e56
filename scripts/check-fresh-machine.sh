#!/usr/bin/env bash
# Proves that a fresh Debian 12 machine builds trl.cpp with nothing but scripts/install-deps.sh: bootstraps a
# minimal Debian 12 root (debootstrap --variant=minbase bookworm) in a temporary directory, puts a clean clone of
# this checkout's HEAD in it, and runs there, as root with no stdin, one step after another:
#   install-deps   bash scripts/install-deps.sh
#   demo           bash scripts/demo.sh                       (the README's main command)
#   build          cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build
#                  (every target: library, CLI, tests, benchmarks; reuses the demo's objects)
#   tests          ctest --test-dir build -R "$TESTS"          (a fast subset; --tests '' skips it)
# With --ci (what CI's .ci/run does) the root runs the whole of CI instead, each configuration built once:
#   install-deps   bash scripts/install-deps.sh
#   configure      cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRL_WERROR=ON   (test.sh's Release build)
#   demo           bash scripts/demo.sh                       (builds only trl, in that folder)
#   test           bash scripts/test.sh                       (the README's test command: builds the rest and runs
#                                                              every check; its output is shown as it runs)
#   python-pip     bash scripts/check-python-install.sh build --pip   (the README's `pip install .` of the Python
#                                                              package into a new venv, its build tool from PyPI)
# Each step's output goes to a log; a failing step prints "check-fresh-machine: step '<name>' failed (exit N)" and
# the last 60 lines of its log. Nothing is cached: every run starts from a new root, removed on exit.
#
#   sudo bash scripts/check-fresh-machine.sh               # HEAD, committed files only
#   sudo bash scripts/check-fresh-machine.sh --worktree    # HEAD plus the working tree's changes and new
#                                                          # (untracked, not ignored) files, as `git add -A` would
#                                                          # commit them: for checking before a commit
# Options: --ci      run scripts/test.sh in the root after the demo, as above (TRL_* and CI variables pass in)
#          --werror  configure the build step with -DTRL_WERROR=ON as scripts/test.sh does (recompiles
#                    everything the demo built: ~2x the build time; test.sh already checks warnings on the host)
#          --tests REGEX   ctest subset to run in the root (default '^(Cli|Tokenizer)\.'; '' = none)
#          --jobs N        build parallelism (CMAKE_BUILD_PARALLEL_LEVEL; default: Ninja's, cores + 2)
#          --mirror URI    Debian mirror (default: the host's apt sources, else http://deb.debian.org/debian)
#          --keep          keep the root and the logs (mounts are still removed); prints where they are
# Needs root (debootstrap, chroot, mount) and ~3 GB in $TMPDIR (default /tmp). Mounts (/proc, /sys, /dev with
# /dev/pts) live in a private mount namespace per step (unshare), so they vanish with the step; the cleanup still
# unmounts anything left under the temporary directory and refuses to delete it while something is mounted there.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

worktree=0 werror=0 keep=0 ci=0 jobs="" mirror="${TRL_DEBIAN_MIRROR:-}" tests='^(Cli|Tokenizer)\.'
while [ $# -gt 0 ]; do
  case "$1" in
    --worktree) worktree=1 ;;
    --werror) werror=1 ;;
    --ci) ci=1 ;;
    --keep) keep=1 ;;
    --tests) [ $# -ge 2 ] || { echo "check-fresh-machine: --tests needs a value" >&2; exit 2; }; tests=$2; shift ;;
    --jobs) [ $# -ge 2 ] || { echo "check-fresh-machine: --jobs needs a value" >&2; exit 2; }; jobs=$2; shift ;;
    --mirror) [ $# -ge 2 ] || { echo "check-fresh-machine: --mirror needs a value" >&2; exit 2; }; mirror=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "check-fresh-machine: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
if [ -n "$jobs" ] && ! [[ "$jobs" =~ ^[1-9][0-9]*$ ]]; then
  echo "check-fresh-machine: --jobs wants a positive integer, got '$jobs'" >&2; exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "check-fresh-machine: must run as root (debootstrap, chroot and mount need it)" >&2; exit 2
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
git -C "$repo" rev-parse --verify -q HEAD >/dev/null || { echo "check-fresh-machine: $repo has no HEAD commit" >&2; exit 2; }
sha=$(git -C "$repo" rev-parse HEAD)

# The mirror of the host's own apt sources (deb822 first, then the one-line format), never the security archive.
detect_mirror() {
  local uri=""
  if [ -r /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
      /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                             if (i <= NF && $i !~ /security/) { print $i; exit } }' /etc/apt/sources.list)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}
[ -n "$mirror" ] || mirror=$(detect_mirror)

tmp="" root="" logs=""
# Every mount point at or under $tmp in this mount namespace, deepest first.
mounts_under_tmp() {
  [ -n "$tmp" ] || return 0
  awk -v t="$tmp" '{ if ($5 == t || index($5, t "/") == 1) print $5 }' /proc/self/mountinfo | sort -r
}
cleanup() {
  local rc=$? pid mp left
  trap - EXIT INT TERM
  set +e
  if [ -n "$root" ] && [ -d "$root" ]; then
    # Processes still running inside the root (a daemon a step left behind) would keep files busy.
    for pid in /proc/[0-9]*; do
      pid=${pid#/proc/}
      [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$root" ] && kill -KILL "$pid" 2>/dev/null
    done
  fi
  for mp in $(mounts_under_tmp); do
    umount -R "$mp" 2>/dev/null || umount -R -l "$mp" 2>/dev/null
  done
  left=$(mounts_under_tmp)
  if [ -n "$left" ]; then
    echo "check-fresh-machine: still mounted, NOT removing $tmp:" >&2
    echo "$left" >&2
    exit 1
  fi
  if [ -n "$tmp" ] && [ -d "$tmp" ]; then
    if [ "$keep" = 1 ]; then
      echo "check-fresh-machine: kept the root in $root"
    else
      rm -rf --one-file-system -- "$tmp"
    fi
  fi
  if [ -n "$logs" ] && [ -d "$logs" ]; then
    if [ "$keep" = 1 ] || [ "$rc" != 0 ]; then
      echo "check-fresh-machine: logs in $logs" >&2
    else
      rm -rf -- "$logs"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tmp=$(mktemp -d -t check-fresh-machine.XXXXXX)
logs=$(mktemp -d -t check-fresh-machine-logs.XXXXXX)
root="$tmp/root"
mkdir "$root"
case "$tmp" in "$repo"|"$repo"/*) echo "check-fresh-machine: the temporary directory is inside the repository" >&2; exit 2 ;; esac

step_no=0
summary=()
# run_step NAME COMMAND...: runs COMMAND (errexit on, no stdin) with its output in a log; stops everything on failure.
# run_step --show NAME COMMAND...: the same, with the output also shown as it comes.
run_step() {
  local show=0 name log rc start
  if [ "$1" = --show ]; then show=1; shift; fi
  name=$1
  shift
  step_no=$((step_no + 1))
  log="$logs/$step_no-$name.log"
  start=$SECONDS
  set +e
  if [ "$show" = 1 ]; then
    ( set -euo pipefail; "$@" ) 2>&1 </dev/null | tee "$log"
    rc=${PIPESTATUS[0]}
  else
    ( set -euo pipefail; "$@" ) >"$log" 2>&1 </dev/null
    rc=$?
  fi
  set -e
  if [ "$rc" != 0 ]; then
    echo "check-fresh-machine: step '$name' failed (exit $rc) after $((SECONDS - start)) s; last 60 lines of $log:" >&2
    tail -n 60 "$log" >&2
    exit "$rc"
  fi
  summary+=("$(printf '%-13s %5d s' "$name" $((SECONDS - start)))")
  echo "check-fresh-machine: ${summary[-1]}"
}

# Runs a command line in the root, in its own mount namespace (its mounts disappear when it ends), as a fresh root
# login would: clean environment, HOME=/root, in the clone.
in_root() {
  local env=(HOME=/root USER=root LOGNAME=root LANG=C.UTF-8 TERM=dumb DEBIAN_FRONTEND=noninteractive
             PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  [ -z "$jobs" ] || env+=(CMAKE_BUILD_PARALLEL_LEVEL="$jobs")
  # scripts/test.sh's settings (TRL_FUZZ_SECONDS, TRL_SKIP_SANITIZERS, ...) and CI's flag reach the root.
  local v
  for v in $(compgen -e); do
    case "$v" in TRL_*|CI) env+=("$v=${!v}") ;; esac
  done
  # shellcheck disable=SC2016 # the inner script expands its own arguments
  unshare --mount --propagation private -- /bin/bash -euo pipefail -c '
    r=$1; shift
    mount -t proc proc "$r/proc"
    mount -t sysfs sysfs "$r/sys"
    mount --rbind /dev "$r/dev"                       # brings /dev/pts and /dev/shm along
    [ -e "$r/dev/pts/ptmx" ] || mount -t devpts devpts "$r/dev/pts"
    exec chroot "$r" /usr/bin/env -i "$@"
  ' in_root "$root" "${env[@]}" /bin/bash -euo pipefail -c "cd /root/trl.cpp && $1"
}

ensure_host_tools() {
  local missing=()
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  [ -e /usr/share/keyrings/debian-archive-keyring.gpg ] || missing+=(debian-archive-keyring)
  command -v unshare >/dev/null || missing+=(util-linux)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing on the host: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

bootstrap() {
  echo "debootstrap --variant=minbase bookworm $root $mirror"
  debootstrap --variant=minbase bookworm "$root" "$mirror"
  cp -L --remove-destination /etc/resolv.conf "$root/etc/resolv.conf"
  # debootstrap writes no /etc/hosts; every installed machine (and container) has one naming itself, as Debian's
  # installer writes it. Without it each lookup of this machine's name goes to the DNS server and often waits out
  # its 5 s timeout: measured, half of the mpirun launches took 5.1 s instead of 0.1 s, 150 s of CI's Release tests.
  printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' "$(hostname)" \
    >"$root/etc/hosts"
  # The network's TLS settings, as the host has them (a machine on this network is set up so): extra certificate
  # authorities (a proxy's; installed into the root's bundle when install-deps installs ca-certificates) and pip's
  # configuration that points at that bundle. The Python package's `pip install .` fetches its build tool from PyPI.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  [ ! -f /etc/pip.conf ] || cp /etc/pip.conf "$root/etc/pip.conf"
  # Packages must not start services in the root (none of ours has one; this is the usual chroot guard).
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
}

copy_repo() {
  local dst="$root/root/trl.cpp" index patch
  git clone --quiet --no-local --no-hardlinks "$repo" "$dst"
  if [ "$(git -C "$dst" rev-parse HEAD)" != "$sha" ]; then
    git -C "$dst" -c advice.detachedHead=false checkout --quiet --detach "$sha"
  fi
  echo "cloned $sha"
  if [ "$worktree" = 1 ]; then
    # What `git add -A` would commit, staged in a private index: the repository's index, refs and work tree stay
    # untouched (only blob objects get written to its object store, as `git stash create` would).
    index="$tmp/worktree.index"
    patch="$tmp/worktree.patch"
    cp "$(git -C "$repo" rev-parse --absolute-git-dir)/index" "$index" 2>/dev/null || true
    GIT_INDEX_FILE="$index" git -C "$repo" add -A
    GIT_INDEX_FILE="$index" git -C "$repo" diff --cached --binary HEAD >"$patch"
    if [ -s "$patch" ]; then
      git -C "$dst" apply --binary --whitespace=nowarn "$patch"
      echo "applied the working tree's changes:"
      GIT_INDEX_FILE="$index" git -C "$repo" diff --cached --stat HEAD
    else
      echo "the working tree has no changes"
    fi
  fi
}

build_cmd="cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release"
[ "$werror" = 0 ] || build_cmd+=" -DTRL_WERROR=ON"
build_cmd+=" && cmake --build build"

echo "check-fresh-machine: $sha$([ "$worktree" = 0 ] || echo ' + working tree') in a new Debian 12 root ($mirror)"
run_step host-tools ensure_host_tools
run_step debootstrap bootstrap
run_step copy-repo copy_repo
run_step install-deps in_root "bash scripts/install-deps.sh"
if [ "$ci" = 1 ]; then
  # One Release configuration for the demo and every test: the demo builds trl with scripts/test.sh's flags, and
  # test.sh builds only what is left.
  run_step configure in_root "cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRL_WERROR=ON >/dev/null"
  run_step demo in_root "bash scripts/demo.sh"
  demo_log="$logs/$step_no-demo.log"
  run_step --show test in_root "bash scripts/test.sh"
  # The README's install of the Python package, `pip install .` into a new venv (test.sh proved the CMake route).
  run_step python-pip in_root "update-ca-certificates >/dev/null && bash scripts/check-python-install.sh build --pip"
else
  run_step demo in_root "bash scripts/demo.sh"
  demo_log="$logs/$step_no-demo.log"
  run_step build in_root "$build_cmd"
  if [ -n "$tests" ]; then
    run_step tests in_root "ctest --test-dir build --output-on-failure -R $(printf '%q' "$tests")"
  fi
fi
for line in "${summary[@]}"; do echo "check-fresh-machine: step $line"; done
# The demo's evidence: first and last logged loss, and how many answers were exact.
{ grep -E '^ +step +[0-9]+ +loss' "$demo_log" | sed -n '1p;$p'; grep -E 'answers exact' "$demo_log"; } |
  sed 's/^ */check-fresh-machine: demo | /' || true
echo "check-fresh-machine: passed in $SECONDS s"

#!/usr/bin/env bash
# One entry point for the course. Each command sets up what it needs first (idempotently), then runs.
#
#   ./course.sh lab       set up, then open the course in JupyterLab (localhost only, token auth, 8 simulated devices)
#   ./course.sh test      set up with the test tools too, then run every test: unit tests and nbval over every
#                         notebook (as another processor would run it, so that no stored digit is this machine's)
#   ./course.sh setup     only the learner's set-up: a Python >= 3.12 virtual environment in .venv with what
#                         lessons 00-12 need (about 1 GB), and graphviz's `dot`
#   ./course.sh check     check this machine in under a minute (Python, JAX, 8 devices, diagrams, an exercise,
#                         the progress file, lesson 13's TPU compiler); prints a report to paste to the instructor
#   ./course.sh tpu       add lesson 13's TPU compiler (libtpu, Linux x86-64 only) to the set-up
#   ./course.sh refresh   re-execute every notebook in place, to store fresh outputs (after changing course_lib)
#   ./course.sh lock      re-resolve the dependencies and rewrite constraints.txt and binder/requirements.txt
#   ./course.sh compat    run the unit tests and every notebook on the oldest supported and the newest JAX (slow)
#   ./course.sh site      build the course's website from the stored outputs into build/site/html (--serve: and
#                         preview it on http://127.0.0.1:8000)
#   ./course.sh release-check   fail unless this commit is tagged v<course_lib.__version__> and the notebooks'
#                         install ref exists (CI runs it on tags)
#
# Extra arguments go to the program that runs: `./course.sh test tests/test_devices.py -x`,
# `./course.sh lab --no-browser`. Environment: PYTHON=/path/to/python3.12 picks the interpreter,
# COURSE_VENV=dir picks where the virtual environment lives (default .venv).
set -euo pipefail
cd "$(dirname "$0")"

VENV=${COURSE_VENV:-.venv}
MIN_PY="3.12"
# pyproject.toml's extras each command installs (on top of course_lib's runtime dependencies). An environment
# keeps what it has: `./course.sh test` after `./course.sh setup` adds the test tools, and `lab` then removes none.
LEARNER_EXTRAS="lab"
ALL_EXTRAS="lab,test,site,tpu,instructor"

say() { printf '[course] %s\n' "$*" >&2; }
die() { printf '[course] error: %s\n' "$*" >&2; exit 1; }

# An interpreter is suitable when it runs, is >= 3.12, and can make a virtual environment with pip.
suitable() {
  "$1" -c 'import sys, venv, ensurepip; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1
}

find_python() {
  local c
  local -a candidates=()
  [ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
  candidates+=(python3.12 python3.13 python3.14 python3 python)
  # pyenv keeps interpreters whose shims only answer when that version is selected: look in its folder too.
  local root=${PYENV_ROOT:-$HOME/.pyenv}
  if [ -d "$root/versions" ]; then
    for c in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -V); do candidates+=("$c/bin/python3"); done
  fi
  if command -v uv >/dev/null 2>&1; then
    c=$(uv python find ">=$MIN_PY" 2>/dev/null || true)
    [ -n "$c" ] && candidates+=("$c")
  fi
  for c in "${candidates[@]}"; do
    if suitable "$c"; then command -v "$c" || echo "$c"; return 0; fi
  done
  if [ -n "${PYTHON:-}" ]; then
    say "PYTHON=$PYTHON is not a Python >= $MIN_PY with venv and ensurepip."
  fi
  cat >&2 <<EOF
[course] error: no Python >= $MIN_PY found (JAX >= 0.11 needs it). Tried: ${candidates[*]}
Install one, then run this command again. Any of these works:
  pyenv install 3.12            (then this script finds it in ~/.pyenv by itself)
  uv python install 3.12
  sudo apt-get install python3.12 python3.12-venv        (Debian, Ubuntu)
  brew install python@3.12                               (macOS)
  conda env create -f environment.yml && conda activate spmd-course
Or point to one directly:  PYTHON=/path/to/python3.12 ./course.sh ${CMD:-test}
EOF
  exit 1
}

# The exact line that installs graphviz's `dot` on this system.
dot_install_line() {
  if [ "$(uname -s)" = "Darwin" ]; then echo "brew install graphviz"
  elif command -v apt-get >/dev/null 2>&1; then echo "sudo apt-get install -y graphviz"
  elif command -v dnf >/dev/null 2>&1; then echo "sudo dnf install -y graphviz"
  elif command -v pacman >/dev/null 2>&1; then echo "sudo pacman -S graphviz"
  elif command -v apk >/dev/null 2>&1; then echo "sudo apk add graphviz"
  elif command -v conda >/dev/null 2>&1; then echo "conda install -c conda-forge graphviz"
  else echo "install Graphviz from https://graphviz.org/download/ so that \`dot\` is on PATH"
  fi
}

ensure_dot() {
  command -v dot >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing graphviz (the \`dot\` binary that draws the course's diagrams) with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null \
      || die "apt-get could not install graphviz; run: apt-get install -y graphviz"
    command -v dot >/dev/null 2>&1 && return 0
  fi
  die "graphviz's \`dot\` binary is missing; the diagrams need it. Install it with:
    $(dot_install_line)
then run this command again."
}

stamp() {
  # What the environment was built from: changes to any of these trigger a re-install.
  cat pyproject.toml constraints.txt 2>/dev/null | "$1" -c 'import sys, hashlib; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest(), sys.version)'
}

# The union of two comma-separated lists of extras, in ALL_EXTRAS's order.
union_extras() {
  local e out=""
  for e in ${ALL_EXTRAS//,/ }; do
    case ",$1,$2," in *",$e,"*) out+="${out:+,}$e" ;; esac
  done
  echo "$out"
}

# ensure_venv [EXTRAS]: a virtual environment with course_lib and EXTRAS (default: the learner's) installed at
# constraints.txt's versions. .course-stamp records what it was built from (line 1) and its extras (line 2).
ensure_venv() {
  local py extras=${1:-$LEARNER_EXTRAS}
  if [ -x "$VENV/bin/python" ] && suitable "$VENV/bin/python"; then
    :
  else
    py=$(find_python)
    [ -e "$VENV" ] && { say "replacing $VENV (its Python is missing or older than $MIN_PY)"; rm -rf "$VENV"; }
    say "creating $VENV with $("$py" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    "$py" -m venv "$VENV"
  fi
  local want have had
  want=$(stamp "$VENV/bin/python")
  have=$(sed -n 1p "$VENV/.course-stamp" 2>/dev/null || true)
  had=$(sed -n 2p "$VENV/.course-stamp" 2>/dev/null || true)
  # An environment stamped before extras were recorded had every extra.
  [ -n "$have" ] && [ -z "$had" ] && had=$ALL_EXTRAS
  [ "$have" = "$want" ] || had=""
  local need; need=$(union_extras "$had" "$extras")
  if [ "$have" != "$want" ] || [ "$need" != "$had" ]; then
    say "installing course_lib and its pinned dependencies (extras: $need) into $VENV (first run: a few minutes)"
    local -a pins=()
    [ -f constraints.txt ] && pins=(-c constraints.txt)
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${pins[@]}" -e ".[$need]" \
      || die "pip could not install the course's dependencies (see above)."
    printf '%s\n%s\n' "$want" "$need" > "$VENV/.course-stamp"
  fi
}

# Lesson 13's TPU compiler: libtpu has wheels for Linux x86-64 only.
tpu_platform_ok() { [ "$(uname -s)" = Linux ] && [ "$(uname -m)" = x86_64 ]; }

setup() { ensure_dot; ensure_venv "${1:-$LEARNER_EXTRAS}"; }

CMD=${1:-}
[ $# -gt 0 ] && shift
case "$CMD" in
  setup)
    setup
    say "ready: $("$VENV/bin/python" -c 'import jax, sys; print("Python", sys.version.split()[0], "JAX", jax.__version__)')"
    ;;
  lab)
    setup
    export JAX_NUM_CPU_DEVICES=${JAX_NUM_CPU_DEVICES:-8}
    # Where libtpu (lesson 13's TPU compiler: ./course.sh tpu) is installed, JAX would try to start a TPU and print
    # its start-up errors in the first cell that uses JAX. Where this machine has no TPU (/dev/accel*, /dev/vfio) and no
    # NVIDIA GPU, JAX gets the CPU only. Set JAX_PLATFORMS yourself to choose otherwise.
    if [ -z "${JAX_PLATFORMS:-}" ] && ! compgen -G "/dev/accel*" >/dev/null && ! compgen -G "/dev/vfio/[0-9]*" >/dev/null \
       && ! command -v nvidia-smi >/dev/null 2>&1; then
      export JAX_PLATFORMS=cpu
    fi
    # Bound to localhost; Jupyter's token authentication stays on (it prints the URL with the token).
    # Jupyter refuses to run as root unless told; containers and cloud shells often are root.
    extra=()
    [ "$(id -u)" = 0 ] && extra+=(--allow-root)
    # Trust the course's own notebooks, so that their stored diagrams show as SVG (untrusted, they show a PNG).
    "$VENV/bin/jupyter" trust notebooks/[0-9][0-9]_*.ipynb >/dev/null 2>&1 || say "could not mark the notebooks trusted"
    exec "$VENV/bin/jupyter" lab --ServerApp.ip=127.0.0.1 --ServerApp.root_dir=. "${extra[@]}" \
      --LabApp.default_url=/lab/tree/notebooks/00_setup_and_devices.ipynb "$@"
    ;;
  test)
    setup "$ALL_EXTRAS"
    # Every core (at most 4) runs tests: each test file and each notebook pass stays whole in one worker
    # (pytest-xdist, --dist loadfile). nbval runs every notebook once, as another processor
    # would (conftest.py, --nbval-isa; --nbval-passes=2 adds this processor's run). Pass -n yourself to choose, e.g. `./course.sh test -n 0`.
    workers=()
    case " $* " in
      *" -n"*|*" --numprocesses"*|*" -p no:xdist "*) ;;
      *) n=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
         [ "$n" -gt 4 ] && n=4
         [ "$n" -gt 1 ] && workers=(-n "$n" --dist loadfile --no-loadscope-reorder) ;;
    esac
    exec "$VENV/bin/python" -m pytest ${workers[@]+"${workers[@]}"} "$@"
    ;;
  refresh)
    setup "$ALL_EXTRAS"
    exec "$VENV/bin/python" tools/refresh_notebooks.py "$@"
    ;;
  lock)
    ensure_dot
    py=$(find_python)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$py" -m venv "$tmp/venv"
    "$tmp/venv/bin/python" -m pip install -q --disable-pip-version-check -e ".[$ALL_EXTRAS]"
    {
      echo "# Exact versions the stored notebook outputs were produced with. Written by ./course.sh lock."
      echo "# Python $("$tmp/venv/bin/python" -c 'import sys; print(sys.version.split()[0])') on $(uname -s) $(uname -m)."
      "$tmp/venv/bin/python" -m pip freeze --exclude-editable | grep -v '^course[_-]lib' | LC_ALL=C sort -f
    } > constraints.txt
    "$tmp/venv/bin/python" tools/binder_requirements.py > binder/requirements.txt
    say "wrote constraints.txt and binder/requirements.txt; run ./course.sh refresh and ./course.sh test next."
    ;;
  site)
    # Renders the stored outputs, executes nothing: needs the Python packages only (no graphviz).
    ensure_venv site
    exec "$VENV/bin/python" tools/site/build.py "$@"
    ;;
  check)
    # No `dot` is a finding of the check (with the line that installs it), not a reason to stop before it.
    ensure_venv
    exec "$VENV/bin/python" -m course_lib.setup_check "$@"
    ;;
  tpu)
    if ! tpu_platform_ok; then
      die "lesson 13's TPU compiler (libtpu) has wheels for Linux x86-64 only, and this is $(uname -s) $(uname -m).
Here lesson 13 skips its TPU cells and says so; its stored outputs show what they print. To run them, open
lesson 13 on Colab or Kaggle (its first cell installs libtpu there) or use a Linux x86-64 machine."
    fi
    setup "$LEARNER_EXTRAS,tpu"
    "$VENV/bin/python" -m course_lib.setup_check --only tpu
    ;;
  release-check)
    py=$(find_python)
    exec "$py" tools/release_check.py "$@"
    ;;
  compat)
    # Throwaway environments under ${COMPAT_DIR:-/tmp/course-compat}; not part of `./course.sh test`.
    ensure_dot
    py=$(find_python)
    exec "$py" tools/compat.py "$@"
    ;;
  # --- Teaching a class (INSTRUCTORS.md; tools/copies.py) ----------------------------------------------------
  #   ./course.sh student DIR            the lessons as learners get them, solutions withheld (course_settings.json)
  #   ./course.sh instructor DIR         every stub replaced by its solution, executed, every check ✔
  #   ./course.sh nbgrader DIR           nbgrader source notebooks (DIR/source/lessonNN) with graded test cells
  #   ./course.sh progress FILE... [--csv OUT]   a class table from learners' course_progress.json files
  student|instructor|nbgrader|progress)
    # The instructor copy executes every lesson (lesson 13 with the TPU compiler); nbgrader comes with its extra.
    case "$CMD" in
      instructor) setup "$(union_extras "$LEARNER_EXTRAS" tpu)" ;;
      nbgrader) ensure_venv "$(union_extras "$LEARNER_EXTRAS" instructor)" ;;
      *) ensure_venv ;;
    esac
    exec "$VENV/bin/python" tools/copies.py "$CMD" "$@"
    ;;
  *)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    sed -n 's/^  #   \(\.\/course\.sh \(student\|instructor\|nbgrader\|progress\) .*\)/\1/p' "$0"  # teaching a class
    [ -z "$CMD" ] || [ "$CMD" = help ] || [ "$CMD" = -h ] || [ "$CMD" = --help ] || exit 2
    ;;
esac

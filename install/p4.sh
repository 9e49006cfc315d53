#!/usr/bin/env bash
# The P4 toolchain, which no package registry has, built from pinned upstream sources against Debian's dev packages.
#   install/p4.sh bmv2   PI (P4Runtime gRPC server) + bmv2's simple_switch_grpc: what the P4 data plane runs on
#   install/p4.sh p4c    p4c's bmv2 back end (p4c-bm2-ss): only to recompile p4src/ (the compiled program is committed)
# Environment:
#   P4_PREFIX=/usr/local          where the tools are installed
#   P4_BUILD=/var/tmp/mbalancer-p4  build trees and logs (one log per stage under logs/)
#   P4_SOURCES=DIR                build from already-downloaded sources instead of the upstream git repositories:
#                                 DIR/PI, DIR/behavioral-model (and DIR/p4c), each a work tree with its submodules
#   JOBS=N                        parallel compile jobs (default: the number of CPUs)
#   P4_TRACE=1                    build bmv2 able to trace every packet (--log-console, log_level="debug"); the default
#                                 build leaves those logs out and runs the MBalancer pipeline about twice as fast
# Idempotent: a stamp under $P4_PREFIX/share/mbalancer-p4/ records what was installed; a second run with the same pins
# only checks the tool still runs. A failed build resumes at the stage that failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# Pins: bmv2 1.15.5 and the PI commit its CI built against at that release (PI has no release tags).
BMV2_REPO=https://github.com/p4lang/behavioral-model.git
BMV2_REF=1.15.5
PI_REPO=https://github.com/p4lang/PI.git
PI_REF=f96af95e090619491e3abf2df69df340c2c9cb46
# PI's submodules the build needs (proto/openconfig/public is documentation only).
PI_SUBMODULES=(proto/p4runtime proto/openconfig/gnmi third_party/uthash third_party/googletest)
P4C_REPO=https://github.com/p4lang/p4c.git
P4C_REF=v1.2.5.16

P4_PREFIX=${P4_PREFIX:-/usr/local}
P4_BUILD=${P4_BUILD:-/var/tmp/mbalancer-p4}
P4_SOURCES=${P4_SOURCES:-}
JOBS=${JOBS:-$(nproc)}
P4_TRACE=${P4_TRACE:-0}
STAMPS=$P4_PREFIX/share/mbalancer-p4
LOGS=$P4_BUILD/logs

say() { echo "install/p4.sh: $*"; }
fail() { echo "install/p4.sh: FAILED: $*" >&2; exit 1; }

# Run one stage with its output in a log; print one line when it starts and one with its time when it ends. A failing
# stage prints the end of its log and where the whole log is, then stops the script.
stage() {
    local name=$1; shift
    local log=$LOGS/$name.log start=$SECONDS
    say "[$name] ..."
    # In the background, not under `if`: bash ignores `set -e` in a command whose status `if` tests, and a stage's
    # function must stop at its first failing step.
    "$@" >"$log" 2>&1 &
    if ! wait $!; then
        echo "--- last lines of $log ---" >&2
        tail -n 25 "$log" >&2
        fail "stage $name after $((SECONDS - start)) s (whole log: $log)"
    fi
    say "[$name] done in $((SECONDS - start)) s"
}

# A stage that leaves a mark in the build tree is skipped when rerun, so a failed build resumes where it stopped.
stage_once() {
    local name=$1 mark=$P4_BUILD/.done-$1-$2; shift 2
    if [ -e "$mark" ]; then say "[$name] already done (build tree $P4_BUILD)"; return; fi
    stage "$name" "$@"
    touch "$mark"
}

# Bring a source tree to $P4_BUILD/src/NAME at REF: a copy from $P4_SOURCES/NAME when given, else a git clone.
fetch_source() {
    local name=$1 repo=$2 ref=$3; shift 3
    local dest=$P4_BUILD/src/$name
    rm -rf "$dest"
    mkdir -p "$P4_BUILD/src"
    if [ -n "$P4_SOURCES" ]; then
        [ -d "$P4_SOURCES/$name" ] || { echo "no directory $P4_SOURCES/$name (P4_SOURCES)"; return 1; }
        cp -a "$P4_SOURCES/$name" "$dest"
        check_ref "$dest" "$ref"
    else
        git clone --quiet "$repo" "$dest"
        git -C "$dest" checkout --quiet "$ref"
        [ $# -eq 0 ] || git -C "$dest" submodule update --init --quiet -- "$@"
    fi
    for sub in "$@"; do
        [ -n "$(ls -A "$dest/$sub" 2>/dev/null)" ] || { echo "$name: submodule $sub is empty"; return 1; }
    done
}

# A copied tree that is a git work tree must be at the pinned ref; a plain directory is taken as the user gave it.
check_ref() {
    local dir=$1 ref=$2 want have
    git -C "$dir" rev-parse --git-dir >/dev/null 2>&1 || { echo "$dir: not a git tree, taken as is"; return 0; }
    want=$(git -C "$dir" rev-parse --verify --quiet "$ref^{commit}") || { echo "$dir: has no $ref"; return 1; }
    have=$(git -C "$dir" rev-parse HEAD)
    [ "$want" = "$have" ] || git -C "$dir" checkout --quiet "$ref"
}

build_pi() {
    cd "$P4_BUILD/src/PI"
    ./autogen.sh
    ./configure --prefix="$P4_PREFIX" --with-proto --without-internal-rpc --without-cli --without-bmv2 \
        --disable-static
    make -j"$JOBS"
    make install
    ldconfig
}

# bmv2: only the parts simple_switch_grpc needs (its tests, other targets and tools would double the build time).
BMV2_DIRS=(thrift_src third_party proto src include PI services targets/simple_switch targets/simple_switch_grpc)
# The fast flavour follows bmv2's docs/performance.md: -O3, and no per-packet debug or event logs (whose cost grows with
# every table and action a packet meets); P4_TRACE=1 keeps them.
bmv2_flavor() { if [ "$P4_TRACE" = 1 ]; then echo trace; else echo fast; fi; }
build_bmv2() {
    cd "$P4_BUILD/src/behavioral-model"
    local flags=()
    [ "$(bmv2_flavor)" = trace ] || flags=(--disable-logging-macros --disable-elogger CXXFLAGS="-g -O3" CFLAGS="-g -O3")
    # A tree built before in the other flavour keeps its objects unless cleaned.
    [ ! -e Makefile ] || make clean
    ./autogen.sh
    # PI's headers and libraries are in the prefix, which need not be on the compiler's default paths.
    ./configure --prefix="$P4_PREFIX" --with-pi --disable-static "${flags[@]}" \
        CPPFLAGS="-I$P4_PREFIX/include" LDFLAGS="-L$P4_PREFIX/lib"
    for dir in "${BMV2_DIRS[@]}"; do make -j"$JOBS" -C "$dir"; done
    for dir in "${BMV2_DIRS[@]}"; do make -C "$dir" install; done
    ldconfig
}

check_bmv2() {
    local bin=$P4_PREFIX/bin/simple_switch_grpc
    [ -x "$bin" ] || { echo "$bin missing"; return 1; }
    local version
    version=$("$bin" --version) || return 1
    echo "$bin $version"
    [[ $version == "$BMV2_REF"* ]] || { echo "$bin is version $version, not $BMV2_REF"; return 1; }
}

install_bmv2() {
    local pins="bmv2 $BMV2_REF ($(bmv2_flavor)), PI $PI_REF"
    if [ "$(cat "$STAMPS/bmv2" 2>/dev/null)" = "$pins" ] && check_bmv2 >/dev/null 2>&1; then
        say "bmv2 already installed ($pins) in $P4_PREFIX"
        return
    fi
    local key=${BMV2_REF}-${PI_REF:0:12}
    stage "packages" bash "$here/system.sh" "$here/p4-apt-packages.txt"
    stage_once "PI-source" "$key" fetch_source PI "$PI_REPO" "$PI_REF" "${PI_SUBMODULES[@]}"
    stage_once "PI-build" "$key" build_pi
    stage_once "bmv2-source" "$key" fetch_source behavioral-model "$BMV2_REPO" "$BMV2_REF"
    stage_once "bmv2-build" "$key-$(bmv2_flavor)" build_bmv2
    stage "bmv2-check" check_bmv2
    mkdir -p "$STAMPS"
    echo "$pins" >"$STAMPS/bmv2"
    say "bmv2 installed ($pins): $P4_PREFIX/bin/simple_switch_grpc"
}

# p4c: the front end and the bmv2 back end only (the others, the unit tests and link-time optimisation would triple
# the build). Its CMake fetches protobuf, abseil and P4Runtime at the versions it pins; with P4_SOURCES they are taken
# from DIR/p4c-deps/{protobuf,abseil,p4runtime} instead. Debian's libgc stands in for the bdwgc it would fetch.
P4C_DEPS=(protobuf abseil p4runtime)
build_p4c() {
    local src=$P4_BUILD/src/p4c deps=()
    if [ -n "$P4_SOURCES" ]; then
        for dep in "${P4C_DEPS[@]}"; do
            [ -d "$P4_SOURCES/p4c-deps/$dep" ] || { echo "no directory $P4_SOURCES/p4c-deps/$dep (P4_SOURCES)"; return 1; }
            deps+=("-DFETCHCONTENT_SOURCE_DIR_${dep^^}=$P4_SOURCES/p4c-deps/$dep")
        done
    fi
    # GCC 12 (Debian 12) rejects erase_if predicates that take the map's element by non-const reference.
    sed -i 's/(flow_join_points_t::value_type &el)/(const flow_join_points_t::value_type \&el)/' "$src/ir/visitor.cpp"
    cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$P4_PREFIX" \
        -DENABLE_GTESTS=OFF -DENABLE_EBPF=OFF -DENABLE_UBPF=OFF -DENABLE_DPDK=OFF -DENABLE_P4TC=OFF \
        -DENABLE_P4FMT=OFF -DENABLE_P4TEST=OFF -DENABLE_P4C_GRAPHS=OFF -DENABLE_LTO=OFF \
        -DP4C_USE_PREINSTALLED_BDWGC=ON "${deps[@]}"
    cmake --build "$src/build" -j "$JOBS"
    cmake --install "$src/build"
}

check_p4c() {
    local bin=$P4_PREFIX/bin/p4c-bm2-ss
    [ -x "$bin" ] || { echo "$bin missing"; return 1; }
    "$bin" --version | head -n 1
}

install_p4c() {
    local pins="p4c $P4C_REF"
    if [ "$(cat "$STAMPS/p4c" 2>/dev/null)" = "$pins" ] && check_p4c >/dev/null 2>&1; then
        say "p4c already installed ($pins) in $P4_PREFIX"
        return
    fi
    stage "packages" bash "$here/system.sh" "$here/p4-apt-packages.txt"
    stage "p4c-packages" bash "$here/system.sh" "$here/p4c-apt-packages.txt"
    stage_once "p4c-source" "$P4C_REF" fetch_source p4c "$P4C_REPO" "$P4C_REF"
    stage_once "p4c-build" "$P4C_REF" build_p4c
    stage "p4c-check" check_p4c
    mkdir -p "$STAMPS"
    echo "$pins" >"$STAMPS/p4c"
    say "p4c installed ($pins): $P4_PREFIX/bin/p4c-bm2-ss"
}

# With P4_SOURCES, every tree the build will need must be there before anything is installed or built.
check_sources() {
    [ -n "$P4_SOURCES" ] || return 0
    local dir
    for dir in "$@"; do
        [ -d "$P4_SOURCES/$dir" ] || fail "P4_SOURCES=$P4_SOURCES has no $dir/ (see the top of install/p4.sh)"
    done
}

main() {
    local what=${1:-}
    case "$what" in
        bmv2) check_sources PI behavioral-model ;;
        p4c) check_sources p4c "${P4C_DEPS[@]/#/p4c-deps/}" ;;
        *) fail "usage: install/p4.sh bmv2|p4c (got '${what}')" ;;
    esac
    [ "$(id -u)" -eq 0 ] || [ -w "$P4_PREFIX" ] || fail "$P4_PREFIX is not writable: run as root or set P4_PREFIX"
    mkdir -p "$LOGS"
    "install_$what"
}

main "$@"

#!/usr/bin/env bash
# Build the project's virtualenv: Debian's python3, pip at the pinned version, then this package with every
# extra, every version held by install/constraints.txt. Usage: install/python.sh VENV_DIR
#
# Environment:
#   PYTHON          interpreter for the virtualenv (default /usr/bin/python3: Mininet and the tests use it too)
#   MBALANCER_PIP   pip requirement to install first (default: the pip pinned in constraints.txt); e.g. "pip" for
#                   the newest pip, to check the install still works with it
#
# Constraints reach pip in two ways, because pip 26.2 changed where they apply:
#   PIP_CONSTRAINT        the packages installed into the virtualenv (every pip version).
#   PIP_BUILD_CONSTRAINT  the isolated environments in which sdists are built (pip >= 26.2 reads only this one there;
#                         older pips pass PIP_CONSTRAINT into those environments and ignore this variable).
# The one package that needs a build constraint is ryu 4.34 (sdist only): its setup hooks call setuptools'
# easy_install.get_script_args, which setuptools 68 removed, so it must be built with setuptools < 68
# (install/build-constraints.txt). Without it the build fails with "AttributeError: ... 'get_script_args'".
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
venv=${1:?usage: install/python.sh VENV_DIR}
python=${PYTHON:-/usr/bin/python3}
log="$venv/install.log"

export PIP_CONSTRAINT="$here/constraints.txt"
export PIP_BUILD_CONSTRAINT="$here/build-constraints.txt"
export PIP_DISABLE_PIP_VERSION_CHECK=1

say() { echo "install/python.sh: $*"; }

# Run pip with its output in the log; on failure name the step and show pip's own error lines, not a wall of text.
# PIP_PYTHON names another environment's interpreter (default: the virtualenv's).
pip_step() {
    local what=$1; shift
    say "$what"
    if ! "${PIP_PYTHON:-$venv/bin/python}" -m pip "$@" >>"$log" 2>&1; then
        echo "install/python.sh: FAILED: $what; pip said:" >&2
        grep -E '^(ERROR|error|  [A-Za-z]*Error)|No matching distribution|Could not find a version' "$log" \
            | tail -n 15 | cut -c1-240 >&2 || tail -n 15 "$log" >&2
        echo "install/python.sh: full pip output in $log" >&2
        exit 1
    fi
}

pinned_pip=$(grep -E '^pip==' "$here/constraints.txt" || echo pip)
if [ ! -x "$venv/bin/python" ]; then
    say "creating the virtualenv $venv with $python"
    "$python" -m venv "$venv"
fi
: >"$log"
# pip itself is installed without the constraints, so that MBALANCER_PIP may name another version than the pin.
PIP_CONSTRAINT= pip_step "pip: ${MBALANCER_PIP:-$pinned_pip}" install -q --upgrade "${MBALANCER_PIP:-$pinned_pip}"
say "pip $("$venv/bin/python" -m pip --version | cut -d' ' -f2)"
# Every extra of setup.py (tests/test_install.py checks this list against it): this machine runs the testbed, the
# plots, the Ryu app and the tests, where a switch box's `pip install .` takes none of them.
extras="testbed,plots,ryu,test"
pip_step "mbalancer, its extras ($extras) and their pinned dependencies (a few minutes on a new machine)" \
    install -q -e "$root[$extras]"

# The P4Runtime bindings from PyPI load only with protobuf 3.20: regenerated in place with grpcio-tools' protoc, which
# is kept out of the virtualenv (it asks for setuptools >= 77; ryu's environment is pinned below 68).
pip_step "grpcio-tools (protoc) for the P4Runtime bindings" \
    install -q --upgrade --no-deps --target "$venv/protoc" grpcio-tools
if ! "$venv/bin/python" "$here/p4runtime_bindings.py" --protoc "$venv/protoc" >>"$log" 2>&1; then
    echo "install/python.sh: FAILED: regenerating the P4Runtime bindings: $(tail -n 1 "$log")" >&2
    exit 1
fi
say "$(tail -n 1 "$log" | sed 's|^install/p4runtime_bindings.py: ||')"

# p4runtime-shell, the way to look into a running P4 switch (docs/dataplanes/p4.md), in an environment of its own: its
# pins (p4runtime 1.4.1, protobuf 3.20, ipython 7.31) clash with the virtualenv's.
shell_env="$venv/p4runtime-shell"
[ -x "$shell_env/bin/python" ] || "$python" -m venv "$shell_env"
PIP_CONSTRAINT="$here/p4runtime-shell-constraints.txt" PIP_PYTHON="$shell_env/bin/python" \
    pip_step "p4runtime-shell in $shell_env" install -q p4runtime-shell
say "done"

# Sourced by scripts/moto.sh and scripts/python-client.sh: one PyPI package in a private
# virtualenv, installed where missing.
#
#   ensure_venv_package WHO VENV REQUIREMENT CHECK
#
# CHECK is python code run by the venv's python with the pinned version as argv[1]; it exits 0
# when the package is usable at that version. When it does not, the venv is created (where
# missing) and REQUIREMENT (`name==version`, extras allowed) installed with pip, then CHECK must
# pass. Prints the venv's python; WHO prefixes the messages on stderr.
ensure_venv_package() {
    local who="$1" venv="$2" requirement="$3" check="$4"
    local python="$venv/bin/python" version="${3##*==}"
    installed() {
        [ -x "$python" ] && "$python" -c "$check" "$version" >/dev/null 2>&1
    }
    if ! installed; then
        echo "$who: installing $requirement into $venv" >&2
        command -v python3 >/dev/null 2>&1 || { echo "$who: python3 is missing" >&2; exit 1; }
        if [ ! -x "$python" ]; then
            mkdir -p "$(dirname "$venv")"
            python3 -m venv "$venv"
        fi
        "$python" -m pip install --quiet --disable-pip-version-check "$requirement" >&2
        installed || { echo "$who: $requirement did not install into $venv" >&2; exit 1; }
    fi
    echo "$python"
}

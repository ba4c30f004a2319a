#!/usr/bin/env bash
# Set up this checkout on a fresh Debian/Ubuntu machine: everything the README's commands and
# the test suite need, nothing to install by hand. Safe to run again.
#   - headless Chromium + ChromeDriver (Debian's packages) for the dashboard browser test,
#     installed with apt-get when root (or passwordless sudo); otherwise one line says how;
#   - .venv with the CPU build of torch 2.13.0 and the project with its dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."

have_chromium() {
    command -v chromedriver >/dev/null 2>&1 &&
        { command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; }
}
if ! have_chromium; then
    packages=(chromium chromium-driver)
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
    else
        echo "setup: install headless Chromium for the dashboard browser test:" \
            "sudo apt-get install -y ${packages[*]}" >&2
    fi
fi

# Debian and Ubuntu ship the venv module in a separate package
if ! python3 -c "import ensurepip, venv" >/dev/null 2>&1; then
    venv_pkg="python3-venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$venv_pkg" >/dev/null
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$venv_pkg" >/dev/null
    else
        echo "setup: python3 cannot make a virtual environment: sudo apt-get install -y $venv_pkg" >&2
        exit 1
    fi
fi

python3 -m venv .venv  # an existing .venv is kept and reused
.venv/bin/python -m pip install -q torch==2.13.0
# compat: a .pth naming src/, so type checkers find the package as Python does (the default
# editable mode installs an import hook, which mypy and pyright cannot follow; .ci/run runs both)
.venv/bin/python -m pip install -q -e ".[dev]" --config-settings editable_mode=compat
echo "setup: .venv ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"

# Sourced by .ci/test and .ci/demo: brings a fresh machine to the point where the project runs.
# Installs only from the repository's own files (pyproject.toml + uv.lock) and Debian's packages.
set -euo pipefail

need_apt=()
ldconfig -p 2>/dev/null | grep -q 'libodbc.so.2' || need_apt+=(unixodbc)
[ -e /usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so ] || [ -e /usr/lib/aarch64-linux-gnu/odbc/libtdsodbc.so ] || need_apt+=(tdsodbc)
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
# The Queues page's browser test drives Debian's Chromium through Debian's chromedriver.
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
if [ "${#need_apt[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo ">> installing system packages: ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo ">> missing system packages (${need_apt[*]}); install them with apt-get as root" >&2
        exit 1
    fi
fi

if ! python3 -m uv --version >/dev/null 2>&1; then
    echo ">> installing uv"
    python3 -m pip install --quiet --disable-pip-version-check uv
fi

echo ">> syncing .venv from uv.lock"
python3 -m uv sync --locked --all-extras --python "$(command -v python3)" --quiet

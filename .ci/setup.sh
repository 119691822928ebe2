# Sourced by .ci/test and .ci/demo: brings a fresh machine to the point where the project runs.
# Installs only from the repository's own files (pyproject.toml + uv.lock) and Debian's packages.
# SQLQUEUE_SETUP=demo (set by .ci/demo) installs only what the demo uses: Java for Spark, the
# package with its spark extra and the demo group (a development .venv is synced whole instead).
# The tests also need unixODBC and FreeTDS (the SQL Server drivers' statements are checked),
# Chromium (the Queues page's browser test) and the dev group. Root is needed only to install
# missing Debian packages.
set -euo pipefail

need_apt=()
command -v java >/dev/null 2>&1 || need_apt+=(default-jre-headless)
if [ "${SQLQUEUE_SETUP:-test}" != demo ]; then
    ldconfig -p 2>/dev/null | grep -q 'libodbc.so.2' || need_apt+=(unixodbc)
    [ -e /usr/lib/x86_64-linux-gnu/odbc/libtdsodbc.so ] || [ -e /usr/lib/aarch64-linux-gnu/odbc/libtdsodbc.so ] || need_apt+=(tdsodbc)
    command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
    command -v chromedriver >/dev/null 2>&1 || need_apt+=(chromium-driver)
    # Spark's JDBC reader reads locked batches with PostgreSQL's JDBC driver (tests/conftest.py).
    [ -e /usr/share/java/postgresql.jar ] || need_apt+=(libpostgresql-jdbc-java)
    # The database-fault tests make PostgreSQL 15 clusters of their own (tests/pg_clusters.py).
    [ -x /usr/lib/postgresql/15/bin/initdb ] || need_apt+=(postgresql-15)
fi
if [ "${#need_apt[@]}" -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo ">> installing system packages: ${need_apt[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
    else
        echo ">> missing system packages (${need_apt[*]}): install them (as root: apt-get install ${need_apt[*]}) and run this again" >&2
        exit 1
    fi
fi

# uv from the Python that runs everything, else from a virtualenv of its own (no root, no system pip).
if python3 -m uv --version >/dev/null 2>&1; then
    uv=(python3 -m uv)
else
    tools="${XDG_CACHE_HOME:-$HOME/.cache}/sqlqueue-uv"
    if [ ! -x "$tools/bin/uv" ]; then
        echo ">> installing uv into $tools"
        python3 -m venv "$tools"
        "$tools/bin/python" -m pip install --quiet --disable-pip-version-check uv
    fi
    uv=("$tools/bin/uv")
fi

# The demo on a development checkout (a .venv with the dev group, which includes the demo's) keeps
# the whole development environment: a demo-only sync would uninstall the test and docs tools.
if [ "${SQLQUEUE_SETUP:-test}" = demo ] && [ ! -x .venv/bin/pytest ]; then
    echo ">> syncing .venv from uv.lock (the package, its spark extra and the demo group)"
    "${uv[@]}" sync --locked --extra spark --no-default-groups --group demo --python "$(command -v python3)" --quiet
else
    echo ">> syncing .venv from uv.lock"
    "${uv[@]}" sync --locked --all-extras --python "$(command -v python3)" --quiet
fi

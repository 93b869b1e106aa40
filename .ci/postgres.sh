# PostgreSQL for the db/ tests (and anything else reading GEMMTUNE_TEST_PG_URL).
# Sourced by .ci/run under `set -euo pipefail`, as root, on Debian 12. Idempotent: a second
# run finds the package, the running cluster, the role and the database, and only re-exports.

_gemmtune_pg_setup() {
    local role=gemmtune password=gemmtune database=gemmtune_test version port

    if ! command -v pg_lsclusters >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql
    fi

    version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    # Columns of pg_lsclusters: version cluster port status owner datadir logfile.
    _gemmtune_cluster() { pg_lsclusters --no-header | awk -v v="$version" -v c="$1" '$1 == v && $2 == "main" {print $c}'; }
    if [ -z "$(_gemmtune_cluster 2)" ]; then
        pg_createcluster "$version" main
    fi
    # Started by hand: CI containers have no systemd to do it.
    if [ "$(_gemmtune_cluster 4)" != online ]; then
        pg_ctlcluster "$version" main start
    fi
    port=$(_gemmtune_cluster 3)
    unset -f _gemmtune_cluster

    _gemmtune_psql() { runuser -u postgres -- psql --port "$port" -v ON_ERROR_STOP=1 -qtA "$@"; }
    # CREATEDB: the tests give every case a fresh database of its own.
    if [ "$(_gemmtune_psql -c "SELECT 1 FROM pg_roles WHERE rolname = '$role'")" != 1 ]; then
        _gemmtune_psql -c "CREATE ROLE $role LOGIN CREATEDB PASSWORD '$password'"
    fi
    if [ "$(_gemmtune_psql -c "SELECT 1 FROM pg_database WHERE datname = '$database'")" != 1 ]; then
        _gemmtune_psql -c "CREATE DATABASE $database OWNER $role"
    fi
    unset -f _gemmtune_psql

    export GEMMTUNE_TEST_PG_URL="postgresql://$role:$password@localhost:$port/$database"
    echo "PostgreSQL $version ready: GEMMTUNE_TEST_PG_URL=$GEMMTUNE_TEST_PG_URL"
}
_gemmtune_pg_setup
unset -f _gemmtune_pg_setup

#!/bin/sh
# Build the experiment's extension in place: benchmarks/native/_durable_record<suffix>.so.
# Needs a C compiler, the Python headers and libpq's headers (libpq-fe.h: Debian's
# libpq-dev, Homebrew's libpq). It links to no libpq: it resolves libpq's functions at
# run time in the copy psycopg loaded (see record.py), whose PGconn it is handed.
#
#   PYTHON=/path/to/python sh benchmarks/native/build.sh
set -eu
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
include=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
suffix=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
pq_include=$(pg_config --includedir 2>/dev/null || echo /usr/include/postgresql)
case "$(uname)" in
    Darwin) shared="-bundle -undefined dynamic_lookup" ;;
    *) shared="-shared" ;;
esac
target="_durable_record$suffix"
if [ -f "$target" ] && [ "$target" -nt _durable_record.c ] && [ "$target" -nt build.sh ]; then
    echo "benchmarks/native/$target is up to date"
    exit 0
fi
# Several processes may build at once (each pytest-xdist worker collects the test that
# builds it): each compiles to a file of its own and renames it into place, so a reader
# loads a whole library, never one half written.
tmp="$target.$$.tmp"
trap 'rm -f "$tmp"' EXIT
${CC:-cc} -O2 -fPIC -Wall -Wextra -Wno-unused-parameter $shared \
    -I"$include" -I"$pq_include" \
    _durable_record.c -o "$tmp" -ldl
mv -f "$tmp" "$target"
echo "built benchmarks/native/$target"

#!/usr/bin/env bash
# Runs every test of the workspace: unit tests, the conformance suite on SQLite (file and
# in-memory) and on a real PostgreSQL server, trybuild compile-fail tests, crash tests in
# real processes, and doctests.
#
# The PostgreSQL tests start a throwaway cluster from the machine's PostgreSQL binaries
# (loopback only, a port and directory of their own), or use DATABASE_URL when it is set.
# On a machine without those binaries this script installs Debian's `postgresql` package
# first: the PostgreSQL suite is mandatory, never skipped.
#
# The operator console's browser test (durable-console/tests/browser.rs) drives Debian's
# `chromium` through `chromedriver`; this script installs `chromium` and `chromium-driver`
# when `chromedriver` is missing (CHROMEDRIVER names another one). Never skipped either.
#
# durable-cli's bounded-memory test runs the binary under GNU time (Debian's `time`),
# installed here when /usr/bin/time is missing.
#
# The SQLite clock-skew tests (durable-sqlite/tests/clock_skew.rs) run workers under
# libfaketime, an hour ahead and behind; this script installs Debian's `faketime` when
# its library is missing (FAKETIME_LIB names another one).
set -euo pipefail
cd "$(dirname "$0")/.."

# rust-toolchain.toml pins 1.95.0, the machine's one toolchain. Where rustup knows it only
# as `stable`, register it under the pinned name instead of letting rustup download it.
if command -v rustup >/dev/null 2>&1; then
  toolchains=$(rustup toolchain list 2>/dev/null || true)
  stable=$(rustup run stable rustc --version 2>/dev/null || true)
  if [[ $'\n'"$toolchains" != *$'\n'1.95.0* && "$stable" == "rustc 1.95.0"* ]]; then
    rustup toolchain link 1.95.0 "$(rustup run stable rustc --print sysroot)"
  fi
fi

have_pg_binaries() {
  command -v initdb >/dev/null 2>&1 || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}

if [ -z "${DATABASE_URL:-}" ] && ! have_pg_binaries; then
  echo "scripts/test.sh: PostgreSQL binaries not found; installing Debian's postgresql package" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  have_pg_binaries || { echo "scripts/test.sh: postgresql installed but initdb still not found" >&2; exit 1; }
fi

if [ -z "${CHROMEDRIVER:-}" ] && ! command -v chromedriver >/dev/null 2>&1; then
  echo "scripts/test.sh: chromedriver not found; installing Debian's chromium and chromium-driver packages" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  command -v chromedriver >/dev/null 2>&1 || { echo "scripts/test.sh: chromium-driver installed but chromedriver still not found" >&2; exit 1; }
fi

# durable-cli/tests/bounded.rs measures the `durable` binary's peak memory with GNU time
# (`/usr/bin/time -f %M`, the child's ru_maxrss); Debian's `time` package installs it.
if [ ! -x /usr/bin/time ]; then
  echo "scripts/test.sh: /usr/bin/time not found; installing Debian's time package" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends time >/dev/null
  [ -x /usr/bin/time ] || { echo "scripts/test.sh: time installed but /usr/bin/time still not found" >&2; exit 1; }
fi

have_libfaketime() {
  [ -n "${FAKETIME_LIB:-}" ] || compgen -G '/usr/lib/*/faketime/libfaketimeMT.so.1' >/dev/null \
    || compgen -G '/usr/lib/faketime/libfaketimeMT.so.1' >/dev/null
}

if ! have_libfaketime; then
  echo "scripts/test.sh: libfaketime not found; installing Debian's faketime package" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends faketime >/dev/null
  have_libfaketime || { echo "scripts/test.sh: faketime installed but libfaketimeMT.so.1 still not found" >&2; exit 1; }
fi

# The compile-fail cases first, with the facade's default features: their pinned messages
# list the implementations of a trait, which the integration features' crates change.
cargo test -p durable --test ui
exec cargo test --workspace --all-features "$@"

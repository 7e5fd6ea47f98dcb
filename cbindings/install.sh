#!/usr/bin/env bash
# Installs libssmk: the shared library (with its SONAME link), the C and C++ headers and ssmk.pc.
#
#   cbindings/install.sh [--prefix DIR] [--libdir DIR] [--lib PATH] [--destdir DIR]
#
# --prefix   install prefix (default /usr/local)
# --libdir   library directory (default PREFIX/lib; Debian multiarch: PREFIX/lib/x86_64-linux-gnu)
# --lib      an already built libssmk.so (default: build it with `cargo build --release`)
# --destdir  staging root prepended to every path (for packaging), as with `make DESTDIR=`
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
prefix=/usr/local libdir="" lib="" destdir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --libdir) libdir="$2"; shift 2 ;;
    --lib) lib="$2"; shift 2 ;;
    --destdir) destdir="$2"; shift 2 ;;
    *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
libdir="${libdir:-$prefix/lib}"
includedir="$prefix/include"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
major="${version%%.*}"
if [ -z "$lib" ]; then
  (cd "$root" && cargo build --release --lib)
  lib="${CARGO_TARGET_DIR:-$root/target}/release/libssmk.so"
fi
install -d "$destdir$libdir/pkgconfig" "$destdir$includedir"
install -m 0755 "$lib" "$destdir$libdir/libssmk.so.$version"
ln -sfn "libssmk.so.$version" "$destdir$libdir/libssmk.so.$major"
ln -sfn "libssmk.so.$major" "$destdir$libdir/libssmk.so"
install -m 0644 "$root/include/ssmk.h" "$root/include/ssmk.hpp" "$destdir$includedir/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@LIBDIR@|$libdir|" -e "s|@INCLUDEDIR@|$includedir|" \
    -e "s|@VERSION@|$version|" "$here/ssmk.pc.in" > "$destdir$libdir/pkgconfig/ssmk.pc"
echo "installed ssmk $version into $destdir$prefix"

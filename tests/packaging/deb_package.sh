#!/bin/sh
# deb_package.sh BUILD_DIR SCRATCH VERSION CPACK: the Debian packages (issue 19),
# built by CPack from BUILD_DIR's already-built tree (cmake/Packaging.cmake)
# and checked as a device would get them.
#
#   1. `cpack -G DEB --config BUILD_DIR/CPackConfig.cmake` into SCRATCH: a
#      package per component (libcleave0, cleaved, cleave, libcleave-dev, a
#      module package per backend built).
#   2. Control fields (`dpkg-deb --field`): every package has the project's
#      VERSION, a maintainer, a section and a description; libcleave0
#      depends on Debian's library packages found by dpkg-shlibdeps (libzmq,
#      libsodium, OpenBLAS, libc6); cleaved on libcleave0 of the same version;
#      the cleave-opencl package alone on the OpenCL loader.
#   3. Contents (`dpkg-deb --contents`): usr/bin/cleaved, the unit
#      usr/lib/systemd/system/cleaved.service, /etc/cleave/cleaved.conf as a
#      conffile, libcleave.so.0 in libcleave0, the copyright and changelog.
#   4. `dpkg --root` into a scratch root (libcleave0 and cleave unpacked,
#      cleaved installed, its maintainer scripts run): the root's cleaved
#      loads the root's libcleave.so.0, `cleaved --version` prints VERSION,
#      the unit runs /usr/bin/cleaved, the packaged configuration has only
#      keys cleaved knows, the postinst neither enables nor starts the
#      service; reinstalled, the admin's edit of the conffile is kept;
#      removed, the conffile stays; purged, it goes.
#   5. apt resolves the packages' dependencies (`apt-get -s install ./*.deb`),
#      where apt-get is installed.
#   6. lintian, where installed: no error tags (warnings are printed).
# Exit 77 (CTest: skipped) without dpkg-deb, dpkg-shlibdeps or file.
set -eu
BUILD=$1
SCRATCH=$2
VERSION=$3
CPACK=$4

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

command -v dpkg-deb >/dev/null 2>&1 || skip "no dpkg-deb (apt-get install dpkg)"
command -v dpkg-shlibdeps >/dev/null 2>&1 || skip "no dpkg-shlibdeps (apt-get install dpkg-dev)"
command -v file >/dev/null 2>&1 || skip "no file (CPack's DEB generator needs it; apt-get install file)"

rm -rf "$SCRATCH"
mkdir -p "$SCRATCH"
OUT=$SCRATCH/out
"$CPACK" -G DEB --config "$BUILD/CPackConfig.cmake" -B "$OUT" >"$SCRATCH/cpack.log" 2>&1 ||
  { cat "$SCRATCH/cpack.log"; fail "cpack -G DEB"; }
ARCH=$(dpkg --print-architecture)
for p in libcleave0 cleaved cleave libcleave-dev; do
  [ -f "$OUT/${p}_${VERSION}_$ARCH.deb" ] || { ls "$OUT"; fail "no ${p}_${VERSION}_$ARCH.deb"; }
done
ls "$OUT"/*.deb

field() { dpkg-deb --field "$OUT/${1}_${VERSION}_$ARCH.deb" "$2"; }
# has_dep PACKAGE REGEX: PACKAGE's Depends names a package matching REGEX.
has_dep() {
  field "$1" Depends | tr ',' '\n' | grep -Eq "^ *($2)( |$)" || { field "$1" Depends; fail "$1 does not depend on $2"; }
}

# --- 2. Control fields.
for deb in "$OUT"/*.deb; do
  p=$(dpkg-deb --field "$deb" Package)
  [ "$(field "$p" Version)" = "$VERSION" ] || fail "$p: version $(field "$p" Version), not $VERSION"
  for f in Maintainer Section Priority Description Architecture; do
    [ -n "$(field "$p" $f)" ] || fail "$p: no $f"
  done
  echo "$p: Depends: $(field "$p" Depends)"
done
has_dep libcleave0 'libzmq[0-9]+'
has_dep libcleave0 'libsodium[0-9]+'
has_dep libcleave0 'libopenblas[0-9a-z-]*'
has_dep libcleave0 'libc6'
has_dep cleaved "libcleave0 \\(= $VERSION\\)"
has_dep libcleave-dev "libcleave0 \\(= $VERSION\\)"
for p in libcleave0 cleaved cleave; do
  if field "$p" Depends | grep -q 'opencl\|cuda'; then fail "$p depends on a GPU library: $(field "$p" Depends)"; fi
done
if [ -f "$OUT/cleave-opencl_${VERSION}_$ARCH.deb" ]; then
  has_dep cleave-opencl 'ocl-icd-libopencl1'
fi
[ "$(field libcleave0 Section)" = libs ] || fail "libcleave0: section $(field libcleave0 Section)"
dpkg-deb --info "$OUT/libcleave0_${VERSION}_$ARCH.deb" shlibs | grep -q "^libcleave 0 libcleave0" ||
  fail "libcleave0 has no shlibs entry for libcleave.so.0"

# --- 3. Contents.
contents() { dpkg-deb --contents "$OUT/${1}_${VERSION}_$ARCH.deb" | awk '{print $6}'; }
has_file() {
  contents "$1" | grep -Eq "^\\./$2\$" || { contents "$1"; fail "$1 lacks $2"; }
}
has_file cleaved usr/bin/cleaved
has_file cleaved usr/lib/systemd/system/cleaved.service
has_file cleaved etc/cleave/cleaved.conf
has_file cleaved usr/share/doc/cleaved/copyright
has_file cleaved usr/share/doc/cleaved/changelog.gz
has_file libcleave0 'usr/lib/([a-z0-9_]+-linux-gnu/)?libcleave\.so\.0'
has_file libcleave-dev 'usr/lib/([a-z0-9_]+-linux-gnu/)?libcleave\.a'
has_file libcleave-dev usr/include/cleave/cleave.h
has_file cleave usr/bin/cleave
has_file cleave usr/share/cleave/models/mlp.json
if contents libcleave0 | grep -q 'backend'; then fail "libcleave0 holds a backend module"; fi
dpkg-deb --info "$OUT/cleaved_${VERSION}_$ARCH.deb" conffiles | grep -qx /etc/cleave/cleaved.conf ||
  fail "cleaved: /etc/cleave/cleaved.conf is not a conffile"

# --- 4. Installed by dpkg into a scratch root with its own database (the
# maintainer scripts run with DPKG_ROOT set: they leave the host's systemd
# alone). libcleave0 and cleave are only unpacked: CPack's ldconfig postinst
# would act on the host.
ROOT=$SCRATCH/root
mkdir -p "$ROOT/var/lib/dpkg/info" "$ROOT/var/lib/dpkg/updates"
: >"$ROOT/var/lib/dpkg/status"
: >"$ROOT/var/lib/dpkg/available"
in_root() {
  PATH="$PATH:/usr/sbin:/sbin" dpkg --root="$ROOT" --log="$SCRATCH/dpkg.log" --force-script-chrootless --force-depends \
    --force-not-root "$@" >>"$SCRATCH/dpkg.out" 2>&1 || { cat "$SCRATCH/dpkg.out"; fail "dpkg --root $*"; }
}
deb() { echo "$OUT/${1}_${VERSION}_$ARCH.deb"; }
status() { dpkg-query --admindir="$ROOT/var/lib/dpkg" -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null || true; }
in_root --unpack "$(deb libcleave0)" "$(deb cleave)"
in_root --install "$(deb cleaved)"
[ "$(status cleaved)" = "ii " ] || fail "cleaved is '$(status cleaved)' in the scratch root, not installed"
lib=$(ldd "$ROOT/usr/bin/cleaved" | sed -n 's/.*libcleave.so.0 => \([^ ]*\).*/\1/p')
case $(readlink -f "$lib") in
  "$(readlink -f "$ROOT")"/*) ;;
  *) ldd "$ROOT/usr/bin/cleaved"; fail "the installed cleaved loads '$lib', not the root's libcleave.so.0" ;;
esac
v=$("$ROOT/usr/bin/cleaved" --version) || fail "cleaved --version exited $?"
echo "installed: cleaved --version: $v"
echo "$v" | grep -q "$VERSION" || fail "cleaved --version printed '$v', not $VERSION"
v=$("$ROOT/usr/bin/cleave" --version) || fail "cleave --version exited $?"
echo "$v" | grep -q "$VERSION" || fail "cleave --version printed '$v', not $VERSION"

UNIT=$ROOT/usr/lib/systemd/system/cleaved.service
grep -qx 'ExecStart=/usr/bin/cleaved --config /etc/cleave/cleaved.conf' "$UNIT" || { cat "$UNIT"; fail "ExecStart"; }
grep -qx 'ExecStartPre=/usr/bin/cleaved --config /etc/cleave/cleaved.conf --check-config' "$UNIT" ||
  { cat "$UNIT"; fail "ExecStartPre"; }
if grep -q "$SCRATCH\\|_CPack_Packages" "$UNIT"; then cat "$UNIT"; fail "the unit names the staging tree"; fi
# The packaged configuration names only keys cleaved knows: it fails on its (absent) key file.
code=0
"$ROOT/usr/bin/cleaved" --config "$ROOT/etc/cleave/cleaved.conf" --check-config >"$SCRATCH/conf.log" 2>&1 || code=$?
if [ $code != 1 ] || ! grep -q "cleaved.conf:[0-9]*: key: /var/lib/cleave/board1.key" "$SCRATCH/conf.log"; then
  cat "$SCRATCH/conf.log"
  fail "the packaged configuration (exit $code)"
fi
CTRL=$SCRATCH/control
dpkg-deb --control "$(deb cleaved)" "$CTRL"
for s in postinst prerm postrm; do
  [ -x "$CTRL/$s" ] || fail "cleaved has no executable $s"
  sh -n "$CTRL/$s" || fail "cleaved's $s is not valid sh"
done
if grep -v '^ *#' "$CTRL/postinst" | grep -Eq 'enable|deb-systemd-invoke +start|systemctl +(--[a-z]+ +)*start'; then
  cat "$CTRL/postinst"
  fail "cleaved's postinst enables or starts the service"
fi
# An upgrade keeps the admin's edit of the conffile; a removal keeps the
# conffile, a purge removes it.
echo "# edited by the admin" >>"$ROOT/etc/cleave/cleaved.conf"
in_root --force-confold --install "$(deb cleaved)"
grep -q "edited by the admin" "$ROOT/etc/cleave/cleaved.conf" || fail "reinstalling cleaved lost the conffile's edit"
in_root --remove cleaved
if [ -e "$ROOT/usr/bin/cleaved" ] || [ -e "$UNIT" ]; then fail "removing cleaved left its files"; fi
[ -f "$ROOT/etc/cleave/cleaved.conf" ] || fail "removing cleaved removed its conffile"
in_root --purge cleaved
[ ! -e "$ROOT/etc/cleave/cleaved.conf" ] || fail "purging cleaved left /etc/cleave/cleaved.conf"
echo "installed: the unit runs /usr/bin/cleaved; the conffile survives an upgrade and goes on purge"

# --- 5. apt would install them (dependencies resolvable here).
if command -v apt-get >/dev/null 2>&1; then
  (cd "$OUT" && apt-get -s -q install ./libcleave0_*.deb ./cleaved_*.deb ./cleave_*.deb) >"$SCRATCH/apt.log" 2>&1 ||
    { cat "$SCRATCH/apt.log"; fail "apt-get -s install: the dependencies do not resolve"; }
  echo "apt: the dependencies of libcleave0, cleaved and cleave resolve"
fi

# --- 6. lintian.
if command -v lintian >/dev/null 2>&1; then
  lintian --tag-display-limit 0 "$OUT"/*.deb >"$SCRATCH/lintian.log" 2>&1 || true
  cat "$SCRATCH/lintian.log"
  if grep -q '^E: ' "$SCRATCH/lintian.log"; then fail "lintian reports errors"; fi
  echo "lintian: no errors ($(grep -c '^W: ' "$SCRATCH/lintian.log" || true) warnings)"
else
  echo "lintian: not installed, not run"
fi
echo "PASS: the packages build, depend on Debian's libraries and run from a scratch root"

#!/bin/sh
# Meson install script: creates SYSCONFDIR/tpfabric/tpfabricd.conf from the
# example installed beside it, only when no such file exists, so that an
# install never overwrites an operator's configuration. Honours DESTDIR.
# Says what it did on stdout; meson from 0.57 on (Debian 12's 1.0.1 among
# them) shows a script's output only when the script fails, so the same line
# goes to BUILDDIR/meson-logs/tpfabric-install.txt too (beside meson's
# install-log.txt, which lists only the files meson itself installed).
# Usage (from meson.add_install_script): install_config.sh SYSCONFDIR/tpfabric
set -eu
dir=$1
case $dir in
/*) ;;
*) dir=$MESON_INSTALL_PREFIX/$dir ;;
esac
target=${DESTDIR:-}$dir
if [ -e "$target/tpfabricd.conf" ]; then
    line="tpfabric: keeping the existing $dir/tpfabricd.conf (the new example is $dir/tpfabricd.conf.example)"
else
    cp "$target/tpfabricd.conf.example" "$target/tpfabricd.conf"
    chmod 0644 "$target/tpfabricd.conf"
    line="tpfabric: installed $dir/tpfabricd.conf from tpfabricd.conf.example"
fi
echo "$line"
# One line per install, the latest last; a log that cannot be written loses nothing the install needs.
if [ -n "${MESON_BUILD_ROOT:-}" ] && [ -d "$MESON_BUILD_ROOT/meson-logs" ]; then
    echo "$(date '+%Y-%m-%d %H:%M:%S') ${DESTDIR:+DESTDIR=$DESTDIR: }$line" >>"$MESON_BUILD_ROOT/meson-logs/tpfabric-install.txt" || true
fi

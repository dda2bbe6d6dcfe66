#!/bin/sh
# Meson install script: creates SYSCONFDIR/tpfabric/tpfabricd.conf from the
# example installed beside it, only when no such file exists, so that an
# install never overwrites an operator's configuration. Honours DESTDIR.
# Usage (from meson.add_install_script): install_config.sh SYSCONFDIR/tpfabric
set -eu
dir=$1
case $dir in
/*) ;;
*) dir=$MESON_INSTALL_PREFIX/$dir ;;
esac
target=${DESTDIR:-}$dir
if [ -e "$target/tpfabricd.conf" ]; then
    echo "tpfabric: keeping the existing $dir/tpfabricd.conf (the new example is $dir/tpfabricd.conf.example)"
else
    cp "$target/tpfabricd.conf.example" "$target/tpfabricd.conf"
    chmod 0644 "$target/tpfabricd.conf"
    echo "tpfabric: installed $dir/tpfabricd.conf from tpfabricd.conf.example"
fi

#!/bin/sh
# Remove what install.sh registered: menu entry, icons and file types (settings and caches stay;
# see docs/install.md for where they are).
#
# Usage: packaging/linux/uninstall.sh [--system]
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ICONS="$HERE/../icons/hicolor"
APP_ID=io.github.qbstudio.qbstudio
MODE=user
[ "${1:-}" = --system ] && MODE=system
xdg-desktop-menu uninstall --novendor --mode "$MODE" "$APP_ID.desktop"
xdg-mime uninstall --novendor --mode "$MODE" "$HERE/qbstudio-mime.xml"
for dir in "$ICONS"/*x*; do
    size=$(basename "$dir" | cut -dx -f1)
    xdg-icon-resource uninstall --noupdate --mode "$MODE" --context apps --size "$size" qbstudio
done
xdg-icon-resource forceupdate --mode "$MODE"
echo "qb Studio unregistered ($MODE)"

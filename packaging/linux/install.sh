#!/bin/sh
# Register qb Studio with the desktop: menu entry, icons, and the .qbproj/.mxq/.mblt file types.
#
# Usage: packaging/linux/install.sh [--system] [QBSTUDIO]
#   QBSTUDIO  the qbstudio executable to launch (default: `qbstudio` on PATH, e.g. from pip);
#             for the bundle: dist/qbstudio/qbstudio (made absolute here).
#   --system  for all users (needs root); default: the current user (~/.local/share).
# Needs xdg-utils (Debian: apt-get install xdg-utils). Undo with uninstall.sh.
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
ICONS="$HERE/../icons/hicolor"
APP_ID=io.github.qbstudio.qbstudio
MODE=user
EXEC=qbstudio
for arg in "$@"; do
    case "$arg" in
        --system) MODE=system ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) EXEC=$(cd "$(dirname "$arg")" && pwd)/$(basename "$arg") ;;
    esac
done
for tool in xdg-desktop-menu xdg-icon-resource xdg-mime; do
    command -v "$tool" >/dev/null 2>&1 || { echo "install.sh: $tool not found (install xdg-utils)" >&2; exit 1; }
done
if [ "$EXEC" != qbstudio ] && [ ! -x "$EXEC" ]; then
    echo "install.sh: $EXEC is not an executable" >&2; exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Exec/TryExec point at the chosen executable (quoted: the path may hold spaces)
sed -e "s|^Exec=qbstudio |Exec=\"$EXEC\" |" -e "s|^TryExec=qbstudio\$|TryExec=$EXEC|" \
    "$HERE/$APP_ID.desktop" > "$work/$APP_ID.desktop"
for dir in "$ICONS"/*x*; do
    size=$(basename "$dir" | cut -dx -f1)
    xdg-icon-resource install --noupdate --novendor --mode "$MODE" --context apps --size "$size" \
        "$dir/apps/qbstudio.png" qbstudio
done
xdg-icon-resource forceupdate --mode "$MODE"
xdg-mime install --novendor --mode "$MODE" "$HERE/qbstudio-mime.xml"
xdg-desktop-menu install --novendor --mode "$MODE" "$work/$APP_ID.desktop"
for type in application/x-qbstudio-project application/x-qbcompiler-mxq application/x-qbcompiler-mblt; do
    [ "$MODE" = user ] && xdg-mime default "$APP_ID.desktop" "$type"
done
echo "qb Studio registered ($MODE): menu entry, icons, file types; launches $EXEC"

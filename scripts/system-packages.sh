#!/bin/sh
# Debian packages: real data the test suite reads (Fashion-MNIST, LibriVox speech, DejaVu fonts for rendered
# text), a font for the graph view, and the desktop-integration tools (validators for the .desktop entry and
# AppStream metainfo, xdg-utils for the install scripts, Xvfb and Qt's X11 libraries for the bundle's
# screenshot check). Installed when missing and when we can (root with apt-get); otherwise the tests that
# need them skip and say why.
set -e
missing=""
[ -d /usr/share/datasets/fashion-mnist ] || missing="$missing dataset-fashion-mnist"
[ -d /usr/share/pocketsphinx/test/data/librivox ] || missing="$missing pocketsphinx-testdata"  # speech for the corpus
[ -d /usr/share/backgrounds/mate/nature ] || missing="$missing mate-backgrounds"  # held-out photos (MobileNetV2)
[ -f /usr/share/backgrounds/Bridge_by_Sander_Klootwijk.jpg ] || missing="$missing lomiri-wallpapers-16.04"  # held-out photos
[ -d /usr/share/fonts/truetype/dejavu ] || missing="$missing fonts-dejavu-core"  # rendered text for OCR models
[ -d /usr/share/fonts/truetype/wqy ] || missing="$missing fonts-wqy-microhei"  # a glyph for Netron's shape brackets
command -v bible >/dev/null 2>&1 || missing="$missing bible-kjv"  # public-domain English text for the LLM bench
command -v desktop-file-validate >/dev/null 2>&1 || missing="$missing desktop-file-utils"
command -v appstreamcli >/dev/null 2>&1 || missing="$missing appstream"
command -v xdg-mime >/dev/null 2>&1 || missing="$missing xdg-utils"
command -v update-mime-database >/dev/null 2>&1 || missing="$missing shared-mime-info"
command -v Xvfb >/dev/null 2>&1 || missing="$missing xvfb xauth"
for pkg in libxcb-icccm4 libxcb-keysyms1 libxcb-image0 libxcb-render-util0 libxkbcommon-x11-0 libxcb-cursor0; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing="$missing $pkg"
done
[ -z "$missing" ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "Installing Debian packages:$missing"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
else
    echo "Note: not installing$missing (needs root and apt-get); tests that need it will skip." >&2
fi

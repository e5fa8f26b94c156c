#!/bin/sh
# Debian packages: real data the test suite reads (Fashion-MNIST, LibriVox speech, DejaVu fonts for rendered
# text) and a font for the graph view. Installed when missing and when we can (root with apt-get); otherwise
# the tests that need them skip and say why.
set -e
missing=""
[ -d /usr/share/datasets/fashion-mnist ] || missing="$missing dataset-fashion-mnist"
[ -d /usr/share/pocketsphinx/test/data/librivox ] || missing="$missing pocketsphinx-testdata"  # speech for the corpus
[ -d /usr/share/fonts/truetype/dejavu ] || missing="$missing fonts-dejavu-core"  # rendered text for OCR models
[ -d /usr/share/fonts/truetype/wqy ] || missing="$missing fonts-wqy-microhei"  # a glyph for Netron's shape brackets
[ -z "$missing" ] && exit 0
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = "0" ]; then
    echo "Installing Debian packages:$missing"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
else
    echo "Note: not installing$missing (needs root and apt-get); tests that need it will skip." >&2
fi

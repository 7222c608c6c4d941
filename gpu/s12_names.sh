#!/usr/bin/env bash
# Issue 12 and 15, session 12: gpu/s11_names.sh (the naming shapes, attach, its refusal under
# watch) on session 12's binaries.
#   bash gpu/s12_names.sh OUT      (binaries: $NEW, default .bench/s12/names)
DEST=/opt/wp-s12n NEW=${NEW:-$PWD/.bench/s12/names} exec bash gpu/s11_names.sh "$@"

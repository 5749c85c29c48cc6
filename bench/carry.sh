#!/usr/bin/env bash
# Carries a set of staged folders to the offline GPU machine in pieces small enough for one device
# call each (a call moves the whole working tree plus what it carries, at most 64 MiB; the tracked
# tree alone is ~13 MiB, so a 54 MiB wheel chunk no longer fits beside it).
#
#   bash bench/carry.sh pack SET MIB DIR...  # dev machine: tar DIRs (under .stage/), split into
#                                            # MIB-sized pieces, one folder each: .stage/SET-aa ...
#   bash bench/carry.sh take                 # GPU machine, every call: keep the pieces carried now
#   bash bench/carry.sh unpack SET DEST      # GPU machine: when all have come, rebuild DIRs in DEST
set -euo pipefail
PIECES=/tmp/carry-pieces
case "${1:-}" in
    pack) set_name=$2 mib=$3; shift 3
          rm -rf .stage/"$set_name"-*
          tar cf - -C .stage "$@" | split -b "${mib}m" - ".stage/$set_name.tar."
          for p in .stage/"$set_name".tar.*; do
              d=".stage/$set_name-${p##*.}"; mkdir -p "$d"; mv "$p" "$d/"
          done
          (cd .stage && sha256sum "$set_name"-*/* > "$set_name.sha256" && cp "$set_name.sha256" "$set_name-aa/")
          ls -d .stage/"$set_name"-* | while read -r d; do echo "$d $(du -sm "$d" | cut -f1) MiB"; done ;;
    take) mkdir -p "$PIECES"; shopt -s nullglob
          for f in .stage/*-??/*; do cp -n "$f" "$PIECES/" 2>/dev/null || true; done
          ls "$PIECES" ;;
    unpack) set_name=$2 dest=$3; mkdir -p "$dest"
            (cd "$PIECES" && sed -E 's#^([0-9a-f]+  ).*/#\1#' "$set_name.sha256" | sha256sum --quiet -c -)
            cat "$PIECES/$set_name".tar.* | tar xf - -C "$dest"
            echo "unpacked $set_name into $dest: $(ls "$dest" | tr '\n' ' ')" ;;
    *) echo "usage: $0 pack SET MIB DIR... | take | unpack SET DEST" >&2; exit 2 ;;
esac

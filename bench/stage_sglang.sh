#!/usr/bin/env bash
# Stage SGLang 0.5.16 for the offline GPU machine: the wheels of bench/sglang_wheels.txt (those
# neither the image nor bench/device_wheels.txt holds), with sglang-kernel slimmed of its
# FlashAttention 3 library (sgl_kernel/flash_ops.abi3.so, 342 of its 383 MB, imported only by
# SGLang's fa3 attention backend: run with --attention-backend triton), packed by bench/carry.sh
# into pieces that fit one device call each (.stage/g-aa, .stage/g-ab). Run from the repository root:
#   bash bench/stage_sglang.sh
# then one call per piece: carry [".stage/g-aa"] `bash bench/carry.sh take`, and with the last
# `bash bench/carry.sh take && bash bench/gpu_session.sh sglang_install`.
set -euo pipefail
DEST=.stage/sglang
rm -rf "$DEST" && mkdir -p "$DEST"
PLAT=()
for t in manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
         manylinux_2_34 manylinux_2_35; do
  PLAT+=(--platform "${t}_x86_64")
done
mapfile -t WHEELS < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' bench/sglang_wheels.txt | grep -v '^$')
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLAT[@]}" -d "$DEST" "${WHEELS[@]}"
# Slim the kernel wheel: drop flash_ops and its RECORD line (the wheel stays valid: every other
# file's hash in RECORD still holds).
kernel=$(ls "$DEST"/sglang_kernel-*.whl)
work=$(mktemp -d)
(cd "$work" && python3 -m zipfile -e "$OLDPWD/$kernel" . && rm -f sgl_kernel/flash_ops*.so \
   && sed -i '/^sgl_kernel\/flash_ops/d' sglang_kernel-*.dist-info/RECORD && rm "$OLDPWD/$kernel" \
   && python3 -c "import sys, zipfile, pathlib; z = zipfile.ZipFile(sys.argv[1], 'w', zipfile.ZIP_DEFLATED); [z.write(p, p.as_posix()) for p in sorted(pathlib.Path('.').rglob('*')) if p.is_file()]" "$OLDPWD/$kernel")
rm -rf "$work"
du -sh "$DEST"; ls "$DEST" | wc -l
bash bench/carry.sh pack g 40 sglang

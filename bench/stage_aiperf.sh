#!/usr/bin/env bash
# Stage AIPerf 0.13.0 for the offline GPU machine into .stage/a1 (one device call's carry, 47 MB):
# only the wheels that neither the machine's image (the package list in the tool library's
# device/KINDS.md) nor bench/device_wheels.txt (installed to /tmp/site) holds, so that it
# fits one call. bench/gpu_session.sh step aiperf_install installs them with --no-deps into
# /tmp/aiperf-site, which is put before /tmp/site on PYTHONPATH for AIPerf alone (its pins of
# pyzmq and fastapi's neighbours differ from vLLM's). Run from the repository root:
#   bash bench/stage_aiperf.sh
set -euo pipefail
DEST=.stage/a1
mkdir -p "$DEST"
PLAT=()
for t in manylinux1 manylinux2014 manylinux_2_5 manylinux_2_17 manylinux_2_24 manylinux_2_26 manylinux_2_27 \
         manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35 manylinux_2_39; do
  PLAT+=(--platform "${t}_x86_64")
done
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLAT[@]}" -d "$DEST" \
  aiperf==0.13.0 aiosqlite==0.22.1 alembic==1.20.1 blinker==1.9.0 brotli==1.2.1 cffi==2.1.1 choreographer==1.4.0 \
  colorlog==6.12.0 crick==0.0.8 cyclopts==4.25.3 dash==3.1.1 dash-bootstrap-components==2.0.4 datasets==5.2.0 \
  dill==0.4.1 docstring_parser==0.18.0 ffmpeg-python==0.2.0 Flask==3.1.3 future==1.0.0 importlib_metadata==10.2.0 \
  iso8601==2.1.0 itsdangerous==2.2.0 jsonpatch==1.48 jsonpointer==3.12 kaleido==1.2.0 kopf==1.45.2 \
  kubernetes_asyncio==32.3.2 lazy-importer==0.1.0 linkify-it-py==2.2.0 uc-micro-py logistro==2.0.1 Mako==1.4.3 \
  mdit-py-plugins==0.7.0 multiprocess==0.70.19 nest-asyncio==1.6.0 opentelemetry-api==1.45.2 optuna==5.0.0 \
  orjson==3.11.9 platformdirs==4.14.8 plotly==6.4.0 pycparser==3.12 pytz==2026.6 retrying==1.4.2 rich-rst==2.2.0 \
  ruamel.yaml==0.18.17 ruamel.yaml.clib==0.2.15 soundfile==0.13.1 SQLAlchemy==2.1.9 starlette-compress==2.0.0 \
  textual==5.3.0 tzdata==2026.6 zstandard==0.25.0 pyzmq==26.4.0 \
  2> >(grep -v 'is ignored: it is neither a file nor a directory' >&2)
du -sh "$DEST"; ls "$DEST" | wc -l

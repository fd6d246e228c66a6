#!/usr/bin/env bash
# Run HERE (a machine with pip and a registry), not on the GPU machine: puts into .whl/ the
# wheels that the H200 machines (Python 3.12, no registry, ray not installed) need for
# `serve --replicas` / `matrix --ray`, for a device call that carries ".whl".
#
# Only what their image lacks, and only what vlaperf's use of Ray needs (checked on the CPU:
# tests/test_ray.py passes in a venv holding just these on top of that image's packages; the
# dashboard modules that need more are skipped by Ray with an INFO line). ray's own wheel is
# 76 MiB, over the 64 MiB a call may carry: its Java jar (ray/jars, 31 MiB, only for Java
# workers) is dropped, with its RECORD lines, which leaves 45 MiB; all of .whl is then ~49 MiB.
# grpcio-reflection is pinned to the image's grpcio (1.84.0): 1.85 refuses to import against it.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.whl}  # the folder a device call carries
mkdir -p "$DEST"
PLAT=(--python-version 3.12 --implementation cp --only-binary=:all: --no-deps
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
WHEELS=(
  ray==2.60.0 websockets==17.4
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  jsonschema==4.26.0 referencing==0.37.0 jsonschema-specifications==2025.9.1 rpds-py==2026.9.1
  mmh3==5.3.1 opentelemetry-api==1.45.2 grpcio-reflection==1.84.0
)
TMP=$(mktemp -d)
python3 -m pip download -q "${PLAT[@]}" -d "$TMP" "${WHEELS[@]}"
python3 - "$TMP" <<'EOF'
import glob, os, sys, zipfile
tmp = sys.argv[1]
src = glob.glob(os.path.join(tmp, "ray-2.60.0-*.whl"))[0]
slim = src + ".slim"
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if info.filename.startswith("ray/jars/"):
            continue
        data = zi.read(info)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"\n".join(l for l in data.split(b"\n") if not l.startswith(b"ray/jars/"))
        zo.writestr(info, data)
os.replace(slim, src)
EOF
rm -f "$DEST"/websockets-*.whl "$DEST"/ray-*.whl  # one version of each
mv "$TMP"/*.whl "$DEST"/
rmdir "$TMP"
du -ch "$DEST"/*.whl | tail -1

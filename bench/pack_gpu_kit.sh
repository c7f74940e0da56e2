#!/usr/bin/env bash
# Pack what the lent GPU machine lacks for bench/gpu_suite.sh into .gpu/ (git-ignored), under the
# device tool's 64 MiB limit: ../shared/tools/gpu-kit's wheels plus PyAV (the annotation bench), unpacked
# and recompressed as one .gpu/site.tar.xz (the wheels alone, av included, are about 70 MB).
#
#   bash bench/pack_gpu_kit.sh
#   device run, carry [".gpu"]:  source .gpu/env.sh && bash bench/gpu_suite.sh --device cuda --out $OUT
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
../shared/tools/gpu-kit sim
av=$(.venv/bin/pip show av | awk '/^Version:/{print $2}')
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .gpu/whl "av==$av"
site=$(mktemp -d)
for wheel in .gpu/whl/*.whl; do unzip -q -o "$wheel" -d "$site"; done
tar -C "$site" -cf - . | xz -T0 -6 > .gpu/site.tar.xz
rm -rf "$site" .gpu/whl
cat > .gpu/env.sh <<'ENV'
# source .gpu/env.sh on the GPU machine, from the project root: GL loaders, then the packed packages
for f in .gpu/gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done; ldconfig 2>/dev/null || true
mkdir -p /tmp/site && tar -C /tmp/site -xJf .gpu/site.tar.xz || return 9
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 MUJOCO_GL=egl HF_HUB_OFFLINE=1
python3 -c "import torch, transformers; print('gpu kit:', torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
ENV
echo "pack_gpu_kit: .gpu is $(du -sm .gpu | cut -f1) MiB"

# Sourced by every device script, from the repository root, on a bare machine (carry [".whl",
# ".devdata"]): the carried wheels installed into /tmp/site, then the environment each run
# there needs. The device runs as root, which Open MPI refuses unless told; NVLink multicast
# stays off (the device notes say why).
# shellcheck shell=bash
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export RUSTYFLOW_DATA_DIR=${RUSTYFLOW_DATA_DIR:-$PWD/.devdata}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0

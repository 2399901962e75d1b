#!/usr/bin/env bash
# Install the provider from its source into the Python that runs Airflow, pinned by the repository's
# constraints.txt, keeping the Airflow that is already installed. docker/Dockerfile's RUN step; the
# container tests run it in a scratch virtual environment.
#   install-provider.sh SOURCE_DIR [EXTRAS [TORCH_BUILD]]   (defaults: fleet,examples and cpu)
# TORCH_BUILD cpu: PyTorch's CPU build (docker/torch-cpu.txt); cuda: PyPI's.
set -euo pipefail
SRC="${1:?usage: install-provider.sh SOURCE_DIR [EXTRAS [TORCH_BUILD]]}"
EXTRAS="${2:-fleet,examples}"
case "${3:-cpu}" in
  cpu) TORCH_INDEX=(-r "$SRC/docker/torch-cpu.txt") ;;
  cuda) TORCH_INDEX=() ;;
  *) echo "TORCH_BUILD is cpu or cuda, not $3" >&2; exit 2 ;;
esac
AIRFLOW_VERSION="$(python -c 'from importlib.metadata import version; print(version("apache-airflow"))')"
python -m pip install --no-cache-dir "${TORCH_INDEX[@]}" -c "$SRC/constraints.txt" "apache-airflow==$AIRFLOW_VERSION" "$SRC[$EXTRAS]"
# The provider and, for the fleet, the Celery provider must import, or the image is no use.
python -c 'import airflow_quota_provider.executors.quota_executor, airflow.providers.celery.executors.celery_executor'
# Mount points of docker/compose.yaml's named volumes, owned by the airflow user, so that a new
# volume starts with that owner (Docker copies a directory's owner into an empty named volume).
mkdir -p "${AIRFLOW_HOME:?}/config" "$AIRFLOW_HOME/checkpoints" "$AIRFLOW_HOME/logs"
